"""Install extras: ``pip install headwater`` is the client and the CLI;
``[server]`` adds what a node needs, ``[spark]`` adds pyspark. Checked two ways: the
declared dependencies, and a client program run with the server's and Spark's packages
made unimportable."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.node_process import NodeProcess

ROOT = Path(__file__).resolve().parent.parent
SERVER_ONLY = ("pysyncobj", "cryptography", "grpcio-reflection")
SPARK_ONLY = ("pyspark",)
BLOCKED = ("pysyncobj", "pyspark", "grpc_reflection", "cryptography")


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[=<>!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_base_install_leaves_out_the_server_and_spark() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = _names(project["dependencies"])
    extras = {k: _names(v) for k, v in project["optional-dependencies"].items()}
    assert not base & {*SERVER_ONLY, *SPARK_ONLY}, base
    assert set(SERVER_ONLY) <= extras["server"]
    assert set(SPARK_ONLY) <= extras["spark"]
    # Every pin is exact, and the extras share no package with different pins.
    pinned = [
        *project["dependencies"],
        *(r for v in project["optional-dependencies"].values() for r in v),
    ]
    assert all("==" in r or r.startswith("headwater[") for r in pinned), pinned


def _run_blocked(program: str) -> subprocess.CompletedProcess[str]:
    """Run ``program`` where importing any BLOCKED package fails, as without the extras."""
    prelude = (
        "import sys\n"
        f"for name in {BLOCKED!r}:\n"
        "    sys.modules[name] = None  # import raises ModuleNotFoundError\n"
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + program],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_client_program_runs_without_the_server_and_spark_packages(
    shared_node: NodeProcess,
) -> None:
    done = _run_blocked(
        "from headwater.client import Admin, Producer, Consumer, LogReader\n"
        "from headwater.client.aio import AsyncProducer, AsyncConsumer\n"
        "import headwater.cli.main\n"
        f"with Admin({shared_node.address!r}) as admin:\n"
        "    admin.create_topic('extras-check', 1, 1)\n"
        f"with Producer({shared_node.address!r}, acks='all') as producer:\n"
        "    print(producer.send('extras-check', b'v').result(10).offset)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


def test_commands_without_their_extra_name_it() -> None:
    done = _run_blocked("from headwater.cli.main import main\nmain(['serve'])\n")
    assert done.returncode != 0
    assert "needs the server extra: pip install 'headwater[server]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    spark = _run_blocked(
        "from headwater.cli.main import main\nmain(['bench', 'spark', '--help'])\n"
    )
    assert "pip install 'headwater[spark]'" in spark.stderr, spark.stderr
