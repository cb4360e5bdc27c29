"""The metadata core, without I/O: records, ``apply``, and the controller's decisions.

Seeded and deterministic: every decision takes the image, the epoch and a seeded
``random.Random``; a failing property prints its Hypothesis seed and example.
"""

from __future__ import annotations

import dataclasses
import pickle
import random
from collections import Counter
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.raft.metadata import decisions as c
from headwater.raft.metadata import records as r
from headwater.raft.metadata.image import (
    BrokerState,
    MetadataImage,
    PartitionState,
    apply,
    image_digest,
    snapshot_records,
)
from headwater.shared.errors import ErrorCode, HeadwaterError

LIMITS = c.TopicLimits(
    partitions_max=10_000, topics_max=100, default_partitions=1, default_replication_factor=1
)
EPOCH = 1


def commit(image: MetadataImage, result: c.ControllerResult[object]) -> MetadataImage:
    """Apply a decision's records; they must never be refused."""
    applied = apply(image, result.records)
    assert applied.refusal is None, applied.refusal
    return applied.image


def cluster(brokers: int, racks: tuple[str, ...] = ("",), epoch: int = EPOCH) -> MetadataImage:
    """An image with an active controller and ``brokers`` registered, unfenced brokers."""
    rng = random.Random(7)
    image = commit(MetadataImage(), c.activate(MetadataImage(), epoch, 1, "n1:1", rng))
    for node in range(1, brokers + 1):
        rack = racks[(node - 1) % len(racks)]
        result = c.register_broker(image, epoch, node, f"inc-{node}", f"n{node}:1", rack)
        image = commit(image, result)
        image = commit(image, c.heartbeat(image, epoch, node, result.response))
    return image


def create(
    image: MetadataImage, name: str, partitions: int, rf: int, seed: int = 1, **configs: str
) -> MetadataImage:
    result = c.create_topics(
        image, EPOCH, [c.NewTopic(name, partitions, rf, configs)], LIMITS, random.Random(seed)
    )
    (outcome,) = result.response
    assert outcome.error is None, outcome.error
    return commit(image, result)


def fence(image: MetadataImage, *nodes: int, now_ms: int = 10_000) -> MetadataImage:
    seen = {b: (0 if b in nodes else now_ms) for b in image.brokers}
    result = c.fence_expired(image, EPOCH, seen, now_ms, 3000)
    assert result.response == sorted(nodes)
    return commit(image, result)


def ask_isr(
    image: MetadataImage, topic: str, p: PartitionState, isr: tuple[int, ...]
) -> c.ControllerResult[PartitionState]:
    """``p``'s leader asks for ``isr`` at ``p``'s epochs (AlterPartition)."""
    return c.alter_partition_isr(
        image,
        EPOCH,
        p.leader,
        image.brokers[p.leader].broker_epoch,
        image.topics[topic].topic_id,
        p.partition,
        p.leader_epoch,
        p.partition_epoch,
        isr,
    )


def rejoin(image: MetadataImage, topic: str, node: int) -> MetadataImage:
    """Each leader asks for ``node`` back in its ISR (it caught up), as AlterPartition."""
    for p in image.topics[topic].partitions:
        if node in p.replicas and node not in p.isr and p.leader >= 0:
            result = ask_isr(image, topic, p, (*p.isr, node))
            image = commit(image, result)
    return image


def check_invariants(image: MetadataImage) -> None:
    for topic, p in image.partitions():
        assert len(set(p.replicas)) == len(p.replicas) > 0
        assert set(p.isr) <= set(p.replicas)
        if p.leader != r.NO_LEADER:
            assert p.leader in p.isr
            # Live, or shutting down and the only live ISR member left.
            assert not image.brokers[p.leader].fenced, (topic.name, p)


# --------------------------------------------------------------------------- records


def test_records_round_trip_through_json() -> None:
    image = create(cluster(3), "orders", 4, 3)
    records = snapshot_records(image)
    assert r.decode_batch(r.encode_batch(records)) == tuple(records)


def test_decoder_refuses_unknown_types_versions_and_garbage() -> None:
    with pytest.raises(r.RecordFormatError, match="unknown record type"):
        r.decode_batch(b'[{"type": "Nope", "version": 1}]')
    with pytest.raises(r.RecordFormatError, match="version 2"):
        r.decode_batch(
            b'[{"type": "TopicDeleted", "version": 2, "controller_epoch": 1, "topic_id": "x"}]'
        )
    with pytest.raises(r.RecordFormatError, match="lacks field"):
        r.decode_batch(b'[{"type": "TopicDeleted", "version": 1, "controller_epoch": 1}]')
    with pytest.raises(r.RecordFormatError, match="not JSON"):
        r.decode_batch(b"\xff")


def test_snapshot_rebuilds_the_same_image() -> None:
    image = create(cluster(4, racks=("a", "b")), "t", 8, 3)
    image = fence(image, 2)
    rebuilt = apply(MetadataImage(), snapshot_records(image))
    assert rebuilt.refusal is None
    assert (
        dataclasses.replace(
            rebuilt.image, offset=image.offset, broker_epoch_last=image.broker_epoch_last
        )
        == image
    )


def test_the_image_digest_is_the_same_on_a_rebuilt_image_and_changes_with_anything() -> None:
    image = create(create(cluster(4), "b", 3, 3), "a", 2, 2)
    rebuilt = apply(MetadataImage(), snapshot_records(image)).image
    assert image_digest(dataclasses.replace(rebuilt, offset=image.offset)) == image_digest(image)
    reordered = dataclasses.replace(image, topics=dict(reversed(list(image.topics.items()))))
    assert list(reordered.topics) != list(image.topics)
    assert image_digest(reordered) == image_digest(image)
    assert image_digest(dataclasses.replace(image, offset=image.offset + 1)) != image_digest(image)
    assert image_digest(fence(image, 2)) != image_digest(image)


def registered_with_addresses() -> MetadataImage:
    """``cluster(2)`` with broker 2 registered again with its inter-broker listener and
    its Kafka listener."""
    image = cluster(2)
    result = c.register_broker(
        image, EPOCH, 2, "inc-2-kafka", "n2:1", "", "n2:2", 0, kafka_address="n2:9092"
    )
    image = commit(image, result)
    return commit(image, c.heartbeat(image, EPOCH, 2, result.response))


def test_a_brokers_listener_addresses_reach_the_record_the_image_and_the_snapshot() -> None:
    image = registered_with_addresses()
    result = c.register_broker(cluster(1), EPOCH, 2, "i", "n2:1", "", "n2:2", 0, "n2:9092")
    (record,) = result.records
    assert isinstance(record, r.RegisterBroker)
    assert (record.internal_address, record.kafka_address) == ("n2:2", "n2:9092")
    assert r.decode_batch(r.encode_batch([record])) == (record,)
    snapshot = [rec for rec in snapshot_records(image) if isinstance(rec, r.RegisterBroker)]
    assert [(rec.node_id, rec.kafka_address) for rec in snapshot] == [(1, ""), (2, "n2:9092")]
    assert image.broker_internal_address(2) == "n2:2"
    assert image.broker_kafka_address(2) == "n2:9092"
    assert image.broker_kafka_address(1) == image.broker_kafka_address(9) == ""
    rebuilt = apply(MetadataImage(), snapshot_records(image)).image
    assert rebuilt.brokers == image.brokers
    assert image_digest(dataclasses.replace(rebuilt, offset=image.offset)) == image_digest(image)
    moved = dataclasses.replace(
        image,
        brokers={**image.brokers, 2: dataclasses.replace(image.brokers[2], kafka_address="x:1")},
    )
    assert image_digest(moved) != image_digest(image)


def test_a_register_broker_record_without_its_defaulted_fields_decodes() -> None:
    """A journal's RegisterBroker without internal_address, partition_capacity and
    kafka_address decodes with their defaults; a field of the wrong type is refused."""
    old = (
        b'[{"type": "RegisterBroker", "version": 1, "controller_epoch": 1, "node_id": 2, '
        b'"incarnation_id": "inc-2", "broker_epoch": 1, "address": "n2:1", "rack": "a"}]'
    )
    (record,) = r.decode_batch(old)
    assert record == r.RegisterBroker(1, 2, "inc-2", 1, "n2:1", "a")
    assert isinstance(record, r.RegisterBroker)
    assert (record.internal_address, record.partition_capacity, record.kafka_address) == ("", 0, "")
    with pytest.raises(r.RecordFormatError, match="kafka_address"):
        r.decode_batch(old.replace(b'"rack": "a"', b'"rack": "a", "kafka_address": 9092'))


class _BrokerStateWithoutKafkaAddress:
    """Pickles as a ``BrokerState`` state of its first 10 field values, in order: what a
    snapshot holds when its ``BrokerState`` has no ``kafka_address``."""

    def __reduce__(self) -> tuple[object, ...]:
        state = [2, "inc-2", 4, "n2:1", "a", False, False, "n2:2", 10, "disk full"]
        return (object.__new__, (BrokerState,), state)


def test_a_snapshot_without_kafka_address_loads() -> None:
    """The Raft snapshot pickles the image; the fields a broker's state lacks take their
    defaults, and a newer state's extra values are ignored."""
    loaded = pickle.loads(pickle.dumps({"brokers": _BrokerStateWithoutKafkaAddress()}, 2))
    broker = loaded["brokers"]
    assert broker == BrokerState(
        2,
        "inc-2",
        4,
        "n2:1",
        "a",
        fenced=False,
        internal_address="n2:2",
        partition_capacity=10,
        log_dir_problem="disk full",
    )
    assert broker.kafka_address == ""
    image = registered_with_addresses()
    assert pickle.loads(pickle.dumps(image, 2)) == image
    newer = BrokerState.__new__(BrokerState)
    newer.__setstate__([*dataclasses.astuple(image.brokers[2]), "a field added later"])
    assert newer == image.brokers[2]
    with pytest.raises(ValueError, match="lacks 'rack'"):
        BrokerState.__new__(BrokerState).__setstate__([2, "inc-2", 4, "n2:1"])


# --------------------------------------------------------------------------- apply refuses stale records


def test_records_of_an_older_controller_epoch_are_refused() -> None:
    image = cluster(3, epoch=5)
    stale = r.TopicCreated(4, "late", "id-late", ())
    result = apply(image, [stale])
    assert result.refusal is not None and "controller epoch 4" in result.refusal
    assert "late" not in result.image.topics
    assert result.image.offset == image.offset + 1  # refused batches still count


def test_a_batch_is_atomic() -> None:
    image = cluster(3)
    batch = [r.TopicCreated(EPOCH, "a", "id-a", ()), r.TopicDeleted(EPOCH, "no-such-id")]
    result = apply(image, batch)
    assert result.refusal is not None
    assert "a" not in result.image.topics


def test_partition_changes_must_follow_the_current_partition_epoch() -> None:
    image = create(cluster(3), "t", 1, 3)
    topic = image.topics["t"]
    p = topic.partitions[0]
    change = r.PartitionChanged(
        EPOCH,
        topic.topic_id,
        0,
        p.replicas,
        p.isr,
        p.isr[1],
        p.leader_epoch + 1,
        p.partition_epoch + 1,
    )
    image = commit(image, c.ControllerResult((change,), None))
    # The same change again was computed from an older state: refused.
    again = apply(image, [change])
    assert again.refusal is not None and "partition epoch" in again.refusal
    backwards = dataclasses.replace(
        change, partition_epoch=change.partition_epoch + 1, leader_epoch=0
    )
    refused = apply(image, [backwards])
    assert refused.refusal is not None and "leader epoch" in refused.refusal


def test_broker_records_need_the_current_broker_epoch() -> None:
    image = cluster(2)
    old_epoch = image.brokers[2].broker_epoch
    image = commit(image, c.register_broker(image, EPOCH, 2, "inc-2-restarted", "n2:1", ""))
    result = apply(image, [r.UnfenceBroker(EPOCH, 2, old_epoch)])
    assert result.refusal is not None and "not current" in result.refusal
    with pytest.raises(HeadwaterError) as info:
        c.heartbeat(image, EPOCH, 2, old_epoch)
    assert info.value.code is ErrorCode.STALE_BROKER_EPOCH


def test_leader_outside_the_isr_is_refused() -> None:
    image = create(cluster(3), "t", 1, 3)
    topic = image.topics["t"]
    p = topic.partitions[0]
    bad = r.PartitionChanged(
        EPOCH,
        topic.topic_id,
        0,
        p.replicas,
        (p.replicas[1],),
        p.replicas[0],
        p.leader_epoch,
        p.partition_epoch + 1,
    )
    result = apply(image, [bad])
    assert result.refusal is not None and "not in the ISR" in result.refusal


# --------------------------------------------------------------------------- placement


@pytest.mark.parametrize(
    ("brokers", "partitions", "rf"), [(3, 6, 3), (5, 10, 3), (4, 7, 2), (3, 3000, 3)]
)
def test_placement_spreads_replicas_and_leaders_evenly(
    brokers: int, partitions: int, rf: int
) -> None:
    image = create(cluster(brokers), "t", partitions, rf, seed=partitions)
    states = image.topics["t"].partitions
    leaders = Counter(p.leader for p in states)
    replicas = Counter(b for p in states for b in p.replicas)
    assert max(leaders.values()) - min(leaders.values()) <= 1
    assert max(replicas.values()) - min(replicas.values()) <= 1
    assert all(len(set(p.replicas)) == rf and p.isr == p.replicas for p in states)
    assert all(p.leader == p.replicas[0] for p in states)


def test_placement_puts_replicas_on_different_racks() -> None:
    image = create(cluster(6, racks=("a", "b", "c")), "t", 12, 3)
    racks = {b.node_id: b.rack for b in image.brokers.values()}
    for p in image.topics["t"].partitions:
        assert len({racks[b] for b in p.replicas}) == 3, p


def test_rack_alternating_order() -> None:
    image = cluster(5, racks=("a", "a", "b"))  # racks: 1a 2a 3b 4a 5a
    order = c.rack_alternating([image.brokers[b] for b in sorted(image.brokers)])
    assert order == [1, 3, 2, 4, 5]


def test_placement_uses_only_live_brokers() -> None:
    image = fence(cluster(4), 4)
    image = create(image, "t", 8, 3)
    assert all(4 not in p.replicas for p in image.topics["t"].partitions)


def test_create_topics_reports_each_bad_request_alone() -> None:
    image = create(cluster(3), "exists", 1, 1)
    requests = [
        c.NewTopic("ok", 2, 3),
        c.NewTopic("", 1, 1),
        c.NewTopic("rf", 1, 4),
        c.NewTopic("parts", 0, 1),
        c.NewTopic("__internal", 1, 1),
        c.NewTopic("exists", 1, 1),
        c.NewTopic("twice", 1, 1),
        c.NewTopic("twice", 1, 1),
        c.NewTopic("ok.x", 1, 1),
        c.NewTopic("ok_x", 1, 1),
    ]
    result = c.create_topics(image, EPOCH, requests, LIMITS, random.Random(1))
    codes = [o.error.code if o.error else None for o in result.response]
    assert codes == [
        None,
        ErrorCode.INVALID_TOPIC_EXCEPTION,
        ErrorCode.INVALID_REPLICATION_FACTOR,
        ErrorCode.INVALID_PARTITIONS,
        ErrorCode.INVALID_TOPIC_EXCEPTION,
        ErrorCode.TOPIC_ALREADY_EXISTS,
        ErrorCode.INVALID_REQUEST,  # a name given twice: neither is created (Kafka's rule)
        ErrorCode.INVALID_REQUEST,
        None,
        ErrorCode.INVALID_TOPIC_EXCEPTION,  # collides with ok.x in metric names
    ]
    assert "valid range is [1, 3]" in str(result.response[2].error)
    image = commit(image, result)
    assert sorted(image.topics) == ["exists", "ok", "ok.x"]


def test_validate_only_writes_nothing() -> None:
    result = c.create_topics(
        cluster(1), EPOCH, [c.NewTopic("t", 1, 1)], LIMITS, random.Random(1), validate_only=True
    )
    assert result.records == () and result.response[0].error is None


def test_add_partitions_keeps_the_replication_factor() -> None:
    image = create(cluster(3), "t", 2, 2)
    image = commit(image, c.create_partitions(image, EPOCH, "t", 5, LIMITS, random.Random(3)))
    states = image.topics["t"].partitions
    assert [p.partition for p in states] == [0, 1, 2, 3, 4]
    assert all(len(p.replicas) == 2 for p in states)
    with pytest.raises(HeadwaterError) as info:
        c.create_partitions(image, EPOCH, "t", 5, LIMITS, random.Random(3))
    assert info.value.code is ErrorCode.INVALID_PARTITIONS and "[6, 10000]" in info.value.message


def _checked(configs: Mapping[str, str]) -> Mapping[str, str]:
    """A stand-in for the node's config check: numbers only, written canonically."""
    for key, value in configs.items():
        if not value.isdigit():
            raise HeadwaterError(ErrorCode.INVALID_CONFIG, f"{key}={value!r} is not a number")
    return {key: str(int(value)) for key, value in configs.items()}


CHECKED = dataclasses.replace(LIMITS, check_configs=_checked)


def test_altering_topic_configs_sets_removes_and_replaces_overrides() -> None:
    image = create(cluster(1), "t", 1, 1, retention_ms="1000", segment_bytes="4096")
    changed = c.alter_topic_configs(
        image, EPOCH, "t", {"retention_ms": "02000", "segment_bytes": None}, False, CHECKED
    )
    assert changed.response == {"retention_ms": "2000"}
    assert [(x.key, x.value) for x in changed.records] == [
        ("retention_ms", "2000"),
        ("segment_bytes", None),
    ]
    image = commit(image, changed)
    assert dict(image.topics["t"].configs) == {"retention_ms": "2000"}
    # Nothing differs: no record.
    same = c.alter_topic_configs(image, EPOCH, "t", {"retention_ms": "2000"}, False, CHECKED)
    assert same.records == ()
    # Replace: the given overrides are the whole set.
    replaced = c.alter_topic_configs(image, EPOCH, "t", {"segment_bytes": "8"}, True, CHECKED)
    image = commit(image, replaced)
    assert dict(image.topics["t"].configs) == {"segment_bytes": "8"}
    # Validate only: the answer, no record.
    checked = c.alter_topic_configs(image, EPOCH, "t", {"segment_bytes": "9"}, False, CHECKED, True)
    assert checked.records == () and checked.response == {"segment_bytes": "9"}


def test_altering_topic_configs_refuses_bad_values_internal_and_unknown_topics() -> None:
    image = create(cluster(1), "t", 1, 1)
    internal = c.NewTopic("__consumer_offsets", 1, 1, internal=True)
    image = commit(image, c.create_topics(image, EPOCH, [internal], LIMITS, random.Random(1)))
    with pytest.raises(HeadwaterError) as bad:
        c.alter_topic_configs(image, EPOCH, "t", {"retention_ms": "soon"}, False, CHECKED)
    assert bad.value.code is ErrorCode.INVALID_CONFIG
    with pytest.raises(HeadwaterError) as internal:
        c.alter_topic_configs(image, EPOCH, "__consumer_offsets", {}, False, CHECKED)
    assert internal.value.code is ErrorCode.INVALID_TOPIC_EXCEPTION
    with pytest.raises(HeadwaterError) as missing:
        c.alter_topic_configs(image, EPOCH, "nope", {}, False, CHECKED)
    assert missing.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_delete_topics() -> None:
    image = create(cluster(1), "t", 1, 1)
    result = c.delete_topics(image, EPOCH, ["t", "missing"])
    assert [o.error.code if o.error else None for o in result.response] == [
        None,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ]
    assert "t" not in commit(image, result).topics


# --------------------------------------------------------------------------- election


def test_fencing_the_leader_moves_leadership_to_an_isr_member_with_a_new_epoch() -> None:
    image = create(cluster(3), "t", 6, 3)
    before = image.topics["t"].partitions
    image = fence(image, 2)
    assert image.brokers[2].fenced
    for old, new in zip(before, image.topics["t"].partitions, strict=True):
        # The fenced broker leaves every ISR (it rejoins once it catches up again).
        assert new.isr == tuple(b for b in old.isr if b != 2)
        assert new.partition_epoch == old.partition_epoch + 1
        if old.leader == 2:
            assert new.leader in old.isr and new.leader != 2
            assert new.leader_epoch == old.leader_epoch + 1
        else:
            assert (new.leader, new.leader_epoch) == (old.leader, old.leader_epoch)
    check_invariants(image)


def test_no_live_isr_member_means_offline_until_one_returns() -> None:
    image = create(cluster(3), "t", 1, 1)
    (p,) = image.topics["t"].partitions
    image = fence(image, p.leader)
    (offline,) = image.topics["t"].partitions
    assert offline.leader == r.NO_LEADER and offline.isr == p.isr
    broker = image.brokers[p.leader]
    image = commit(image, c.heartbeat(image, EPOCH, broker.node_id, broker.broker_epoch))
    (back,) = image.topics["t"].partitions
    assert back.leader == p.leader and back.leader_epoch == offline.leader_epoch + 1


def test_an_offline_log_dir_moves_leadership_and_isr_away_until_it_is_back() -> None:
    image = create(cluster(3), "t", 6, 3)
    before = image.topics["t"].partitions
    broker = image.brokers[2]
    problem = "/data/t-0: append failed: [Errno 28] No space left on device"
    image = commit(
        image, c.heartbeat(image, EPOCH, 2, broker.broker_epoch, log_dir_problem=problem)
    )
    assert image.brokers[2].state == "log_dir_offline" and not image.brokers[2].live
    assert image.brokers[2].log_dir_problem == problem and not image.brokers[2].fenced
    for old, new in zip(before, image.topics["t"].partitions, strict=True):
        assert new.isr == tuple(b for b in old.isr if b != 2)
        assert new.leader != 2
    check_invariants(image)
    # The same report again changes nothing; no new replica goes to the offline broker.
    again = c.heartbeat(image, EPOCH, 2, broker.broker_epoch, log_dir_problem=problem)
    assert again.records == ()
    image = create(image, "placed", 4, 2)
    assert all(2 not in p.replicas for p in image.topics["placed"].partitions)
    # Its ISR return is refused while it is offline (a leader asking to add it).
    p = image.topics["t"].partitions[0]
    asked = ask_isr(image, "t", p, (*p.isr, 2))
    assert 2 not in asked.response.isr
    # Back online: running again; it rejoins ISRs through its leaders, once caught up.
    image = commit(image, c.heartbeat(image, EPOCH, 2, broker.broker_epoch))
    assert image.brokers[2].state == "running" and image.brokers[2].live
    p = image.topics["t"].partitions[0]
    image = commit(image, ask_isr(image, "t", p, (*p.isr, 2)))
    assert 2 in image.topics["t"].partitions[0].isr


def test_a_sole_replica_on_an_offline_log_dir_is_offline_until_it_is_back() -> None:
    image = create(cluster(1), "t", 2, 1)
    image = commit(image, c.heartbeat(image, EPOCH, 1, 1, log_dir_problem="full"))
    assert all(p.leader == r.NO_LEADER for p in image.topics["t"].partitions)
    assert all(p.isr == (1,) for p in image.topics["t"].partitions)
    image = commit(image, c.heartbeat(image, EPOCH, 1, 1))
    assert all(p.leader == 1 for p in image.topics["t"].partitions)


def test_an_offline_log_dir_survives_the_snapshot() -> None:
    image = commit(cluster(2), c.heartbeat(cluster(2), EPOCH, 2, 2, log_dir_problem="full"))
    rebuilt = apply(MetadataImage(), snapshot_records(image)).image
    assert rebuilt.brokers[2].log_dir_problem == "full"
    assert image_digest(dataclasses.replace(rebuilt, offset=image.offset)) == image_digest(image)


def test_unclean_election_picks_a_live_replica_outside_the_isr() -> None:
    image = create(cluster(3), "t", 1, 3, unclean_leader_election="true")
    topic = image.topics["t"]
    (p,) = topic.partitions
    shrunk = r.PartitionChanged(
        EPOCH,
        topic.topic_id,
        0,
        p.replicas,
        (p.leader,),
        p.leader,
        p.leader_epoch,
        p.partition_epoch + 1,
    )
    image = commit(image, c.ControllerResult((shrunk,), None))
    image = fence(image, p.leader)
    (after,) = image.topics["t"].partitions
    assert after.leader not in (p.leader, r.NO_LEADER)
    assert after.isr == (after.leader,)


def test_preferred_leader_election_moves_leadership_back() -> None:
    image = create(cluster(3), "t", 6, 3)
    image = fence(image, 1)
    moved = [p for p in image.topics["t"].partitions if p.preferred_leader == 1]
    assert moved and all(p.leader != 1 for p in moved)
    broker = image.brokers[1]
    image = commit(image, c.heartbeat(image, EPOCH, 1, broker.broker_epoch))
    # Not in the ISR yet: nothing moves until the leaders add it back (it caught up).
    assert c.elect_preferred_leaders(image, EPOCH).records == ()
    image = rejoin(image, "t", 1)
    result = c.elect_preferred_leaders(image, EPOCH)
    assert result.response == len(moved)
    image = commit(image, result)
    assert all(p.leader == p.preferred_leader for p in image.topics["t"].partitions)
    assert c.elect_preferred_leaders(image, EPOCH).records == ()


def test_a_restarted_broker_loses_its_leadership_until_it_heartbeats() -> None:
    image = create(cluster(3), "t", 3, 3)
    image = commit(image, c.register_broker(image, EPOCH, 1, "inc-1-again", "n1:1", ""))
    assert image.brokers[1].fenced
    assert all(p.leader != 1 for p in image.topics["t"].partitions)
    check_invariants(image)


def test_registering_the_same_incarnation_again_is_idempotent() -> None:
    image = cluster(2)
    result = c.register_broker(image, EPOCH, 2, "inc-2", "n2:1", "")
    assert result.records == () and result.response == image.brokers[2].broker_epoch


def test_controlled_shutdown_moves_leadership_and_reports_ready() -> None:
    image = create(cluster(3), "t", 6, 3)
    image = create(image, "solo", 3, 1)
    broker = image.brokers[2]
    result = c.heartbeat(image, EPOCH, 2, broker.broker_epoch, want_shutdown=True)
    assert result.response.shutdown_ready
    image = commit(image, result)
    assert image.brokers[2].shutting_down
    assert all(p.leader != 2 and 2 not in p.isr for p in image.topics["t"].partitions)
    # A partition with no other replica keeps its leader until the node stops.
    solo = [p for p in image.topics["solo"].partitions if p.replicas == (2,)]
    assert all(p.leader == 2 for p in solo)


def test_fencing_considers_only_silent_unfenced_brokers() -> None:
    image = cluster(3)
    result = c.fence_expired(image, EPOCH, {1: 9_000, 2: 9_000, 3: 9_000}, 10_000, 3000)
    assert result.records == ()
    result = c.fence_expired(image, EPOCH, {1: 9_000, 2: 9_000}, 10_000, 3000)
    assert result.response == [3]  # never heard from counts as silent


# --------------------------------------------------------------------------- reassignment


def test_reassignment_adds_then_drops_replicas_once_the_new_ones_are_in_sync() -> None:
    image = create(cluster(4), "t", 1, 2)
    topic = image.topics["t"]
    (p,) = topic.partitions
    target = tuple(b for b in (1, 2, 3, 4) if b not in p.replicas)
    image = commit(image, c.reassign_partition(image, EPOCH, "t", 0, target))
    (moving,) = image.topics["t"].partitions
    assert set(moving.replicas) == set(p.replicas) | set(target)
    assert moving.adding_replicas == target and moving.removing_replicas == p.replicas
    assert c.maybe_complete_reassignments(image, EPOCH).records == ()  # not in sync yet
    with pytest.raises(HeadwaterError) as info:
        c.reassign_partition(image, EPOCH, "t", 0, (1,))
    assert info.value.code is ErrorCode.REASSIGNMENT_IN_PROGRESS
    caught_up = r.PartitionChanged(
        EPOCH,
        topic.topic_id,
        0,
        moving.replicas,
        moving.replicas,
        moving.leader,
        moving.leader_epoch,
        moving.partition_epoch + 1,
        moving.adding_replicas,
        moving.removing_replicas,
    )
    image = commit(image, c.ControllerResult((caught_up,), None))
    image = commit(image, c.maybe_complete_reassignments(image, EPOCH))
    (done,) = image.topics["t"].partitions
    assert done.replicas == target and set(done.isr) == set(target)
    assert done.leader in target and done.leader_epoch == moving.leader_epoch + 1
    assert done.adding_replicas == done.removing_replicas == ()


def test_reassignment_checks_its_target() -> None:
    image = create(cluster(3), "t", 1, 1)
    for target, code in [
        ((), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        ((1, 1), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        ((9,), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
    ]:
        with pytest.raises(HeadwaterError) as info:
            c.reassign_partition(image, EPOCH, "t", 0, target)
        assert info.value.code is code
    with pytest.raises(HeadwaterError) as info:
        c.reassign_partition(image, EPOCH, "t", 5, (1,))
    assert info.value.code is ErrorCode.PARTITION_OUT_OF_RANGE


# --------------------------------------------------------------------------- simulation


@settings(max_examples=60)
@given(st.integers(0, 2**32 - 1))
def test_random_histories_keep_the_invariants(seed: int) -> None:
    """A seeded history of creates, fences, returns, shutdowns, preferred elections and
    restarts: after every committed decision, leaders are live ISR members and the ISR
    lies within the replicas; no decision is ever refused by ``apply``."""
    rng = random.Random(seed)
    brokers = rng.randint(1, 6)
    image = cluster(brokers, racks=("a", "b"))
    now = 10_000
    seen = dict.fromkeys(image.brokers, now)
    for step in range(40):
        now += 1000
        action = rng.choice(
            ["create", "silence", "heartbeat", "shutdown", "prefer", "restart", "disk"]
        )
        node = rng.randint(1, brokers)
        broker = image.brokers[node]
        if action == "create":
            live = len(image.live_broker_ids())
            if live:
                request = c.NewTopic(f"t{step}", rng.randint(1, 8), rng.randint(1, live))
                result: c.ControllerResult[object] = c.create_topics(
                    image, EPOCH, [request], LIMITS, rng
                )  # type: ignore[assignment]
                image = commit(image, result)
        elif action == "silence":
            seen[node] = now - 5000
            image = commit(image, c.fence_expired(image, EPOCH, seen, now, 3000))
        elif action == "heartbeat" and not broker.shutting_down:
            seen[node] = now
            image = commit(image, c.heartbeat(image, EPOCH, node, broker.broker_epoch))
        elif action == "shutdown":
            image = commit(
                image, c.heartbeat(image, EPOCH, node, broker.broker_epoch, want_shutdown=True)
            )
        elif action == "disk" and not broker.shutting_down:
            seen[node] = now
            problem = rng.choice(["", "/data: [Errno 28] No space left on device"])
            image = commit(
                image,
                c.heartbeat(image, EPOCH, node, broker.broker_epoch, log_dir_problem=problem),
            )
        elif action == "prefer":
            image = commit(image, c.elect_preferred_leaders(image, EPOCH))
        elif action == "restart":
            seen[node] = now
            image = commit(
                image,
                c.register_broker(
                    image, EPOCH, node, f"inc-{node}-{step}", broker.address, broker.rack
                ),
            )
        check_invariants(image)


# --------------------------------------------------------------------------- AlterPartition


def test_alter_partition_checks_epochs_membership_and_liveness() -> None:
    image = create(cluster(3), "t", 1, 3)
    topic = image.topics["t"]
    (p,) = topic.partitions
    follower = next(b for b in p.replicas if b != p.leader)
    leader = image.brokers[p.leader]
    args = (EPOCH, p.leader, leader.broker_epoch, topic.topic_id, 0)
    shrunk = tuple(b for b in p.isr if b != follower)
    result = c.alter_partition_isr(image, *args, p.leader_epoch, p.partition_epoch, shrunk)
    assert result.response.isr == shrunk
    image = commit(image, result)
    (now,) = image.topics["t"].partitions
    # A request at an older partition epoch (the same one again, its answer lost, or
    # another made on a lagging image) gets the current state and commits nothing.
    for isr in (shrunk, p.isr):
        stale = c.alter_partition_isr(image, *args, p.leader_epoch, p.partition_epoch, isr)
        assert stale.records == () and stale.response == now
    # One at a partition epoch the controller never reached is refused.
    with pytest.raises(HeadwaterError) as info:
        c.alter_partition_isr(image, *args, p.leader_epoch, now.partition_epoch + 1, p.isr)
    assert info.value.code is ErrorCode.FENCED_LEADER_EPOCH
    for isr, fragment in [((follower,), "hold the leader"), ((p.leader, 9), "within the replicas")]:
        with pytest.raises(HeadwaterError) as info:
            c.alter_partition_isr(image, *args, now.leader_epoch, now.partition_epoch, isr)
        assert fragment in info.value.message
    image = fence(image, follower)
    (now,) = image.topics["t"].partitions
    # A joining broker that is not live is left out; the record is still written, so that
    # the answer is newer than the request and no copy of it can commit later.
    left_out = c.alter_partition_isr(
        image, *args, now.leader_epoch, now.partition_epoch, (*now.isr, follower)
    )
    assert left_out.response.isr == now.isr
    assert left_out.response.partition_epoch == now.partition_epoch + 1
    image = commit(image, left_out)
    (now,) = image.topics["t"].partitions
    with pytest.raises(HeadwaterError) as info:
        c.alter_partition_isr(
            image,
            EPOCH,
            follower,
            image.brokers[follower].broker_epoch,
            topic.topic_id,
            0,
            now.leader_epoch,
            now.partition_epoch,
            now.isr,
        )
    assert info.value.code is ErrorCode.FENCED_LEADER_EPOCH


def test_alter_partition_adds_the_live_joiners_and_leaves_out_the_others() -> None:
    image = create(cluster(3), "t", 1, 3)
    topic = image.topics["t"]
    (p,) = topic.partitions
    live, fenced = (b for b in p.replicas if b != p.leader)
    image = fence(image, live, fenced)
    image = commit(image, c.heartbeat(image, EPOCH, live, image.brokers[live].broker_epoch, False))
    (now,) = image.topics["t"].partitions
    assert now.isr == (p.leader,)
    result = ask_isr(image, "t", now, (p.leader, live, fenced))
    assert result.response.isr == (p.leader, live)
    assert result.response.partition_epoch == now.partition_epoch + 1
    assert commit(image, result).topics["t"].partitions[0] == result.response


# ----------------------------------------------------------------------- partition limits


def test_no_broker_gets_more_partitions_than_it_registered_capacity_for() -> None:
    """One CreateTopics of 100,000 partitions exhausted a node's file descriptors."""
    rng = random.Random(3)
    image = commit(MetadataImage(), c.activate(MetadataImage(), EPOCH, 1, "n1:1", rng))
    for node, capacity in ((1, 10), (2, 10), (3, 0)):  # 0: no limit stated
        result = c.register_broker(image, EPOCH, node, f"i{node}", f"n{node}:1", "", "", capacity)
        image = commit(image, result)
        image = commit(image, c.heartbeat(image, EPOCH, node, result.response))
    assert image.brokers[1].partition_capacity == 10
    image = create(image, "fits", 9, 2)  # 6 replicas on each broker
    refused = c.create_topics(image, EPOCH, [c.NewTopic("over", 9, 3)], LIMITS, rng)
    (outcome,) = refused.response
    assert outcome.error is not None and outcome.error.code is ErrorCode.INVALID_PARTITIONS
    assert "over its capacity of 10" in outcome.error.message and not refused.records
    with pytest.raises(HeadwaterError, match="capacity"):
        c.create_partitions(image, EPOCH, "fits", 30, LIMITS, rng)
    # A request may create at most partitions_max partitions in all.
    small = dataclasses.replace(LIMITS, partitions_max=10)
    both = c.create_topics(
        cluster(3), EPOCH, [c.NewTopic("a", 6, 1), c.NewTopic("b", 6, 1)], small, rng
    )
    assert both.response[0].error is None
    assert both.response[1].error is not None and "per request" in both.response[1].error.message


def test_preferred_leaders_move_back_only_for_brokers_past_the_imbalance() -> None:
    """Kafka's rule (leader.imbalance.per.broker.percentage): a broker gets its preferred
    leaderships back only when more than the given share of them is led elsewhere."""
    image = create(cluster(3), "t", 30, 3)

    def lead_elsewhere(image: MetadataImage, index: int) -> MetadataImage:
        p = image.topics["t"].partitions[index]
        other = next(b for b in p.isr if b != p.preferred_leader)
        moved = c._change(image.topics["t"], p, EPOCH, leader=other)
        return commit(image, c.ControllerResult((moved,), None))

    mine = [p.partition for p in image.topics["t"].partitions if p.preferred_leader == 1]
    assert len(mine) == 10
    image = lead_elsewhere(image, mine[0])  # one of its ten led elsewhere: 10%
    assert c.elect_preferred_leaders(image, EPOCH, 10).records == ()
    image = lead_elsewhere(image, mine[1])  # 20%
    result = c.elect_preferred_leaders(image, EPOCH, 10)
    assert result.response == 2
    image = commit(image, result)
    assert all(p.leader == p.preferred_leader for p in image.topics["t"].partitions)
