"""Every client RPC with edge values, and a mutation fuzzer of the client services.

``sweep_cases()`` gives, for every method of the Broker, Admin and Groups services (from
the protobuf descriptors, so a new method or field is swept without a change here), the
request with each field in turn set to an edge value: integers at 0, -1 and the type's
extremes, strings empty, 10,000 characters long, with a NUL, ``..`` and an internal
topic's name, bytes of 0xff, enums at an undefined number, repeated fields with 10,001
entries, and the empty request. ``fuzz_cases(rng, count)`` mutates encoded requests
(bit flips, truncations, garbage appended, random bytes). ``run_case`` calls a node with
one and returns what came back: the only outcomes allowed are an answer or a typed
status, never UNKNOWN or INTERNAL, nor the metadata overflow of an echoed input.

    python -m tests.rpc_sweep --cases 100000 --seed 7   # make fuzz runs a long one

starts a node of its own, runs the sweep and the fuzzer against it, and fails (exit 1)
on a disallowed status, an ERROR or a traceback in the node's log, a heartbeat gap (a
fenced broker) or a node that stopped serving.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc
from google.protobuf import descriptor
from google.protobuf.message import Message

from headwater.client import Admin, Producer
from headwater.tools.devcluster import LocalNode
from headwater.v1 import headwater_pb2 as pb

SERVICES: Final = ("Broker", "Admin", "Groups")
CALL_TIMEOUT_S: Final = 2.0
STREAM_READ_S: Final = 0.5
FORBIDDEN: Final = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL})
INT32: Final = (0, -1, (1 << 31) - 1, -(1 << 31))
INT64: Final = (0, -1, (1 << 63) - 1, -(1 << 63))
UINT: Final = (0, (1 << 32) - 1)
STRINGS: Final = ("", "x" * 10_000, "bad\x00name", "..", "__consumer_offsets", "\u00e9")
REPEATED_COUNT: Final = 10_001
F = descriptor.FieldDescriptor


@dataclass(frozen=True, slots=True)
class Method:
    path: str
    request: type[Message]
    client_streaming: bool
    server_streaming: bool


@dataclass(frozen=True, slots=True)
class Case:
    method: Method
    label: str
    payload: bytes


def methods() -> list[Method]:
    """Every method of the client services, from the descriptors."""
    found = []
    for name in SERVICES:
        service = pb.DESCRIPTOR.services_by_name[name]
        for method in service.methods:
            request = getattr(pb, method.input_type.name)
            found.append(
                Method(
                    f"/{service.full_name}/{method.name}",
                    request,
                    method.client_streaming,
                    method.server_streaming,
                )
            )
    return found


def _edge_values(field: descriptor.FieldDescriptor) -> tuple[Any, ...]:
    kind = field.type
    if kind in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        return INT32
    if kind in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
        return INT64
    if kind in (F.TYPE_UINT32, F.TYPE_FIXED32):
        return UINT
    if kind in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return (0, (1 << 64) - 1)
    if kind == F.TYPE_BOOL:
        return (True,)
    if kind in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        return (0.0, -1.0, float("inf"), float("nan"), 1e300)
    if kind == F.TYPE_STRING:
        return STRINGS
    if kind == F.TYPE_BYTES:
        return (b"", b"\xff" * 1000)
    if kind == F.TYPE_ENUM:
        return (99,)
    return ()


SWEEP_TOPIC: Final = "sweep"
SWEEP_GROUP: Final = "sweep-group"


def base_request(request: type[Message]) -> Message:
    """``request`` with the fields that name things naming what exists (the topic
    SWEEP_TOPIC, the group SWEEP_GROUP) and a record where records go: a variant then
    reaches the checks past "no such topic"."""
    message = request()
    fields = request.DESCRIPTOR.fields_by_name
    if "topic" in fields and fields["topic"].type == F.TYPE_STRING:
        message.topic = SWEEP_TOPIC  # type: ignore[attr-defined]
    for name in ("topics", "names"):
        if name in fields and fields[name].type == F.TYPE_STRING and fields[name].is_repeated:
            getattr(message, name).append(SWEEP_TOPIC)
    if "group_id" in fields:
        message.group_id = SWEEP_GROUP  # type: ignore[attr-defined]
    if "records" in fields and fields["records"].message_type is pb.RecordList.DESCRIPTOR:
        message.records.records.add(value=b"v")  # type: ignore[attr-defined]
    return message


def _variants(request: type[Message], depth: int = 1) -> Iterator[tuple[str, Message]]:
    """The empty request, the base one (``base_request``), then the base with each field
    in turn at its edge values; a message field also holds each of its own variants
    (``depth`` levels down)."""
    yield "empty", request()
    base = base_request(request)
    yield "base", base
    for field in request.DESCRIPTOR.fields:
        repeated = field.is_repeated
        if field.type == F.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                message = _copy(base)
                getattr(message, field.name)["x" * 300] = _map_value(field)
                yield f"{field.name}=map", message
                continue
            if repeated:
                many = _copy(base)
                for _ in range(1000):
                    getattr(many, field.name).add()
                yield f"{field.name}=[default]*1000", many
            nested = field.message_type._concrete_class
            for label, inner in _variants(nested, depth - 1) if depth > 0 else [("", nested())]:
                message = _copy(base)
                if repeated:
                    getattr(message, field.name).add().CopyFrom(inner)
                else:
                    getattr(message, field.name).CopyFrom(inner)
                yield f"{field.name}.{label or 'default'}", message
            continue
        for value in _edge_values(field):
            message = _copy(base)
            try:
                if repeated:
                    del getattr(message, field.name)[:]
                    getattr(message, field.name).extend([value] * (3 if value else REPEATED_COUNT))
                else:
                    setattr(message, field.name, value)
            except (ValueError, TypeError):
                continue  # a value the type cannot hold
            yield f"{field.name}={str(value)[:20]!r}", message


def _copy(message: Message) -> Message:
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def _map_value(field: descriptor.FieldDescriptor) -> Any:
    value_field = field.message_type.fields_by_name["value"]
    return "" if value_field.type == F.TYPE_STRING else 0


def sweep_cases() -> list[Case]:
    return [
        Case(method, label, message.SerializeToString())
        for method in methods()
        for label, message in _variants(method.request)
    ]


def fuzz_cases(rng: random.Random, count: int) -> Iterator[Case]:
    """``count`` mutated requests, each from a sweep case (seeded)."""
    seeds = sweep_cases()
    for _ in range(count):
        base = rng.choice(seeds)
        data = bytearray(base.payload[:4096])
        how = rng.randrange(5)
        if how == 0 and data:
            for _flip in range(rng.randint(1, 8)):
                i = rng.randrange(len(data))
                data[i] ^= 1 << rng.randrange(8)
        elif how == 1 and data:
            del data[rng.randrange(len(data)) :]
        elif how == 2:
            data += rng.randbytes(rng.randint(1, 64))
        elif how == 3:
            data = bytearray(rng.randbytes(rng.randint(0, 256)))
        else:
            tag = rng.randint(1, 30) << 3 | rng.choice((0, 1, 2, 5))
            data += bytes([tag]) + rng.randbytes(rng.randint(0, 16))
        yield Case(base.method, f"fuzz({base.label}, {how})", bytes(data))


def run_case(channel: grpc.Channel, case: Case) -> grpc.StatusCode:
    """Call the node with ``case``; the status it ended with (OK for an answer; a stream
    still answering after STREAM_READ_S counts as OK)."""
    serializers = {"request_serializer": _identity, "response_deserializer": _identity}
    method = case.method
    try:
        if not method.client_streaming and not method.server_streaming:
            channel.unary_unary(method.path, **serializers)(case.payload, timeout=CALL_TIMEOUT_S)
        elif not method.client_streaming:
            stream = channel.unary_stream(method.path, **serializers)(
                case.payload, timeout=STREAM_READ_S
            )
            for _ in stream:
                pass
        else:
            stream = channel.stream_stream(method.path, **serializers)(
                iter([case.payload]), timeout=STREAM_READ_S
            )
            for _ in stream:
                pass
    except grpc.RpcError as error:
        code: grpc.StatusCode = error.code()  # type: ignore[attr-defined]
        details = error.details() or ""  # type: ignore[attr-defined]
        if code is grpc.StatusCode.DEADLINE_EXCEEDED and method.server_streaming:
            return grpc.StatusCode.OK
        if "metadata size exceeds" in details:
            return grpc.StatusCode.INTERNAL  # an echoed input overflowed the status
        return code
    return grpc.StatusCode.OK


def _identity(data: bytes) -> bytes:
    return data


def prepare(address: str) -> None:
    """What the base requests name: SWEEP_TOPIC with a few records."""
    with Admin(address) as admin:
        admin.create_topic(SWEEP_TOPIC, partitions=1)
    with Producer(address, acks="1") as producer:
        for i in range(10):
            producer.send(SWEEP_TOPIC, b"%d" % i, partition=0)


def findings(node: LocalNode, outcomes: list[tuple[Case, grpc.StatusCode]]) -> list[str]:
    """What broke the rules: forbidden statuses, ERROR lines, tracebacks, fencing."""
    found = [
        f"{case.method.path} {case.label}: {code.name}"
        for case, code in outcomes
        if code in FORBIDDEN
    ]
    log = node.log()
    found += [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line]
    found += [line for line in log.splitlines() if "fenced broker" in line]
    if not node.serving():
        found.append("the node stopped serving")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="fuzz cases after the sweep")
    parser.add_argument("--seed", type=int, default=7)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hwsweep-") as root:
        node = LocalNode(Path(root) / "data", log_path=Path(root) / "node.log")
        node.start()
        try:
            outcomes: list[tuple[Case, grpc.StatusCode]] = []
            began = time.monotonic()
            prepare(node.address)
            with grpc.insecure_channel(node.address) as channel:
                cases = [*sweep_cases(), *fuzz_cases(random.Random(options.seed), options.cases)]
                for i, case in enumerate(cases, 1):
                    outcomes.append((case, run_case(channel, case)))
                    if i % 1000 == 0:
                        print(f"{i}/{len(cases)} cases", file=sys.stderr)
            found = findings(node, outcomes)
        finally:
            node.kill()
    print(f"{len(outcomes)} cases in {time.monotonic() - began:.0f} s, seed {options.seed}")
    for line in found[:50]:
        print(f"FINDING {line}")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
