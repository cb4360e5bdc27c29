"""The faults of a chaos run and the plan of its fault cycles (pure: a seeded rng in).

A *fault cycle* is: pick the target nodes, inject one fault, hold it ``duration_ms``,
undo it (resume, restart, heal the network), wait until every node serves again, then
stay quiet ``quiet_ms`` before the next cycle. The plan is made in rounds: each round is a
shuffled permutation of the chosen faults, so that ``cycles >= len(faults)`` runs every
fault at least once and a long run spreads them evenly. Targets are picked when the cycle
runs (who leads what changes), with the same seeded rng.

Faults (``Fault``):

- ``kill-random``, ``kill-leader``, ``kill-controller``: SIGKILL one node (any node; the
  leader of a random partition; the active controller), start it again after the
  duration.
- ``kill-two``: SIGKILL two nodes at once (the partitions lose their majority), start
  both again.
- ``pause-leader``, ``pause-controller``, ``pause-two``: SIGSTOP, then SIGCONT after the
  duration (a duration over the broker session, 3 s, gets the paused node fenced).
- ``pause-then-kill-successor``: pause a partition's leader, wait until another replica
  leads that partition, SIGKILL that new leader, then wake the old one and restart the
  killed one.
- ``restart``: SIGTERM (controlled shutdown) one node and start it again.
- ``partition-isolate``: one random node loses the other nodes (clients still reach
  every node, as in Jepsen).
- ``partition-leader``: the active controller is cut off from the other nodes: a
  minority that holds leaderships against a majority that elects new ones.
- ``partition-bridge``: two nodes cannot reach each other; the third reaches both (a
  non-transitive partition).
- ``partition-one-way``: the active controller receives nothing from the other nodes,
  while its own packets still reach them.
- ``disk-full``: one random node's data folder (its own small file system) fills up
  with a ballast file; the ballast goes after the duration.
- ``slow-disk``: the writes and fsyncs to one node's data folder (the active
  controller's half the time) are delayed by hundreds of milliseconds to seconds; the
  delays go after the duration.

The network faults need the nodes in network namespaces (``headwater.tools.chaos.netns``); the
disk faults need their own file systems (root, to mount them) and a slow-disk library
(``headwater.tools.chaos.slow_disk``, built with cc) (``headwater.tools.chaos.disks``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import random  # the caller passes a seeded random.Random


class Fault(enum.StrEnum):
    KILL_RANDOM = "kill-random"
    KILL_LEADER = "kill-leader"
    KILL_CONTROLLER = "kill-controller"
    KILL_TWO = "kill-two"
    PAUSE_LEADER = "pause-leader"
    PAUSE_CONTROLLER = "pause-controller"
    PAUSE_TWO = "pause-two"
    PAUSE_THEN_KILL_SUCCESSOR = "pause-then-kill-successor"
    RESTART = "restart"
    PARTITION_ISOLATE = "partition-isolate"
    PARTITION_LEADER = "partition-leader"
    PARTITION_BRIDGE = "partition-bridge"
    PARTITION_ONE_WAY = "partition-one-way"
    DISK_FULL = "disk-full"
    SLOW_DISK = "slow-disk"

    @property
    def needs_network(self) -> bool:
        return self.value.startswith("partition-")

    @property
    def needs_disks(self) -> bool:
        return self in (Fault.DISK_FULL, Fault.SLOW_DISK)


ALL_FAULTS: Final = tuple(Fault)
DURATION_MS: Final[dict[Fault, tuple[int, int]]] = {
    Fault.KILL_RANDOM: (500, 4000),
    Fault.KILL_LEADER: (500, 4000),
    Fault.KILL_CONTROLLER: (500, 4000),
    Fault.KILL_TWO: (1000, 5000),
    Fault.PAUSE_LEADER: (1000, 8000),
    Fault.PAUSE_CONTROLLER: (1000, 8000),
    Fault.PAUSE_TWO: (1000, 6000),
    Fault.PAUSE_THEN_KILL_SUCCESSOR: (1000, 4000),
    Fault.RESTART: (0, 1000),
    Fault.PARTITION_ISOLATE: (2000, 8000),
    Fault.PARTITION_LEADER: (2000, 8000),
    Fault.PARTITION_BRIDGE: (2000, 8000),
    Fault.PARTITION_ONE_WAY: (2000, 8000),
    Fault.DISK_FULL: (2000, 8000),
    Fault.SLOW_DISK: (3000, 10000),
}
"""[low, high] of the time a fault is held, per fault (a uniform draw)."""
QUIET_MS: Final = (500, 2000)
"""[low, high] of the quiet time after a cycle's recovery."""
assert set(DURATION_MS) == set(Fault)


@dataclass(frozen=True, slots=True)
class Cycle:
    number: int
    """1-based."""
    fault: Fault
    duration_ms: int
    quiet_ms: int


def parse_faults(text: str) -> tuple[Fault, ...]:
    """Faults from ``all`` or a comma-separated list of names (``kill-*`` style prefixes
    ending in ``*`` select every fault starting so). ValueError names the valid ones."""
    chosen: list[Fault] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if item == "all":
            matches = list(Fault)
        elif item.endswith("*"):
            matches = [f for f in Fault if f.value.startswith(item[:-1])]
        else:
            matches = [f for f in Fault if f.value == item]
        if not matches:
            valid = ", ".join(f.value for f in Fault)
            raise ValueError(f"unknown nemesis {item!r}; valid: all, {valid} (or a prefix*)")
        chosen += [f for f in matches if f not in chosen]
    if not chosen:
        raise ValueError("no nemesis chosen")
    return tuple(chosen)


def plan(rng: random.Random, faults: Sequence[Fault], cycles: int) -> list[Cycle]:
    """``cycles`` fault cycles in rounds of shuffled ``faults`` (see the module doc)."""
    assert faults, "plan needs at least one fault"
    assert cycles >= 0
    out: list[Cycle] = []
    while len(out) < cycles:
        round_ = list(faults)
        rng.shuffle(round_)
        for fault in round_[: cycles - len(out)]:
            low, high = DURATION_MS[fault]
            out.append(
                Cycle(
                    number=len(out) + 1,
                    fault=fault,
                    duration_ms=rng.randint(low, high),
                    quiet_ms=rng.randint(*QUIET_MS),
                )
            )
    return out
