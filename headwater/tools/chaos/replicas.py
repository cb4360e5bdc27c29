"""Compare a topic's replicas byte for byte below the high watermark.

For each partition, every replica's node is asked (Admin.DescribeReplicaLog, through
``headwater.client.Admin.describe_replica_log``) for its log start offset and high
watermark; the common range is [the largest log start, the smallest high watermark);
then each node hashes (SHA-256) its stored batches over that range. Followers store the
leader's batches unchanged, so replicas that agree give the same covered range, batch
count, size and hash. Everything below every replica's high watermark is committed, so
any difference there is a replication bug (or committed data lost on a replica).

``compare_metadata`` does the same for the metadata: every node's image offset and
digest (``Metadata`` with ``include_digest``), which must be equal once nodes are at one
offset: every voter applies the same metadata batches in the same order, and every
broker-only node rebuilds the same image from them.

``differences`` and ``metadata_differences`` are pure; ``compare_replicas`` and
``compare_metadata`` do the calls. Used by ``headwater debug compare-replicas`` and at the
end of a chaos run.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from headwater.client import Admin, ReplicaLogDescription
from headwater.shared.errors import ErrorCode, HeadwaterError

HASH_BUSY_RETRIES: Final = 10
HASH_BUSY_PAUSE_S: Final = 0.2


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One node's replica: its offsets, and what it hashed over the common range."""

    node_id: int
    log_start_offset: int
    high_watermark: int
    log_end_offset: int
    leader_epoch: int
    is_leader: bool
    covered_start_offset: int
    covered_end_offset: int
    batch_count: int
    size_bytes: int
    sha256: str
    """Hex digest."""
    damage: str = ""
    """What the node set aside from this replica when it opened it ("" when nothing)."""

    @property
    def fingerprint(self) -> tuple[int, int, int, int, str]:
        return (
            self.covered_start_offset,
            self.covered_end_offset,
            self.batch_count,
            self.size_bytes,
            self.sha256,
        )


@dataclass(frozen=True, slots=True)
class PartitionComparison:
    partition: int
    replicas: tuple[int, ...]
    start_offset: int
    """The largest log start offset over the replicas."""
    end_offset: int
    """The smallest high watermark over the replicas (the range compared ends here)."""
    views: tuple[ReplicaView, ...]
    errors: tuple[tuple[int, str], ...]
    """(node id, error) of replicas that could not be asked."""
    differences: tuple[str, ...]

    @property
    def identical(self) -> bool:
        return not self.differences and not self.errors


def common_range(views: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """[max log start, min high watermark) of (log_start_offset, high_watermark) pairs."""
    assert views
    return max(start for start, _ in views), min(hw for _, hw in views)


def differences(views: Sequence[ReplicaView]) -> tuple[str, ...]:
    """One line per group of replicas that hashed something else than the largest group
    (empty when all agree)."""
    groups: dict[tuple[int, int, int, int, str], list[int]] = {}
    for view in views:
        groups.setdefault(view.fingerprint, []).append(view.node_id)
    if len(groups) <= 1:
        return ()
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    return tuple(
        f"node(s) {','.join(map(str, nodes))}: offsets [{start}, {end}), {batches} batches, "
        f"{size} bytes, sha256 {digest[:16]}"
        for (start, end, batches, size, digest), nodes in ranked
    )


def fold_pages(answers: Sequence[ReplicaLogDescription]) -> ReplicaView:
    """One view of a range a node hashed in pages (a DescribeReplicaLog call hashes at most
    256 MiB): offsets and damage from the last answer, the covered range from the first
    page's start to the last page's end, batches and bytes summed, and the digest of the
    one page, or else the SHA-256 of the pages' digests in order (replicas that agree
    page at the same batches, so they fold to the same view)."""
    first, last = answers[0], answers[-1]
    digests = [a.sha256 for a in answers]
    digest = digests[0] if len(digests) == 1 else hashlib.sha256(b"".join(digests)).digest()
    return ReplicaView(
        node_id=last.node_id,
        log_start_offset=last.log_start_offset,
        high_watermark=last.high_watermark,
        log_end_offset=last.log_end_offset,
        leader_epoch=last.leader_epoch,
        is_leader=last.is_leader,
        covered_start_offset=first.covered_start_offset,
        covered_end_offset=last.covered_end_offset,
        batch_count=sum(a.batch_count for a in answers),
        size_bytes=sum(a.size_bytes for a in answers),
        sha256=digest.hex(),
        damage=last.damage,
    )


def hash_replica(
    admin: Admin, address: str, topic: str, partition: int, start: int, end: int
) -> ReplicaView:
    """The node's hash of its replica over [start, end), asked for page by page until the
    covered range reaches ``end`` (or the node's log ends first: a page that covers
    nothing ends it). A node hashing as many ranges as it allows at once is asked again
    after a pause, up to HASH_BUSY_RETRIES times."""
    answers: list[ReplicaLogDescription] = []
    offset = start
    busy = 0
    while True:
        try:
            answer = admin.describe_replica_log(address, topic, partition, offset, end)
        except HeadwaterError as error:
            if error.code is not ErrorCode.THROTTLING_QUOTA_EXCEEDED or busy >= HASH_BUSY_RETRIES:
                raise
            busy += 1
            time.sleep(HASH_BUSY_PAUSE_S * busy)
            continue
        covered = answer.covered_end_offset
        if covered < 0 and answers:
            return fold_pages(answers)  # the log ended (was cut) since the last page
        answers.append(answer)
        if covered < 0 or covered >= end or covered <= offset:
            return fold_pages(answers)
        offset = covered


def compare_partition(
    admin: Admin, topic: str, partition: int, replicas: Sequence[int], addresses: dict[int, str]
) -> PartitionComparison:
    """Ask every replica's node twice: for its offsets, then for its hash of the common
    range."""
    errors: list[tuple[int, str]] = []
    figures: dict[int, tuple[int, int]] = {}
    for node_id in replicas:
        address = addresses.get(node_id)
        if not address:
            errors.append((node_id, "no address in the metadata"))
            continue
        try:
            answer = admin.describe_replica_log(address, topic, partition)
        except HeadwaterError as error:
            errors.append((node_id, str(error)))
            continue
        figures[node_id] = (answer.log_start_offset, answer.high_watermark)
    if not figures:
        return PartitionComparison(partition, tuple(replicas), -1, -1, (), tuple(errors), ())
    start, end = common_range(list(figures.values()))
    views = []
    for node_id in figures:
        try:
            views.append(hash_replica(admin, addresses[node_id], topic, partition, start, end))
        except HeadwaterError as error:
            errors.append((node_id, str(error)))
    return PartitionComparison(
        partition, tuple(replicas), start, end, tuple(views), tuple(errors), differences(views)
    )


def replicas_behind(admin: Admin, topic: str) -> list[str]:
    """One line per replica of ``topic`` whose high watermark or log end offset is not the
    largest high watermark of its partition: after the writes stop and the ISRs are full,
    every replica reaches it within a fetch or two. A replica left below it, or one that
    cannot be asked, would shrink the range ``compare_replicas`` can compare."""
    metadata = admin.metadata([topic])
    addresses = {b.node_id: b.address for b in metadata.brokers}
    behind: list[str] = []
    for described in metadata.topics:
        for p in sorted(described.partitions, key=lambda p: p.partition):
            figures: dict[int, tuple[int, int]] = {}
            for node_id in p.replicas:
                if node_id not in addresses:
                    behind.append(f"partition {p.partition}, node {node_id}: no address")
                    continue
                try:
                    answer = admin.describe_replica_log(addresses[node_id], topic, p.partition)
                except HeadwaterError as error:
                    behind.append(f"partition {p.partition}, node {node_id}: {error}")
                    continue
                figures[node_id] = (answer.high_watermark, answer.log_end_offset)
            top = max((hw for hw, _ in figures.values()), default=0)
            behind += [
                f"partition {p.partition}, node {node_id}: high watermark {hw}, log end "
                f"{end}, below {top}"
                for node_id, (hw, end) in sorted(figures.items())
                if hw != top or end != top
            ]
    return behind


def compare_replicas(admin: Admin, topic: str) -> list[PartitionComparison]:
    """Compare every partition of ``topic`` (UNKNOWN_TOPIC_OR_PARTITION if none)."""
    metadata = admin.metadata([topic])
    addresses = {b.node_id: b.address for b in metadata.brokers}
    described = {t.name: t for t in metadata.topics}.get(topic)
    if described is None:
        raise HeadwaterError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r} does not exist"
        )
    return [
        compare_partition(admin, topic, p.partition, list(p.replicas), addresses)
        for p in sorted(described.partitions, key=lambda p: p.partition)
    ]


@dataclass(frozen=True, slots=True)
class MetadataView:
    node_id: int
    offset: int
    digest: str
    """Hex SHA-256 of the node's image."""


@dataclass(frozen=True, slots=True)
class MetadataComparison:
    views: tuple[MetadataView, ...]
    errors: tuple[tuple[int, str], ...]
    differences: tuple[str, ...]

    @property
    def identical(self) -> bool:
        return bool(self.views) and not self.differences and not self.errors


def metadata_differences(views: Sequence[MetadataView]) -> tuple[str, ...]:
    """One line per group of nodes whose (offset, digest) is not the largest group's; a
    group at the same offset with another digest is named as diverged (empty when all
    agree)."""
    groups: dict[tuple[int, str], list[int]] = {}
    for view in views:
        groups.setdefault((view.offset, view.digest), []).append(view.node_id)
    if len(groups) <= 1:
        return ()
    offsets = [offset for offset, _ in groups]
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    return tuple(
        f"node(s) {','.join(map(str, nodes))}: metadata offset {offset}, sha256 {digest[:16]}"
        + (" (DIVERGED: another image at this offset)" if offsets.count(offset) > 1 else "")
        for (offset, digest), nodes in ranked
    )


def compare_metadata(
    admin: Admin, addresses: dict[int, str], deadline_s: float = 30.0, poll_s: float = 0.25
) -> MetadataComparison:
    """Ask every node for its metadata offset and image digest until all answer and are
    at one offset (a change in flight moves the offset), or ``deadline_s`` passes; return
    the last answers. Nodes at one offset with different digests end the wait at once."""
    deadline = time.monotonic() + deadline_s
    while True:
        views: list[MetadataView] = []
        errors: list[tuple[int, str]] = []
        for node_id, address in sorted(addresses.items()):
            try:
                answer = admin.node_metadata(address)
            except HeadwaterError as error:
                errors.append((node_id, str(error)))
                continue
            views.append(
                MetadataView(node_id, answer.metadata_offset, answer.metadata_digest.hex())
            )
        found = metadata_differences(views)
        diverged = any("DIVERGED" in line for line in found)
        if (not found and not errors) or diverged or time.monotonic() >= deadline:
            return MetadataComparison(tuple(views), tuple(errors), found)
        time.sleep(poll_s)


def metadata_comparison_json(comparison: MetadataComparison) -> dict[str, Any]:
    return {
        "identical": comparison.identical,
        "differences": list(comparison.differences),
        "errors": [{"node_id": n, "error": e} for n, e in comparison.errors],
        "views": [
            {"node_id": v.node_id, "offset": v.offset, "sha256": v.digest} for v in comparison.views
        ],
    }


def comparison_json(comparison: PartitionComparison) -> dict[str, Any]:
    return {
        "partition": comparison.partition,
        "replicas": list(comparison.replicas),
        "start_offset": comparison.start_offset,
        "end_offset": comparison.end_offset,
        "identical": comparison.identical,
        "differences": list(comparison.differences),
        "errors": [{"node_id": n, "error": e} for n, e in comparison.errors],
        "views": [
            {
                "node_id": v.node_id,
                "log_start_offset": v.log_start_offset,
                "high_watermark": v.high_watermark,
                "log_end_offset": v.log_end_offset,
                "leader_epoch": v.leader_epoch,
                "is_leader": v.is_leader,
                "covered_start_offset": v.covered_start_offset,
                "covered_end_offset": v.covered_end_offset,
                "batch_count": v.batch_count,
                "size_bytes": v.size_bytes,
                "sha256": v.sha256,
                "damage": v.damage,
            }
            for v in comparison.views
        ],
    }
