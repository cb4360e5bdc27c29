"""``headwater bench metrics``: what Prometheus metrics cost a node, with metrics on
against off in one run.

Each round starts two fresh single nodes in turn (data in a temporary folder), one with
``--metrics-listen`` and one without, the order alternating between rounds, and runs the
same workloads against each as separate ``headwater bench`` processes (as a user would
run them):

- ``batch``: ``bench produce --mode batch --partitions 4 --acks all`` (send_batch);
- ``record``: ``bench produce --mode record --acks 1`` (per-record send);
- ``small``: ``bench produce --mode record --acks 1 --linger-ms 0 --batch-bytes 4096``:
  many small produce requests, where a per-request cost shows most;
- ``consume``: ``bench consume`` of the ``batch`` topic (columnar, from the start).

While the node with metrics runs, a scraper reads its /metrics every
``--scrape-interval-s`` (as Prometheus would, more often than its 15 s default), and the
scrape times are reported. The figure is each workload's throughput ratio, metrics on
over off, pair by pair, and the median of the pairs.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Final

import click

from headwater.tools.benchmarks.cluster import (
    median_ratio,
    paired_ratios,
    produce_batch,
    produce_per_record,
    run_bench,
)
from headwater.tools.benchmarks.perf import percentile
from headwater.tools.devcluster import LocalNode
from headwater.tools.ports import free_port

WORKLOADS: Final = ("batch", "record", "small", "consume")


class Scraper:
    """GETs a node's /metrics every ``interval_s`` in a thread; keeps the times taken."""

    def __init__(self, address: str, interval_s: float) -> None:
        self.url = f"http://{address}/metrics"
        self.interval_s = interval_s
        self.times_ms: list[float] = []
        self.failures: list[str] = []
        self.last_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            began = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=10) as answer:  # noqa: S310
                    self.last_bytes = len(answer.read())
            except OSError as exc:  # reported with the figures; the scraping goes on
                self.failures.append(str(exc))
                continue
            self.times_ms.append((time.perf_counter() - began) * 1000)


def _workloads(bootstrap: str, round_no: int, records: int, record_records: int) -> dict[str, Any]:
    topic = f"batch-{round_no}"
    return {
        "batch": produce_batch(bootstrap, topic, records),
        "record": produce_per_record(bootstrap, f"record-{round_no}", record_records),
        "small": produce_per_record(
            bootstrap,
            f"small-{round_no}",
            record_records // 5,
            "--linger-ms",
            "0",
            "--batch-bytes",
            "4096",
        ),
        "consume": run_bench(bootstrap, "consume", "--topic", topic, "--records", str(records)),
    }


def run(rounds: int, records: int, record_records: int, scrape_interval_s: float) -> dict[str, Any]:
    on: dict[str, list[float]] = {w: [] for w in WORKLOADS}
    off: dict[str, list[float]] = {w: [] for w in WORKLOADS}
    scrapes_ms: list[float] = []
    scrape_failures: list[str] = []
    scrape_bytes = 0
    with tempfile.TemporaryDirectory(prefix="headwater-bench-metrics-") as root:
        for round_no in range(rounds):
            order = (True, False) if round_no % 2 == 0 else (False, True)
            for metered in order:
                node = LocalNode(
                    Path(root) / f"r{round_no}-{'on' if metered else 'off'}" / "data",
                    metrics_port=free_port() if metered else None,
                )
                node.start()
                try:
                    if node.metrics_address is not None:
                        with Scraper(node.metrics_address, scrape_interval_s) as scraper:
                            results = _workloads(node.address, round_no, records, record_records)
                        scrapes_ms += scraper.times_ms
                        scrape_failures += scraper.failures
                        scrape_bytes = max(scrape_bytes, scraper.last_bytes)
                    else:
                        results = _workloads(node.address, round_no, records, record_records)
                finally:
                    node.kill()
                for workload, result in results.items():
                    (on if metered else off)[workload].append(float(result["records_per_s"]))
    ratios = {w: paired_ratios(on[w], off[w]) for w in WORKLOADS}
    scrapes_ms.sort()
    return {
        "rounds": rounds,
        "records_per_s_metrics_on": on,
        "records_per_s_metrics_off": off,
        "ratio_on_over_off": ratios,
        "median_ratio": {w: median_ratio(r) for w, r in ratios.items()},
        "scrapes": len(scrapes_ms),
        "scrape_ms_p50": round(percentile(scrapes_ms, 0.5), 2) if scrapes_ms else None,
        "scrape_ms_max": round(scrapes_ms[-1], 2) if scrapes_ms else None,
        "scrape_bytes": scrape_bytes,
        "scrape_failures": scrape_failures,
    }


@click.command("metrics")
@click.option("--rounds", type=click.IntRange(1, 100), default=3, show_default=True)
@click.option(
    "--records",
    type=click.IntRange(1),
    default=3_000_000,
    show_default=True,
    help="Records of the send_batch and consume workloads.",
)
@click.option(
    "--record-records",
    type=click.IntRange(5),
    default=1_000_000,
    show_default=True,
    help="Records of the per-record workload (the small-request one sends a fifth).",
)
@click.option(
    "--scrape-interval-s", type=click.FloatRange(0.05, 60), default=1.0, show_default=True
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bench_metrics(
    rounds: int, records: int, record_records: int, scrape_interval_s: float, as_json: bool
) -> None:
    """Produce and consume throughput of a node with metrics on against off."""
    result = run(rounds, records, record_records, scrape_interval_s)
    if as_json:
        print(json.dumps(result))
        return
    for workload in WORKLOADS:
        click.echo(
            f"{workload}: on {result['records_per_s_metrics_on'][workload]} off "
            f"{result['records_per_s_metrics_off'][workload]} records/s; ratios "
            f"{result['ratio_on_over_off'][workload]} (median {result['median_ratio'][workload]})"
        )
    click.echo(
        f"{result['scrapes']} scrapes: p50 {result['scrape_ms_p50']} ms, max "
        f"{result['scrape_ms_max']} ms, {result['scrape_bytes']} bytes, "
        f"{len(result['scrape_failures'])} failed"
    )
