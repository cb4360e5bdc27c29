"""When a metadata voter may stand for election, and when it grants a pre-vote (pure).

pysyncobj 0.3.17 has neither PreVote nor a rule for voters with bad disks: a voter whose
thread stalled on a slow disk missed the leader's heartbeats, started an election with a
higher term when it woke, and so deposed a healthy leader; with writes delayed by seconds
there was no controller for 36 s. The quorum (``RaftFollowerGuard``) adds the Raft
thesis' PreVote (§9.6) in front of pysyncobj's elections:

- A voter whose election timeout ran out first asks the others for a *pre-vote* for the
  term it would stand in. Nobody's term changes. Only with a majority of grants (its own
  included) does it start the real election.
- A voter grants a pre-vote (``grant_pre_vote``) only when it has not heard from a
  leader for about an election timeout (the shortest, less two heartbeat periods: the
  candidate's timer started at a heartbeat that reached the others up to one period
  apart), is not the leader itself, its own journal can be
  written, and the candidate's log is at least as up to date as its own (the RequestVote
  rule). So a voter that was cut off, paused or stalled cannot depose a leader that a
  majority still hears.
- A voter stands (``may_stand``) only when its journal can be written; when its journal
  writes were slow lately it waits ``slow_candidacy_delay_s`` without a leader first, so
  that voters with healthy disks win, and a cluster whose disks are all slow still
  elects one.

CheckQuorum is pysyncobj's leader fallback (``leaderFallbackTimeout``): a leader that
has not heard from a majority for that long steps down.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LogPosition:
    """(term, index) of a voter's last journal entry: Raft's "up to date" order."""

    term: int
    index: int

    def at_least(self, other: LogPosition) -> bool:
        return (self.term, self.index) >= (other.term, other.index)


def grant_pre_vote(
    *,
    own_term: int,
    own_log: LogPosition,
    candidate_term: int,
    candidate_log: LogPosition,
    since_leader_s: float,
    election_timeout_s: float,
    is_leader: bool,
    journal_failed: bool,
) -> bool:
    """Would this voter vote for the candidate in ``candidate_term`` (the term it would
    stand in)? See the module doc."""
    return (
        not is_leader
        and not journal_failed
        and candidate_term > own_term
        and since_leader_s >= election_timeout_s
        and candidate_log.at_least(own_log)
    )


def may_stand(
    *,
    journal_failed: bool,
    journal_slow: bool,
    since_leader_s: float,
    slow_candidacy_delay_s: float,
) -> bool:
    """May a voter whose election timeout ran out ask for pre-votes now?"""
    if journal_failed:
        return False
    return not journal_slow or since_leader_s >= slow_candidacy_delay_s


def has_majority(grants: int, voters: int) -> bool:
    """Do ``grants`` (the candidate's own included) make a majority of ``voters``?"""
    return grants > voters / 2
