"""Generated stubs are never edited by hand and never stale."""

from __future__ import annotations

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_grpc_stubs_are_fresh(tmp_path: Path) -> None:
    generate = runpy.run_path(str(ROOT / "scripts/gen_proto.py"))["generate"]
    fresh = {p.name: p.read_bytes() for p in generate(tmp_path)}
    committed = {p.name: p.read_bytes() for p in (ROOT / "proto/headwater/v1").glob("*_pb2*")}
    assert fresh.keys() == committed.keys()
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stale generated stubs {stale}: run make proto"
