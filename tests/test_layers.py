"""The layer contract: which top-level folders may import which.

Folders map to packages (``pyproject.toml``): ``client/`` is ``headwater.client``,
``node/`` is ``headwater.node``, and so on; under ``headwater/``, ``shared/`` is what
clients and servers share, ``cli/`` the command line and ``tools/`` the tooling. The
rules (a name matches that module and everything under it):

- the client library (``client/``) imports no server code (``node``, with the server's
  settings, ``raft``), no Spark, no Raft library, no command-line module and no tooling:
  a user who wants a client needs neither pysyncobj nor pyspark;
- the Raft quorum (``raft/``) and the log (``log/``) import no node code and no client,
  and the metadata model (``raft/metadata/``) nothing of the quorum;
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
- ``node/`` is in rooms: the broker core (``node/core/``, ``node/groups/``) imports no
  protobuf, no gRPC and neither front; the Kafka front (``node/kafka/``) no protobuf, no
  gRPC and nothing of the gRPC front (``node/rpc/``), which imports nothing of the Kafka
  front: each front translates to the core, never through the other; the rooms the core
  stands on (``replicas/``, ``cluster/``, ``security/``, ``ops/``) import neither the core
  nor a front (``ALLOWED`` lists the exceptions: gRPC's handler wrapping, Kafka's codec
  for the consumer protocol);
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
SERVER = ("headwater.node", "headwater.raft", "headwater.raft.metadata")
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
    "headwater/shared/grpc_channels.py",
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

GRPC_FRONT = ("headwater.node.rpc",)
"""The gRPC front: the servicers of ``headwater.v1``, forwarding, request decoding."""
GRPC_PLUMBING = ("headwater.node.rpc.call_hooks",)
"""What every gRPC servicer and interceptor wraps its handlers with (the internal
Replica and Sasl servicers, the authorizer's and the metrics' interceptors)."""
KAFKA_FRONT = ("headwater.node.kafka",)
KAFKA_CODEC = ("headwater.node.kafka.protocol", "headwater.node.kafka.request_shape")
"""Kafka's wire format, which the classic groups' consumer protocol is written in."""
PROTOCOL_FREE = (*PROTOBUF, "grpc", *GRPC_FRONT, *KAFKA_FRONT)
"""Forbidden to the broker core: protobuf, gRPC and both fronts."""
BELOW_THE_CORE = ("headwater.node.core", "headwater.node.groups.core", *GRPC_FRONT, *KAFKA_FRONT)
"""Forbidden to the rooms the core stands on: the core and both fronts."""

RULES: dict[str, tuple[str, ...]] = {
    # node/'s rooms: the broker core (core/, groups/) is protocol-free; each front
    # (kafka/, rpc/) stands on it and never on the other; the rooms the core stands on
    # (replicas/, cluster/, security/, ops/) import neither the core nor a front.
    "node/core": PROTOCOL_FREE,
    "node/groups": PROTOCOL_FREE,
    "node/transactions": PROTOCOL_FREE,
    "node/kafka": (*PROTOBUF, "grpc", *GRPC_FRONT),
    "node/rpc": KAFKA_FRONT,
    **dict.fromkeys(("node/replicas", "node/cluster", "node/security", "node/ops"), BELOW_THE_CORE),
    "client": (*SERVER, "headwater.sparkconnector", *COMMANDS, *TOOLING, "pysyncobj", "pyspark"),
    "raft": ("headwater.node", "headwater.client", "headwater.sparkconnector", *COMMANDS, *TOOLING),
    "raft/metadata": ("headwater.raft",),
    "log": (
        "headwater.node",
        "headwater.raft",
        "headwater.raft.metadata",
        "headwater.client",
        *COMMANDS,
        *TOOLING,
    ),
    "sparkconnector": (
        "headwater.node",
        "headwater.raft",
        "headwater.raft.metadata",
        "pysyncobj",
        *PROTOBUF,
        *COMMANDS,
    ),
    "node": ("headwater.client", "headwater.sparkconnector", *COMMANDS, *TOOLING, "pyspark"),
    "headwater/tools/benchmarks": (
        "headwater.node",
        "headwater.raft",
        "headwater.raft.metadata",
        *PROTOBUF,
    ),
    "headwater/tools/devcluster.py": (*SERVER, "headwater.sparkconnector", *COMMANDS, *PROTOBUF),
    "scripts/bench_all.py": (
        "headwater.node",
        "headwater.raft",
        "headwater.raft.metadata",
        *PROTOBUF,
    ),
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


ALLOWED: dict[str, tuple[str, ...]] = {
    "raft/metadata": ("headwater.raft.metadata",),
    "node/groups/consumer_protocol.py": KAFKA_CODEC,
    **dict.fromkeys(("node/replicas", "node/security", "node/ops"), GRPC_PLUMBING),
}
"""Exceptions to ``RULES``, by folder or file: modules these may import all the same."""


def _allowed(path: Path, root: Path, module: str) -> bool:
    """Whether ``module`` is an exception for ``path``: an allowed module, under one, or
    the package one is taken from (``from a import allowed`` names ``a`` too)."""
    relative = path.relative_to(root).as_posix()
    return any(
        (relative == place or relative.startswith(place + "/"))
        and (_forbidden(module, modules) or any(m.startswith(module + ".") for m in modules))
        for place, modules in ALLOWED.items()
    )


def violations(root: Path) -> list[str]:
    """One line per import that breaks a rule, under ``root`` laid out like the project."""
    found = []
    for folder, forbidden in RULES.items():
        place = root / folder
        for path in [place] if place.is_file() else sorted(place.rglob("*.py")):
            found.extend(
                f"{path.relative_to(root)} imports {module}"
                for module in sorted(imported_modules(path.read_text()))
                if _forbidden(module, forbidden) and not _allowed(path, root, module)
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
        "    from headwater.node.replicas.partition import Partition\n"
    )
    (tmp_path / "client" / "commands.py").write_text("import headwater.cli.cluster\n")
    (tmp_path / "raft").mkdir()
    (tmp_path / "raft" / "worse.py").write_text("import headwater.node.topics\n")
    (tmp_path / "raft" / "metadata").mkdir()
    (tmp_path / "raft" / "metadata" / "image.py").write_text(
        "from headwater.raft.metadata import records\nfrom headwater.raft import quorum\n"
    )
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
    for room in ("core", "groups", "kafka", "rpc", "replicas", "security"):
        (tmp_path / "node" / room).mkdir()
    (tmp_path / "node" / "core" / "broker_core.py").write_text(
        "from headwater.v1 import headwater_pb2\n"
    )
    (tmp_path / "node" / "core" / "topic_admin.py").write_text("import grpc\n")
    (tmp_path / "node" / "groups" / "core.py").write_text(
        "from headwater.node.kafka import answers\n"
    )
    (tmp_path / "node" / "groups" / "consumer_protocol.py").write_text(
        "from headwater.node.kafka import protocol\n"
    )
    (tmp_path / "node" / "kafka" / "handlers.py").write_text(
        "from headwater.node.rpc.admin_service import AdminService\n"
    )
    (tmp_path / "node" / "rpc" / "broker_service.py").write_text(
        "from headwater.node.kafka import handlers\n"
    )
    (tmp_path / "node" / "replicas" / "partition.py").write_text(
        "from headwater.node.core.broker_core import BrokerCore\n"
    )
    (tmp_path / "node" / "security" / "authorizer.py").write_text(
        "from headwater.node.rpc.call_hooks import around\n"
        "from headwater.node.rpc.broker_service import BrokerService\n"
    )
    assert violations(tmp_path) == [
        "node/core/broker_core.py imports headwater.v1",
        "node/core/broker_core.py imports headwater.v1.headwater_pb2",
        "node/core/topic_admin.py imports grpc",
        "node/groups/core.py imports headwater.node.kafka",
        "node/groups/core.py imports headwater.node.kafka.answers",
        "node/kafka/handlers.py imports headwater.node.rpc.admin_service",
        "node/kafka/handlers.py imports headwater.node.rpc.admin_service.AdminService",
        "node/rpc/broker_service.py imports headwater.node.kafka",
        "node/rpc/broker_service.py imports headwater.node.kafka.handlers",
        "node/replicas/partition.py imports headwater.node.core.broker_core",
        "node/replicas/partition.py imports headwater.node.core.broker_core.BrokerCore",
        "node/security/authorizer.py imports headwater.node.rpc.broker_service",
        "node/security/authorizer.py imports headwater.node.rpc.broker_service.BrokerService",
        "client/bad.py imports headwater.node.replicas.partition",
        "client/bad.py imports headwater.node.replicas.partition.Partition",
        "client/commands.py imports headwater.cli.cluster",
        "client/settings.py imports headwater.node.config",
        "client/settings.py imports headwater.node.config.X",
        "raft/worse.py imports headwater.node.topics",
        "raft/metadata/image.py imports headwater.raft.quorum",
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
