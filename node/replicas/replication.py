"""High watermark and ISR math of a partition leader (pure; Kafka's rules).

The leader tracks, per follower, the offset it last fetched from (its log end offset:
a follower fetches from its own end, after appending everything it had). From those:

- **Caught up.** A follower is caught up while its log end offset reaches the leader's,
  and also, when it fetches at or past the leader's log end offset *as of its previous
  fetch*, as of that previous fetch (under steady writes a follower is rarely exactly at
  the end, yet it is keeping up). ``last_caught_up_ms`` records the last such moment.
- **High watermark** = the minimum log end offset over the ISR (the leader's own
  included), and it never goes back. A follower whose offset the leader has not yet
  heard (-1, e.g. right after a leader change) holds it where it is.
- **ISR shrink**: a follower in the ISR that is not at the leader's end and has not been
  caught up for ``replica_lag_ms_max`` leaves it.
- **ISR expand**: a follower outside the ISR whose offset reaches the high watermark and
  the start of the leader's current epoch (so it has this leader's records, not a
  divergent tail) and that fetched within ``replica_lag_ms_max`` joins it.

Time is ``now_ms`` from the caller; nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

UNKNOWN: Final = -1


@dataclass(frozen=True, slots=True)
class FollowerProgress:
    log_end_offset: int = UNKNOWN
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    leader_end_at_last_fetch: int = UNKNOWN


def on_fetch(
    progress: FollowerProgress, fetch_offset: int, leader_end_offset: int, now_ms: int
) -> FollowerProgress:
    """The follower's progress after a fetch from ``fetch_offset``."""
    caught_up = progress.last_caught_up_ms
    if fetch_offset >= leader_end_offset:
        caught_up = now_ms
    elif progress.leader_end_at_last_fetch != UNKNOWN and (
        fetch_offset >= progress.leader_end_at_last_fetch
    ):
        caught_up = max(caught_up, progress.last_fetch_ms)
    return FollowerProgress(fetch_offset, caught_up, now_ms, leader_end_offset)


def high_watermark(
    current: int,
    leader_id: int,
    leader_end_offset: int,
    isr: Sequence[int],
    followers: Mapping[int, FollowerProgress],
) -> int:
    """The new high watermark (never below ``current``)."""
    ends = [leader_end_offset]
    for replica in isr:
        if replica == leader_id:
            continue
        progress = followers.get(replica)
        ends.append(progress.log_end_offset if progress is not None else UNKNOWN)
    lowest = min(ends)
    return current if lowest == UNKNOWN else max(current, lowest)


def is_caught_up(
    progress: FollowerProgress | None, leader_end_offset: int, now_ms: int, lag_ms_max: int
) -> bool:
    if progress is None:
        return False
    if progress.log_end_offset >= leader_end_offset:
        return True
    return now_ms - progress.last_caught_up_ms <= lag_ms_max


def isr_after_shrink(
    leader_id: int,
    isr: Sequence[int],
    followers: Mapping[int, FollowerProgress],
    leader_end_offset: int,
    now_ms: int,
    lag_ms_max: int,
) -> tuple[int, ...]:
    """The ISR without the followers that fell behind (the same tuple when none did)."""
    return tuple(
        r
        for r in isr
        if r == leader_id or is_caught_up(followers.get(r), leader_end_offset, now_ms, lag_ms_max)
    )


def isr_after_expand(
    leader_id: int,
    replicas: Sequence[int],
    isr: Sequence[int],
    followers: Mapping[int, FollowerProgress],
    high_watermark_now: int,
    epoch_start_offset: int,
    now_ms: int,
    lag_ms_max: int,
) -> tuple[int, ...]:
    """The ISR plus the followers that caught up (the same tuple when none did)."""
    joining = []
    for replica in replicas:
        if replica == leader_id or replica in isr:
            continue
        progress = followers.get(replica)
        if progress is None or progress.log_end_offset == UNKNOWN:
            continue
        if (
            progress.log_end_offset >= high_watermark_now
            and progress.log_end_offset >= epoch_start_offset
            and now_ms - progress.last_fetch_ms <= lag_ms_max
        ):
            joining.append(replica)
    return tuple(isr) + tuple(joining)


# --------------------------------------------------------------------------- truncation


@dataclass(frozen=True, slots=True)
class TruncationStep:
    """Where a follower cuts its log after one OffsetForLeaderEpoch answer.

    ``offset``: truncate to it (never above the follower's log end offset). ``done``: the
    logs agree below ``offset``; when False, the follower asks again with its latest epoch
    after the cut (it did not know the epoch the leader answered with).
    """

    offset: int
    done: bool


def truncation_step(
    own_end_offset_for: Callable[[int], tuple[int, int]],
    log_end_offset: int,
    high_watermark: int,
    leader_answer_epoch: int,
    leader_answer_end_offset: int,
) -> TruncationStep:
    """Kafka's truncation rule (KIP-101 as amended by KIP-279), given the leader's answer
    ``(leader_answer_epoch, leader_answer_end_offset)`` to "where does my latest epoch end
    in your log?" and ``own_end_offset_for(epoch)``, the follower's own answer to the same
    question about any epoch.

    - The leader knows no epoch that old (-1, -1): keep what is committed, cut to the high
      watermark.
    - The follower knows the epoch the leader answered with: the logs agree up to the
      smaller of the two ends of that epoch.
    - It does not (the leader answered with an older epoch the follower never saw): cut to
      where the follower's own largest epoch below it ends, and ask again. Cutting only to
      the leader's end offset there would keep a tail of another epoch at offsets the
      leader filled differently: replicas of equal length with different bytes.
    """
    if leader_answer_end_offset < 0 or leader_answer_epoch < 0:
        return TruncationStep(min(high_watermark, log_end_offset), True)
    own_epoch, own_end = own_end_offset_for(leader_answer_epoch)
    if own_epoch < 0:
        return TruncationStep(min(leader_answer_end_offset, log_end_offset), True)
    if own_epoch != leader_answer_epoch:
        return TruncationStep(min(own_end, log_end_offset), False)
    return TruncationStep(min(own_end, leader_answer_end_offset, log_end_offset), True)
