"""High watermark and ISR math (headwater.node.replicas.replication) against simple oracles."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from headwater.node.replicas import replication as rep

LAG_MS_MAX = 1000


@st.composite
def leader_views(
    draw: st.DrawFn,
) -> tuple[int, list[int], list[int], dict[int, rep.FollowerProgress]]:
    replicas = list(range(1, draw(st.integers(1, 5)) + 1))
    leader = draw(st.sampled_from(replicas))
    isr = [leader] + [r for r in replicas if r != leader and draw(st.booleans())]
    leader_end = draw(st.integers(0, 100))
    followers = {
        r: rep.FollowerProgress(log_end_offset=draw(st.integers(-1, leader_end)))
        for r in replicas
        if r != leader and draw(st.booleans())
    }
    return leader, replicas, isr, followers


@given(leader_views(), st.integers(0, 100))
def test_high_watermark_is_the_minimum_over_the_isr_and_never_goes_back(
    view: tuple[int, list[int], list[int], dict[int, rep.FollowerProgress]], current: int
) -> None:
    leader, _, isr, followers = view
    leader_end = max([current] + [p.log_end_offset for p in followers.values()])
    ends = [leader_end] + [
        followers[r].log_end_offset if r in followers else -1 for r in isr if r != leader
    ]
    oracle = current if -1 in ends else max(current, min(ends))
    assert rep.high_watermark(current, leader, leader_end, isr, followers) == oracle


@given(leader_views(), st.integers(0, 5000))
def test_shrink_drops_exactly_the_lagging_followers(
    view: tuple[int, list[int], list[int], dict[int, rep.FollowerProgress]], now: int
) -> None:
    leader, _, isr, followers = view
    leader_end = 100
    stamped = {
        r: rep.FollowerProgress(p.log_end_offset, last_caught_up_ms=now - 700 * r)
        for r, p in followers.items()
    }
    kept = rep.isr_after_shrink(leader, isr, stamped, leader_end, now, LAG_MS_MAX)
    for r in isr:
        p = stamped.get(r)
        in_sync = r == leader or (
            p is not None
            and (p.log_end_offset >= leader_end or now - p.last_caught_up_ms <= LAG_MS_MAX)
        )
        assert (r in kept) == in_sync
    assert kept[0] == isr[0] and set(kept) <= set(isr)


@given(leader_views(), st.integers(0, 100), st.integers(0, 100))
def test_expand_adds_followers_that_reached_the_high_watermark_and_the_epoch(
    view: tuple[int, list[int], list[int], dict[int, rep.FollowerProgress]],
    hw: int,
    epoch_start: int,
) -> None:
    leader, replicas, isr, followers = view
    now = 10_000
    fresh = {
        r: rep.FollowerProgress(p.log_end_offset, last_fetch_ms=now - 10)
        for r, p in followers.items()
    }
    grown = rep.isr_after_expand(leader, replicas, isr, fresh, hw, epoch_start, now, LAG_MS_MAX)
    assert tuple(grown[: len(isr)]) == tuple(isr)
    for r in replicas:
        if r in isr:
            continue
        p = fresh.get(r)
        joins = (
            p is not None and p.log_end_offset >= max(hw, epoch_start) and p.log_end_offset != -1
        )
        assert (r in grown) == joins


def test_caught_up_under_steady_writes_counts_the_previous_fetch() -> None:
    """A follower that fetches up to where the leader was at its previous fetch is
    keeping up, even though the leader has moved on again (Kafka's rule)."""
    p = rep.FollowerProgress()
    p = rep.on_fetch(p, fetch_offset=0, leader_end_offset=10, now_ms=100)  # behind
    assert p.last_caught_up_ms == 0
    p = rep.on_fetch(p, fetch_offset=10, leader_end_offset=20, now_ms=200)
    assert p.last_caught_up_ms == 100  # it had what the leader had at t=100
    p = rep.on_fetch(p, fetch_offset=20, leader_end_offset=20, now_ms=300)
    assert p.last_caught_up_ms == 300
    assert rep.is_caught_up(p, leader_end_offset=20, now_ms=10_000, lag_ms_max=LAG_MS_MAX)
    assert not rep.is_caught_up(p, leader_end_offset=25, now_ms=10_000, lag_ms_max=LAG_MS_MAX)
