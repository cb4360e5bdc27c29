"""Server-side assignors and member reconciliation (pure), as in Kafka's KIP-848.

An assignor maps the group's members (each with the topics it subscribes to) and the
topics' partition counts to a **target assignment**: each partition of a subscribed topic
to exactly one member subscribed to it.

- ``uniform`` (the default) is sticky: every member keeps the partitions it has, as long as
  it still subscribes to their topic; free partitions go to the least loaded eligible
  member; then a partition moves only from a member holding two or more above another
  member that could take it. With equal subscriptions, member counts differ by at most
  one and a member keeps at least ``min(what it had, partitions // members)``.
- ``range`` gives each member a contiguous range of every topic it subscribes to (Kafka's
  RangeAssignor): members sorted by id, the first ``count % members`` get one extra.

``reconcile`` moves one member from its current assignment toward the target without
ever letting two members hold a partition at once: what the member must give up goes to
``revoking`` first (its epoch stays), and only once it reports them released does it take
new partitions, and then only those no other member still holds. Partitions held by
another member are added on a later call, once released.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from typing import Final

from headwater.node.groups.image import GroupState
from headwater.node.groups.records import MemberAssignment, TopicPartitionKey

Subscriptions = Mapping[str, Set[str]]
"""member id -> the topic names it subscribes to"""
Assignment = dict[str, frozenset[TopicPartitionKey]]
Owned = Mapping[str, Set[TopicPartitionKey]]
"""member id -> the partitions it holds now"""
Assignor = Callable[[Subscriptions, Mapping[str, int], Owned], Assignment]


def uniform(
    members: Subscriptions,
    partition_counts: Mapping[str, int],
    current: Owned,
) -> Assignment:
    """The sticky, balanced assignment described in the module docstring."""
    eligible: dict[TopicPartitionKey, frozenset[str]] = {}
    for topic, count in sorted(partition_counts.items()):
        subscribers = frozenset(m for m, topics in members.items() if topic in topics)
        if subscribers:
            for partition in range(count):
                eligible[(topic, partition)] = subscribers
    owned: dict[str, set[TopicPartitionKey]] = {m: set() for m in members}
    for member in sorted(members):
        for tp in sorted(current.get(member, ())):
            if member in eligible.get(tp, ()) and not any(tp in o for o in owned.values()):
                owned[member].add(tp)
    taken = {tp for held in owned.values() for tp in held}
    for tp in sorted(eligible):
        if tp not in taken:
            least = min(sorted(eligible[tp]), key=lambda m: len(owned[m]))
            owned[least].add(tp)
    _balance(owned, eligible)
    return {m: frozenset(held) for m, held in owned.items()}


def _balance(
    owned: dict[str, set[TopicPartitionKey]], eligible: Mapping[TopicPartitionKey, Set[str]]
) -> None:
    """Move one partition at a time from a member holding two or more above another that
    may take it, until none does (each move lowers the sum of squared counts: it ends)."""
    while True:
        by_load = sorted(owned, key=lambda m: (-len(owned[m]), m))
        moved = False
        for giver in by_load:
            for taker in reversed(by_load):
                if len(owned[giver]) - len(owned[taker]) <= 1:
                    break
                movable = sorted((tp for tp in owned[giver] if taker in eligible[tp]), reverse=True)
                if movable:
                    owned[giver].remove(movable[0])
                    owned[taker].add(movable[0])
                    moved = True
                    break
            if moved:
                break
        if not moved:
            return


def range_assignor(
    members: Subscriptions,
    partition_counts: Mapping[str, int],
    current: Owned,
) -> Assignment:
    """Kafka's RangeAssignor: contiguous ranges per topic (``current`` is not used)."""
    del current
    owned: dict[str, set[TopicPartitionKey]] = {m: set() for m in members}
    for topic, count in sorted(partition_counts.items()):
        subscribers = sorted(m for m, topics in members.items() if topic in topics)
        if not subscribers:
            continue
        share, extra = divmod(count, len(subscribers))
        start = 0
        for index, member in enumerate(subscribers):
            size = share + (1 if index < extra else 0)
            owned[member] |= {(topic, p) for p in range(start, start + size)}
            start += size
    return {m: frozenset(held) for m, held in owned.items()}


ASSIGNORS: Final[dict[str, Assignor]] = {"uniform": uniform, "range": range_assignor}
DEFAULT_ASSIGNOR: Final = "uniform"


def reconcile(
    group: GroupState, member_id: str, owned_now: Set[TopicPartitionKey]
) -> MemberAssignment:
    """Member ``member_id``'s next assignment toward the group's target, given the
    partitions it reports owning (``owned_now``, from its heartbeat). Equal to its current
    assignment when nothing can change yet."""
    target = group.target.get(member_id, frozenset())
    current = group.current.get(member_id)
    assigned = set(current.assigned) if current is not None else set()
    revoking = set(current.revoking) if current is not None else set()
    epoch = current.member_epoch if current is not None else 0
    revoking &= set(owned_now)  # what the member reports released is free
    must_give_up = assigned - target
    if must_give_up or revoking:
        assigned -= must_give_up
        revoking |= must_give_up
    else:
        for tp in sorted(target - assigned):
            if group.owner(tp) in (None, member_id):
                assigned.add(tp)
        epoch = group.target_epoch
    return MemberAssignment(
        group.group_id, member_id, epoch, tuple(sorted(assigned)), tuple(sorted(revoking))
    )
