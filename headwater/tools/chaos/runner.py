"""``python -m headwater.tools.chaos``: a Jepsen-style fault-injection run against 3 real nodes.

A run: start 3 ``headwater serve`` processes; create topic ``chaos`` (RF 3,
``min_insync_replicas=2``); start acks=all producers of unique values and consumers of
every partition (``headwater.tools.chaos.workload``), or with ``--client kafka`` librdkafka's
idempotent producers and a consumer group through the nodes' Kafka listeners
(``headwater.tools.chaos.kafka_workload``); run the planned fault cycles
(``headwater.tools.chaos.nemesis``, ``faults``); then heal, restart whatever is down, wait for
full ISRs, stop the producers, read every partition whole, run the checker
(``headwater.tools.chaos.checker``) and compare the replicas byte for byte below the high
watermark (``headwater.tools.chaos.replicas``). Exit status 0 when the checker finds no anomaly
and the replicas are identical, 1 otherwise, 130 on Ctrl-C.

Network partitions need the nodes in network namespaces. When a network nemesis is
chosen and the machine allows it (root, ``ip``, ``iptables``), this process makes the
namespaces (``headwater.tools.chaos.netns``), runs the whole run again inside the hub namespace
as a child (``ip netns exec``; the child gets ``--inside-netns``), forwards Ctrl-C and
SIGTERM to it, and removes the namespaces afterwards, whatever happened. Otherwise it
prints why, drops the network nemeses and runs on loopback.

Every process a run starts is stopped by its own process id. The seed is printed first;
the same seed gives the same fault plan, targets and workload choices (timing still
varies). A failing run keeps its directory (printed): ``history.jsonl`` (one event per
line, ``headwater.tools.chaos.history``; ``--check-history`` checks it again) and ``n<i>.log``,
each node's output.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

import click

from headwater.client import Admin, OffsetSpec
from headwater.shared.errors import HeadwaterError
from headwater.tools.chaos import nemesis, netns
from headwater.tools.chaos.checker import check
from headwater.tools.chaos.cluster import ChaosCluster, wait_for
from headwater.tools.chaos.disks import Disks, DisksUnavailableError
from headwater.tools.chaos.faults import FaultInjector, wall_clock
from headwater.tools.chaos.history import parse_lines
from headwater.tools.chaos.read_gaps import read_gaps
from headwater.tools.chaos.replicas import compare_metadata, compare_replicas, replicas_behind
from headwater.tools.chaos.report import (
    RunResult,
    build_examples,
    invariant_alarms,
    node_log_highlights,
    text_lines,
    to_json,
)
from headwater.tools.chaos.workload import ConsumerWorker, ProducerWorker, Recorder, final_read

if TYPE_CHECKING:
    from headwater.tools.chaos.kafka_workload import KafkaConsumerWorker, KafkaProducerWorker

TOPIC: Final = "chaos"
NODES: Final = 3
START_DEADLINE_S: Final = 60.0
IN_SYNC_DEADLINE_S: Final = 120.0
WARM_UP_DEADLINE_S: Final = 30.0
FLUSH_TIMEOUT_S: Final = 35.0
FINAL_READ_DEADLINE_S: Final = 120.0
RETRIES_WITH: Final = 20
GROUP_CATCH_UP_DEADLINE_S: Final = 90.0
CLIENTS: Final = ("grpc", "kafka")


class Producing(Protocol):
    """A producer worker: ``workload.ProducerWorker`` or ``kafka_workload.KafkaProducerWorker``."""

    @property
    def sent(self) -> int: ...
    @property
    def acknowledged(self) -> int: ...
    @property
    def stopped(self) -> bool: ...
    def start(self) -> None: ...
    def stop(self, flush_timeout_s: float) -> None: ...


class Consuming(Protocol):
    """A consumer worker: ``workload.ConsumerWorker`` or ``kafka_workload.KafkaConsumerWorker``."""

    @property
    def polled(self) -> int: ...
    @property
    def stopped(self) -> bool: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Options:
    cycles: int
    seed: int
    faults: tuple[nemesis.Fault, ...]
    partitions: int
    keep: Path | None
    as_json: bool
    time_limit_s: float | None
    producers: int
    consumers: int
    rate_per_s: float
    settle_isr_s: float
    network: str
    client: str = "grpc"

    def argv(self) -> list[str]:
        """The command-line arguments that give these options again (for the child)."""
        args = [
            f"--cycles={self.cycles}",
            f"--seed={self.seed}",
            f"--nemeses={','.join(f.value for f in self.faults)}",
            f"--partitions={self.partitions}",
            f"--producers={self.producers}",
            f"--consumers={self.consumers}",
            f"--rate={self.rate_per_s}",
            f"--settle-isr={self.settle_isr_s}",
            f"--network={self.network}",
            f"--client={self.client}",
        ]
        if self.keep is not None:
            args.append(f"--keep={self.keep}")
        if self.as_json:
            args.append("--json")
        if self.time_limit_s is not None:
            args.append(f"--time-limit={self.time_limit_s}")
        return args


def say(text: str) -> None:
    """Progress goes to stderr, so that --json leaves stdout to the JSON document."""
    print(f"[chaos {wall_clock()}] {text}", file=sys.stderr, flush=True)


def _stop_on_sigterm() -> None:
    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


# ----------------------------------------------------------------------------- the run


def _prepare_dir(keep: Path | None) -> Path:
    if keep is None:
        return Path(tempfile.mkdtemp(prefix="headwater-chaos-"))
    if keep.exists() and any(keep.iterdir()):
        raise click.UsageError(f"--keep {keep} is not empty (nodes would find old data there)")
    keep.mkdir(parents=True, exist_ok=True)
    return keep


def _prepare_disks(
    options: Options, run_dir: Path, result: RunResult
) -> tuple[Disks | None, Options]:
    """The run's disks when it has disk faults; the options less the disk faults this
    machine cannot run (noted in ``result.skipped`` and said)."""
    wanted = [f for f in options.faults if f.needs_disks]
    if not wanted:
        return None, options
    full = nemesis.Fault.DISK_FULL in wanted
    slow = nemesis.Fault.SLOW_DISK in wanted
    node_ids = tuple(range(1, NODES + 1))
    try:
        return Disks(run_dir, node_ids, full, slow), options
    except DisksUnavailableError as first:
        if full and slow:
            try:  # a machine without root may still build the slow disk
                disks = Disks(run_dir, node_ids, False, True)
            except DisksUnavailableError:
                pass
            else:
                return disks, _skip(options, result, [nemesis.Fault.DISK_FULL], str(first))
        return None, _skip(options, result, wanted, str(first))


def _skip(options: Options, result: RunResult, faults: list[nemesis.Fault], reason: str) -> Options:
    say(f"note: {', '.join(f.value for f in faults)} skipped: {reason}")
    result.skipped_nemeses += [f.value for f in faults]
    kept = tuple(f for f in options.faults if f not in faults)
    if not kept:
        raise click.UsageError(f"every nemesis chosen is unavailable here: {reason}")
    return dataclasses.replace(options, faults=kept)


def _start(cluster: ChaosCluster, options: Options, recorder: Recorder) -> None:
    for node_id in cluster.nodes:
        cluster.start(node_id)
    late = cluster.wait_serving(cluster.nodes, START_DEADLINE_S)
    if late:
        raise RuntimeError(f"node(s) {late} not serving after {START_DEADLINE_S:g} s")
    if wait_for(cluster.controller, START_DEADLINE_S, 0.2) is None:
        raise RuntimeError(f"no active controller after {START_DEADLINE_S:g} s")
    with Admin(cluster.bootstrap, request_timeout_s=30.0) as admin:
        admin.create_topic(TOPIC, options.partitions, NODES, {"min_insync_replicas": "2"})
    if not wait_for(lambda: cluster.in_sync(TOPIC), IN_SYNC_DEADLINE_S, 0.2):
        raise RuntimeError(f"topic {TOPIC} not in sync after {IN_SYNC_DEADLINE_S:g} s")
    recorder.note(f"{wall_clock()} cluster up: {cluster.bootstrap}, topic {TOPIC} in sync")


@dataclass
class Workload:
    """The run's producers and consumers, of either client."""

    producers: list[Producing] = field(default_factory=list)
    consumers: list[Consuming] = field(default_factory=list)
    kafka_producers: list[KafkaProducerWorker] = field(default_factory=list)
    kafka_consumers: list[KafkaConsumerWorker] = field(default_factory=list)
    kafka_log: logging.Logger | None = None

    def fatal_errors(self) -> list[str]:
        """One problem per fatal librdkafka error (none for the gRPC client)."""
        return [
            f"producer {w.name}: fatal librdkafka error: {e}"
            for w in self.kafka_producers
            for e in w.fatal
        ] + [
            f"consumer {w.name}: fatal librdkafka error: {e}"
            for w in self.kafka_consumers
            for e in w.fatal
        ]

    def counts(self) -> dict[str, int]:
        """What the workload did, for the summary: records sent and acknowledged, records
        the consumers polled (not the final read); with Kafka clients, the producers'
        epoch bumps, the consumer group's assignments and the times a member left and
        joined again."""
        out = {
            "sent": sum(p.sent for p in self.producers),
            "acknowledged": sum(p.acknowledged for p in self.producers),
            "consumed": sum(c.polled for c in self.consumers),
        }
        if self.kafka_producers:
            out["epoch_bumps"] = sum(p.epoch_bumps for p in self.kafka_producers)
        if self.kafka_consumers:
            out["group_assignments"] = sum(c.assignments for c in self.kafka_consumers)
            out["group_rejoins"] = sum(c.rejoins for c in self.kafka_consumers)
        return out

    def stop(self) -> None:
        for producer in self.producers:
            if not producer.stopped:
                producer.stop(1.0)
        for consumer in self.consumers:
            if not consumer.stopped:
                consumer.stop()
        if self.kafka_log is not None:
            from headwater.tools.chaos.kafka_workload import close_logger  # noqa: PLC0415

            close_logger(self.kafka_log)
            self.kafka_log = None


def _start_workload(
    cluster: ChaosCluster,
    options: Options,
    recorder: Recorder,
    rng: random.Random,
    run_dir: Path,
    workload: Workload,
) -> None:
    """Make and start the consumers, then the producers, of ``options.client``."""
    seeds = [rng.randrange(1 << 62) for _ in range(options.producers)]
    if options.client == "kafka":
        from headwater.tools.chaos import kafka_workload as kw  # noqa: PLC0415 (a dev dependency)

        servers = cluster.kafka_bootstrap
        workload.kafka_log = kw.client_logger(run_dir)
        workload.kafka_consumers = [
            kw.KafkaConsumerWorker(
                f"{prefix}{i}",
                servers,
                TOPIC,
                options.seed + i + offset,
                recorder,
                workload.kafka_log,
                protocol,
            )
            for prefix, offset, protocol in (("c", 0, kw.CLASSIC), ("n", 100, kw.CONSUMER))
            for i in range(options.consumers)
        ]
        workload.consumers = list(workload.kafka_consumers)
        for consumer in workload.consumers:
            consumer.start()
        workload.kafka_producers = [
            kw.KafkaProducerWorker(
                f"p{i}",
                servers,
                TOPIC,
                options.partitions,
                seeds[i],
                recorder,
                options.rate_per_s,
                workload.kafka_log,
                max_in_flight=5 if i % 2 == 0 else 1,
            )
            for i in range(options.producers)
        ]
        workload.producers = list(workload.kafka_producers)
    else:
        workload.consumers = [
            ConsumerWorker(f"c{i}", cluster.bootstrap, TOPIC, options.partitions, recorder)
            for i in range(options.consumers)
        ]
        for consumer in workload.consumers:
            consumer.start()
        workload.producers = [
            ProducerWorker(
                f"p{i}",
                cluster.bootstrap,
                TOPIC,
                options.partitions,
                seeds[i],
                0 if i % 2 == 0 else RETRIES_WITH,
                recorder,
                options.rate_per_s,
            )
            for i in range(options.producers)
        ]
    for producer in workload.producers:
        producer.start()


def _high_watermarks(bootstrap: str, partitions: int) -> dict[int, int]:
    with Admin(bootstrap, request_timeout_s=10.0) as admin:
        return {
            p: admin.list_offsets(TOPIC, OffsetSpec.LATEST, partitions=[p])[p]
            for p in range(partitions)
        }


def _group_catch_up(
    cluster: ChaosCluster, workload: Workload, options: Options, result: RunResult
) -> None:
    """Wait until, for every partition, a consumer of the group holds it at its high
    watermark (read to the end, or started there from the committed offset); a group
    that does not within GROUP_CATCH_UP_DEADLINE_S is stuck: a problem of the run."""
    if not workload.kafka_consumers:
        return
    ends = wait_for(lambda: _high_watermarks(cluster.bootstrap, options.partitions), 30.0, 0.5)
    if ends is None:
        result.problems.append("consumer group not checked: no high watermarks in 30 s")
        return
    behind: dict[tuple[str, int], int | None] = {}

    groups = sorted({c.group for c in workload.kafka_consumers})

    def caught_up() -> bool:
        behind.clear()
        for group in groups:
            reached: dict[int, int] = {}
            for consumer in workload.kafka_consumers:
                if consumer.group != group:
                    continue
                for p, position in consumer.positions().items():
                    reached[p] = max(reached.get(p, position), position)
            behind.update(
                {(group, p): reached.get(p) for p, end in ends.items() if reached.get(p, -1) < end}
            )
        return not behind

    if not wait_for(caught_up, GROUP_CATCH_UP_DEADLINE_S, 0.5):
        where = ", ".join(
            f"{group} partition {p} {'unassigned' if at is None else f'at {at}'} of {ends[p]}"
            for (group, p), at in sorted(behind.items())
        )
        result.problems.append(
            f"a consumer group did not read to the high watermarks in "
            f"{GROUP_CATCH_UP_DEADLINE_S:g} s: {where}"
        )


def _finish(
    cluster: ChaosCluster,
    injector: FaultInjector,
    workload: Workload,
    options: Options,
    recorder: Recorder,
    result: RunResult,
) -> None:
    """Heal, stop the workload, read everything, compare; every step that fails is a
    problem of the run, and the checker runs on the history whatever happened."""

    def step(what: str, action: Callable[[], None]) -> None:
        say(what)
        try:
            action()
        except (HeadwaterError, RuntimeError, OSError) as error:
            result.problems.append(f"{what}: {error}")

    def heal() -> None:
        result.problems.extend(injector.recover())
        if not wait_for(lambda: cluster.in_sync(TOPIC), IN_SYNC_DEADLINE_S, 0.5):
            result.problems.append(f"ISRs not full {IN_SYNC_DEADLINE_S:g} s after healing")

    def stop_workload() -> None:
        for producer in workload.producers:
            producer.stop(FLUSH_TIMEOUT_S)
        if workload.kafka_consumers:
            for member in workload.kafka_consumers:
                member.settle()
            say("waiting for the consumer group to read to the high watermarks")
            _group_catch_up(cluster, workload, options, result)
        for consumer in workload.consumers:
            consumer.stop()
        if not wait_for(lambda: cluster.in_sync(TOPIC), IN_SYNC_DEADLINE_S, 0.5):
            result.problems.append(f"ISRs not full {IN_SYNC_DEADLINE_S:g} s after the workload")

    def read_all() -> None:
        _, problems = final_read(
            cluster.bootstrap, TOPIC, options.partitions, recorder, FINAL_READ_DEADLINE_S
        )
        result.problems.extend(problems)

    def compare() -> None:
        with Admin(cluster.bootstrap, request_timeout_s=30.0) as admin:
            behind: list[str] = []

            def caught_up() -> bool:
                behind[:] = replicas_behind(admin, TOPIC)
                return not behind

            if not wait_for(caught_up, IN_SYNC_DEADLINE_S, 0.5):
                result.problems += [f"replica not caught up: {line}" for line in behind]
            result.replicas = compare_replicas(admin, TOPIC)
            say("comparing every node's metadata image")
            addresses = {b.node_id: b.address for b in admin.metadata([TOPIC]).brokers}
            result.metadata = compare_metadata(admin, addresses)

    step("healing: every node back, waiting for full ISRs", heal)
    step("stopping the workload", stop_workload)
    step("final read of every partition", read_all)
    step("comparing replicas", compare)
    injector.note_crashes()
    result.problems += injector.crashes + injector.alarms + workload.fatal_errors()
    history = recorder.events()
    result.report = check(history)
    if workload.kafka_consumers:
        result.read_gaps = read_gaps(history, {c.name: c.group for c in workload.kafka_consumers})
    result.examples = build_examples(result.report, history, injector.context)


def run(options: Options, topology: netns.Topology | None, skipped: list[str]) -> RunResult:
    """One run; raises KeyboardInterrupt on Ctrl-C (after stopping everything)."""
    began = time.monotonic()
    network = f"namespaces {topology.prefix}-*" if topology else "loopback"
    result = RunResult(options.seed, network, skipped, Counter(), client=options.client)
    run_dir = _prepare_dir(options.keep)
    result.run_dir = run_dir
    say(f"seed {options.seed}; run directory {run_dir}; {network}")
    rng = random.Random(options.seed)
    recorder = Recorder(run_dir / "history.jsonl")
    recorder.note(f"{wall_clock()} seed {options.seed}, options {options.argv()}")
    disks, options = _prepare_disks(options, run_dir, result)
    cluster = ChaosCluster(run_dir, NODES, topology, disks, kafka=options.client == "kafka")
    workload = Workload()
    try:
        _start(cluster, options, recorder)
        injector = FaultInjector(
            cluster, TOPIC, options.partitions, rng, recorder, topology, options.settle_isr_s
        )
        _start_workload(cluster, options, recorder, rng, run_dir, workload)
        producers = workload.producers
        if not wait_for(lambda: all(p.acknowledged for p in producers), WARM_UP_DEADLINE_S):
            result.problems.append(f"no acknowledged write in {WARM_UP_DEADLINE_S:g} s")
        plan = nemesis.plan(rng, options.faults, options.cycles)
        for cycle in plan:
            elapsed = time.monotonic() - began
            if options.time_limit_s is not None and elapsed > options.time_limit_s:
                say(f"time limit reached after {cycle.number - 1} cycles")
                break
            say(f"cycle {cycle.number}/{len(plan)}: {cycle.fault} for {cycle.duration_ms} ms")
            injector.run(cycle)
            result.cycles_by_nemesis[cycle.fault.value] += 1
            problems = injector.recover()
            if problems:
                say(f"cycle {cycle.number}: {'; '.join(problems)}")
            time.sleep(cycle.quiet_ms / 1000)
        _finish(cluster, injector, workload, options, recorder, result)
    except (HeadwaterError, RuntimeError) as error:
        result.problems.append(f"run stopped: {error}")
    except KeyboardInterrupt:
        say(f"interrupted; history and node logs kept in {run_dir}")
        raise
    finally:
        workload.stop()
        result.workload = workload.counts()
        for line in cluster.close():
            say(line)
        if disks is not None:
            disks.close()
        recorder.close()
        result.duration_s = time.monotonic() - began
        logs = {i: n.log_path for i, n in cluster.nodes.items()}
        result.node_log = node_log_highlights(logs)
        result.problems += invariant_alarms(logs)
    return result


def _conclude(result: RunResult, options: Options) -> int:
    """Print the result; remove the run's directory when it passed and --keep was not
    given, else say where it is. Returns the exit status."""
    if result.valid and options.keep is None and result.run_dir is not None:
        shutil.rmtree(result.run_dir, ignore_errors=True)
        result.run_dir = None
    if options.as_json:
        print(json.dumps(to_json(result), indent=1))
    else:
        print("\n".join(text_lines(result)))
    if result.run_dir is not None:
        say(f"history and node logs kept in {result.run_dir}")
    return 0 if result.valid else 1


# ----------------------------------------------------------------------------- namespaces


def _run_in_namespaces(topology: netns.Topology, options: Options) -> int:
    """Make the namespaces, run the run in the hub as a child, remove the namespaces (also
    when interrupted while making them)."""
    child: subprocess.Popen[bytes] | None = None
    interrupts = 0

    def forward(signum: int, _frame: object) -> None:
        nonlocal interrupts
        interrupts += 1
        if child is None:
            raise KeyboardInterrupt  # still making the namespaces: ``finally`` removes them
        if child.poll() is None:
            child.send_signal(signal.SIGKILL if interrupts > 2 else signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        netns.create(topology)
        say(
            f"created network namespaces {', '.join(topology.namespaces())} (bridge hwbr0 "
            f"{topology.hub_ip}/24 in the hub, node i at {topology.ip(1)[:-2]}1i)"
        )
        child = subprocess.Popen(
            [
                *topology.exec_prefix(topology.hub),
                sys.executable,
                "-m",
                "headwater.tools.chaos",
                *options.argv(),
                f"--inside-netns={topology.prefix}",
            ],
            start_new_session=True,  # signals reach it through this process only
        )
        return child.wait()
    finally:
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGKILL)
            child.wait()
        for line in netns.destroy(topology):
            say(line)
        left = netns.existing(topology)
        if left:
            say(f"WARNING: namespaces left behind: {left} (remove with: ip netns del NAME)")
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _choose_network(options: Options) -> tuple[netns.Topology | None, Options, list[str]]:
    """(topology to make, options to run with, nemeses skipped) for this machine."""
    wanted = [f for f in options.faults if f.needs_network]
    if not wanted:
        return None, options, []
    reason = "--network loopback" if options.network == "loopback" else netns.unavailable_reason()
    if reason is None:
        return netns.topology_for(os.getpid(), tuple(range(1, NODES + 1))), options, []
    if options.network == "netns":
        raise click.UsageError(f"--network netns: namespaces unavailable: {reason}")
    skipped = [f.value for f in wanted]
    kept = tuple(f for f in options.faults if not f.needs_network)
    say(f"note: network partitions skipped ({', '.join(skipped)}): {reason}; nodes on loopback")
    if not kept:
        raise click.UsageError("every nemesis chosen needs network namespaces, unavailable here")
    return None, dataclasses.replace(options, faults=kept), skipped


def _check_history(path: Path, as_json: bool) -> int:
    with open(path, encoding="utf-8") as lines:
        report = check(list(parse_lines(lines)))
    if as_json:
        print(json.dumps({"valid": report.valid(), "anomalies": report.counts()}))
    else:
        from headwater.tools.chaos.checker import summary_lines  # noqa: PLC0415

        print("\n".join(summary_lines(report)))
    return 0 if report.valid() else 1


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--cycles", type=click.IntRange(min=0), default=20, show_default=True)
@click.option("--seed", type=int, default=None, help="Seed of every random choice (printed).")
@click.option(
    "--nemeses",
    default="all",
    show_default=True,
    help="Comma-separated faults or prefixes (kill-*, pause-*, partition-*): "
    + ", ".join(f.value for f in nemesis.Fault),
)
@click.option("--partitions", type=click.IntRange(1, 64), default=6, show_default=True)
@click.option("--keep", type=click.Path(path_type=Path), help="Keep the run's files here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option(
    "--time-limit",
    "time_limit_s",
    type=click.FloatRange(min=0),
    help="Start no fault cycle after this many seconds.",
)
@click.option("--producers", type=click.IntRange(1, 8), default=2, show_default=True)
@click.option("--consumers", type=click.IntRange(0, 8), default=2, show_default=True)
@click.option(
    "--rate", "rate_per_s", type=click.FloatRange(min=1), default=40.0, show_default=True,
    help="Records per second per producer.",
)  # fmt: skip
@click.option(
    "--settle-isr", "settle_isr_s", type=click.FloatRange(min=0), default=10.0,
    show_default=True, help="Seconds to wait for full ISRs after each cycle.",
)  # fmt: skip
@click.option(
    "--network", type=click.Choice(["auto", "netns", "loopback"]), default="auto",
    show_default=True, help="Namespaces when possible (auto), always, or never.",
)  # fmt: skip
@click.option(
    "--client", type=click.Choice(CLIENTS), default="grpc", show_default=True,
    help="The workload's client: headwater.client over gRPC, or librdkafka (idempotent "
    "producers, a consumer group) over the nodes' Kafka listeners.",
)  # fmt: skip
@click.option(
    "--check-history", type=click.Path(exists=True, path_type=Path),
    help="Only check a kept history.jsonl and exit.",
)  # fmt: skip
@click.option("--inside-netns", hidden=True, default=None)
def main(
    cycles: int,
    seed: int | None,
    nemeses: str,
    partitions: int,
    keep: Path | None,
    as_json: bool,
    time_limit_s: float | None,
    producers: int,
    consumers: int,
    rate_per_s: float,
    settle_isr_s: float,
    network: str,
    client: str,
    check_history: Path | None,
    inside_netns: str | None,
) -> None:
    """Run Headwater under faults (kills, pauses, restarts, network partitions) and check
    the history for lost, unseen, reordered, skipped and inconsistent records. See
    docs/chaos.md."""
    if check_history is not None:
        sys.exit(_check_history(check_history, as_json))
    try:
        faults = nemesis.parse_faults(nemeses)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--nemeses") from None
    if client == "kafka":
        try:
            import confluent_kafka  # noqa: F401, PLC0415
        except ImportError:
            raise click.ClickException(
                "--client kafka needs confluent-kafka (a dev dependency: make installs it)"
            ) from None
    options = Options(
        cycles=cycles,
        seed=seed if seed is not None else secrets.randbelow(1 << 31),
        faults=faults,
        partitions=partitions,
        keep=keep.resolve() if keep is not None else None,
        as_json=as_json,
        time_limit_s=time_limit_s,
        producers=producers,
        consumers=consumers,
        rate_per_s=rate_per_s,
        settle_isr_s=settle_isr_s,
        network=network,
        client=client,
    )
    if inside_netns is None:
        topology, options, skipped = _choose_network(options)
        if topology is not None:
            try:
                sys.exit(_run_in_namespaces(topology, options))
            except netns.NetnsError as exc:
                if options.network == "netns":
                    raise click.ClickException(str(exc)) from None
                say(f"note: could not make network namespaces ({exc}); nodes on loopback")
                kept = tuple(f for f in options.faults if not f.needs_network)
                skipped = [f.value for f in options.faults if f.needs_network]
                options = dataclasses.replace(options, faults=kept)
                topology = None
    else:
        topology = netns.Topology(inside_netns, tuple(range(1, NODES + 1)))
        skipped = []
    _stop_on_sigterm()
    say(f"seed {options.seed} (python -m headwater.tools.chaos {' '.join(options.argv())})")
    try:
        result = run(options, topology, skipped)
    except KeyboardInterrupt:
        say("interrupted; every process stopped")
        sys.exit(130)
    sys.exit(_conclude(result, options))
