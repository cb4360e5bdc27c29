"""How a Raft follower takes an AppendEntries message: the rule of the Raft paper (§5.3),
which pysyncobj 0.3.17 does not follow, as a pure decision.

pysyncobj deletes every entry after ``prevLogIdx`` whenever its log is longer, then
appends the message's entries. A message that arrives late or repeats what the follower
already has (a heartbeat sent before the follower's last append was acknowledged, a
resend after ``next_node_idx`` was reset) therefore cuts committed, applied entries off
the journal and moves the commit index back (pysyncobj logs "truncating already-applied
log entries"). The entries come back with the next message, but until then a committed
entry may be held by fewer voters than a majority, so a leader failure in between can
elect a voter that lacks it: a committed metadata batch lost, and voters whose images
differ.

The rule, for a message whose ``prevLogIdx`` entry matches in term (anything else is
refused by pysyncobj without touching the log):

- entries the follower already holds with the same index and term are skipped (by the
  Log Matching Property they, and everything before them, are the leader's);
- the first entry that differs in term, and everything after it, is deleted, and the
  rest of the message appended; nothing is deleted for any other reason;
- a message that adds nothing leaves a longer log as it is; the follower acknowledges
  only what the message proved it shares with the leader, and commits no further than
  that (its tail may still be an old term's);
- a conflict at or below the follower's commit index cannot happen in Raft (a committed
  entry is in every later leader's log): such a message is refused, never applied.

Invariant: the follower's journal never loses an entry at or below its commit index, and
its commit index never moves back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

Entry = tuple[Any, int, int]
"""pysyncobj's log entry: (command bytes, index, term)."""


class AppendAction(Enum):
    DEFER = "defer"  # hand the message on unchanged: pysyncobj refuses it (no match at prev)
    APPEND = "append"  # hand on the rewritten message: deletes only a conflicting suffix
    ACKNOWLEDGE = "acknowledge"  # nothing to add; keep the longer log, acknowledge prev_index
    REFUSE = "refuse"  # would delete a committed entry, or the message is malformed


@dataclass(frozen=True, slots=True)
class AppendPlan:
    action: AppendAction
    prev_index: int = 0
    prev_term: int = 0
    entries: tuple[Entry, ...] = ()
    commit_limit: int = 0  # the follower commits no further than this
    reason: str = ""


def plan_append(
    term_at: Callable[[int], int | None],
    last_index: int,
    committed_index: int,
    prev_index: int,
    prev_term: int | None,
    entries: Sequence[Entry],
    leader_commit: int,
) -> AppendPlan:
    """Decide what a follower does with AppendEntries(prev_index, prev_term, entries,
    leader_commit). ``term_at(i)`` is the term of the follower's entry i, None when it has
    none (beyond its log, or compacted into a snapshot); ``last_index`` its last entry;
    ``committed_index`` the highest index it has committed or applied."""
    if not isinstance(prev_term, int) or term_at(prev_index) != prev_term:
        return AppendPlan(AppendAction.DEFER)
    for offset, entry in enumerate(entries):
        if (
            not isinstance(entry, tuple)
            or len(entry) != 3
            or not isinstance(entry[1], int)
            or not isinstance(entry[2], int)
            or entry[1] != prev_index + 1 + offset
        ):
            return AppendPlan(
                AppendAction.REFUSE,
                reason=f"entry {offset} is not (command, index {prev_index + 1 + offset}, term)",
            )
    matched_index, matched_term = prev_index, prev_term
    skip = 0
    for entry in entries:
        index, term = entry[1], entry[2]
        if index > last_index or term_at(index) != term:
            break
        matched_index, matched_term = index, term
        skip += 1
    remaining = tuple(entries[skip:])
    if remaining:
        first = matched_index + 1
        if first <= last_index and first <= committed_index:
            return AppendPlan(
                AppendAction.REFUSE,
                reason=(
                    f"entry {first} (term {remaining[0][2]}) conflicts with the committed "
                    f"entry of term {term_at(first)} (commit index {committed_index})"
                ),
            )
        last_new = remaining[-1][1]
        return AppendPlan(
            AppendAction.APPEND,
            matched_index,
            matched_term,
            remaining,
            min(leader_commit, last_new),
        )
    if matched_index == last_index:
        return AppendPlan(
            AppendAction.APPEND,
            matched_index,
            matched_term,
            (),
            min(leader_commit, matched_index),
        )
    return AppendPlan(
        AppendAction.ACKNOWLEDGE,
        matched_index,
        matched_term,
        (),
        min(leader_commit, matched_index),
    )
