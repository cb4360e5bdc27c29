"""Regenerate the gRPC/protobuf stubs of proto/headwater/v1 (``make proto``).

Usage: python scripts/gen_proto.py [OUT_DIR]

Writes headwater/v1/*_pb2.py, *_pb2_grpc.py and *.pyi under OUT_DIR (default: proto/),
so that the stubs import as ``headwater.v1.*``. tests/test_proto_fresh.py regenerates
into a temporary folder and fails when the committed stubs differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"


def generate(out_dir: Path) -> list[Path]:
    """Run protoc on every .proto under proto/headwater/v1; return the files written."""
    protos = sorted(
        str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "headwater/v1").glob("*.proto")
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--plugin=protoc-gen-mypy={Path(sys.executable).parent / 'protoc-gen-mypy'}",
        f"--mypy_out={out_dir}",
        f"--plugin=protoc-gen-mypy_grpc={Path(sys.executable).parent / 'protoc-gen-mypy_grpc'}",
        f"--mypy_grpc_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out_dir / "headwater/v1").glob("*_pb2*"))


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_ROOT
    for path in generate(target):
        print(path)
