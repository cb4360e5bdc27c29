"""Carry out the fault cycles of ``headwater.tools.chaos.nemesis`` on a ``ChaosCluster``.

``FaultInjector.run(cycle)`` picks the targets with the run's seeded rng (who leads what is
asked of the cluster at that moment), injects the fault, holds it, undoes it and records
a ``Nemesis`` start and end event (with the wall-clock time, to line up with the nodes'
logs). ``recover`` then brings every node back: heals the network, resumes paused nodes,
starts stopped ones, and waits (with deadlines) until they serve, agree on a controller
and, briefly, until the ISRs are full again.

Runs on the runner's main thread; ``time.sleep`` here is the nemesis holding a fault,
and Ctrl-C interrupts it.
"""

from __future__ import annotations

import random
import time
from datetime import datetime
from typing import Final

from headwater.tools.chaos import netns
from headwater.tools.chaos.cluster import ChaosCluster, wait_for
from headwater.tools.chaos.history import Nemesis
from headwater.tools.chaos.nemesis import Cycle, Fault
from headwater.tools.chaos.workload import Recorder

SUCCESSOR_DEADLINE_S: Final = 15.0
NO_CONTROLLER_S_MAX: Final = 5.0
"""Longest the nodes with healthy disks may go without an active controller while one
node's disk is full or slow (elections take well under a second; the rest is room for
a loaded machine)."""
SLOW_WRITE_MS: Final = (200, 3000)
SLOW_FSYNC_MS_MAX: Final = 5000
SERVE_DEADLINE_S: Final = 60.0
CONTROLLER_DEADLINE_S: Final = 30.0


def wall_clock() -> str:
    """The local time of day with milliseconds, as in the nodes' log lines."""
    return datetime.now().astimezone().strftime("%H:%M:%S.%f")[:-3]


class FaultInjector:
    def __init__(
        self,
        cluster: ChaosCluster,
        topic: str,
        partitions: int,
        rng: random.Random,
        recorder: Recorder,
        topology: netns.Topology | None,
        settle_isr_s: float,
    ) -> None:
        self.cluster = cluster
        self.topic = topic
        self.partitions = partitions
        self.rng = rng
        self.recorder = recorder
        self.topology = topology
        self.settle_isr_s = settle_isr_s
        self.timeline: list[tuple[int, int, int, str, tuple[int, ...]]] = []
        """(cycle, start ms, end ms, fault, nodes) of the cycles run."""
        self.crashes: list[str] = []
        """Nodes found down that no nemesis stopped: each fails the run."""
        self.alarms: list[str] = []
        """Broken promises seen during a fault (no controller while a majority of the
        nodes had healthy disks): each fails the run."""

    # ------------------------------------------------------------------ targets

    def _all(self) -> list[int]:
        return sorted(self.cluster.nodes)

    def _random(self, count: int = 1) -> list[int]:
        up = sorted(self.cluster.up())
        pool = up if len(up) >= count else self._all()
        return sorted(self.rng.sample(pool, count))

    def _leader(self) -> tuple[int, str]:
        partition = self.rng.randrange(self.partitions)
        leader = self.cluster.leader(self.topic, partition)
        if leader is None:
            return self._random()[0], f"partition {partition} has no leader: a random node"
        return leader, f"leader of partition {partition}"

    def _controller(self) -> tuple[int, str]:
        controller = self.cluster.controller()
        if controller is None:
            return self._random()[0], "no active controller: a random node"
        return controller, "the active controller"

    # ------------------------------------------------------------------ cycles

    def note_crashes(self) -> None:
        """Put every node found dead without a nemesis stopping it in ``crashes``."""
        exits = list(self.cluster.exited_on_their_own().items())
        exits += self.cluster.unexpected_exits
        self.cluster.unexpected_exits.clear()
        for node_id, status in exits:
            crash = f"node {node_id} exited on its own with status {status} (see its log)"
            self.crashes.append(crash)
            self.recorder.note(crash)

    def run(self, cycle: Cycle) -> None:
        self.note_crashes()
        start_ms = self.recorder.now_ms()
        hold_s = cycle.duration_ms / 1000
        nodes, what = self._inject(cycle, hold_s)
        self.recorder.add(
            Nemesis(
                cycle.number,
                cycle.fault.value,
                "end",
                tuple(nodes),
                f"{wall_clock()} {what}",
                self.recorder.now_ms(),
            )
        )
        self.timeline.append(
            (cycle.number, start_ms, self.recorder.now_ms(), cycle.fault.value, tuple(nodes))
        )

    def _started(self, cycle: Cycle, nodes: list[int], what: str) -> None:
        self.recorder.add(
            Nemesis(
                cycle.number,
                cycle.fault.value,
                "start",
                tuple(nodes),
                f"{wall_clock()} {what}, held {cycle.duration_ms} ms",
                self.recorder.now_ms(),
            )
        )

    def _inject(self, cycle: Cycle, hold_s: float) -> tuple[list[int], str]:
        fault = cycle.fault
        if fault in (Fault.KILL_RANDOM, Fault.KILL_LEADER, Fault.KILL_CONTROLLER, Fault.KILL_TWO):
            nodes, what = self._pick(fault)
            self._started(cycle, nodes, f"SIGKILL {what}")
            for n in nodes:
                self.cluster.kill(n)
            time.sleep(hold_s)
            for n in nodes:
                self.cluster.start(n)
            return nodes, f"restarted {nodes}"
        if fault in (Fault.PAUSE_LEADER, Fault.PAUSE_CONTROLLER, Fault.PAUSE_TWO):
            nodes, what = self._pick(fault)
            self._started(cycle, nodes, f"SIGSTOP {what}")
            for n in nodes:
                self.cluster.pause(n)
            time.sleep(hold_s)
            for n in nodes:
                self.cluster.resume(n)
            return nodes, f"SIGCONT {nodes}"
        if fault is Fault.PAUSE_THEN_KILL_SUCCESSOR:
            return self._pause_then_kill_successor(cycle, hold_s)
        if fault.needs_disks:
            return self._disk(cycle, hold_s)
        if fault is Fault.RESTART:
            (node,) = self._random()
            self._started(cycle, [node], f"SIGTERM node {node} (controlled shutdown)")
            status = self.cluster.terminate(node)
            time.sleep(hold_s)
            self.cluster.start(node)
            return [node], f"node {node} exited with {status}, started again"
        return self._partition(cycle, hold_s)

    def _pick(self, fault: Fault) -> tuple[list[int], str]:
        if fault in (Fault.KILL_LEADER, Fault.PAUSE_LEADER):
            node, why = self._leader()
            return [node], f"node {node} ({why})"
        if fault in (Fault.KILL_CONTROLLER, Fault.PAUSE_CONTROLLER):
            node, why = self._controller()
            return [node], f"node {node} ({why})"
        if fault in (Fault.KILL_TWO, Fault.PAUSE_TWO):
            nodes = self._random(2)
            return nodes, f"nodes {nodes}"
        nodes = self._random()
        return nodes, f"node {nodes[0]} (random)"

    def _pause_then_kill_successor(self, cycle: Cycle, hold_s: float) -> tuple[list[int], str]:
        partition = self.rng.randrange(self.partitions)
        old = self.cluster.leader(self.topic, partition)
        if old is None:
            old = self._random()[0]
        self._started(cycle, [old], f"SIGSTOP node {old} (leader of partition {partition})")
        self.cluster.pause(old)
        others = [n for n in self._all() if n != old]

        def successor() -> int | None:
            leader = self.cluster.leader(self.topic, partition, via=others)
            return leader if leader is not None and leader != old else None

        new = wait_for(successor, SUCCESSOR_DEADLINE_S, 0.1)
        if new is None:
            self.recorder.note(
                f"cycle {cycle.number}: no new leader of partition {partition} within "
                f"{SUCCESSOR_DEADLINE_S:g} s of pausing node {old}"
            )
            self.cluster.resume(old)
            return [old], "no successor appeared; SIGCONT"
        self.recorder.note(
            f"{wall_clock()} cycle {cycle.number}: node {new} leads partition {partition}: SIGKILL"
        )
        self.cluster.kill(new)
        time.sleep(hold_s)
        self.cluster.resume(old)
        time.sleep(min(hold_s, 1.0))
        self.cluster.start(new)
        return [old, new], f"SIGCONT node {old}, restarted node {new}"

    def _partition(self, cycle: Cycle, hold_s: float) -> tuple[list[int], str]:
        topology = self.topology
        assert topology is not None, f"{cycle.fault} needs network namespaces"
        fault = cycle.fault
        if fault in (Fault.PARTITION_ISOLATE, Fault.PARTITION_LEADER):
            if fault is Fault.PARTITION_LEADER:
                node, why = self._controller()
            else:
                node, why = self._random()[0], "random"
            others = tuple(n for n in self._all() if n != node)
            nodes, what = [node], f"isolate node {node} ({why}) from nodes {list(others)}"
            self._started(cycle, nodes, what)
            netns.cut(topology, (node,), others)
        elif fault is Fault.PARTITION_BRIDGE:
            bridge = self._random()[0]
            a, b = (n for n in self._all() if n != bridge)
            nodes, what = [a, b], f"cut nodes {a} and {b} apart; node {bridge} reaches both"
            self._started(cycle, nodes, what)
            netns.cut(topology, (a,), (b,))
        else:
            node, why = self._controller()
            nodes, what = [node], f"node {node} ({why}) receives nothing from the other nodes"
            self._started(cycle, nodes, what)
            for other in self._all():
                if other != node:
                    netns.drop_from(topology, node, other)
        time.sleep(hold_s)
        netns.heal(topology)
        return nodes, "healed"

    def _disk(self, cycle: Cycle, hold_s: float) -> tuple[list[int], str]:
        disks = self.cluster.disks
        assert disks is not None, f"{cycle.fault} needs the run's disks"
        if cycle.fault is Fault.DISK_FULL:
            (node,) = self._random()
            self._started(cycle, [node], f"fill node {node}'s file system (random)")
            filled = disks.fill(node)
            self.recorder.note(f"{wall_clock()} node {node}: ballast of {filled} bytes")
            self._watch_controller(cycle, node, hold_s)
            disks.empty(node)
            return [node], f"emptied node {node}'s file system"
        node, why = self._controller() if self.rng.random() < 0.5 else (self._random()[0], "random")
        write_ms = self.rng.randint(*SLOW_WRITE_MS)
        fsync_ms = self.rng.randint(write_ms, SLOW_FSYNC_MS_MAX)
        self._started(
            cycle,
            [node],
            f"slow node {node}'s disk ({why}): writes {write_ms} ms, fsyncs {fsync_ms} ms",
        )
        disks.slow(node, write_ms, fsync_ms)
        self._watch_controller(cycle, node, hold_s)
        disks.slow(node, 0, 0)
        return [node], f"node {node}'s disk fast again"

    def _watch_controller(self, cycle: Cycle, faulty: int, hold_s: float) -> None:
        """Hold the fault for ``hold_s`` while asking the other nodes for the active
        controller; an alarm when they had none for more than NO_CONTROLLER_S_MAX."""
        healthy = [n for n in self._all() if n != faulty]
        end = time.monotonic() + hold_s
        gap_began: float | None = None
        longest = 0.0
        while (now := time.monotonic()) < end:
            if self.cluster.controller(via=healthy) is None:
                gap_began = now if gap_began is None else gap_began
                longest = max(longest, now - gap_began)
            else:
                gap_began = None
            time.sleep(0.2)
        self.recorder.note(
            f"{wall_clock()} cycle {cycle.number}: nodes {healthy} went at most "
            f"{longest:.1f} s without an active controller"
        )
        if longest > NO_CONTROLLER_S_MAX:
            alarm = (
                f"cycle {cycle.number} ({cycle.fault}, node {faulty}): nodes {healthy} had no "
                f"active controller for {longest:.1f} s (at most {NO_CONTROLLER_S_MAX:g} s)"
            )
            self.alarms.append(alarm)
            self.recorder.note(alarm)

    # ------------------------------------------------------------------ recovery

    def recover(self) -> list[str]:
        """Heal, resume, start (noting in ``crashes`` any node that died by itself); wait
        for every node to serve and a controller to be agreed, then up to
        ``settle_isr_s`` for full ISRs. Returns the deadlines missed."""
        self.note_crashes()
        problems: list[str] = []
        if self.topology is not None:
            netns.heal(self.topology)
        for node_id, node in self.cluster.nodes.items():
            if node.paused:
                self.cluster.resume(node_id)
            if not node.running:
                self.cluster.start(node_id)
        late = self.cluster.wait_serving(self._all(), SERVE_DEADLINE_S)
        if late:
            problems.append(f"node(s) {late} not serving {SERVE_DEADLINE_S:g} s after recovery")
        if wait_for(self.cluster.controller, CONTROLLER_DEADLINE_S, 0.2) is None:
            problems.append(f"no active controller {CONTROLLER_DEADLINE_S:g} s after recovery")
        if self.settle_isr_s > 0 and not wait_for(
            lambda: self.cluster.in_sync(self.topic), self.settle_isr_s, 0.2
        ):
            self.recorder.note(f"ISRs not full {self.settle_isr_s:g} s after recovery")
        for problem in problems:
            self.recorder.note(problem)
        return problems

    def context(self, time_ms: int) -> str:
        """Where ``time_ms`` falls among the cycles: during one, or how long after one."""
        before = [c for c in self.timeline if c[1] <= time_ms]
        if not before:
            return "before the first fault"
        number, start, end, fault, nodes = before[-1]
        if time_ms <= end:
            return f"during cycle {number} ({fault} {list(nodes)}, {time_ms - start} ms in)"
        return f"{time_ms - end} ms after cycle {number} ({fault} {list(nodes)}) ended"
