"""Produce and consume throughput through the docker-compose deployment against the same
3-node cluster run as local processes, in one run (BENCHMARKS.md).

    python scripts/bench_deploy.py [--rounds 3] [--records 3000000] [--network bridge|host]

Each round brings up the compose deployment (``make up``; the images must exist or are
built first), creates a topic of 4 partitions with replication factor 3 and
min_insync_replicas 2, runs ``headwater bench produce --mode batch --acks all`` and
``headwater bench consume`` against 127.0.0.1:7700,7702,7704, and takes it down with its
data (``make down VOLUMES=1``); then does the same with ``headwater dev-cluster``'s 3 local
processes on the same ports. The order alternates between rounds. It reports each
figure's compose/local ratio pair by pair, the median, and ``make up``'s seconds to
healthy. ``--network host`` runs the host-network deployment
(``make up NETWORK=host``, deploy/docker-compose.host.yml) instead of the default one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from headwater.client import Admin
from headwater.tools.benchmarks.cluster import paired_ratios, run_bench
from headwater.tools.devcluster import start_dev_cluster, stop_dev_cluster

ROOT = Path(__file__).resolve().parent.parent
BOOTSTRAP = "127.0.0.1:7700,127.0.0.1:7702,127.0.0.1:7704"


def workload(topic: str, records: int) -> dict[str, float]:
    with Admin(BOOTSTRAP) as admin:
        admin.create_topic(topic, 4, 3, {"min_insync_replicas": "2"})
    produced = run_bench(
        BOOTSTRAP,
        "produce",
        "--topic",
        topic,
        "--mode",
        "batch",
        "--acks",
        "all",
        "--records",
        str(records),
    )
    consumed = run_bench(BOOTSTRAP, "consume", "--topic", topic, "--records", str(records))
    return {
        "produce_records_per_s": float(produced["records_per_s"]),
        "consume_records_per_s": float(consumed["records_per_s"]),
    }


def on_compose(topic: str, records: int, network: str) -> dict[str, float]:
    began = time.monotonic()
    make = ["make", f"NETWORK={network}"]
    subprocess.run([*make, "up"], cwd=ROOT, check=True, capture_output=True)
    healthy_s = time.monotonic() - began
    try:
        return {**workload(topic, records), "make_up_s": round(healthy_s, 1)}
    finally:
        subprocess.run([*make, "down", "VOLUMES=1"], cwd=ROOT, check=True, capture_output=True)


def on_local(topic: str, records: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="headwater-bench-deploy-") as root:
        cluster = start_dev_cluster(3, 7700, Path(root), lambda: False)
        try:
            return workload(topic, records)
        finally:
            stop_dev_cluster(cluster)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=3_000_000)
    parser.add_argument("--network", choices=("bridge", "host"), default="bridge")
    args = parser.parse_args()
    compose: list[dict[str, float]] = []
    local: list[dict[str, float]] = []
    for round_no in range(args.rounds):
        order = ("compose", "local") if round_no % 2 == 0 else ("local", "compose")
        for where in order:
            topic = f"deploy-{round_no}-{where}"
            if where == "compose":
                compose.append(on_compose(topic, args.records, args.network))
            else:
                local.append(on_local(topic, args.records))
            print(where, (compose if where == "compose" else local)[-1], flush=True)
    result: dict[str, Any] = {
        "rounds": args.rounds,
        "records": args.records,
        "network": args.network,
    }
    for figure in ("produce_records_per_s", "consume_records_per_s"):
        ratios = paired_ratios([c[figure] for c in compose], [lo[figure] for lo in local])
        result[figure] = {
            "compose": [round(c[figure]) for c in compose],
            "local": [round(lo[figure]) for lo in local],
            "ratio": ratios,
            "median_ratio": statistics.median(ratios),
        }
    result["make_up_s"] = [c["make_up_s"] for c in compose]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
