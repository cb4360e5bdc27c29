"""``headwater bench acls``: what authorization costs, with the authorizer on (and
``--acls`` ACLs stored) against off, in one run.

Each round starts two fresh single-node clusters in turn, the order alternating between
rounds; both speak mutual TLS (a throwaway CA from ``headwater.tools.tls_certs``), so that the
only difference is the authorizer:

- ``authorizer = acl``, with ``User:admin`` a super user, which stores ``--acls`` ACLs:
  ``--acls - 4`` literal topic ACLs for other principals and topics, and the four the
  benchmark's principal ``User:bench`` needs: create, write and read on its topics
  (prefixed ``bench-``; read implies describe) and write on the cluster (idempotent
  producer ids);
- ``authorizer = none``.

The workloads run as ``headwater bench`` processes presenting ``bench``'s certificate:

- ``batch``: ``bench produce --mode batch --partitions 4 --acks all``;
- ``record``: ``bench produce --mode record --acks 1`` (per-record send);
- ``consume``: ``bench consume`` of the ``batch`` topic, the median of three runs.

The figures are each workload's throughput ratio, authorizer on over off, pair by pair,
with the median of the pairs; and the authorizer's decision time, measured in this
process on an index of the same ACLs (``checks_us``).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import click

from headwater.client import Admin, ClientSecurity
from headwater.shared.acls import AclIndex, Operation, ResourceType, parse_acl
from headwater.shared.tls import CA_FILE_ENV, CERT_FILE_ENV, KEY_FILE_ENV, PROTOCOL_ENV, TLS
from headwater.tools.benchmarks.cluster import median_ratio, paired_ratios, throughput_workloads
from headwater.tools.devcluster import LocalCluster
from headwater.tools.tls_certs import DevPki, create_named_pki

THROUGHPUT: Final = ("batch", "record", "consume")
PRINCIPAL: Final = "User:bench"
TOPIC_PREFIX: Final = "bench-"


def _acls(count: int) -> list[Any]:
    needed = [
        parse_acl("topic", TOPIC_PREFIX, PRINCIPAL, "write", pattern_type="prefixed"),
        parse_acl("topic", TOPIC_PREFIX, PRINCIPAL, "read", pattern_type="prefixed"),
        parse_acl("topic", TOPIC_PREFIX, PRINCIPAL, "create", pattern_type="prefixed"),
        parse_acl("cluster", "headwater-cluster", PRINCIPAL, "write"),
    ]
    others = [
        parse_acl("topic", f"team-{i % 97}-topic-{i}", f"User:user-{i}", "read")
        for i in range(max(0, count - len(needed)))
    ]
    return others + needed


def _decision_us(acls: list[Any]) -> float:
    """Microseconds per decision of ``User:bench`` writing its topic, on these ACLs."""
    index = AclIndex(acls)
    checks = 200_000
    began = time.perf_counter()
    for _ in range(checks):
        index.allows(PRINCIPAL, "127.0.0.1", Operation.WRITE, ResourceType.TOPIC, "bench-batch")
    return round((time.perf_counter() - began) / checks * 1e6, 3)


def run(rounds: int, acl_count: int, records: int, record_records: int) -> dict[str, Any]:
    on: dict[str, list[float]] = {w: [] for w in THROUGHPUT}
    off: dict[str, list[float]] = {w: [] for w in THROUGHPUT}
    acls = _acls(acl_count)
    with tempfile.TemporaryDirectory(prefix="headwater-bench-acls-") as root:
        named = create_named_pki(Path(root) / "pki", ("node-1",), ("admin", "bench"))
        pki = DevPki(
            named.folder, named.ca_file, {1: named.nodes["node-1"]}, named.clients["admin"]
        )
        admin = named.clients["admin"]
        admin_security = ClientSecurity(
            TLS, str(named.ca_file), str(admin.cert_file), str(admin.key_file)
        )
        bench = named.clients["bench"]
        client_env = {
            PROTOCOL_ENV: "SSL",
            CA_FILE_ENV: str(named.ca_file),
            CERT_FILE_ENV: str(bench.cert_file),
            KEY_FILE_ENV: str(bench.key_file),
        }
        for round_no in range(rounds):
            order = (True, False) if round_no % 2 == 0 else (False, True)
            for authorizing in order:
                settings = (
                    {"HEADWATER_AUTHORIZER": "acl", "HEADWATER_SUPER_USERS": "User:admin"}
                    if authorizing
                    else {"HEADWATER_AUTHORIZER": "none"}
                )
                cluster = LocalCluster(
                    Path(root) / f"r{round_no}-{'acl' if authorizing else 'none'}",
                    1,
                    env=settings,
                    tls=pki,
                    tls_client_auth=True,
                )
                cluster.start()
                try:
                    if authorizing:
                        with Admin(cluster.bootstrap(), security=admin_security) as client:
                            client.create_acls(acls)
                            if len(client.describe_acls()) != len(acls):
                                raise click.ClickException("the ACLs were not all stored")
                    results = throughput_workloads(
                        cluster.bootstrap(),
                        f"{TOPIC_PREFIX}batch-{round_no}",
                        f"{TOPIC_PREFIX}record-{round_no}",
                        records,
                        record_records,
                        client_env,
                    )
                finally:
                    cluster.close()
                for workload in THROUGHPUT:
                    (on if authorizing else off)[workload].append(
                        float(results[workload]["records_per_s"])
                    )
    ratios = {w: paired_ratios(on[w], off[w]) for w in THROUGHPUT}
    return {
        "rounds": rounds,
        "acls": len(acls),
        "records_per_s_authorizer_on": on,
        "records_per_s_authorizer_off": off,
        "ratio_on_over_off": ratios,
        "median_ratio": {w: median_ratio(r) for w, r in ratios.items()},
        "decision_us": _decision_us(acls),
    }


@click.command("acls")
@click.option("--rounds", type=click.IntRange(1, 100), default=3, show_default=True)
@click.option(
    "--acls",
    "acl_count",
    type=click.IntRange(4, 100_000),
    default=1000,
    show_default=True,
    help="ACLs stored in the authorizing cluster.",
)
@click.option("--records", type=click.IntRange(1), default=2_000_000, show_default=True)
@click.option(
    "--record-records",
    type=click.IntRange(1),
    default=1_000_000,
    show_default=True,
    help="Records of the per-record workload.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bench_acls(
    rounds: int, acl_count: int, records: int, record_records: int, as_json: bool
) -> None:
    """Produce and consume with the authorizer on (and --acls ACLs) against off."""
    result = run(rounds, acl_count, records, record_records)
    if as_json:
        print(json.dumps(result))
        return
    for workload in THROUGHPUT:
        click.echo(
            f"{workload}: authorizer on {result['records_per_s_authorizer_on'][workload]} off "
            f"{result['records_per_s_authorizer_off'][workload]} records/s; ratios "
            f"{result['ratio_on_over_off'][workload]} (median {result['median_ratio'][workload]})"
        )
    click.echo(f"one decision with {result['acls']} ACLs: {result['decision_us']} us")
