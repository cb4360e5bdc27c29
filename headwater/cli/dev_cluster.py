"""``headwater dev-cluster``: N combined nodes (controller and broker) on loopback.

Each node is a child ``headwater serve`` process: node i (1-based) serves gRPC on
``base_port + 2(i-1)`` and Raft on the port after it, keeps its data in ``DIR/node-i``
and its log in ``DIR/node-i.log``. The nodes share a Raft secret: HEADWATER_CLUSTER_SECRET
when set, else the one kept in ``DIR/cluster-secret`` (mode 0600, made on first use), so
that a node can be restarted by hand with the command printed for it. With ``--restart``,
a node that exits is started again after RESTART_DELAY_S, unless it exited RESTART_LIMIT
times within RESTART_WINDOW_S. The nodes are ``headwater.tools.devcluster``'s, as the
tests' and the benchmarks' are. Ctrl-C (or SIGTERM) stops them all with SIGTERM
(controlled shutdown) and waits for them.
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import click

from headwater.cli.output import echo
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.tools.devcluster import (
    CLIENT_SECURITY_ENV,
    SECRET_ENV,
    LocalCluster,
    LocalNode,
    start_dev_cluster,
    stop_dev_cluster,
)

SECRET_FILE: Final = "cluster-secret"  # noqa: S105 (a file name)
SECRET_CHARS_MAX: Final = 1024
RESTART_DELAY_S: Final = 1.0
RESTART_LIMIT: Final = 5
RESTART_WINDOW_S: Final = 60.0


@click.command("dev-cluster")
@click.option("--nodes", type=click.IntRange(1, 9), default=3, show_default=True)
@click.option(
    "--base-port",
    type=click.IntRange(1024, 65000),
    default=7700,
    show_default=True,
    help="Node i serves gRPC on BASE + 2(i-1) and Raft on the port after.",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=Path("./data/dev-cluster"),
    show_default=True,
)
@click.option(
    "--metrics-base-port",
    type=click.IntRange(0, 65000),
    default=9100,
    show_default=True,
    help="Node i serves Prometheus metrics on 127.0.0.1:(BASE + i); 0 turns metrics off.",
)
@click.option(
    "--kafka-base-port",
    type=click.IntRange(0, 65000),
    default=9092,
    show_default=True,
    help="Node i serves Kafka's wire protocol on 127.0.0.1:(BASE + i - 1), with --tls over "
    "mutual TLS (security.protocol=SSL); 0 turns it off.",
)
@click.option(
    "--tls",
    is_flag=True,
    help="Mutual TLS on every listener, with a throwaway CA and certificates for the nodes "
    "and a client (admin) made under DATA_DIR/tls on first use; prints the client settings.",
)
@click.option(
    "--restart",
    is_flag=True,
    help="Start a node that exits again after 1 s (unless it exited 5 times within 60 s).",
)
def dev_cluster(
    nodes: int,
    base_port: int,
    data_dir: Path,
    metrics_base_port: int,
    kafka_base_port: int,
    tls: bool,
    restart: bool,
) -> None:
    """Run NODES combined nodes on loopback until Ctrl-C. The Raft secret is
    HEADWATER_CLUSTER_SECRET, else kept in DATA_DIR/cluster-secret; a command to restart
    each node by hand is printed."""
    run_dev_cluster(nodes, base_port, data_dir, metrics_base_port, tls, restart, kafka_base_port)


def dev_secret(data_dir: Path) -> tuple[str, Path | None]:
    """The cluster's Raft secret and the file holding it: HEADWATER_CLUSTER_SECRET when
    set (no file), else ``data_dir/cluster-secret`` from an earlier run, else a new random
    secret written there (mode 0600, created exclusively).

    A kept file is trusted only as ssh trusts a key: a regular file (not a symlink),
    owned by this user, that no one else may read or write; it holds 1 to
    SECRET_CHARS_MAX printable ASCII characters without spaces, and an optional newline
    (so that ``$(cat FILE)`` in a shell gives the same secret)."""
    given = os.environ.get(SECRET_ENV)
    if given:
        return given, None
    path = data_dir / SECRET_FILE
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _kept_secret(path), path
    secret = secrets.token_hex(16)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(secret + "\n")
    return secret, path


def _kept_secret(path: Path) -> str:
    def refuse(problem: str) -> HeadwaterError:
        return HeadwaterError(
            ErrorCode.INVALID_CONFIG,
            f"{path}: {problem}; it must be a file of yours, mode 0600, holding 1 to "
            f"{SECRET_CHARS_MAX} printable ASCII characters without spaces (delete it for a "
            "new secret)",
        )

    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:  # a symlink (ELOOP), or unreadable
        raise refuse(f"cannot be opened ({error.strerror})") from None
    with os.fdopen(descriptor, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise refuse("is not a regular file")
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise refuse(f"is owned by uid {info.st_uid} with mode {info.st_mode & 0o777:o}")
        raw = file.read(SECRET_CHARS_MAX + 2)
    text = raw[:-1] if raw.endswith(b"\n") else raw
    if not 1 <= len(text) <= SECRET_CHARS_MAX or not all(0x21 <= b <= 0x7E for b in text):
        raise refuse("does not hold a secret")
    return text.decode("ascii")


class RestartPolicy:
    """When ``dev-cluster --restart`` starts an exited node again: after ``delay_s``,
    unless the node exited ``limit`` times within ``window_s`` (a node that keeps dying,
    say on a bad data folder, is left down for its log to be read)."""

    def __init__(
        self,
        delay_s: float = RESTART_DELAY_S,
        limit: int = RESTART_LIMIT,
        window_s: float = RESTART_WINDOW_S,
    ) -> None:
        self.delay_s = delay_s
        self.limit = limit
        self.window_s = window_s
        self._exits: dict[int, list[float]] = {}

    def restart_at(self, node_id: int, now: float) -> float | None:
        """Record that node ``node_id`` exited at ``now``; when to start it again (None:
        it exited too often, leave it down)."""
        recent = [t for t in self._exits.get(node_id, []) if now - t < self.window_s]
        recent.append(now)
        self._exits[node_id] = recent
        return None if len(recent) >= self.limit else now + self.delay_s


def run_dev_cluster(
    nodes: int,
    base_port: int,
    data_dir: Path,
    metrics_base_port: int,
    tls: bool = False,
    restart: bool = False,
    kafka_base_port: int = 0,
) -> None:
    stopping = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    data_dir = data_dir.resolve()  # the printed commands work from any folder
    data_dir.mkdir(parents=True, exist_ok=True)
    secret, secret_file = dev_secret(data_dir)
    cluster = start_dev_cluster(
        nodes,
        base_port,
        data_dir,
        lambda: stopping,
        metrics_base_port,
        tls,
        secret,
        kafka_base_port,
    )
    try:
        for node in cluster.nodes.values():
            assert node.process is not None
            click.echo(
                f"node {node.node_id}: {node.address} (pid {node.process.pid}, raft "
                f"{node.raft_address}, kafka {node.kafka_address or 'off'}, metrics "
                f"{node.metrics_address or 'off'}, data "
                f"{node.data_dir}, log {node.log_path})"
            )
        if secret_file is not None:
            click.echo(f"cluster secret: in {secret_file}")
            if not restart:
                click.echo(
                    "a node restarted by hand is not stopped by Ctrl-C here: stop it yourself"
                )
                for node in cluster.nodes.values():
                    script = write_restart_script(node, secret_file)
                    click.echo(
                        f"restart node {node.node_id} by hand: sh {shlex.quote(str(script))}"
                    )
        else:
            click.echo(f"cluster secret: {SECRET_ENV} (from the environment)")
        click.echo(f"bootstrap: {cluster.bootstrap(list(cluster.nodes.values()))}")
        click.echo(f"export HEADWATER_BOOTSTRAP={cluster.bootstrap(list(cluster.nodes.values()))}")
        kafka = [n.kafka_address for n in cluster.nodes.values() if n.kafka_address]
        if kafka:
            click.echo(f"Kafka clients: bootstrap.servers={','.join(kafka)}")
        security = cluster.client_security
        if security.tls:
            click.echo("mutual TLS: clients present a certificate signed by the cluster's CA")
            click.echo("export HEADWATER_SECURITY_PROTOCOL=SSL")
            click.echo(f"export HEADWATER_TLS_CA_FILE={Path(security.ca_file).resolve()}")
            click.echo(f"export HEADWATER_TLS_CERT_FILE={Path(security.cert_file).resolve()}")
            click.echo(f"export HEADWATER_TLS_KEY_FILE={Path(security.key_file).resolve()}")
            if kafka:
                click.echo(
                    "Kafka clients: security.protocol=SSL, ssl.ca.location="
                    f"{Path(security.ca_file).resolve()}, ssl.certificate.location="
                    f"{Path(security.cert_file).resolve()}, ssl.key.location="
                    f"{Path(security.key_file).resolve()}"
                )
        click.echo(
            "Ctrl-C stops the cluster."
            + (" Nodes that exit are restarted (--restart)." if restart else "")
        )
        sys.stdout.flush()
        watch_nodes(cluster, lambda: stopping, RestartPolicy() if restart else None)
    finally:
        stop(cluster)


def restart_command(node: LocalNode, secret_file: Path) -> str:
    """A shell line that starts ``node`` as dev-cluster did: its command and settings,
    the secret read from ``secret_file``, a shell's client settings removed (a node would
    take HEADWATER_TLS_* as its own, and refuses HEADWATER_SECURITY_PROTOCOL), its output
    appended to its log."""
    words = ["env", *(f"-u {name}" for name in sorted(CLIENT_SECURITY_ENV))]
    words.append(f"{SECRET_ENV}=$(cat {shlex.quote(str(secret_file))})")
    words += [f"{k}={shlex.quote(v)}" for k, v in node.env.items() if k != SECRET_ENV]
    words.append(shlex.join(node.command()))
    words.append(f">> {shlex.quote(str(node.log_path))} 2>&1")
    return " ".join(words)


def write_restart_script(node: LocalNode, secret_file: Path) -> Path:
    """``restart_command`` in a shell script beside the node's data folder (the command is
    hundreds of characters: the secret's file, the client settings it clears, every
    flag); the script names the secret's file, never the secret."""
    script = node.data_dir.parent / f"{node.data_dir.name}.restart"
    script.write_text(f"#!/bin/sh\nexec {restart_command(node, secret_file)}\n")
    script.chmod(0o700)
    return script.resolve()


def watch_nodes(
    cluster: LocalCluster, stopping: Callable[[], bool], policy: RestartPolicy | None
) -> None:
    """Until ``stopping()``: report each node that exits and, with a ``policy``, start
    it again when the policy says."""
    reported: set[int] = set()
    due: dict[int, float] = {}
    while not stopping():
        now = time.monotonic()
        for node in cluster.nodes.values():
            node_id = node.node_id
            if node_id in due and now >= due[node_id]:
                del due[node_id]
                reported.discard(node_id)
                node.start(wait=False, own_session=True)
                assert node.process is not None
                click.echo(f"node {node_id} restarted (pid {node.process.pid})")
                continue
            code = node.process.poll() if node.process else None
            if code is None or node_id in reported:
                continue
            reported.add(node_id)
            message = f"node {node_id} exited with status {code}"
            when = policy.restart_at(node_id, now) if policy is not None else None
            if when is not None:
                due[node_id] = when
                message += f"; restarting it in {when - now:g} s"
            elif policy is not None:
                message += (
                    f"; it exited {policy.limit} times within {policy.window_s:g} s, so it "
                    f"stays down (log: {node.log_path})"
                )
            click.echo(message)
            sys.stdout.flush()
        time.sleep(0.2)


def stop(cluster: LocalCluster) -> None:
    """``stop_dev_cluster``, saying how many nodes it stopped."""
    stopped = stop_dev_cluster(cluster)
    if stopped:
        echo(f"stopped {stopped} node(s)")
