"""The outcome of a chaos run: what it did, what the checker and the replica comparison
found, examples of each anomaly placed among the fault cycles, and the node log lines
worth reading; printed for people or as one JSON document.

The JSON document (``--json``)::

    {"valid": bool, "seed": int, "network": str, "client": "grpc" | "kafka",
     "skipped_nemeses": [str],
     "workload": {"sent", "acknowledged", "consumed": int,
                  "epoch_bumps", "group_assignments", "group_rejoins": int (Kafka
                  clients only)},
     "cycles": int, "cycles_by_nemesis": {name: int}, "duration_s": float,
     "sends": {"ok": int, "fail": int, "info": int, "ok_without_offset": int},
     "polled_records": int, "final_records": int,
     "anomalies": {name: count}, "failures": {name: count},
     "examples": {name: [case with "context"]},
     "replicas": {"identical": bool, "partitions": [...]},
     "metadata": {"identical": bool, "differences": [str], "errors": [...],
                  "views": [{"node_id", "offset", "sha256"}]} | null,
     "group_read_gaps": {group: {"longest_ms": int, "cycle": int, "nemesis": str,
                                 "open": bool, "by_nemesis": {name: int}}} (Kafka clients),
     "problems": [str], "node_log": {node id: [line]}, "run_dir": str | null}
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from headwater.tools.chaos.checker import TOLERATED_DEFAULT, Report, case_json, summary_lines
from headwater.tools.chaos.history import Event, Poll, Send
from headwater.tools.chaos.read_gaps import ReadGap, longest_by_group
from headwater.tools.chaos.replicas import (
    MetadataComparison,
    PartitionComparison,
    comparison_json,
    metadata_comparison_json,
)

EXAMPLES_MAX: Final = 5
LOG_LINES_MAX: Final = 12
LOG_PATTERN: Final = re.compile(r"CRITICAL|ERROR|Traceback|truncat|below the high watermark")
ALARM_PATTERN: Final = re.compile(
    r"truncating already-applied|conflicts with the committed entry"
    r"|below this replica's high watermark"
)
"""Node log lines that mean a replication or metadata invariant was attacked: a run with
any of them fails even if the checker found nothing."""


@dataclass
class RunResult:
    seed: int
    network: str
    skipped_nemeses: list[str]
    cycles_by_nemesis: Counter[str]
    duration_s: float = 0.0
    report: Report | None = None
    replicas: list[PartitionComparison] = field(default_factory=list)
    metadata: MetadataComparison | None = None
    problems: list[str] = field(default_factory=list)
    node_log: dict[int, list[str]] = field(default_factory=dict)
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    run_dir: Path | None = None
    client: str = "grpc"
    """The workload's client (``--client``): "grpc" or "kafka"."""
    workload: dict[str, int] = field(default_factory=dict)
    """What the producers and consumers did (``runner.Workload.counts``)."""
    read_gaps: tuple[ReadGap, ...] = ()
    """How long each consumer group went without reading after each fault (Kafka-client
    runs: ``headwater.tools.chaos.read_gaps``)."""

    @property
    def replicas_identical(self) -> bool:
        return bool(self.replicas) and all(c.identical for c in self.replicas)

    @property
    def valid(self) -> bool:
        return (
            self.report is not None
            and self.report.valid(TOLERATED_DEFAULT)
            and self.replicas_identical
            and self.metadata is not None
            and self.metadata.identical
            and not self.problems
        )


def case_times(history: Iterable[Event]) -> Callable[[object], int | None]:
    """A function giving the history time (ms) a case points at: the acknowledgement of
    its value's send, or for a value never acknowledged its first poll; a poll case
    carries its own time."""
    sent: dict[str, int] = {}
    first_polled: dict[str, int] = {}
    for event in history:
        if isinstance(event, Send):
            sent[event.value] = event.time_ms
        elif isinstance(event, Poll):
            for r in event.records:
                first_polled.setdefault(r.value, event.time_ms)

    def time_of(case: object) -> int | None:
        own = getattr(case, "time_ms", None)
        if isinstance(own, int) and own > 0:
            return own
        values = getattr(case, "values", None) or (getattr(case, "value", None),)
        times = [sent.get(v, first_polled.get(v)) for v in values if isinstance(v, str)]
        known = [t for t in times if t is not None]
        return min(known) if known else None

    return time_of


def build_examples(
    report: Report, history: list[Event], context: Callable[[int], str]
) -> dict[str, list[dict[str, Any]]]:
    time_of = case_times(history)
    out: dict[str, list[dict[str, Any]]] = {}
    for name, cases in report.cases().items():
        if not cases:
            continue
        rows = []
        for case in cases[:EXAMPLES_MAX]:
            data = case_json(case)
            row: dict[str, Any] = data if isinstance(data, dict) else {"partition": data}
            when = time_of(case)
            if when is not None:
                row["context"] = context(when)
            rows.append(row)
        out[name] = rows
    return out


def node_log_highlights(logs: dict[int, Path]) -> dict[int, list[str]]:
    """Per node, the first lines that say something went wrong (errors, tracebacks,
    truncations), at most LOG_LINES_MAX, and a count of the rest."""
    out: dict[int, list[str]] = {}
    for node_id, path in sorted(logs.items()):
        if not path.exists():
            continue
        hits = [
            line.rstrip()
            for line in path.read_text(errors="replace").splitlines()
            if LOG_PATTERN.search(line)
        ]
        if hits:
            extra = (
                [f"... and {len(hits) - LOG_LINES_MAX} more"] if len(hits) > LOG_LINES_MAX else []
            )
            out[node_id] = hits[:LOG_LINES_MAX] + extra
    return out


def invariant_alarms(logs: dict[int, Path]) -> list[str]:
    """One problem per node whose log holds ALARM_PATTERN lines (count and the first)."""
    problems = []
    for node_id, path in sorted(logs.items()):
        if not path.exists():
            continue
        hits = [
            line.strip()
            for line in path.read_text(errors="replace").splitlines()
            if ALARM_PATTERN.search(line)
        ]
        if hits:
            problems.append(f"node {node_id} logged {len(hits)} invariant alarm(s): {hits[0]}")
    return problems


def to_json(result: RunResult) -> dict[str, Any]:
    report = result.report
    return {
        "valid": result.valid,
        "seed": result.seed,
        "network": result.network,
        "client": result.client,
        "workload": result.workload,
        "skipped_nemeses": result.skipped_nemeses,
        "cycles": sum(result.cycles_by_nemesis.values()),
        "cycles_by_nemesis": dict(sorted(result.cycles_by_nemesis.items())),
        "duration_s": round(result.duration_s, 1),
        "sends": (
            {
                "ok": report.sends.ok,
                "fail": report.sends.fail,
                "info": report.sends.info,
                "ok_without_offset": report.sends.ok_without_offset,
            }
            if report
            else None
        ),
        "polled_records": report.polled_records if report else 0,
        "final_records": report.final_records if report else 0,
        "anomalies": report.counts() if report else {},
        "failures": report.failures() if report else {},
        "examples": result.examples,
        "replicas": {
            "identical": result.replicas_identical,
            "partitions": [comparison_json(c) for c in result.replicas],
        },
        "metadata": metadata_comparison_json(result.metadata) if result.metadata else None,
        "group_read_gaps": _read_gaps_json(result.read_gaps),
        "problems": result.problems,
        "node_log": {str(k): v for k, v in result.node_log.items()},
        "run_dir": str(result.run_dir) if result.run_dir else None,
    }


def _read_gaps_json(gaps: tuple[ReadGap, ...]) -> dict[str, Any]:
    """{group: {"longest_ms", "cycle", "nemesis", "open", "by_nemesis": {name: longest
    ms}}}."""
    out: dict[str, Any] = {}
    for group, longest in longest_by_group(gaps).items():
        by_nemesis: dict[str, int] = {}
        for gap in gaps:
            if gap.group == group:
                by_nemesis[gap.nemesis] = max(by_nemesis.get(gap.nemesis, 0), gap.gap_ms)
        out[group] = {
            "longest_ms": longest.gap_ms,
            "cycle": longest.cycle,
            "nemesis": longest.nemesis,
            "open": longest.open,
            "by_nemesis": dict(sorted(by_nemesis.items())),
        }
    return out


def text_lines(result: RunResult) -> list[str]:
    lines = [f"seed {result.seed}; network: {result.network}; client: {result.client}"]
    if result.skipped_nemeses:
        lines.append(f"skipped nemeses: {', '.join(result.skipped_nemeses)}")
    total = sum(result.cycles_by_nemesis.values())
    lines.append(f"fault cycles: {total} in {result.duration_s:.0f} s")
    lines += [f"  {name:<27} {n}" for name, n in sorted(result.cycles_by_nemesis.items())]
    if result.workload:
        lines.append("workload: " + ", ".join(f"{k} {v}" for k, v in result.workload.items()))
    if result.report is not None:
        lines += summary_lines(result.report)
    for group, longest in sorted(longest_by_group(result.read_gaps).items()):
        lines.append(
            f"group {group}: at most {longest.gap_ms / 1000:.1f} s without reading after a "
            f"fault (cycle {longest.cycle}, {longest.nemesis}"
            + (", and never again)" if longest.open else ")")
        )
    for name, rows in result.examples.items():
        lines.append(f"{name}: e.g.")
        lines += [f"  {row}" for row in rows]
    if result.replicas:
        differing = [c for c in result.replicas if not c.identical]
        if not differing:
            ranges = ", ".join(
                f"{c.partition}:[{c.start_offset},{c.end_offset})" for c in result.replicas
            )
            lines.append(f"replicas: identical below the high watermark ({ranges})")
        for c in differing:
            lines.append(
                f"replicas of partition {c.partition} differ in [{c.start_offset}, {c.end_offset}):"
            )
            lines += [f"  {d}" for d in c.differences]
            lines += [f"  node {n}: {e}" for n, e in c.errors]
    else:
        lines.append("replicas: not compared")
    metadata = result.metadata
    if metadata is None:
        lines.append("metadata images: not compared")
    elif metadata.identical:
        view = metadata.views[0]
        lines.append(
            f"metadata images: identical on {len(metadata.views)} nodes "
            f"(offset {view.offset}, sha256 {view.digest[:16]})"
        )
    else:
        lines.append("metadata images differ:")
        lines += [f"  {d}" for d in metadata.differences]
        lines += [f"  node {n}: {e}" for n, e in metadata.errors]
    lines += [f"problem: {p}" for p in result.problems]
    if not result.valid:  # normal truncations of unreplicated tails are noise otherwise
        for node_id, log_lines in result.node_log.items():
            lines.append(f"node {node_id} log:")
            lines += [f"  {line}" for line in log_lines]
    lines.append("result: " + ("PASS" if result.valid else "FAIL"))
    return lines
