"""``headwater bench kafka-attacks``: what a stranger's traffic on the Kafka listener costs
the clients that logged in.

It starts its own node (``headwater.tools.devcluster``) with users and a Kafka listener
that asks for logins, and measures a logged-in librdkafka client (an AdminClient, user
``alice``, from 127.0.0.1) asking for Metadata every 50 ms: quiet, then while a stranger,
from other loopback addresses and in a process of its own, does one of:

- ``stalled-frames``: connects, announces a 256 MiB Produce frame and sends nothing more,
  again each time it is closed (before any login; on a PLAINTEXT listener, in the second
  figure, the stranger needs no login to send it);
- ``prelogin-flood``: 16 connections from one address sending ApiVersions before any
  login, as fast as they are answered, reconnecting when closed (also: how long a fresh
  login takes);
- ``silent-tls``: 10,000 TCP connections to a SASL_SSL listener that never send a byte
  (their TLS handshakes never begin), from ten addresses, held open (also: the node's
  resident memory before and with them, and how long a fresh login over TLS takes).

Each figure is the Metadata latency's median and maximum, and the ratio of the attacked
median to the quiet one, measured in the same run.
"""

from __future__ import annotations

import json
import multiprocessing
import socket
import statistics
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import click

from headwater.client import Admin, ClientSecurity
from headwater.tools.devcluster import LocalNode
from headwater.tools.ports import free_port
from headwater.tools.tls_certs import create_named_pki

Settings = dict[str, str | int | float | bool]
DEADLINE_S: Final = 60.0
MEASURE_S: Final = 10.0
STRANGERS: Final = tuple(f"127.0.0.{n}" for n in range(2, 12))
PRODUCE_API: Final = 0
API_VERSIONS: Final = 18
SILENT_SOCKETS: Final = 10_000
FLOOD_CONNECTIONS: Final = 16


def _connect(address: str, source: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5, source_address=(source, 0))


def _stall(address: str, seconds: float) -> None:
    """Announce a 256 MiB Produce and say nothing more; again when closed."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with _connect(address, STRANGERS[0]) as sock:
                sock.sendall(struct.pack(">ihhi", 256 << 20, PRODUCE_API, 3, 1))
                sock.settimeout(0.5)
                while time.monotonic() < end:
                    try:
                        if not sock.recv(1):
                            break
                    except TimeoutError:
                        continue
        except OSError:
            time.sleep(0.05)


def _flood(address: str, seconds: float) -> None:
    """FLOOD_CONNECTIONS threads sending ApiVersions v0 before any login."""
    frame = struct.pack(">ihhih", 10, API_VERSIONS, 0, 1, -1)
    end = time.monotonic() + seconds

    def one(source: str) -> None:
        while time.monotonic() < end:
            try:
                with _connect(address, source) as sock:
                    while time.monotonic() < end:
                        sock.sendall(frame)
                        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
                        sock.recv(size, socket.MSG_WAITALL)
            except (OSError, struct.error):
                time.sleep(0.01)

    threads = [
        threading.Thread(target=one, args=(STRANGERS[0],), daemon=True)
        for _ in range(FLOOD_CONNECTIONS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _silent(address: str, seconds: float) -> None:
    """SILENT_SOCKETS connections that never send a byte, held open."""
    held: list[socket.socket] = []
    for n in range(SILENT_SOCKETS):
        try:
            held.append(_connect(address, STRANGERS[n % len(STRANGERS)]))
        except OSError:
            continue
    time.sleep(seconds)
    for sock in held:
        sock.close()


def metadata_latencies_ms(client: Any, seconds: float) -> list[float]:
    """Metadata through a librdkafka ``client`` every 50 ms for ``seconds``: each call's
    milliseconds (a call that fails counts as 5,000)."""
    found = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.perf_counter()
        try:
            client.list_topics(timeout=5)
            found.append((time.perf_counter() - began) * 1000)
        except Exception:
            found.append(5000.0)
        time.sleep(0.05)
    return found


def _login_ms(settings: Settings) -> float:
    """How long a fresh client takes to log in and get Metadata."""
    from confluent_kafka.admin import AdminClient

    began = time.perf_counter()
    AdminClient(settings).list_topics(timeout=DEADLINE_S)
    return (time.perf_counter() - began) * 1000


def _figures(quiet: list[float], attacked: list[float]) -> dict[str, float]:
    return {
        "quiet_median_ms": round(statistics.median(quiet), 2),
        "attacked_median_ms": round(statistics.median(attacked), 2),
        "attacked_max_ms": round(max(attacked), 1),
        "median_ratio": round(statistics.median(attacked) / statistics.median(quiet), 3),
    }


def _measure(
    settings: Settings,
    attack: Callable[[str, float], None],
    kafka_address: str,
    node: LocalNode,
) -> dict[str, float]:
    from confluent_kafka.admin import AdminClient

    client = AdminClient(settings)
    client.list_topics(timeout=DEADLINE_S)
    quiet = metadata_latencies_ms(client, MEASURE_S)
    quiet_login = _login_ms(settings)
    rss_before = node.rss_bytes()
    stranger = multiprocessing.get_context("spawn").Process(
        target=attack, args=(kafka_address, MEASURE_S + 4), daemon=True
    )
    stranger.start()
    time.sleep(2)
    attacked = metadata_latencies_ms(client, MEASURE_S)
    attacked_login = _login_ms(settings)
    rss_during = node.rss_bytes()
    stranger.join(DEADLINE_S)
    return {
        **_figures(quiet, attacked),
        "quiet_login_ms": round(quiet_login, 1),
        "attacked_login_ms": round(attacked_login, 1),
        "rss_growth_mb": round((rss_during - rss_before) / 1e6, 1),
    }


def _node(root: Path, protocol: str, env: dict[str, str], **kwargs: Any) -> LocalNode:
    node = LocalNode(
        root / protocol.lower(),
        kafka_port=free_port(),
        env={"HEADWATER_KAFKA_SECURITY_PROTOCOL": protocol, **env},
        **kwargs,
    )
    node.start()
    return node


def _users(node: LocalNode, security: ClientSecurity | None = None) -> None:
    with Admin(node.address, security=security) as admin:
        admin.upsert_user("alice", "alice-secret")
        admin.create_topic("t", 1)


def run_attacks(root: Path, echo: Callable[[str], None]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    plain_env = {"HEADWATER_CREDENTIALS_OVER_PLAINTEXT": "allow"}
    login: Settings = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "alice",
        "sasl.password": "alice-secret",
    }
    for protocol, attacks in (
        ("SASL_PLAINTEXT", (("stalled-frames", _stall), ("prelogin-flood", _flood))),
        ("PLAINTEXT", (("stalled-frames", _stall),)),
    ):
        node = _node(root, protocol, plain_env)
        try:
            _users(node)
            assert node.kafka_address is not None
            settings: Settings = {"bootstrap.servers": node.kafka_address}
            if protocol == "SASL_PLAINTEXT":
                settings.update(login)
            for name, attack in attacks:
                key = f"{name} ({protocol})"
                echo(f"{key} ...")
                results[key] = _measure(settings, attack, node.kafka_address, node)
                echo(f"  {results[key]}")
        finally:
            node.stop()
    pki = create_named_pki(root / "pki", ("node-1",), ("admin",))
    node = _node(root, "SASL_SSL", {}, tls=pki.nodes["node-1"])
    try:
        admin = pki.clients["admin"]
        _users(
            node, ClientSecurity("SSL", str(pki.ca_file), str(admin.cert_file), str(admin.key_file))
        )
        assert node.kafka_address is not None
        tls_settings: Settings = {
            **login,
            "bootstrap.servers": node.kafka_address,
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(pki.ca_file),
            "ssl.endpoint.identification.algorithm": "none",
        }
        key = "silent-tls (SASL_SSL, 10,000 sockets)"
        echo(f"{key} ...")
        results[key] = _measure(tls_settings, _silent, node.kafka_address, node)
        echo(f"  {results[key]}")
    finally:
        node.stop()
    return results


@click.command("kafka-attacks")
@click.option("--json", "as_json", is_flag=True)
def bench_kafka_attacks(as_json: bool) -> None:
    """A logged-in Kafka client's latency while a stranger attacks the listener."""
    echo = (lambda _line: None) if as_json else click.echo
    with tempfile.TemporaryDirectory(prefix="hw-kafka-attacks-") as root:
        results = run_attacks(Path(root), echo)
    if as_json:
        click.echo(json.dumps(results, indent=2))
