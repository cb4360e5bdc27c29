"""Tooling no runtime layer imports: the local-cluster harness (``devcluster``), free
ports, throwaway certificates for tests, the error table generator, the chaos suite and
the benchmarks."""
