"""Every client RPC with edge values, then mutated requests, against a real node: typed
answers only (no UNKNOWN or INTERNAL status), no ERROR or traceback in the node's log,
no fenced broker, and the node still serving (``tests.rpc_sweep``; ``make fuzz`` runs a
long fuzz)."""

from __future__ import annotations

import random
from pathlib import Path

import grpc

from tests.node_process import NodeProcess
from tests.rpc_sweep import findings, fuzz_cases, prepare, run_case, sweep_cases

FUZZ_CASES = 1000


def test_every_client_rpc_at_its_edges_answers_with_typed_errors(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "data", log_path=tmp_path / "node.log")
    node.start()
    try:
        prepare(node.address)
        with grpc.insecure_channel(node.address) as channel:
            cases = [*sweep_cases(), *fuzz_cases(random.Random(20261127), FUZZ_CASES)]
            outcomes = [(case, run_case(channel, case)) for case in cases]
        found = findings(node, outcomes)
    finally:
        node.kill()
    assert not found, "\n".join(found[:40])
    answered = {code for _case, code in outcomes}
    assert grpc.StatusCode.OK in answered and grpc.StatusCode.INVALID_ARGUMENT in answered
