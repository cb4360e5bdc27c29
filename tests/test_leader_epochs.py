"""The leader-epoch cache against a dumb oracle: a list of (offset, epoch) per record."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from headwater.log.leader_epochs import LeaderEpochCache


def oracle_end_offset(epochs_by_offset: list[int], epoch: int) -> tuple[int, int]:
    """Largest epoch <= ``epoch`` present in the log, and one past its last record."""
    present = [e for e in epochs_by_offset if e <= epoch]
    if not present:
        return -1, -1
    found = max(present)
    last = max(i for i, e in enumerate(epochs_by_offset) if e == found)
    return found, last + 1


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5)), max_size=12), st.integers(0, 70))
def test_cache_matches_the_oracle_through_appends_and_truncations(
    runs: list[tuple[int, int]], cut: int
) -> None:
    cache = LeaderEpochCache()
    epochs_by_offset: list[int] = []
    epoch = 0
    for step, count in runs:
        epoch += step
        cache.assign(epoch, len(epochs_by_offset))
        epochs_by_offset += [epoch] * count
    # Epochs assigned without records (step with zero records) never happen here; every
    # assigned epoch wrote `count` >= 1 records, so the oracle and the cache agree.
    for asked in range(-1, epoch + 2):
        assert cache.end_offset_for(asked, len(epochs_by_offset)) == oracle_end_offset(
            epochs_by_offset, asked
        )
    cut = min(cut, len(epochs_by_offset))
    cache.truncate_from_end(cut)
    epochs_by_offset = epochs_by_offset[:cut]
    for asked in range(-1, epoch + 2):
        assert cache.end_offset_for(asked, cut) == oracle_end_offset(epochs_by_offset, asked)
    assert LeaderEpochCache.from_text(cache.to_text()).entries == cache.entries


def test_retention_moves_the_first_epoch_start() -> None:
    cache = LeaderEpochCache()
    cache.assign(1, 0)
    cache.assign(2, 10)
    cache.assign(5, 20)
    cache.truncate_from_start(15)
    assert [(e.epoch, e.start_offset) for e in cache.entries] == [(2, 15), (5, 20)]


def test_a_lower_epoch_from_the_leader_replaces_a_later_unwritten_one() -> None:
    cache = LeaderEpochCache()
    cache.assign(3, 0)
    cache.assign(6, 10)  # this replica led at epoch 6 from offset 10, wrote nothing
    cache.assign(5, 10)  # the leader's log has epoch 5 records from offset 10
    assert [(e.epoch, e.start_offset) for e in cache.entries] == [(3, 0), (5, 10)]
