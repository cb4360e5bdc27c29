"""``headwater dev-cluster``: the Raft secret it keeps and names, restarting a node by
hand with the command it prints, and ``--restart`` of nodes that die."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from headwater.cli.dev_cluster import SECRET_FILE, RestartPolicy, dev_secret
from headwater.client import Admin, node_serving
from headwater.shared.errors import HeadwaterError
from headwater.tools.devcluster import SECRET_ENV
from headwater.tools.ports import free_port_block
from tests.node_process import wait_until


class DevCluster:
    """A ``headwater dev-cluster`` process whose output lines are collected by a thread."""

    def __init__(self, data_dir: Path, nodes: int, *flags: str, cwd: Path | None = None) -> None:
        self.base = free_port_block(2 * nodes)
        env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "headwater.cli.main",
                "dev-cluster",
                "--nodes",
                str(nodes),
                "--base-port",
                str(self.base),
                "--data-dir",
                str(data_dir),
                "--metrics-base-port",
                "0",
                *flags,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.decode())

    def line(self, pattern: str, deadline_s: float = 90) -> re.Match[str]:
        """The first output line matching ``pattern``, waiting for it."""

        def found() -> re.Match[str] | None:
            return next((m for line in list(self.lines) if (m := re.search(pattern, line))), None)

        return wait_until(found, deadline_s, f"dev-cluster to print {pattern!r}: {self.lines}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=10)
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture
def started() -> Iterator[list[DevCluster]]:
    clusters: list[DevCluster] = []
    try:
        yield clusters
    finally:
        for cluster in clusters:
            cluster.stop()


def serves(address: str) -> bool:
    try:
        with Admin(address, request_timeout_s=2) as admin:
            admin.list_topics()
    except HeadwaterError:
        return False
    return True


def test_secret_is_kept_in_a_private_file_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    secret, path = dev_secret(tmp_path)
    assert path == tmp_path / SECRET_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == secret + "\n" and len(secret) == 32
    assert dev_secret(tmp_path) == (secret, path)  # the next run uses the same one
    monkeypatch.setenv(SECRET_ENV, "from-env")
    assert dev_secret(tmp_path) == ("from-env", None)
    monkeypatch.delenv(SECRET_ENV)
    for content, problem in (
        ("\n", "does not hold a secret"),
        (" padded \n", "does not hold a secret"),  # $(cat FILE) would keep the spaces
        ("a\nb\n", "does not hold a secret"),
    ):
        path.write_text(content)
        with pytest.raises(HeadwaterError, match=problem):
            dev_secret(tmp_path)
    path.write_text("kept\n")
    assert dev_secret(tmp_path) == ("kept", path)
    path.chmod(0o644)  # others may read it: not trusted
    with pytest.raises(HeadwaterError, match="with mode 644"):
        dev_secret(tmp_path)
    path.unlink()
    (tmp_path / "elsewhere").write_text("planted\n")
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(HeadwaterError, match="cannot be opened"):
        dev_secret(tmp_path)


def test_restart_policy_gives_up_on_a_node_that_keeps_dying() -> None:
    policy = RestartPolicy(delay_s=1.0, limit=3, window_s=60.0)
    assert policy.restart_at(1, 100.0) == 101.0
    assert policy.restart_at(1, 110.0) == 111.0
    assert policy.restart_at(2, 115.0) == 116.0  # other nodes count apart
    assert policy.restart_at(1, 120.0) is None  # the third exit within 60 s
    assert policy.restart_at(1, 200.0) == 201.0  # the earlier exits have aged out


@pytest.mark.slow
def test_a_killed_node_restarts_by_hand_with_the_printed_command(
    tmp_path: Path, started: list[DevCluster]
) -> None:
    """The secret was generated and never shown: restarting a killed node meant reading
    it from /proc."""
    cluster = DevCluster(Path("dev"), 3, cwd=tmp_path)  # a relative data folder
    started.append(cluster)
    cluster.line(r"^bootstrap: ")
    assert cluster.line(r"^cluster secret: in (\S+)").group(1) == str(
        (tmp_path / "dev" / SECRET_FILE).resolve()
    )
    pid = int(cluster.line(r"^node 2: \S+ \(pid (\d+),").group(1))
    command = cluster.line(r"^restart node 2 by hand: (.*)$").group(1)
    os.kill(pid, signal.SIGKILL)
    cluster.line(r"^node 2 exited with status -9$")
    log = tmp_path / "dev" / "node-2.log"
    logged = log.stat().st_size
    by_hand = subprocess.Popen(  # the printed command is a shell line
        command,
        shell=True,
        start_new_session=True,
        cwd="/",  # another folder than dev-cluster's
        # A shell that exported dev-cluster --tls's client settings: a node refuses
        # HEADWATER_SECURITY_PROTOCOL and takes HEADWATER_TLS_* as its own.
        env={
            **os.environ,
            "HEADWATER_SECURITY_PROTOCOL": "SSL",
            "HEADWATER_TLS_CA_FILE": str(tmp_path / "no-such-ca.pem"),
        },
    )
    try:
        node_2 = f"127.0.0.1:{cluster.base + 2}"
        wait_until(lambda: serves(node_2), 90, "node 2, restarted by hand, to serve")
        assert log.stat().st_size > logged  # its output goes to its log
        # Answering is not being registered: the controller places replicas only on
        # brokers it has unfenced since their restart, which health SERVING says.
        wait_until(lambda: node_serving(node_2), 90, "node 2 registered and unfenced again")
        with Admin(node_2) as admin:
            admin.create_topic("after-restart", 3, replication_factor=3)
            wait_until(
                lambda: all(
                    len(p.isr) == 3
                    for t in admin.metadata(["after-restart"]).topics
                    for p in t.partitions
                ),
                90,
                "the restarted node in every ISR (it is in the quorum: the secret is right)",
            )
    finally:
        os.killpg(by_hand.pid, signal.SIGKILL)
        by_hand.wait()


@pytest.mark.slow
def test_restart_starts_a_node_that_died(tmp_path: Path, started: list[DevCluster]) -> None:
    cluster = DevCluster(tmp_path / "dev", 1, "--restart")
    started.append(cluster)
    cluster.line(r"Nodes that exit are restarted")
    pid = int(cluster.line(r"^node 1: \S+ \(pid (\d+),").group(1))
    os.kill(pid, signal.SIGKILL)
    cluster.line(r"^node 1 exited with status -9; restarting it in 1 s$")
    restarted = int(cluster.line(r"^node 1 restarted \(pid (\d+)\)$").group(1))
    assert restarted != pid
    wait_until(lambda: serves(f"127.0.0.1:{cluster.base}"), 90, "node 1 to serve again")
    cluster.stop()
    assert cluster.process.returncode == 0
    with pytest.raises(ProcessLookupError):
        os.kill(restarted, 0)  # stopped with the cluster
