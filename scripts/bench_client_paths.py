"""The Python client's paths in one run, optionally against another checkout's client or
node.

Usage: python scripts/bench_client_paths.py [--rounds N] [--baseline DIR]
       [--compare client|node] [--json FILE]

Each round starts a fresh node of this checkout (``headwater serve`` on a free loopback
port, data in a temporary folder) and runs, one client process at a time:

- ``bench produce --mode record`` (per-record ``send``, acks=1),
- ``bench produce --mode batch`` (``send_batch``, acks=1), which also fills the topic the
  two reads below read back,
- ``bench produce --mode batch --acks all`` (``send_batch``, acks=all),
- ``bench consume --mode record`` (``for record in poll()``, touching each value),
- ``bench consume`` (the columnar view: ``result.batches``),
- ``bench e2e --rate 10000`` (produce-to-consume latency at 10,000 records/s).

With ``--baseline DIR`` (another checkout with its own ``.venv``, ``make .venv/.installed``
there), each round runs the same commands with that checkout's client against the same
node (``--compare client``, the default), or with this checkout's client against a node
of that checkout and one of this (``--compare node``: each side its own fresh node, one
at a time), the order of the two alternating between rounds, and the table shows each
round's ratio and their median. It prints a Markdown table with the machine and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_all import machine, start_node

from headwater.tools.devcluster import LocalNode

HERE = Path(__file__).resolve().parent.parent

PATHS: tuple[tuple[str, str, bool], ...] = (
    ("per-record send, records/s", "records_per_s", True),
    ("send_batch, records/s", "records_per_s", True),
    ("send_batch acks=all, records/s", "records_per_s", True),
    ("iterating records, records/s", "records_per_s", True),
    ("columnar, records/s", "records_per_s", True),
    ("e2e at 10k/s, p50 ms", "latency_ms_p50", False),
    ("e2e at 10k/s, p99 ms", "latency_ms_p99", False),
)
"""(row, JSON field, higher is better)"""


def run_bench(checkout: Path, address: str, *args: str) -> dict[str, Any]:
    """One ``headwater bench`` in a process of ``checkout``'s own venv and sources."""
    python = checkout / ".venv" / "bin" / "python"
    command = [str(python), "-m", "headwater.cli.main", "bench", *args, "--json"]
    command += ["--bootstrap", address]
    output = subprocess.run(
        command, cwd=checkout, capture_output=True, check=True, text=True
    ).stdout
    result: dict[str, Any] = json.loads(output)
    return result


def one_client(checkout: Path, address: str, tag: str, counts: dict[str, int]) -> list[float]:
    """Every path of ``PATHS`` once with ``checkout``'s client; topics named by ``tag``."""
    record = run_bench(
        checkout, address, "produce", "--mode", "record", "--acks", "1",
        "--records", str(counts["record"]), "--topic", f"record-{tag}",
    )  # fmt: skip
    batch = run_bench(
        checkout, address, "produce", "--acks", "1",
        "--records", str(counts["batch"]), "--topic", f"batch-{tag}",
    )  # fmt: skip
    batch_all = run_bench(
        checkout, address, "produce", "--acks", "all",
        "--records", str(counts["batch"]), "--topic", f"batch-all-{tag}",
    )  # fmt: skip
    iterated = run_bench(
        checkout, address, "consume", "--mode", "record",
        "--records", str(counts["batch"]), "--topic", f"batch-{tag}",
    )  # fmt: skip
    columnar = run_bench(
        checkout, address, "consume", "--records", str(counts["batch"]), "--topic", f"batch-{tag}"
    )
    e2e = run_bench(
        checkout, address, "e2e", "--rate", "10000",
        "--records", str(counts["e2e"]), "--topic", f"e2e-{tag}",
    )  # fmt: skip
    runs = (record, batch, batch_all, iterated, columnar, e2e, e2e)
    return [float(run[field]) for run, (_row, field, _higher) in zip(runs, PATHS, strict=True)]


class CheckoutNode(LocalNode):
    """A node run by ``checkout``'s own venv and sources."""

    def __init__(self, checkout: Path, data_dir: Path) -> None:
        super().__init__(data_dir)
        self.checkout = checkout
        self.cwd = checkout  # its own sources, not the ones of the folder the script runs in

    def command(self) -> list[str]:
        return [str(self.checkout / ".venv" / "bin" / "python"), *super().command()[1:]]


def measure(
    trees: dict[str, Path], compare: str, round_: int, counts: dict[str, int]
) -> dict[str, list[float]]:
    """One round: every side's figures (see the module doc for the two ways)."""
    order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
    out: dict[str, list[float]] = {}
    shared: LocalNode | None = None
    root = Path(tempfile.mkdtemp(prefix="hwpaths-"))
    try:
        if compare == "client":
            shared = LocalNode(root / "data")
            start_node(shared)
        for name in order:
            node = shared or CheckoutNode(trees[name], root / f"data-{name}")
            if shared is None:
                start_node(node)
            try:
                client = trees[name] if compare == "client" else trees["new"]
                out[name] = one_client(client, node.address, f"{name}-{round_}", counts)
            finally:
                if shared is None:
                    node.stop()
            print(f"round {round_ + 1} {name}: {out[name]}", file=sys.stderr)
    finally:
        if shared is not None:
            shared.stop()
        shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another checkout, with its .venv")
    parser.add_argument("--compare", choices=("client", "node"), default="client")
    parser.add_argument("--record-records", type=int, default=1_500_000)
    parser.add_argument("--batch-records", type=int, default=3_000_000)
    parser.add_argument("--e2e-records", type=int, default=30_000)
    parser.add_argument("--json", type=Path, help="also write every figure here")
    options = parser.parse_args()
    counts = {
        "record": options.record_records,
        "batch": options.batch_records,
        "e2e": options.e2e_records,
    }
    trees = {"new": HERE} | ({"baseline": options.baseline.resolve()} if options.baseline else {})
    figures: dict[str, list[list[float]]] = {name: [] for name in trees}
    for round_ in range(options.rounds):
        for name, values in measure(trees, options.compare, round_, counts).items():
            figures[name].append(values)
    print(
        f"{datetime.date.today()}, {machine()}; {options.rounds} rounds, {counts}, "
        f"compare {options.compare}\n"
    )
    header = "| path | new |" + (" baseline | new / baseline (median) |" if len(trees) > 1 else "")
    print(header)
    print("|---|---|" + ("---|---|" if len(trees) > 1 else ""))
    for column, (row, _field, higher) in enumerate(PATHS):
        new = [round(rounds[column], 3) for rounds in figures["new"]]
        line = f"| {row} | {', '.join(map(str, new))} |"
        if "baseline" in figures:
            old = [round(rounds[column], 3) for rounds in figures["baseline"]]
            ratios = [
                (n / o if higher else o / n) if o and n else 0.0
                for n, o in zip(new, old, strict=True)
            ]
            line += (
                f" {', '.join(map(str, old))} | {', '.join(f'{r:.3f}' for r in ratios)}"
                f" (**{statistics.median(ratios):.3f}**) |"
            )
        print(line)
    if "baseline" in figures:
        print(
            "\nRatios are new / baseline for rates and baseline / new for latencies: above 1 is better."
        )
    if options.json:
        options.json.write_text(json.dumps({"counts": counts, "figures": figures}, indent=2))


if __name__ == "__main__":
    main()
