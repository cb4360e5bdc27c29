"""``headwater bench login-flood``: what a login flood costs legitimate users.

A 3-node cluster (users log in over plaintext on loopback) with a topic of one
partition and 3 replicas. Each round measures acks=all produce latency to the
partition's leader, quiet (``--sends`` records sent one at a time), then again while
another host (127.0.0.2) floods one of the partition's followers with logins: a
process of its own (``python -m headwater.tools.benchmarks.login_flood``) holding
``--connections`` HTTP/2 connections, each calling with a new wrong password for a
65,536-iteration user and giving the call up after ``--give-up-ms`` (grpc-timeout, then
RST_STREAM). Meanwhile a user logs in on that follower for the first time with a
password on the call (PLAIN), so that its check waits in the same queue as the flood's. The figures
are each round's acks=all p50 flooded over quiet, with their median, the first login's
time, and the calls the flood made.

The flood speaks HTTP/2 itself (the ``h2`` package, a development dependency): grpc's
clients cannot pick a source address or give up a call this cheaply.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import click
import h2.config
import h2.connection
import h2.events

from headwater.client import Admin, ClientSecurity, Producer
from headwater.tools.benchmarks.cluster import median_ratio
from headwater.tools.devcluster import LocalCluster, wait_until

EMPTY_MESSAGE: Final = b"\x00\x00\x00\x00\x00"
"""A gRPC frame holding an empty message (no compression, length 0)."""
ATTACKER_HOST: Final = "127.0.0.2"
VICTIM_ITERATIONS: Final = 65_536
DEADLINE_S: Final = 60.0


def h2_client_connection() -> h2.connection.H2Connection:
    return h2.connection.H2Connection(
        h2.config.H2Configuration(
            client_side=True,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
    )


def grpc_request_headers(
    address: str, path: str, extra: list[tuple[bytes, bytes]]
) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path.encode()),
        (b":authority", address.encode()),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
        *extra,
    ]


class GiveUpFlood(threading.Thread):
    """Calls ``path`` on one connection from ``source_host``, each with the headers
    ``headers_for(n)`` and a ``give_up_s`` deadline (grpc-timeout), and cancels
    (RST_STREAM) each call not answered by then: the cheapest way to make a node start
    work it then has no one to answer. Counts calls made and answered in ``made`` and
    ``answered``; ``stop()`` ends it."""

    def __init__(
        self,
        address: str,
        path: str,
        headers_for: Callable[[int], list[tuple[bytes, bytes]]],
        source_host: str,
        give_up_s: float = 0.01,
    ) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.path = path
        self.headers_for = headers_for
        self.source_host = source_host
        self.give_up_s = give_up_s
        self.made = 0
        self.answered = 0
        self.failure: BaseException | None = None
        self._stop_flag = threading.Event()

    def stop(self) -> None:
        self._stop_flag.set()
        self.join(10)

    def run(self) -> None:
        try:
            self._flood()
        except BaseException as error:  # reported to the test through ``failure``
            self.failure = error

    def _flood(self) -> None:
        host, port = self.address.rsplit(":", 1)
        connection = h2_client_connection()
        with socket.create_connection(
            (host, int(port)), timeout=5, source_address=(self.source_host, 0)
        ) as sock:
            connection.initiate_connection()
            sock.sendall(connection.data_to_send())
            timeout = f"{max(1, int(self.give_up_s * 1000))}m".encode()
            while not self._stop_flag.is_set():
                stream = connection.get_next_available_stream_id()
                headers = [(b"grpc-timeout", timeout), *self.headers_for(self.made)]
                connection.send_headers(
                    stream, grpc_request_headers(self.address, self.path, headers)
                )
                connection.send_data(stream, EMPTY_MESSAGE, end_stream=True)
                sock.sendall(connection.data_to_send())
                self.made += 1
                if self._answer_within(sock, connection, stream, time.monotonic() + self.give_up_s):
                    self.answered += 1
                else:
                    connection.reset_stream(stream)
                    sock.sendall(connection.data_to_send())

    @staticmethod
    def _answer_within(
        sock: socket.socket, connection: h2.connection.H2Connection, stream: int, deadline: float
    ) -> bool:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            sock.settimeout(left)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                return False
            if not data:
                raise ConnectionError("the node closed the flood's connection")
            ended = False
            for event in connection.receive_data(data):
                if isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                    ended = ended or event.stream_id == stream
            sock.sendall(connection.data_to_send())
            if ended:
                return True


def wrong_passwords(user: str) -> Callable[[int], list[tuple[bytes, bytes]]]:
    """Headers presenting ``user`` with a new wrong password for each call."""

    def headers(n: int) -> list[tuple[bytes, bytes]]:
        value = base64.b64encode(f"{user}:guess-{n}".encode())
        return [(b"authorization", b"Basic " + value)]

    return headers


def acks_all_p50_ms(producer: Producer, topic: str, sends: int) -> float:
    """The median time of ``sends`` acks=all records sent one at a time to partition 0."""
    took = []
    for n in range(sends):
        began = time.monotonic()
        producer.send(topic, f"v{n}".encode(), partition=0).result(timeout=DEADLINE_S)
        took.append(time.monotonic() - began)
    return statistics.median(took) * 1000


def start_flood(
    address: str, user: str, connections: int, give_up_ms: float
) -> subprocess.Popen[str]:
    """The flood in a process of its own (its work must not share the measuring
    process's interpreter lock), once it has begun; ``stop_flood`` ends it."""
    flood = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "headwater.tools.benchmarks.login_flood",
            address,
            "--user",
            user,
            "--connections",
            str(connections),
            "--give-up-ms",
            str(give_up_ms),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert flood.stdout is not None
    if flood.stdout.readline().strip() != "flooding":
        flood.kill()
        raise click.ClickException("the login flood did not start")
    return flood


def stop_flood(flood: subprocess.Popen[str]) -> int:
    """End the flood; the calls it made. A flood that failed raises ClickException."""
    report, _ = flood.communicate("", timeout=DEADLINE_S)
    made, _answered, *failures = report.split(maxsplit=2) or ["0", "0", "no report"]
    if failures:
        raise click.ClickException(f"the login flood failed: {failures[0]}")
    return int(made)


def flood_round(
    leader: str, follower: str, topic: str, sends: int, connections: int, give_up_ms: float
) -> dict[str, float]:
    """One round (see the module docstring); the newcomer logs in with a password this
    node has not verified yet (a new user per round)."""
    with Producer(leader, acks="all", linger_ms=0) as producer:
        acks_all_p50_ms(producer, topic, 50)  # connections and metadata
        quiet = acks_all_p50_ms(producer, topic, sends)
        newcomer, password = f"newcomer-{time.monotonic_ns()}", secrets.token_hex(16)
        with Admin(leader) as admin:
            admin.upsert_user(newcomer, password)
        with Admin(follower) as admin:
            wait_until(
                lambda: newcomer in [u.name for u in admin.list_users()],
                DEADLINE_S,
                "the new user on the flooded follower",
            )
        # PLAIN: its first call waits in the node's queue of password checks, with the
        # flood's (a SCRAM login runs no PBKDF2 on the node).
        security = ClientSecurity(
            "SASL_PLAINTEXT", username=newcomer, password=password, sasl_mechanism="PLAIN"
        )
        flood = start_flood(follower, "victim", connections, give_up_ms)
        try:
            began = time.monotonic()
            with Admin(follower, security=security) as admin:
                admin.list_topics()
            first_login_s = time.monotonic() - began
            flooded = acks_all_p50_ms(producer, topic, sends)
        finally:
            made = stop_flood(flood)
    return {
        "quiet_p50_ms": round(quiet, 2),
        "flooded_p50_ms": round(flooded, 2),
        "ratio": round(flooded / quiet, 3),
        "first_login_ms": round(first_login_s * 1000, 1),
        "flood_calls": made,
    }


def run(rounds: int, sends: int, connections: int, give_up_ms: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="headwater-bench-login-flood-") as root:
        cluster = LocalCluster(Path(root), 3, env={"HEADWATER_CREDENTIALS_OVER_PLAINTEXT": "allow"})
        cluster.start()
        try:
            bootstrap = cluster.bootstrap()
            with Admin(bootstrap) as admin:
                admin.upsert_user("victim", "victim-secret", iterations=VICTIM_ITERATIONS)
                admin.create_topic("login-flood", partitions=1, replication_factor=3)
                wait_until(
                    lambda: admin.describe_topics(["login-flood"])[0].partitions[0].leader >= 0,
                    DEADLINE_S,
                    "a leader for the benchmark's partition",
                )
                [described] = admin.describe_topics(["login-flood"])
                partition = described.partitions[0]
            leader = cluster.nodes[partition.leader].address
            follower_id = next(r for r in partition.replicas if r != partition.leader)
            follower = cluster.nodes[follower_id].address
            results = [
                flood_round(leader, follower, "login-flood", sends, connections, give_up_ms)
                for _ in range(rounds)
            ]
        finally:
            cluster.close()
    return {
        "rounds": results,
        "median_ratio": median_ratio([r["ratio"] for r in results]),
        "connections": connections,
        "give_up_ms": give_up_ms,
    }


@click.command("login-flood")
@click.option("--rounds", type=click.IntRange(1, 100), default=3, show_default=True)
@click.option("--sends", type=click.IntRange(10), default=300, show_default=True)
@click.option("--connections", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--give-up-ms", type=click.FloatRange(1, 10_000), default=10.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bench_login_flood(
    rounds: int, sends: int, connections: int, give_up_ms: float, as_json: bool
) -> None:
    """acks=all latency on a follower and a first login, quiet against a login flood."""
    result = run(rounds, sends, connections, give_up_ms)
    if as_json:
        print(json.dumps(result))
        return
    for n, r in enumerate(result["rounds"], 1):
        click.echo(
            f"round {n}: acks=all p50 {r['quiet_p50_ms']} ms quiet, {r['flooded_p50_ms']} ms "
            f"flooded ({r['ratio']}x, {r['flood_calls']} flood calls); first login "
            f"{r['first_login_ms']} ms"
        )
    click.echo(f"median flooded/quiet: {result['median_ratio']}")


def main() -> None:
    """A login flood in a process of its own (so that its work does not share the test
    process's interpreter lock): runs until its stdin closes, then prints the calls
    made and answered."""
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("--path", default="/headwater.v1.Admin/ListTopics")
    parser.add_argument("--user", required=True)
    parser.add_argument("--source-host", default="127.0.0.2")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--give-up-ms", type=float, default=10.0)
    args = parser.parse_args()
    # The attacker is another host: on one machine its own work must not take the cores
    # the nodes need, so it gets what they leave.
    os.nice(19)
    floods = [
        GiveUpFlood(
            args.address,
            args.path,
            wrong_passwords(args.user),
            args.source_host,
            args.give_up_ms / 1000,
        )
        for _ in range(args.connections)
    ]
    for flood in floods:
        flood.start()
    # Begun once every connection has had calls refused (or given up).
    wait_until(
        lambda: all(f.made >= 4 or f.failure is not None for f in floods),
        DEADLINE_S,
        "the flood's first calls",
    )
    print("flooding", flush=True)
    sys.stdin.read()
    for flood in floods:
        flood.stop()
    failures = [repr(f.failure) for f in floods if f.failure is not None]
    print(sum(f.made for f in floods), sum(f.answered for f in floods), *failures, flush=True)


if __name__ == "__main__":
    main()
