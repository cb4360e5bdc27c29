"""Run ``headwater serve`` as a real child process and wait for it with deadlines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from headwater.ports import free_port

HEADWATER = [sys.executable, "-m", "headwater.cli"]
START_DEADLINE_S = 30.0


def wait_until(
    condition: Callable[[], Any], deadline_s: float, what: str, interval_s: float = 0.05
) -> Any:
    """Poll ``condition`` until it returns a truthy value; fail with ``what`` at the deadline."""
    end = time.monotonic() + deadline_s
    last_error: Exception | None = None
    while time.monotonic() < end:
        try:
            value = condition()
        except Exception as exc:  # conditions may fail while the system settles
            last_error = exc
        else:
            if value:
                return value
        time.sleep(interval_s)
    raise AssertionError(
        f"timed out after {deadline_s}s waiting for {what} (last error: {last_error})"
    )


class NodeProcess:
    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        node_id: int = 1,
        quorum: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.node_id = node_id
        # An explicit quorum, as a cluster's nodes have; single nodes could also omit it.
        self.quorum = quorum or f"{node_id}@127.0.0.1:{free_port()}"
        self.internal_address = f"127.0.0.1:{free_port()}"
        """The inter-broker listener (Controller and Replica services)."""
        self.extra_args = extra_args
        self.env = env or {}
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"node-{self.port}.log"

    def start(self, wait: bool = True) -> None:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                *HEADWATER,
                "serve",
                "--data-dir",
                str(self.data_dir),
                "--listen",
                self.address,
                "--node-id",
                str(self.node_id),
                "--quorum",
                self.quorum,
                "--internal-listen",
                self.internal_address,
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
        )
        log.close()
        if wait:
            self.wait_serving()

    def serving(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"node exited with {self.process.returncode}: {self.log()}")
        with grpc.insecure_channel(self.address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1
            )
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def wait_serving(self, deadline_s: float = START_DEADLINE_S) -> float:
        """Block until the node answers health checks; return seconds waited."""
        began = time.monotonic()
        wait_until(self.serving, deadline_s, f"node at {self.address} to serve")
        return time.monotonic() - began

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)

    def stop(self) -> int:
        """SIGTERM and wait for a clean exit; return the exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


def run_cli(
    *args: str,
    input_bytes: bytes | None = None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*HEADWATER, *args],
        input=input_bytes,
        capture_output=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
