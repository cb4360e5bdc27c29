"""``headwater bench tls``: what TLS costs, with TLS against plaintext in one run.

Each round starts two fresh clusters in turn (``--nodes`` combined nodes, data in a
temporary folder), one with mutual TLS on both listeners (a throwaway CA from
``headwater.tools.tls_certs``; clients present a certificate, nodes verify each other) and one
in plaintext, the order alternating between rounds, and runs the same workloads against
each as separate ``headwater bench`` processes, whose client TLS settings come from the
environment as a user's would:

- ``batch``: ``bench produce --mode batch --partitions 4 --acks all``;
- ``record``: ``bench produce --mode record --acks 1`` (per-record send);
- ``consume``: ``bench consume`` of the ``batch`` topic (columnar, from the start), run
  ``CONSUME_RUNS`` times in a row and counted by the median run: the first read right
  after a produce varies by 2x from run to run on this machine in either setting (the
  client's page faults, BENCHMARKS.md "Metrics and the docker-compose deployment");
- ``e2e``: ``bench e2e --rate 10000 --acks all``, produce-to-consume latency.

With ``--nodes 3`` every topic has 3 replicas, so replication crosses TLS too. The
figures are each workload's throughput ratio, TLS over plaintext, pair by pair, with the
median of the pairs, and the e2e latency percentiles of each.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Final

import click

from headwater.shared.tls import (
    CA_FILE_ENV,
    CERT_FILE_ENV,
    KEY_FILE_ENV,
    PROTOCOL_ENV,
    SERVER_NAME_ENV,
)
from headwater.tools.benchmarks.cluster import (
    median_ratio,
    paired_ratios,
    run_bench,
    throughput_workloads,
)
from headwater.tools.devcluster import LocalCluster
from headwater.tools.tls_certs import create_dev_pki

THROUGHPUT: Final = ("batch", "record", "consume")


def _workloads(
    bootstrap: str, round_no: int, records: int, record_records: int, env: dict[str, str]
) -> dict[str, Any]:
    results = throughput_workloads(
        bootstrap, f"batch-{round_no}", f"record-{round_no}", records, record_records, env
    )
    e2e = run_bench(
        bootstrap,
        "e2e",
        "--topic",
        f"e2e-{round_no}",
        "--rate",
        "10000",
        "--acks",
        "all",
        "--records",
        "50000",
        env=env,
    )
    return {**results, "e2e": e2e}


def run(rounds: int, nodes: int, records: int, record_records: int) -> dict[str, Any]:
    tls: dict[str, list[float]] = {w: [] for w in THROUGHPUT}
    plain: dict[str, list[float]] = {w: [] for w in THROUGHPUT}
    e2e: dict[str, list[tuple[float, float]]] = {"tls": [], "plaintext": []}
    with tempfile.TemporaryDirectory(prefix="headwater-bench-tls-") as root:
        pki = create_dev_pki(Path(root) / "pki", tuple(range(1, nodes + 1)))
        client_env = {
            PROTOCOL_ENV: "SSL",
            CA_FILE_ENV: str(pki.ca_file),
            CERT_FILE_ENV: str(pki.client.cert_file),
            KEY_FILE_ENV: str(pki.client.key_file),
        }
        # The caller's own TLS settings must not reach the plaintext runs.
        plaintext_env = {
            PROTOCOL_ENV: "PLAINTEXT",
            CA_FILE_ENV: "",
            CERT_FILE_ENV: "",
            KEY_FILE_ENV: "",
            SERVER_NAME_ENV: "",
        }
        for round_no in range(rounds):
            order = (True, False) if round_no % 2 == 0 else (False, True)
            for secured in order:
                cluster = LocalCluster(
                    Path(root) / f"r{round_no}-{'tls' if secured else 'plaintext'}",
                    nodes,
                    env={"HEADWATER_DEFAULT_REPLICATION_FACTOR": str(nodes)},
                    tls=pki if secured else None,
                    tls_client_auth=secured,
                )
                cluster.start()
                try:
                    if nodes > 1:
                        cluster.wait_settled()
                    results = _workloads(
                        cluster.bootstrap(),
                        round_no,
                        records,
                        record_records,
                        client_env if secured else plaintext_env,
                    )
                finally:
                    cluster.close()
                for workload in THROUGHPUT:
                    (tls if secured else plain)[workload].append(
                        float(results[workload]["records_per_s"])
                    )
                e2e["tls" if secured else "plaintext"].append(
                    (results["e2e"]["latency_ms_p50"], results["e2e"]["latency_ms_p99"])
                )
    ratios = {w: paired_ratios(tls[w], plain[w]) for w in THROUGHPUT}
    return {
        "rounds": rounds,
        "nodes": nodes,
        "records_per_s_tls": tls,
        "records_per_s_plaintext": plain,
        "ratio_tls_over_plaintext": ratios,
        "median_ratio": {w: median_ratio(r) for w, r in ratios.items()},
        "e2e_ms_p50_p99": e2e,
    }


@click.command("tls")
@click.option("--rounds", type=click.IntRange(1, 100), default=3, show_default=True)
@click.option("--nodes", type=click.IntRange(1, 5), default=1, show_default=True)
@click.option(
    "--records",
    type=click.IntRange(1),
    default=3_000_000,
    show_default=True,
    help="Records of the send_batch and consume workloads.",
)
@click.option(
    "--record-records",
    type=click.IntRange(1),
    default=1_000_000,
    show_default=True,
    help="Records of the per-record workload.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bench_tls(rounds: int, nodes: int, records: int, record_records: int, as_json: bool) -> None:
    """Produce, consume and e2e latency with mutual TLS against plaintext."""
    result = run(rounds, nodes, records, record_records)
    if as_json:
        print(json.dumps(result))
        return
    for workload in THROUGHPUT:
        click.echo(
            f"{workload}: TLS {result['records_per_s_tls'][workload]} plaintext "
            f"{result['records_per_s_plaintext'][workload]} records/s; ratios "
            f"{result['ratio_tls_over_plaintext'][workload]} "
            f"(median {result['median_ratio'][workload]})"
        )
    click.echo(f"e2e p50/p99 ms: {result['e2e_ms_p50_p99']}")
