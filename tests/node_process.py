"""Real ``headwater serve`` child processes for tests: the project's one local-cluster
harness (headwater.tools.devcluster), under the names the tests use, and ``run_cli``."""

from __future__ import annotations

import os
import subprocess

from headwater.tools.devcluster import HEADWATER_CLI, wait_until
from headwater.tools.devcluster import LocalNode as NodeProcess

HEADWATER = list(HEADWATER_CLI)

__all__ = ["HEADWATER", "NodeProcess", "run_cli", "wait_until"]


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
