"""The layer contract: which top-level folders may import which.

Folders map to packages (``pyproject.toml``): ``client/`` is ``headwater.client``,
``node/`` is ``headwater.node``, and so on; under ``headwater/``, ``shared/`` is what
clients and servers share, ``cli/`` the command line and ``tools/`` the tooling. The
rules (a name matches that module and everything under it):

- the client library (``client/``) imports no server code (``node``, with the server's
  settings, ``raft``), no Spark, no Raft library, no command-line module and no tooling:
  a user who wants a client needs neither pysyncobj nor pyspark;
- the metadata core (``raft/``) and the log (``log/``) import no node code and no client;
- the shared core (``SHARED_CORE``: errors, names, addresses, ACL, credential, quota and
  TLS rules, the partitioner, cancellation, log limits) imports only itself and the
  generated stubs;
- no runtime layer (client, node, raft, log) imports tooling (``TOOLING``: local
  clusters, ports, throwaway certificates, doc generators, chaos, benchmarks);
- the Spark connector imports no server code, no protobuf and no command-line module: it
  speaks the client API (its demo starts its cluster through the local-cluster harness);
- the benchmarks (``headwater/tools/benchmarks/``, ``scripts/bench_all.py``) and the
  local-cluster harness (``headwater/tools/devcluster.py``) import no server code and no
  protobuf either;
- the node imports no client, no Spark connector and no command-line module (what both
  need, the key partitioner and the reconnect options, is in the shared package);
- the broker core (``BROKER_CORE``: ``node/broker_core.py``, ``node/topic_admin.py``)
  imports no protobuf, no gRPC and neither front; the Kafka front's modules that stand on
  the core alone (``KAFKA_FRONT_ON_CORE``) import no protobuf and nothing of the gRPC
  front, and the gRPC servicers nothing of the Kafka front: each front translates to the
  core, never through the other;
- the client's own values (``client/admin_types.py``, what Admin answers, and
  ``client/producer_settings.py``) import no protobuf: messages are read in
  ``client/admin_messages.py`` and in the producer engines, at the gRPC edge.

And one rule on signatures rather than imports: no public method of the clients
(``Admin``, the producers and consumers of both engines, ``LogReader``) takes or returns
a protobuf message or enum (``protobuf_in_signatures`` reads the annotations).

``violations`` reads imports with ``ast`` (``if TYPE_CHECKING:`` blocks included: an
annotation import still ties the layers), so a new import that breaks a rule fails here.
"""

from __future__ import annotations

import ast
import inspect
import types
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER = ("headwater.node", "headwater.raft")
COMMANDS = ("headwater.cli",)
"""Entries match a module and its submodules."""
SHARED_CORE = (
    "headwater/shared/errors.py",
    "headwater/shared/grpc_errors.py",
    "headwater/shared/topics.py",
    "headwater/shared/addresses.py",
    "headwater/shared/acls.py",
    "headwater/shared/acl_messages.py",
    "headwater/shared/credentials.py",
    "headwater/shared/scram.py",
    "headwater/shared/quotas.py",
    "headwater/shared/tls.py",
    "headwater/shared/cancellation.py",
    "headwater/shared/partitioning.py",
    "headwater/shared/log_limits.py",
    "headwater/shared/runtime_tuning.py",
)
"""What clients and nodes both use: each imports only these (and the generated stubs)."""
TOOLING = ("headwater.tools",)
"""Local clusters, free ports, throwaway certificates, doc generators, fault runs and
benchmarks: no runtime layer imports them."""
PROTOBUF = ("headwater.v1", "grpc_health", "google.protobuf")
"""Generated stubs and messages: only the gRPC edges (client, node) touch them."""

GRPC_FRONT = (
    "grpc",
    "headwater.node.service",
    "headwater.node.admin_service",
    "headwater.node.groups.service",
    "headwater.node.forwarding",
)
"""The gRPC front: its servicers and forwarding, over the gRPC library."""
KAFKA_FRONT = ("headwater.node.kafka",)
BROKER_CORE = (
    "node/broker_core.py",
    "node/topic_admin.py",
    "node/groups/core.py",
    "node/groups/classic_groups.py",
    "node/groups/coordinator.py",
)
"""The broker's rules, written once for both fronts."""
KAFKA_FRONT_ON_CORE = ("node/kafka",)
"""The Kafka front, which stands on the broker core alone."""

RULES: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(BROKER_CORE, (*PROTOBUF, *GRPC_FRONT, *KAFKA_FRONT)),
    **dict.fromkeys(KAFKA_FRONT_ON_CORE, (*PROTOBUF, *GRPC_FRONT)),
    "node/service.py": KAFKA_FRONT,
    "node/admin_service.py": KAFKA_FRONT,
    "client": (*SERVER, "headwater.sparkconnector", *COMMANDS, *TOOLING, "pysyncobj", "pyspark"),
    "raft": ("headwater.node", "headwater.client", "headwater.sparkconnector", *COMMANDS, *TOOLING),
    "log": ("headwater.node", "headwater.raft", "headwater.client", *COMMANDS, *TOOLING),
    "sparkconnector": ("headwater.node", "headwater.raft", "pysyncobj", *PROTOBUF, *COMMANDS),
    "node": ("headwater.client", "headwater.sparkconnector", *COMMANDS, *TOOLING, "pyspark"),
    "headwater/tools/benchmarks": ("headwater.node", "headwater.raft", *PROTOBUF),
    "headwater/tools/devcluster.py": (*SERVER, "headwater.sparkconnector", *COMMANDS, *PROTOBUF),
    "scripts/bench_all.py": ("headwater.node", "headwater.raft", *PROTOBUF),
    "client/admin_types.py": PROTOBUF,
    "client/producer_settings.py": PROTOBUF,
    # The container health probe, started as a new process at every check: gRPC only.
    "headwater/healthcheck.py": (
        *SERVER,
        "headwater.client",
        "headwater.log",
        "headwater.sparkconnector",
        "headwater.v1",
        *COMMANDS,
        "click",
        "pyarrow",
    ),
}


def imported_modules(source: str) -> set[str]:
    """Every module a source file imports (``from a.b import c`` gives a.b and a.b.c)."""
    names: set[str] = set()
    for statement in ast.walk(ast.parse(source)):
        if isinstance(statement, ast.Import):
            names.update(alias.name for alias in statement.names)
        elif isinstance(statement, ast.ImportFrom) and statement.module:
            names.add(statement.module)
            names.update(f"{statement.module}.{alias.name}" for alias in statement.names)
    return names


def _forbidden(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(root: Path) -> list[str]:
    """One line per import that breaks a rule, under ``root`` laid out like the project."""
    found = []
    for folder, forbidden in RULES.items():
        place = root / folder
        for path in [place] if place.is_file() else sorted(place.rglob("*.py")):
            found.extend(
                f"{path.relative_to(root)} imports {module}"
                for module in sorted(imported_modules(path.read_text()))
                if _forbidden(module, forbidden)
            )
    core = tuple(name.removesuffix(".py").replace("/", ".") for name in SHARED_CORE)
    for name in SHARED_CORE:
        path = root / name
        if path.exists():
            found.extend(
                f"{name} imports {module}"
                for module in sorted(imported_modules(path.read_text()))
                if module.startswith("headwater")
                and not _forbidden(module, (*core, "headwater.v1"))
            )
    return found


def _is_protobuf(value: object) -> bool:
    """Whether ``value`` (what a name in an annotation stands for) is a protobuf module, a
    message or enum class, or a generic alias over one (``list[pb.TopicSummary]``)."""
    if isinstance(value, types.ModuleType):
        return _forbidden(value.__name__, (*PROTOBUF, "google"))
    args = typing.get_args(value)
    if args:
        return any(_is_protobuf(arg) for arg in args)
    module = getattr(value, "__module__", None) or type(value).__module__
    return _forbidden(module, (*PROTOBUF, "google"))


def protobuf_in_signatures(cls: type) -> list[str]:
    """One line per parameter or return annotation of a public method of ``cls`` that
    names protobuf: each name in the annotation (``pb`` of ``pb.OffsetSpec.ValueType``,
    which is plain ``int`` once evaluated) is looked up in the method's module."""
    found = []
    for name, method in inspect.getmembers(cls, inspect.isfunction):
        if name.startswith("_"):
            continue
        for argument, annotation in inspect.get_annotations(method).items():
            if isinstance(annotation, str):
                names = [
                    node.id
                    for node in ast.walk(ast.parse(annotation, mode="eval"))
                    if isinstance(node, ast.Name)
                ]
                values = [method.__globals__.get(n) for n in names]
            else:
                values = [annotation]
            if any(_is_protobuf(value) for value in values):
                found.append(f"{cls.__name__}.{name} {argument}: {annotation}")
    return found


def test_the_project_keeps_its_layers() -> None:
    assert violations(ROOT) == []


def test_a_deliberate_violation_is_caught(tmp_path: Path) -> None:
    (tmp_path / "client").mkdir()
    (tmp_path / "client" / "bad.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from headwater.shared.topics import check_partition\n"
        "from headwater.client_tools import fine\n"
        "if TYPE_CHECKING:\n"
        "    from headwater.node.partition import Partition\n"
    )
    (tmp_path / "client" / "commands.py").write_text("import headwater.cli.cluster\n")
    (tmp_path / "raft").mkdir()
    (tmp_path / "raft" / "worse.py").write_text("import headwater.node.topics\n")
    (tmp_path / "headwater" / "shared").mkdir(parents=True)
    (tmp_path / "headwater" / "shared" / "topics.py").write_text(
        "from headwater.log import batch\n"
    )
    (tmp_path / "sparkconnector").mkdir()
    (tmp_path / "sparkconnector" / "raw.py").write_text(
        "from headwater.v1 import headwater_pb2\nfrom headwater.cli.cluster import stop\n"
    )
    (tmp_path / "headwater" / "tools").mkdir()
    (tmp_path / "headwater" / "tools" / "devcluster.py").write_text(
        "import grpc_health.v1.health_pb2\nfrom headwater.node.config import NodeConfig\n"
    )
    (tmp_path / "headwater" / "shared" / "tls.py").write_text(
        "from headwater.client import Admin\n"
    )
    (tmp_path / "client" / "settings.py").write_text("from headwater.node.config import X\n")
    (tmp_path / "client" / "cli_like.py").write_text("import headwater.client_cli\n")
    (tmp_path / "node").mkdir()
    (tmp_path / "node" / "tooled.py").write_text("from headwater.tools.ports import free_port\n")
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "bench.py").write_text("import headwater.tools.benchmarks.perf\n")
    (tmp_path / "node" / "broker_core.py").write_text("from headwater.v1 import headwater_pb2\n")
    (tmp_path / "node" / "topic_admin.py").write_text("import grpc\n")
    (tmp_path / "node" / "kafka").mkdir()
    (tmp_path / "node" / "kafka" / "handlers.py").write_text(
        "from headwater.node.admin_service import AdminService\n"
    )
    (tmp_path / "node" / "service.py").write_text("from headwater.node.kafka import handlers\n")
    assert violations(tmp_path) == [
        "node/broker_core.py imports headwater.v1",
        "node/broker_core.py imports headwater.v1.headwater_pb2",
        "node/topic_admin.py imports grpc",
        "node/kafka/handlers.py imports headwater.node.admin_service",
        "node/kafka/handlers.py imports headwater.node.admin_service.AdminService",
        "node/service.py imports headwater.node.kafka",
        "node/service.py imports headwater.node.kafka.handlers",
        "client/bad.py imports headwater.node.partition",
        "client/bad.py imports headwater.node.partition.Partition",
        "client/commands.py imports headwater.cli.cluster",
        "client/settings.py imports headwater.node.config",
        "client/settings.py imports headwater.node.config.X",
        "raft/worse.py imports headwater.node.topics",
        "log/bench.py imports headwater.tools.benchmarks.perf",
        "sparkconnector/raw.py imports headwater.cli.cluster",
        "sparkconnector/raw.py imports headwater.cli.cluster.stop",
        "sparkconnector/raw.py imports headwater.v1",
        "sparkconnector/raw.py imports headwater.v1.headwater_pb2",
        "node/tooled.py imports headwater.tools.ports",
        "node/tooled.py imports headwater.tools.ports.free_port",
        "headwater/tools/devcluster.py imports grpc_health.v1.health_pb2",
        "headwater/tools/devcluster.py imports headwater.node.config",
        "headwater/tools/devcluster.py imports headwater.node.config.NodeConfig",
        "headwater/shared/topics.py imports headwater.log",
        "headwater/shared/topics.py imports headwater.log.batch",
        "headwater/shared/tls.py imports headwater.client",
        "headwater/shared/tls.py imports headwater.client.Admin",
    ]


def test_the_clients_take_and_return_their_own_types() -> None:
    from headwater.client import Admin, Consumer, LogReader, Producer
    from headwater.client.aio import AsyncConsumer, AsyncProducer

    for client in (Admin, Producer, Consumer, AsyncProducer, AsyncConsumer, LogReader):
        assert protobuf_in_signatures(client) == [], client.__name__


def test_a_protobuf_signature_is_caught() -> None:
    deliberate = types.ModuleType("deliberate")
    exec(
        "from __future__ import annotations\n"
        "from headwater.v1 import headwater_pb2 as pb\n"
        "from headwater.v1.headwater_pb2 import TopicSummary\n"
        "from google.protobuf.message import Message\n"
        "Listing = list[pb.GroupListing]\n"
        "class LeakyAdmin:\n"
        "    def topics(self) -> list[pb.TopicDescription]: ...\n"
        "    def summary(self) -> TopicSummary | None: ...\n"
        "    def offsets(self, spec: pb.OffsetSpec.ValueType) -> dict[int, int]: ...\n"
        "    def groups(self) -> Listing: ...\n"
        "    def raw(self, message: Message) -> None: ...\n"
        "    def fine(self, names: list[str]) -> dict[str, int]: ...\n"
        "    def _private(self) -> pb.MetadataResponse: ...\n",
        deliberate.__dict__,
    )
    assert protobuf_in_signatures(deliberate.LeakyAdmin) == [
        "LeakyAdmin.groups return: Listing",
        "LeakyAdmin.offsets spec: pb.OffsetSpec.ValueType",
        "LeakyAdmin.raw message: Message",
        "LeakyAdmin.summary return: TopicSummary | None",
        "LeakyAdmin.topics return: list[pb.TopicDescription]",
    ]


def test_every_test_module_has_one_kind() -> None:
    """``tests/kinds.py`` lists every test module once: unit, simulated or processes."""
    from tests import kinds

    modules = {path.stem for path in (ROOT / "tests").glob("test_*.py")}
    assert not kinds.UNIT & kinds.SIMULATED and not kinds.UNIT & kinds.PROCESSES
    assert not kinds.SIMULATED & kinds.PROCESSES
    assert set(kinds.KIND_OF_MODULE) == modules
