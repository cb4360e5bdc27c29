"""The Kafka front's request handlers: each translates a decoded Kafka request into the
broker core's operations (``headwater.node.core.broker_core``; topic changes through the
Admin service's decisions) and builds the answer at the request's version
(``protocol.build`` leaves out the fields a version lacks).

A handler runs in two steps so that a connection keeps Kafka's order: ``handle`` does
everything whose order matters (appends, in the order requests arrived) and returns an
awaitable answer (acks=all produce waits for the in-sync replicas there), or None when
Kafka sends no answer (Produce with acks=0). The listener awaits answers in order.

Errors are answered per partition or per topic with Kafka's codes (Headwater's codes are
Kafka's; the few of its own map to the nearest Kafka code, ``kafka_code``). This node
answers only for partitions it leads: a request for another's gets
NOT_LEADER_OR_FOLLOWER, and the client asks Metadata where the leader is.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final

from headwater.log.api import ReadResult
from headwater.log.kafka_records import to_kafka_within
from headwater.node.config import KAFKA_TOPIC_CONFIG_NAMES, topic_setting_name
from headwater.node.core.broker_core import (
    Appended,
    BrokerCore,
    FetchedPartition,
    FoundOffset,
    KafkaBatch,
    OffsetSpec,
    Refusal,
)
from headwater.node.core.limits import shape_piece, stored_slices, yield_every
from headwater.node.core.topic_admin import ConfigChanges, TopicAdmin
from headwater.node.kafka import protocol
from headwater.node.kafka.answers import kafka_code, names_by_id, ready
from headwater.node.kafka.group_handlers import TRANSACTIONAL_ID_AUTHORIZATION_FAILED, GroupHandlers
from headwater.node.replicas.partition import Partition
from headwater.raft.metadata.decisions import NewTopic, TopicOutcome
from headwater.raft.metadata.image import MetadataImage
from headwater.shared.acls import CLUSTER_RESOURCE, Operation, ResourceType
from headwater.shared.errors import ErrorCode, HeadwaterError, shown
from headwater.shared.topics import INTERNAL_PREFIX

_log = logging.getLogger(__name__)

CLOSE_CONNECTION: Final = object()
"""A handler's answer that means: send nothing, close the connection."""
Answer = Awaitable[Any] | object | None
EARLIEST_TIMESTAMP: Final = -2
LATEST_TIMESTAMP: Final = -1
TOPIC_RESOURCE: Final = 2
BROKER_RESOURCE: Final = 4
DYNAMIC_TOPIC_CONFIG: Final = 1
DEFAULT_CONFIG: Final = 5
CONFIG_SET: Final = 0
CONFIG_DELETE: Final = 1
CONFIG_APPEND: Final = 2
CONFIG_SUBTRACT: Final = 3
UNKNOWN_TOPIC_ID: Final = 100
"""Kafka's error for a topic id no topic has (Metadata v10+)."""
FETCH_READS_PER_PARTITION_MAX: Final = 4
"""Reads of one partition for one Fetch answer: the first, and more while every batch
read fits in Kafka's bytes asked with room left (a stored batch is 59 bytes larger than
its Kafka batch, so a read of N stored bytes holds less than N of Kafka's). A read of
batches of one record (69 Kafka bytes or more) takes more than half of what is left."""
CLUSTER_OPERATIONS_UNKNOWN: Final = -(2**31)
"""Kafka's "authorized operations not asked for"."""


class KafkaHandlers:
    """Answers Kafka requests from one node's broker core."""

    def __init__(
        self,
        core: BrokerCore,
        *,
        kafka_address: Callable[[int], str],
        topics: TopicAdmin,
        controller_id: Callable[[], int],
        groups: GroupHandlers | None = None,
        sasl: bool = False,
    ) -> None:
        """``kafka_address(node_id)``: the Kafka HOST:PORT a broker registered ('' when it
        has none); ``controller_id``: the controller Metadata names (-1: none); ``sasl``:
        does the listener ask for logins (ApiVersions then lists the SASL APIs)?"""
        self.sasl = sasl
        self.core = core
        self.kafka_address = kafka_address
        self.topics = topics
        self.controller_id = controller_id
        self._by_key: dict[int, Callable[[protocol.Request], Awaitable[Answer]]] = {
            protocol.API_VERSIONS: self.api_versions,
            protocol.METADATA: self.metadata,
            protocol.PRODUCE: self.produce,
            protocol.FETCH: self.fetch,
            protocol.LIST_OFFSETS: self.list_offsets,
            protocol.INIT_PRODUCER_ID: self.init_producer_id,
            protocol.CREATE_TOPICS: self.create_topics_request,
            protocol.DELETE_TOPICS: self.delete_topics_request,
            protocol.CREATE_PARTITIONS: self.create_partitions_request,
            protocol.DESCRIBE_CONFIGS: self.describe_configs,
            protocol.ALTER_CONFIGS: self.alter_configs,
            protocol.INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
            protocol.DESCRIBE_CLUSTER: self.describe_cluster,
        }
        if groups is not None:
            self._by_key.update(groups.by_key())

    async def handle(self, request: protocol.Request) -> Answer:
        """Phase one of ``request`` (see the module doc), after the request-rate quota's
        delay (every request counts, as every gRPC call does)."""
        await self.core.throttle(requests=1)
        return await self._by_key[request.api_key](request)

    def _schema(self, request: protocol.Request) -> type[Any]:
        return protocol.response_schema(request.api_key, request.api_version)

    def _kafka_brokers(self, image: MetadataImage) -> list[tuple[int, str, int, str]]:
        """(node id, host, port, rack) of each registered broker with a Kafka address."""
        found = []
        for node_id, broker in sorted(image.brokers.items()):
            address = self.kafka_address(node_id)
            if address:
                host, _, port = address.rpartition(":")
                found.append((node_id, host, int(port), broker.rack))
        return found

    # ------------------------------------------------------------------ ApiVersions

    async def api_versions(self, request: protocol.Request) -> Answer:
        return ready(
            protocol.answer(
                self._schema(request),
                error_code=0,
                api_keys=protocol.supported_api_keys(self.sasl),
            )
        )

    # ------------------------------------------------------------------ Metadata

    async def metadata(self, request: protocol.Request) -> Answer:
        """Brokers and topics; a missing topic is created first when the node and the
        request allow it (``kafka_auto_create_topics``, ``allow_auto_topic_creation``,
        absent before v4 and then true, as in Kafka). Every topic asked is authorized
        before its existence is looked at; one asked by id that the caller may not
        describe is answered TOPIC_AUTHORIZATION_FAILED without its name, as Kafka does.
        The topics are looked at a slice at a time (``yield_every``)."""
        image = self.core.state.image
        every = request.body.topics is None
        asked = self._asked_topics(image, request.body.topics)
        async for topic in yield_every(asked):
            topic.allowed = topic.name is not None and self.core.may_describe(topic.name)
        if every:
            asked = [topic for topic in asked if topic.allowed]
        missing = [
            topic.name
            for topic in asked
            if topic.allowed
            and topic.name is not None
            and topic.topic_id is None
            and topic.name not in image.topics
        ]
        if (
            missing
            and self.core.config.kafka_auto_create_topics == "true"
            and getattr(request.body, "allow_auto_topic_creation", True)
            and self.core.state.current
        ):

            async def created_first() -> Any:
                refused = await self._auto_create(missing)
                return await self._metadata_answer(request, asked, refused)

            return asyncio.ensure_future(created_first())
        return asyncio.ensure_future(self._metadata_answer(request, asked, {}))

    async def _auto_create(self, names: list[str]) -> dict[str, int]:
        """Create ``names`` with the node's defaults: name -> Kafka's error code of each
        one that was not created (one that exists meanwhile was)."""
        try:
            created = await self.topics.create_topics([NewTopic(name) for name in names])
        except HeadwaterError as error:
            return dict.fromkeys(names, kafka_code(error.code))
        return {
            outcome.name: kafka_code(outcome.error.code)
            for outcome in created
            if outcome.error is not None
            and outcome.error.code is not ErrorCode.TOPIC_ALREADY_EXISTS
        }

    async def _metadata_answer(
        self, request: protocol.Request, asked: list[_AskedTopic], refused: dict[str, int]
    ) -> protocol.Unbuilt:
        """The Metadata answer for ``asked`` (authorized: ``_AskedTopic.allowed``) from
        the current image (``refused``: topics whose creation failed, with the code to
        answer), a slice of topics at a time by their partitions."""
        image = self.core.state.image
        brokers = [
            {"node_id": node_id, "host": host, "port": port, "rack": rack or None}
            for node_id, host, port, rack in self._kafka_brokers(image)
        ]
        live = set(image.live_broker_ids())
        topics: list[dict[str, Any]] = []
        async for asked_topic in yield_every(asked, weight=lambda t: _partition_count(image, t)):
            name = asked_topic.name
            if name is None:  # an id no topic has
                topics.append(
                    {"name": None, "topic_id": asked_topic.topic_id, "error_code": UNKNOWN_TOPIC_ID}
                )
                continue
            if not asked_topic.allowed:
                topics.append(
                    {
                        "name": None if asked_topic.topic_id is not None else name,
                        "topic_id": asked_topic.topic_id,
                        "error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    }
                )
                continue
            try:
                topic = self.core.topic(image, name)
            except HeadwaterError as error:
                code = refused.get(name) or kafka_code(error.code)
                topics.append({"name": name, "error_code": code})
                continue
            partitions = [
                {
                    "error_code": 0 if p.leader >= 0 else ErrorCode.LEADER_NOT_AVAILABLE,
                    "partition_index": p.partition,
                    "leader_id": p.leader,
                    "leader_epoch": p.leader_epoch,
                    "replica_nodes": list(p.replicas),
                    "isr_nodes": list(p.isr),
                    "offline_replicas": [r for r in p.replicas if r not in live],
                }
                for p in topic.partitions
            ]
            topics.append(
                {
                    "name": name,
                    "topic_id": uuid.UUID(hex=topic.topic_id),
                    "error_code": 0,
                    "is_internal": name.startswith(INTERNAL_PREFIX),
                    "partitions": partitions,
                }
            )
        return protocol.answer(
            self._schema(request),
            entries=len(topics) + sum(len(t.get("partitions", ())) for t in topics),
            brokers=brokers,
            cluster_id=image.cluster_id or None,
            controller_id=self.controller_id(),
            topics=topics,
        )

    def _asked_topics(self, image: MetadataImage, asked: Any) -> list[_AskedTopic]:
        """The topics a Metadata request names, in order, once each (``asked`` None:
        every topic but the internal ones): by name, or from v10 by id (an id no topic
        has keeps no name, answered UNKNOWN_TOPIC_ID). The walk of the request bounds
        them to ``topics_max``."""
        if asked is None:
            return [
                _AskedTopic(name, None)
                for name in sorted(n for n in image.topics if not n.startswith(INTERNAL_PREFIX))
            ]
        found: dict[str | uuid.UUID, _AskedTopic] = {}
        for topic in asked:
            if topic.name is not None:
                found.setdefault(topic.name, _AskedTopic(topic.name, None))
                continue
            topic_id = getattr(topic, "topic_id", None)
            if topic_id is not None:
                found.setdefault(topic_id, _AskedTopic(names_by_id(image).get(topic_id), topic_id))
        return list(found.values())

    # ------------------------------------------------------------------ Produce

    async def produce(self, request: protocol.Request) -> Answer:
        """Append every partition's batch in request order; answer once each is
        acknowledged at the request's level (acks 0: no answer at all)."""
        body = request.body
        acks = int(body.acks)
        timeout_ms = protocol.milliseconds(body.timeout)
        # A refusal is kept as its answer's fields, never as the exception: an exception
        # kept beside the frames of its traceback is a reference cycle, and 10,000 of
        # them a request are garbage only the cyclic collector frees, a full collection
        # of which held a node's loop for seconds.
        pending: list[tuple[str, int, Awaitable[Appended | Refusal] | Refusal]] = []
        if body.transactional_id is not None:
            failure = HeadwaterError(
                ErrorCode.INVALID_REQUEST,
                "transactions are not supported; produce without transactional.id",
            )
        elif acks not in (-1, 0, 1):
            failure = HeadwaterError(
                ErrorCode.INVALID_REQUIRED_ACKS, f"acks is {acks}; valid: -1 (all), 0, 1"
            )
        else:
            failure = None
        refused = None if failure is None else Refusal.of(failure)
        entries = [(t.name, data) for t in body.topic_data for data in t.partition_data]
        async for name, data in yield_every(entries, weight=_produce_weight):
            index = int(data.index)
            if refused is not None:
                pending.append((name, index, refused))
                continue
            try:
                partition = await self.core.led(self.core.state.image, Operation.WRITE, name, index)
                appended = await self.core.append(
                    partition, KafkaBatch(data.records), acks_all=acks == -1, timeout_ms=timeout_ms
                )
                pending.append((name, index, appended))
            except HeadwaterError as error:
                pending.append((name, index, Refusal.of(error)))
        if acks == 0:
            # Kafka's rule: no answer; a failure closes the connection, so that the
            # client asks Metadata again (a moved leader) instead of losing what follows.
            if any(isinstance(outcome, Refusal) for _, _, outcome in pending):
                return CLOSE_CONNECTION
            return None
        produced = sum(len(p.records or b"") for t in body.topic_data for p in t.partition_data)
        return self._produce_answer(request, pending, produced)

    async def _produce_answer(
        self,
        request: protocol.Request,
        pending: list[tuple[str, int, Awaitable[Appended | Refusal] | Refusal]],
        produced_bytes: int,
    ) -> Any:
        by_topic: dict[str, list[dict[str, Any]]] = {}
        async for name, index, outcome in yield_every(pending):
            answer: dict[str, Any] = {"index": index, "base_offset": -1, "log_append_time": -1}
            appended = outcome if isinstance(outcome, Refusal) else await outcome
            if isinstance(appended, Refusal):
                answer.update(_produce_refusal(appended))
            else:
                answer.update(
                    error_code=0,
                    base_offset=appended.base_offset,
                    log_start_offset=appended.log_start_offset,
                )
            by_topic.setdefault(name, []).append(answer)
        throttle_ms = await self.core.throttle(produced_bytes=produced_bytes)
        return protocol.answer(
            self._schema(request),
            entries=len(pending),
            throttle_time=throttle_ms,
            responses=[
                {"name": name, "partition_responses": answers} for name, answers in by_topic.items()
            ],
        )

    # ------------------------------------------------------------------ Fetch

    async def fetch(self, request: protocol.Request) -> Answer:
        """Read every partition asked, waiting up to max_wait for min_bytes in all; the
        answer holds at most max_bytes of records, and each partition at most its
        partition_max_bytes, except that the first batch of the first partition with
        records is sent whole whatever its size (KIP-74), so a consumer always makes
        progress."""
        return asyncio.ensure_future(self._fetch(request))

    async def _fetch(self, request: protocol.Request) -> Any:
        body = request.body
        config = self.core.config
        asked = self._fetch_plan(body)
        throttle_ms = await self.core.fetch(
            asked,
            self._kafka_records,
            max_bytes=min(max(int(body.max_bytes), 1), config.fetch_bytes_max),
            min_bytes=int(body.min_bytes),
            max_wait_s=min(max(protocol.milliseconds(body.max_wait), 0), config.fetch_wait_ms_max)
            / 1000,
        )
        answers: dict[str, list[dict[str, Any]]] = {}
        for fetched in asked:
            answers.setdefault(fetched.topic, []).append(
                {
                    "partition_index": fetched.index,
                    "error_code": 0
                    if fetched.refusal is None
                    else kafka_code(fetched.refusal.code),
                    "high_watermark": fetched.high_watermark,
                    "last_stable_offset": fetched.high_watermark,
                    "log_start_offset": fetched.log_start_offset,
                    "aborted_transactions": [],
                    "preferred_read_replica": -1,
                    "records": fetched.records or b"",
                }
            )
        return protocol.answer(
            self._schema(request),
            entries=len(asked),
            throttle_time=throttle_ms,
            error_code=0,
            session_id=0,
            responses=[
                {"topic": name, "partitions": partitions} for name, partitions in answers.items()
            ],
        )

    def _fetch_plan(self, body: Any) -> list[FetchedPartition[bytes]]:
        """Each partition asked, once (the first mention wins; the walk of the request
        bounds them to ``partitions_max``)."""
        plan: dict[tuple[str, int], FetchedPartition[bytes]] = {}
        for topic in body.topics:
            for asked in topic.partitions:
                key = (topic.topic, int(asked.partition))
                if key not in plan:
                    plan[key] = FetchedPartition(
                        *key, int(asked.fetch_offset), int(asked.partition_max_bytes)
                    )
        return list(plan.values())

    async def _kafka_records(
        self, partition: Partition, result: ReadResult, limit: int, whole_first: bool
    ) -> tuple[bytes, int, int]:
        """Kafka batches of ``partition`` from the read ``result`` on, within ``limit``
        bytes (the first whole when ``whole_first``): the bytes, their size and the
        offset after the last batch taken. A stored batch is larger than its Kafka batch
        by the stored header, so a read of ``limit`` stored bytes may hold less than
        ``limit`` in Kafka's bytes: while every batch read is taken, the read goes on from
        where it ended with what is left, ``FETCH_READS_PER_PARTITION_MAX`` reads at
        most. Each read is cut a piece at a time (``stored_slices``). An error on a read,
        or in a batch, once something is taken leaves the answer with what was taken
        before it (the next fetch meets the error)."""
        parts: list[bytes] = []
        left = limit
        offset = result.next_offset
        for _ in range(FETCH_READS_PER_PARTITION_MAX):
            complete = True
            async with contextlib.aclosing(
                stored_slices(result.data, records_of_kafka=False)
            ) as pieces:
                async for piece in pieces:
                    first = whole_first and left == limit
                    try:
                        taken = await shape_piece(
                            piece, functools.partial(to_kafka_within, piece.data, left, first)
                        )
                    except HeadwaterError:
                        if left == limit:
                            raise  # nothing taken: the partition's answer is the error
                        complete = False  # what was taken stands; the error meets the next
                        break
                    parts.append(taken.data)
                    left -= len(taken.data)
                    if taken.next_offset is not None:
                        offset = taken.next_offset
                    if not taken.complete or left <= 0:
                        complete = False
                        break
            if not complete:
                break
            try:
                result = self.core.read(partition, result.next_offset, left)
            except HeadwaterError:  # what was read stands; the error meets the next fetch
                break
            if not result.data:
                break
        records = b"".join(parts)
        return records, len(records), offset

    # ------------------------------------------------------------------ ListOffsets

    async def list_offsets(self, request: protocol.Request) -> Answer:
        """Each partition's offset for the time asked, a slice of partitions at a time."""
        topics = []
        async for topic in yield_every(request.body.topics, weight=lambda t: len(t.partitions)):
            partitions = []
            for asked in topic.partitions:
                answer: dict[str, Any] = {"partition_index": int(asked.partition_index)}
                try:
                    partition = await self.core.led(
                        self.core.state.image,
                        Operation.DESCRIBE,
                        topic.name,
                        int(asked.partition_index),
                    )
                    timestamp = int(asked.timestamp)
                    if timestamp == EARLIEST_TIMESTAMP:
                        found = self.core.offset_of(partition, OffsetSpec.EARLIEST)
                    elif timestamp == LATEST_TIMESTAMP:
                        found = self.core.offset_of(partition, OffsetSpec.LATEST)
                    elif timestamp >= 0:
                        found = self.core.offset_of(partition, OffsetSpec.TIMESTAMP, timestamp)
                        if found.timestamp_ms < 0:  # no record at or after it: Kafka's -1, -1
                            found = FoundOffset(-1, -1)
                    else:
                        raise HeadwaterError(
                            ErrorCode.INVALID_REQUEST,
                            f"timestamp {timestamp}; valid: -2 (earliest), -1 (latest) or >= 0",
                        )
                    answer.update(
                        error_code=0,
                        offset=found.offset,
                        timestamp=found.timestamp_ms,
                        leader_epoch=partition.leader_epoch,
                    )
                except HeadwaterError as error:
                    answer.update(error_code=kafka_code(error.code), offset=-1, timestamp=-1)
                partitions.append(answer)
            topics.append({"name": topic.name, "partitions": partitions})
        entries = sum(len(t["partitions"]) for t in topics)
        return ready(protocol.answer(self._schema(request), entries=entries, topics=topics))

    # ------------------------------------------------------------------ producer ids

    async def init_producer_id(self, request: protocol.Request) -> Answer:
        if request.body.transactional_id is not None:  # not retriable, as FindCoordinator's
            answer = {
                "error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "producer_id": -1,
                "producer_epoch": -1,
            }
            return ready(protocol.answer(self._schema(request), **answer))
        try:
            producer_id, epoch = await self.core.init_producer_id()
            answer = {"error_code": 0, "producer_id": producer_id, "producer_epoch": epoch}
        except HeadwaterError as error:
            answer = {"error_code": kafka_code(error.code), "producer_id": -1, "producer_epoch": -1}
        return ready(protocol.answer(self._schema(request), **answer))

    # ------------------------------------------------------------------ topics

    async def create_topics_request(self, request: protocol.Request) -> Answer:
        """All the topics in one request to the controller, as over gRPC (its limits and
        rules: a name given twice is refused for both). Config names are Kafka's
        (``retention.ms``) or the node's (``topic_setting_name``)."""
        body = request.body
        answers: dict[int, dict[str, Any]] = {}
        wanted: list[tuple[int, NewTopic]] = []
        async for position, topic in yield_every(enumerate(body.topics)):
            if topic.assignments:
                answers[position] = _refused(
                    topic.name,
                    HeadwaterError(
                        ErrorCode.INVALID_REQUEST,
                        "manual replica assignments are not supported; give partitions "
                        "and a replication factor",
                    ),
                )
                continue
            partitions = int(topic.num_partitions)
            replication_factor = int(topic.replication_factor)
            spec = NewTopic(
                name=topic.name,
                partitions=None if partitions == -1 else partitions,
                replication_factor=None if replication_factor == -1 else replication_factor,
                configs={c.name: c.value for c in topic.configs if c.value is not None},
            )
            wanted.append((position, spec))
        if wanted:
            try:
                created = await self.topics.create_topics(
                    [spec for _, spec in wanted], bool(getattr(body, "validate_only", False))
                )
                outcomes = list(zip(wanted, created, strict=True))
                async for (position, _), outcome in yield_every(outcomes):
                    answers[position] = _result(outcome)
            except HeadwaterError as error:
                answers.update((position, _refused(spec.name, error)) for position, spec in wanted)
        results = [answers[position] for position in range(len(body.topics))]
        return ready(protocol.answer(self._schema(request), entries=len(results), topics=results))

    async def delete_topics_request(self, request: protocol.Request) -> Answer:
        """All the topics in one request to the controller, as over gRPC."""
        names = list(request.body.topic_names)
        try:
            deleted = await self.topics.delete_topics(names)
            by_name = {}
            async for outcome in yield_every(deleted):
                by_name[outcome.name] = _result(outcome)
            results = [by_name[name] for name in names]
        except HeadwaterError as error:
            results = [_refused(name, error) for name in names]
        return ready(
            protocol.answer(self._schema(request), entries=len(results), responses=results)
        )

    async def create_partitions_request(self, request: protocol.Request) -> Answer:
        """Grow topics to ``count`` partitions, placed by the controller (manual
        assignments and validate_only are refused)."""
        body = request.body
        results = []
        async for topic in yield_every(body.topics):
            answer: dict[str, Any] = {"name": topic.name}
            try:
                # Authorized before the request's form is looked at, as the other APIs.
                self.core.authorize(Operation.ALTER, topic.name)
                if topic.assignments:
                    raise HeadwaterError(
                        ErrorCode.INVALID_REQUEST,
                        "manual replica assignments are not supported; give the count",
                    )
                if body.validate_only:
                    raise HeadwaterError(
                        ErrorCode.INVALID_REQUEST, "validate_only is not supported here"
                    )
                await self.topics.create_partitions(topic.name, int(topic.count))
                answer["error_code"] = 0
            except HeadwaterError as error:
                answer.update(error_code=kafka_code(error.code), error_message=error.message)
            results.append(answer)
        return ready(protocol.answer(self._schema(request), entries=len(results), results=results))

    async def describe_configs(self, request: protocol.Request) -> Answer:
        """A topic's configs by Kafka's names (``retention.ms`` for ``retention_ms``):
        its overrides (source DYNAMIC_TOPIC_CONFIG) and the node's defaults for the rest
        (DEFAULT_CONFIG). A broker's: none (the node's settings are not Kafka's)."""
        image = self.core.state.image
        defaults = self.core.config.topic_defaults()
        results = []
        per_resource = 1 + len(defaults)
        async for resource in yield_every(request.body.resources, weight=lambda _: per_resource):
            result: dict[str, Any] = {
                "resource_type": int(resource.resource_type),
                "resource_name": resource.resource_name,
                "error_code": 0,
                "configs": [],
            }
            try:
                self._authorize_resource(resource, Operation.DESCRIBE)
                if int(resource.resource_type) == TOPIC_RESOURCE:
                    topic = self.core.topic(image, resource.resource_name)
                    keys = resource.configuration_keys
                    wanted = None if keys is None else {_setting_or_none(k) for k in keys}
                    result["configs"] = [
                        {
                            "name": KAFKA_TOPIC_CONFIG_NAMES[name],
                            "value": topic.configs.get(name, value),
                            "read_only": False,
                            "config_source": (
                                DYNAMIC_TOPIC_CONFIG if name in topic.configs else DEFAULT_CONFIG
                            ),
                            "is_default": name not in topic.configs,
                            "is_sensitive": False,
                        }
                        for name, value in sorted(defaults.items())
                        if wanted is None or name in wanted
                    ]
            except HeadwaterError as error:
                result.update(error_code=kafka_code(error.code), error_message=error.message)
            results.append(result)
        entries = sum(1 + len(result["configs"]) for result in results)
        return ready(protocol.answer(self._schema(request), entries=entries, results=results))

    async def alter_configs(self, request: protocol.Request) -> Answer:
        """AlterConfigs: each topic's overrides become exactly the ones given (the others
        are removed), as in Kafka. Broker configs are refused (the node's settings are
        not Kafka's and change only in its config file)."""
        results = []
        async for resource in yield_every(request.body.resources):
            changes = [(c.name, c.value) for c in resource.configs]
            results.append(
                await self._alter_resource(resource, changes, True, request.body.validate_only)
            )
        return ready(
            protocol.answer(self._schema(request), entries=len(results), responses=results)
        )

    async def incremental_alter_configs(self, request: protocol.Request) -> Answer:
        """IncrementalAlterConfigs: SET and DELETE any topic config; APPEND and SUBTRACT
        the list config ``cleanup.policy`` (its current value and the given items, as a
        set in Kafka's order)."""
        image = self.core.state.image
        results = []
        async for resource in yield_every(request.body.resources):
            try:
                self._authorize_resource(resource, Operation.ALTER)
                changes = [
                    self._incremental_change(image, resource.resource_name, c)
                    for c in resource.configs
                ]
            except HeadwaterError as error:
                results.append(_resource_refused(resource, error))
                continue
            results.append(
                await self._alter_resource(resource, changes, False, request.body.validate_only)
            )
        return ready(
            protocol.answer(self._schema(request), entries=len(results), responses=results)
        )

    def _incremental_change(
        self, image: MetadataImage, topic_name: str, config: Any
    ) -> tuple[str, str | None]:
        """A config change of IncrementalAlterConfigs as (name, value or None: removed)."""
        operation = int(config.config_operation)
        if operation == CONFIG_SET:
            if config.value is None:
                raise HeadwaterError(
                    ErrorCode.INVALID_CONFIG, f"SET of {shown(config.name)} without a value"
                )
            return config.name, config.value
        if operation == CONFIG_DELETE:
            return config.name, None
        if operation not in (CONFIG_APPEND, CONFIG_SUBTRACT):
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST,
                f"config operation {operation}; valid: 0 (set), 1 (delete), 2 (append), "
                "3 (subtract)",
            )
        setting = topic_setting_name(config.name)
        if setting != "cleanup_policy":
            raise HeadwaterError(
                ErrorCode.INVALID_CONFIG,
                f"{shown(config.name)} is not a list config; APPEND and SUBTRACT apply to "
                "cleanup.policy only",
            )
        topic = self.core.topic(image, topic_name)
        current = topic.configs.get(setting, self.core.config.cleanup_policy).split(",")
        given = [item.strip() for item in (config.value or "").split(",") if item.strip()]
        if operation == CONFIG_APPEND:
            items = set(current) | set(given)
        else:
            items = set(current) - set(given)
        if not items:
            raise HeadwaterError(
                ErrorCode.INVALID_CONFIG, "cleanup.policy cannot be empty; keep delete or compact"
            )
        return setting, ",".join(p for p in ("compact", "delete") if p in items)

    async def _alter_resource(
        self, resource: Any, changes: ConfigChanges, replace: bool, validate: bool
    ) -> dict[str, Any]:
        try:
            self._authorize_resource(resource, Operation.ALTER)
            if int(resource.resource_type) == BROKER_RESOURCE:
                raise HeadwaterError(
                    ErrorCode.INVALID_REQUEST,
                    "broker configs cannot be changed over Kafka's protocol; they are the "
                    "node's settings (its config file, HEADWATER_* variables or flags)",
                )
            await self.topics.alter_topic_configs(
                resource.resource_name, changes, replace, bool(validate)
            )
        except HeadwaterError as error:
            return _resource_refused(resource, error)
        return {
            "error_code": 0,
            "resource_type": int(resource.resource_type),
            "resource_name": resource.resource_name,
        }

    def _authorize_resource(self, resource: Any, operation: Operation) -> None:
        """The caller may do ``operation`` on a config resource, checked before anything
        is looked up (a topic's existence or its configs): a topic's needs it on the
        topic, a broker's on the cluster. INVALID_REQUEST for another resource type."""
        kind = int(resource.resource_type)
        if kind == TOPIC_RESOURCE:
            self.core.auth.require(operation, ResourceType.TOPIC, resource.resource_name)
        elif kind == BROKER_RESOURCE:
            self.core.auth.require(operation, ResourceType.CLUSTER, CLUSTER_RESOURCE)
        else:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST, f"resource type {kind}; valid: 2 (topic), 4 (broker)"
            )

    async def describe_cluster(self, request: protocol.Request) -> Answer:
        image = self.core.state.image
        brokers = [
            {"broker_id": node_id, "host": host, "port": port, "rack": rack or None}
            for node_id, host, port, rack in self._kafka_brokers(image)
        ]
        return ready(
            protocol.answer(
                self._schema(request),
                error_code=0,
                cluster_id=image.cluster_id,
                controller_id=self.controller_id(),
                brokers=brokers,
                cluster_authorized_operations=CLUSTER_OPERATIONS_UNKNOWN,
            )
        )


@dataclasses.dataclass(slots=True)
class _AskedTopic:
    """A topic a Metadata request names: by name (``topic_id`` None) or by id (``name``
    None when no topic has it), and whether the caller may describe it."""

    name: str | None
    topic_id: uuid.UUID | None
    allowed: bool = False


def _produce_weight(entry: tuple[str, Any]) -> int:
    """A partition of a Produce, for ``yield_every``: 1, and 1 more for each 10 KiB of
    its records (checked one by one), so the loop is given back every 100 partitions or
    every MiB of records."""
    return 1 + len(entry[1].records or b"") // 10_240


def _partition_count(image: MetadataImage, asked: _AskedTopic) -> int:
    topic = image.topics.get(asked.name) if asked.name is not None else None
    return 1 + (len(topic.partitions) if topic is not None else 0)


def _resource_refused(resource: Any, error: HeadwaterError) -> dict[str, Any]:
    return {
        "error_code": kafka_code(error.code),
        "error_message": error.message,
        "resource_type": int(resource.resource_type),
        "resource_name": resource.resource_name,
    }


def _setting_or_none(name: str) -> str | None:
    """The topic setting a DescribeConfigs key names (None: none; it is not listed)."""
    try:
        return topic_setting_name(name)
    except HeadwaterError:
        return None


def _result(outcome: TopicOutcome) -> dict[str, Any]:
    """A topic's outcome as Kafka's topic result."""
    if outcome.error is None:
        return {"name": outcome.name, "error_code": 0, "error_message": None}
    return _refused(outcome.name, outcome.error)


def _produce_refusal(refusal: Refusal) -> dict[str, Any]:
    """A partition's Produce answer fields for ``refusal``: its code and message, and (v8)
    which records failed when the batch was refused record by record."""
    fields: dict[str, Any] = {
        "error_code": kafka_code(refusal.code),
        "error_message": refusal.message,
    }
    if refusal.records:
        fields["record_errors"] = [
            {"batch_index": index, "batch_index_error_message": why}
            for index, why in refusal.records
        ]
    return fields


def _refused(name: str, error: HeadwaterError) -> dict[str, Any]:
    return {"name": name, "error_code": kafka_code(error.code), "error_message": error.message}
