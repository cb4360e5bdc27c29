"""Local clusters of real ``headwater serve`` processes on loopback: the one harness that
``headwater dev-cluster``, the Spark demo, the benchmarks and the tests start nodes with.

A ``LocalNode`` is one child process: node ``node_id`` serves clients on ``address``,
Raft on ``raft_address`` and, when given, the inter-broker services on
``internal_address``; it keeps its data in ``data_dir`` and appends its output to
``log_path`` (kept across restarts). A ``LocalCluster`` is ``size`` such nodes (ids
1..size) sharing one quorum and one cluster secret. Ports come from ``headwater.tools.ports``
(below the ephemeral range, so that no outgoing connection takes one between the pick and
the bind), or from a fixed plan (``PortPlan``) where users must know them in advance.

Waiting is by condition with a deadline, never a fixed sleep: ``wait_until`` polls and
raises ``WaitTimeoutError`` naming what did not happen. Health is the client's
``node_serving`` (gRPC health checking); questions about the cluster go through
``headwater.client.Admin``, so this module imports no server code and no protobuf.

Thread-safety: one thread drives a cluster's processes.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final, TypeVar

from headwater.client import Admin, node_serving
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.tls import (
    CA_FILE_ENV,
    CERT_FILE_ENV,
    CLIENT_ID_ENV,
    KEY_FILE_ENV,
    PASSWORD_ENV,
    PROTOCOL_ENV,
    SERVER_NAME_ENV,
    TLS,
    USERNAME_ENV,
    ClientSecurity,
)
from headwater.tools.ports import free_port

if TYPE_CHECKING:  # only the types: creating certificates needs the server extra
    from headwater.tools.tls_certs import DevPki, TlsFiles

CLIENT_SECURITY_ENV: Final = frozenset(
    {
        PROTOCOL_ENV,
        CA_FILE_ENV,
        CERT_FILE_ENV,
        KEY_FILE_ENV,
        SERVER_NAME_ENV,
        USERNAME_ENV,
        PASSWORD_ENV,
        CLIENT_ID_ENV,
    }
)
"""A shell's client settings (TLS, credentials): not passed on to the nodes this harness
starts (a node reads the TLS ones as its own settings)."""

HEADWATER_CLI: Final = (sys.executable, "-m", "headwater.cli.main")
SECRET_ENV: Final = "HEADWATER_CLUSTER_SECRET"  # noqa: S105 (a variable name)
START_DEADLINE_S: Final = 60.0
STOP_DEADLINE_S: Final = 30.0
POLL_S: Final = 0.05
T = TypeVar("T")


class WaitTimeoutError(AssertionError):
    """A condition did not hold by its deadline (an AssertionError, so that a test that
    waits fails as a failed check)."""


class NodeExitedError(AssertionError):
    """A node's process ended while something waited on it."""


def wait_until(
    condition: Callable[[], T | None],
    deadline_s: float,
    what: str,
    interval_s: float = POLL_S,
) -> T:
    """Poll ``condition`` until it returns a truthy value (returned); exceptions other
    than NodeExitedError count as "not yet". Raises WaitTimeoutError naming ``what`` and the last
    exception at the deadline, NodeExitedError at once."""
    end = time.monotonic() + deadline_s
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
        except NodeExitedError:
            raise
        except Exception as exc:  # conditions may fail while the system settles
            last_error = exc
        else:
            if value:
                return value
        if time.monotonic() >= end:
            raise WaitTimeoutError(
                f"timed out after {deadline_s:g} s waiting for {what} (last error: {last_error})"
            )
        time.sleep(interval_s)


@dataclass(frozen=True, slots=True)
class PortPlan:
    """Fixed ports: node i serves clients on ``base_port + 2(i-1)`` and Raft on the port
    after it (``headwater dev-cluster --base-port``)."""

    base_port: int

    def ports(self, node_id: int) -> tuple[int, int]:
        client = self.base_port + 2 * (node_id - 1)
        return client, client + 1

    def check(self, size: int) -> None:
        if self.base_port < 1 or self.base_port + 2 * size > 65535:
            raise HeadwaterError(
                ErrorCode.INVALID_CONFIG,
                f"--base-port {self.base_port} leaves no room for {size} nodes (2 ports each)",
            )


class LocalNode:
    """One ``headwater serve`` child process (see the module docstring)."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        node_id: int = 1,
        quorum: str | None = None,
        *,
        internal_listener: bool = True,
        log_path: Path | None = None,
        host: str = "127.0.0.1",
        metrics_port: int | None = None,
        tls: TlsFiles | None = None,
        tls_client_auth: bool = False,
        kafka_port: int | None = None,
    ) -> None:
        """``kafka_port``: serve Kafka's protocol there (``--kafka-listen``; None: off).
        ``quorum`` defaults to this node alone on a free Raft port; ``env`` is added to
        this process's environment (less any client TLS settings in it: HEADWATER_TLS_*
        and HEADWATER_SECURITY_PROTOCOL are the node's own settings too); the log defaults
        to ``node-PORT.log`` beside ``data_dir``. ``tls``: both listeners speak TLS with
        these files (the certificate also serves as the client certificate of this
        harness's health checks), requiring client certificates with
        ``tls_client_auth``."""
        self.data_dir = data_dir
        self.node_id = node_id
        self.port = port or free_port()
        self.address = f"{host}:{self.port}"
        self.quorum = quorum or f"{node_id}@{host}:{free_port()}"
        self.internal_address = f"{host}:{free_port()}" if internal_listener else None
        """The inter-broker listener (Controller and Replica services); None: on the
        client listener, as a single node without ``--internal-listen`` has it."""
        self.kafka_address = f"{host}:{kafka_port}" if kafka_port else None
        """Where the node serves Kafka's wire protocol (``--kafka-listen``); None: off."""
        self.metrics_address = f"{host}:{metrics_port}" if metrics_port else None
        """Where the node serves Prometheus metrics (``--metrics-listen``); None: off."""
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})
        self.security = ClientSecurity()
        """How this harness talks to the node (its health checks)."""
        if tls is not None:
            self.env.update(
                {
                    CERT_FILE_ENV: str(tls.cert_file),
                    KEY_FILE_ENV: str(tls.key_file),
                    CA_FILE_ENV: str(tls.ca_file),
                    "HEADWATER_TLS_CLIENT_AUTH": "required" if tls_client_auth else "none",
                }
            )
            self.security = ClientSecurity(
                TLS, str(tls.ca_file), str(tls.cert_file), str(tls.key_file)
            )
        self.log_path = log_path or data_dir.parent / f"node-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.cwd: Path | None = None
        """The folder the process starts in (``python -m`` finds modules there first)."""

    @property
    def raft_address(self) -> str:
        """This node's Raft address, as the quorum names it."""
        for member in self.quorum.split(","):
            member_id, _, address = member.strip().partition("@")
            if member_id == str(self.node_id):
                return address
        raise HeadwaterError(
            ErrorCode.INVALID_CONFIG, f"node {self.node_id} is not in quorum {self.quorum}"
        )

    def command(self) -> list[str]:
        command = [
            *HEADWATER_CLI,
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--listen",
            self.address,
            "--node-id",
            str(self.node_id),
            "--quorum",
            self.quorum,
        ]
        if self.internal_address is not None:
            command += ["--internal-listen", self.internal_address]
        if self.metrics_address is not None:
            command += ["--metrics-listen", self.metrics_address]
        if self.kafka_address is not None:
            command += ["--kafka-listen", self.kafka_address]
        return [*command, *self.extra_args]

    def start(self, wait: bool = True, own_session: bool = False) -> None:
        """Start the process (appending to its log); with ``wait``, until it serves.
        ``own_session`` keeps a terminal's Ctrl-C from reaching it (the parent stops it)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log: IO[bytes] = open(self.log_path, "ab")  # noqa: SIM115 (the child keeps it)
        try:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env={
                    **{k: v for k, v in os.environ.items() if k not in CLIENT_SECURITY_ENV},
                    **self.env,
                },
                start_new_session=own_session,
                cwd=self.cwd,
            )
        finally:
            log.close()
        if wait:
            self.wait_serving()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def serving(self, timeout_s: float = 1.0) -> bool:
        """Whether the node answers its health check with SERVING. Raises NodeExitedError
        when its process has ended."""
        if self.process is not None and self.process.poll() is not None:
            raise NodeExitedError(
                f"node {self.node_id} at {self.address} exited with status "
                f"{self.process.returncode}; see {self.log_path}: {self.log()[-2000:]}"
            )
        return node_serving(self.address, timeout_s, self.security)

    def wait_serving(self, deadline_s: float = START_DEADLINE_S) -> float:
        """Block until the node serves; return the seconds waited."""
        began = time.monotonic()
        wait_until(self.serving, deadline_s, f"node {self.node_id} at {self.address} to serve")
        return time.monotonic() - began

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def rss_bytes(self) -> int:
        """The node process's resident memory now (Linux: /proc/PID/status, VmRSS)."""
        assert self.process is not None
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
        return int(kib) * 1024

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (SIGKILL by default) and wait for the process to end."""
        if self.running:
            assert self.process is not None
            self.process.send_signal(sig)
            self.process.wait(timeout=STOP_DEADLINE_S)

    def stop(self, deadline_s: float = STOP_DEADLINE_S) -> int:
        """SIGTERM (a controlled shutdown) and wait; SIGKILL at the deadline. Return the
        exit status."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=deadline_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)


def default_layout(root: Path, node_id: int) -> tuple[Path, Path]:
    """Node ``node_id``'s data folder and log file under ``root``."""
    return root / f"n{node_id}" / "data", root / f"n{node_id}.log"


class LocalCluster:
    """``size`` combined nodes (ids 1..size) sharing one quorum and a cluster secret."""

    def __init__(
        self,
        root: Path,
        size: int,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        *,
        secret: str | None = None,
        ports: PortPlan | None = None,
        internal_listener: bool = True,
        layout: Callable[[Path, int], tuple[Path, Path]] | None = None,
        metrics_base_port: int | None = None,
        tls: DevPki | None = None,
        tls_client_auth: bool = False,
        kafka_ports: Mapping[int, int] | None = None,
    ) -> None:
        """``kafka_ports``: node id -> the port it serves Kafka's protocol on (others:
        none). ``layout(root, i)`` gives node i's data folder and log file, by default
        ``root/n<i>/data`` and ``root/n<i>.log``; ``secret`` defaults to a random one
        (``env`` may set HEADWATER_CLUSTER_SECRET instead); with ``metrics_base_port``
        node i serves metrics on 127.0.0.1:(metrics_base_port + i). ``tls``: every node
        speaks TLS with its certificate from this PKI (``headwater.tools.tls_certs``), clients
        of ``admin`` and ``client_security`` present its client certificate."""
        if ports is not None:
            ports.check(size)
        planned = {
            i: ports.ports(i) if ports else (free_port(), free_port()) for i in range(1, size + 1)
        }
        self.quorum = ",".join(f"{i}@127.0.0.1:{raft}" for i, (_, raft) in planned.items())
        self.env = {SECRET_ENV: secret or secrets.token_hex(16), **(env or {})}
        self.root = root
        place = layout or default_layout
        self.nodes = {
            i: LocalNode(
                place(root, i)[0],
                port=client,
                extra_args=extra_args,
                env=self.env,
                node_id=i,
                quorum=self.quorum,
                internal_listener=internal_listener,
                log_path=place(root, i)[1],
                metrics_port=metrics_base_port + i if metrics_base_port else None,
                tls=tls.nodes[i] if tls is not None else None,
                tls_client_auth=tls_client_auth,
                kafka_port=(kafka_ports or {}).get(i),
            )
            for i, (client, _) in planned.items()
        }
        self.client_security = (
            ClientSecurity(
                TLS, str(tls.ca_file), str(tls.client.cert_file), str(tls.client.key_file)
            )
            if tls is not None
            else ClientSecurity()
        )
        """What a client of this cluster uses (TLS with the PKI's client certificate)."""
        self._admins: dict[int, Admin] = {}

    def start(
        self, node_ids: Sequence[int] | None = None, wait: bool = True, own_session: bool = False
    ) -> None:
        """Start the nodes (all by default); with ``wait``, until each serves. If one
        fails to, every node is killed."""
        chosen = [self.nodes[i] for i in (node_ids or self.nodes)]
        try:
            for node in chosen:
                node.start(wait=False, own_session=own_session)
            for node in chosen if wait else ():
                node.wait_serving()
        except BaseException:
            self.close()
            raise

    def wait_serving(
        self, deadline_s: float = START_DEADLINE_S, stopping: Callable[[], bool] = lambda: False
    ) -> None:
        """Wait until every node serves, or until ``stopping()`` (a Ctrl-C) is true."""
        wait_until(
            lambda: stopping() or all(n.serving() for n in self.nodes.values()),
            deadline_s,
            f"nodes {sorted(self.nodes)} to serve",
        )

    def alive(self) -> list[LocalNode]:
        return [n for n in self.nodes.values() if n.running]

    def bootstrap(self, nodes: Sequence[LocalNode] | None = None) -> str:
        """Client addresses of ``nodes`` (the live ones by default), comma-separated."""
        return ",".join(n.address for n in (nodes if nodes is not None else self.alive()))

    def admin(self, node_id: int) -> Admin:
        """An Admin client of node ``node_id`` alone (kept for the cluster's life)."""
        admin = self._admins.get(node_id)
        if admin is None:
            admin = self._admins[node_id] = Admin(
                self.nodes[node_id].address, request_timeout_s=5, security=self.client_security
            )
        return admin

    def wait_settled(self, deadline_s: float = 120.0) -> int:
        """Wait until every node serves, all see the same active controller and every
        broker is running; return the controller's id."""

        def settled() -> int | None:
            if not all(n.serving() for n in self.nodes.values()):
                return None
            views = [
                self.admin(i).node_metadata(n.address, include_digest=False)
                for i, n in self.nodes.items()
            ]
            controllers = {v.controller_id for v in views}
            states = {b.state for v in views for b in v.brokers}
            counts = {len(v.brokers) for v in views}
            if len(controllers) == 1 and -1 not in controllers and states == {"running"}:
                return views[0].controller_id if counts == {len(self.nodes)} else None
            return None

        return wait_until(settled, deadline_s, "every node running under one controller")

    def stop_all(self, deadline_s: float = STOP_DEADLINE_S) -> int:
        """SIGTERM every live node (controlled shutdown) and wait, SIGKILL at the deadline;
        return how many were stopped."""
        running = self.alive()
        for node in running:
            assert node.process is not None
            node.process.send_signal(signal.SIGTERM)
        end = time.monotonic() + deadline_s
        for node in running:
            assert node.process is not None
            try:
                node.process.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait()
        return len(running)

    def close(self) -> None:
        """SIGKILL every live node and close the Admin clients."""
        for node in self.nodes.values():
            node.kill()
        for admin in self._admins.values():
            admin.close()
        self._admins.clear()


# ------------------------------------------------------------------ dev-cluster's cluster

DEV_READY_DEADLINE_S: Final = 60.0


def dev_layout(root: Path, node_id: int) -> tuple[Path, Path]:
    """``dev-cluster``'s node folders: data in ``DIR/node-i``, log in ``DIR/node-i.log``."""
    return root / f"node-{node_id}", root / f"node-{node_id}.log"


def start_dev_cluster(
    nodes: int,
    base_port: int,
    data_dir: Path,
    stopping: Callable[[], bool],
    metrics_base_port: int = 0,
    tls: bool = False,
    secret: str | None = None,
    kafka_base_port: int = 0,
) -> LocalCluster:
    """Start ``nodes`` nodes on the fixed port plan and wait until each serves (or
    ``stopping()``); on failure every node is killed and HeadwaterError names the cause.
    ``tls``: mutual TLS with the PKI under ``data_dir/tls`` (``dev_pki``); ``secret``:
    the Raft secret (random by default); ``kafka_base_port``: node i serves Kafka's
    protocol on that port + i - 1 (0: no Kafka listener)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    pki = dev_pki(data_dir / "tls", nodes) if tls else None
    cluster = LocalCluster(
        data_dir,
        nodes,
        env={"HEADWATER_KAFKA_SECURITY_PROTOCOL": "SSL"} if tls and kafka_base_port else None,
        secret=secret,
        ports=PortPlan(base_port),
        internal_listener=False,
        layout=dev_layout,
        metrics_base_port=metrics_base_port or None,
        tls=pki,
        tls_client_auth=tls,
        kafka_ports={i: kafka_base_port + i - 1 for i in range(1, nodes + 1)}
        if kafka_base_port
        else None,
    )
    try:
        cluster.start(wait=False, own_session=True)  # Ctrl-C reaches this process only
        cluster.wait_serving(DEV_READY_DEADLINE_S, stopping)
    except (NodeExitedError, WaitTimeoutError) as error:
        cluster.close()
        raise HeadwaterError(ErrorCode.UNKNOWN_SERVER_ERROR, str(error)) from None
    except BaseException:  # a Ctrl-C while waiting: no node outlives this process
        cluster.close()
        raise
    return cluster


def dev_pki(folder: Path, nodes: int) -> DevPki:
    """The development PKI under ``folder``: kept from an earlier run when every file is
    there and the certificates are still valid for a day, so that exported client
    settings keep working across restarts; made anew otherwise."""
    from headwater.tools.tls_certs import create_dev_pki, load_dev_pki  # noqa: PLC0415 (server extra)

    node_ids = tuple(range(1, nodes + 1))
    kept = load_dev_pki(folder.resolve(), node_ids)
    return kept if kept is not None else create_dev_pki(folder.resolve(), node_ids)


def stop_dev_cluster(cluster: LocalCluster) -> int:
    """Stop every node with SIGTERM (controlled shutdown), SIGKILL after STOP_DEADLINE_S;
    the number of nodes stopped."""
    stopped = cluster.stop_all(STOP_DEADLINE_S)
    cluster.close()
    return stopped
