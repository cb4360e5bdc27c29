"""How long each consumer group of a chaos run went without reading after each fault
(pure: a function of the history).

A group reads when any of its members polls a record (a ``Poll`` event with records, at
the time it was recorded). For each fault cycle (a ``Nemesis`` event of phase "start",
up to the next cycle's start), a group's gap is the longest stretch between two of its
reads that ends after the fault began and begins before the next one: the time the
group, as a whole, took to read again after the fault (its coordinator moved, its
members' partitions moved, a rebalance ran). A group that never read again after a
fault has a gap up to the end of the history, marked ``open``. Producers write all
through a run, so a group that stops reading for long is waiting on the broker, not on
records.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from headwater.tools.chaos.history import Event, Nemesis, Poll


@dataclass(frozen=True, slots=True)
class ReadGap:
    group: str
    cycle: int
    nemesis: str
    gap_ms: int
    open: bool = False
    """True when the group read nothing after the fault began until the history ends."""


def read_gaps(history: Iterable[Event], group_of: Mapping[str, str]) -> tuple[ReadGap, ...]:
    """Every group's gap after every fault cycle (see the module doc); ``group_of`` maps
    a consumer's name to its group (consumers it does not name are left out)."""
    reads: dict[str, list[int]] = {group: [] for group in set(group_of.values())}
    starts: list[tuple[int, str, int]] = []
    last = 0
    for event in history:
        time_ms = getattr(event, "time_ms", 0)
        last = max(last, time_ms)
        if isinstance(event, Poll) and event.records and event.consumer in group_of:
            reads[group_of[event.consumer]].append(event.time_ms)
        elif isinstance(event, Nemesis) and event.phase == "start":
            starts.append((event.cycle, event.name, event.time_ms))
    starts.sort(key=lambda start: start[2])
    found = []
    for group, times in sorted(reads.items()):
        times.sort()
        for n, (cycle, name, began) in enumerate(starts):
            until = starts[n + 1][2] if n + 1 < len(starts) else last
            found.append(_gap(group, cycle, name, times, began, until, last))
    return tuple(found)


def _gap(
    group: str, cycle: int, name: str, times: list[int], began: int, until: int, last: int
) -> ReadGap:
    first_after = bisect.bisect_right(times, began)
    if first_after == len(times):  # nothing read after the fault began
        since = times[-1] if times else began
        return ReadGap(group, cycle, name, last - since, open=True)
    longest = times[first_after] - (times[first_after - 1] if first_after else began)
    for k in range(first_after + 1, len(times)):
        if times[k - 1] >= until:
            break
        longest = max(longest, times[k] - times[k - 1])
    return ReadGap(group, cycle, name, longest)


def longest_by_group(gaps: Iterable[ReadGap]) -> dict[str, ReadGap]:
    """Each group's longest gap of the run."""
    longest: dict[str, ReadGap] = {}
    for gap in gaps:
        known = longest.get(gap.group)
        if known is None or gap.gap_ms > known.gap_ms:
            longest[gap.group] = gap
    return longest
