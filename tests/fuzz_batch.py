"""A mutation fuzzer for the record batch decoder (``headwater.log.batch``).

Every case is a valid batch (with and without keys, nulls and headers; every codec)
mutated in a way chosen by a seeded generator: bit flips, an int32 of the body or a
header field set to a boundary value (-2^31, -2^30, -1, 0, 1, 2^30, 2^31 - 1, 2^63 - 1,
-2^63, ...), truncation, extension, or a decompression bomb (a small compressed body
that declares or expands to far more than the limit). Most mutations are made to the
uncompressed body, which is then recompressed, and most cases get their lengths and CRC
fixed up afterwards, so that the checks past the CRC are what is tried.

Each case goes through what the broker runs on a produced batch (``validate_batch``, with
a 1 MiB limit on the uncompressed body), what a consumer runs on a fetched one
(``fetched_from``, then the records iterated as a ``poll`` result) and what the broker
runs for a decoded-records Fetch (``decoded_records``). The only outcome allowed besides
success is a HeadwaterError with a documented code (ALLOWED_CODES): anything else is a
finding, printed with its case.

The cases run in a child process whose address space is capped (so an unbounded
allocation is a MemoryError, a finding, not a stalled machine), and the parent watches
it: a crash (signal), or no progress for ``--hang-s`` seconds, is a finding too, and the
case that caused it is written to ``--out`` as hex so that it can be replayed.

    python -m tests.fuzz_batch --cases 20000 --seed 7    # make fuzz runs a long one
"""

from __future__ import annotations

import argparse
import mmap
import random
import resource
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import crc32c

from headwater.client.consumer import PollResult, fetched_from
from headwater.client.positions import TopicPartition
from headwater.log import batch as bf
from headwater.node.rpc.record_encoding import decoded_records
from headwater.shared.errors import ErrorCode, HeadwaterError

ALLOWED_CODES = frozenset(
    {
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
        ErrorCode.INVALID_TIMESTAMP,
    }
)
UNCOMPRESSED_LIMIT = 1 << 20
ADDRESS_SPACE_BYTES = 3 << 30
"""The child's RLIMIT_AS: pyarrow and its pools need about 1 GiB of address space."""
INTERESTING_32 = (
    -(1 << 31),
    -(1 << 30),
    -65536,
    -8,
    -1,
    0,
    1,
    7,
    8,
    255,
    65535,
    1 << 24,
    (1 << 24) + 1,
    1 << 30,
    (1 << 31) - 1,
)
INTERESTING_64 = (-(1 << 63), -(1 << 62), -1, 0, 1, 1 << 62, (1 << 63) - 1, bf.TIMESTAMP_MAX_MS + 1)
HEADER_FIELDS = (  # (offset, struct format) of every header field a mutation may set
    (8, "<i"),
    (28, "<i"),
    (32, "<i"),
    (36, "<i"),
    (40, "<q"),
    (48, "<q"),
    (56, "<q"),
    (64, "<i"),
    (68, "<h"),
    (72, "<i"),
    (24, "<H"),
)


def seed_batches() -> list[tuple[bf.Compression, bytes, bytes]]:
    """(codec, 80-byte header, uncompressed body) of the valid batches cases start from."""
    shapes: list[dict[str, object]] = [
        {"values": [b"v"]},
        {"values": [b"alpha", None, b"gamma"], "keys": [b"k", None, b"kk"]},
        {
            "values": [b"a", b"bb", b"ccc"],
            "keys": [b"k1", b"k2", b"k3"],
            "headers": [[("h", b"v")], None, [("x", None), ("yy", b"zz")]],
            "timestamps_ms": [5, 9, 7],
        },
        {
            "values": [bytes([i]) * (i % 13) for i in range(40)],
            "headers": [[("k" * (i % 3 + 1), b"v" * (i % 4))] * (i % 3) for i in range(40)],
            "timestamps_ms": [1_700_000_000_000 + i for i in range(40)],
        },
        {"values": [b""] * 17, "keys": [b""] * 17, "headers": [[("", b"")]] * 17},
    ]
    out = []
    for shape in shapes:
        for codec in bf.Compression:
            batch = bf.encode_batch(**shape, compression=codec)  # type: ignore[arg-type]
            decoded = bf.read_header(batch)
            stored = batch[bf.HEADER_BYTES : bf.HEADER_BYTES + decoded.body_length]
            body = bf.decompress(stored, codec, decoded.uncompressed_body_length)
            out.append((codec, batch[: bf.HEADER_BYTES], body))
    return out


def assemble(header: bytes, stored: bytes, fix_lengths: bool, fix_crc: bool) -> bytes:
    """A batch from an 80-byte header and a stored body, with lengths and CRC optionally
    made to agree with them."""
    data = bytearray(header) + stored + bytes(-len(stored) % 8)
    if fix_lengths:
        struct.pack_into("<i", data, 8, len(data) - bf.LENGTH_PREFIX_BYTES)
        struct.pack_into("<i", data, 36, len(stored))
    return rechecksummed(data) if fix_crc else bytes(data)


def rechecksummed(data: bytearray) -> bytes:
    """``data`` with its CRC field recomputed over what it now holds."""
    struct.pack_into("<I", data, 20, crc32c.crc32c(bytes(data[bf.CRC_START :])))
    return bytes(data)


def compressed_batch(codec: bf.Compression, stored: bytes, declared: int) -> bytes:
    """A one-record batch of ``codec`` whose stored body is ``stored`` and whose header
    declares ``declared`` uncompressed bytes, lengths and CRC consistent: how a
    decompression bomb reaches the checks past the CRC."""
    header = bytearray(bf.encode_batch([b"x"], compression=codec)[: bf.HEADER_BYTES])
    struct.pack_into("<i", header, 72, declared)
    return assemble(bytes(header), stored, fix_lengths=True, fix_crc=True)


def mutate_bytes(rng: random.Random, data: bytearray) -> None:
    """One or a few mutations of ``data`` in place (it may grow or shrink)."""
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        kind = rng.randrange(6)
        if not data:
            data.extend(rng.randbytes(8))
        if kind == 0:
            position = rng.randrange(len(data))
            data[position] ^= 1 << rng.randrange(8)
        elif kind == 1 and len(data) >= 4:
            position = rng.randrange(len(data) // 4) * 4
            struct.pack_into("<i", data, position, rng.choice(INTERESTING_32))
        elif kind == 2 and len(data) >= 4:
            position = rng.randrange(len(data) - 3)
            struct.pack_into("<i", data, position, rng.choice(INTERESTING_32))
        elif kind == 3:
            del data[rng.randrange(len(data) + 1) :]
        elif kind == 4:
            data.extend(rng.randbytes(rng.choice((1, 4, 8, 64))))
        else:
            position = rng.randrange(len(data))
            data[position] = rng.randrange(256)


BOMB_BYTES = 64 << 20


def bombs() -> list[tuple[bf.Compression, bytes, int]]:
    """(codec, stored body, declared uncompressed size): bodies that expand past the
    limit, some declaring it in the frame and some not."""
    import lz4.frame
    import zstandard

    zeros = bytes(BOMB_BYTES)
    return [
        (bf.Compression.ZSTD, zstandard.ZstdCompressor().compress(zeros), BOMB_BYTES),
        (
            bf.Compression.ZSTD,
            zstandard.ZstdCompressor(write_content_size=False).compress(zeros),
            UNCOMPRESSED_LIMIT,
        ),
        (bf.Compression.LZ4, lz4.frame.compress(zeros, store_size=False), UNCOMPRESSED_LIMIT),
        (bf.Compression.LZ4, lz4.frame.compress(zeros), (1 << 31) - 1),
    ]


class CaseMaker:
    """Case ``i`` of seed ``s`` is the same bytes on every run."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.seeds = seed_batches()
        self.bombs = bombs()

    def case(self, index: int) -> bytes:
        rng = random.Random(self.seed * 1_000_003 + index)
        if rng.random() < 0.02:
            return compressed_batch(*rng.choice(self.bombs))
        codec, header, body = rng.choice(self.seeds)
        raw = bytearray(body)
        if rng.random() < 0.7:
            mutate_bytes(rng, raw)
        header = bytearray(header)
        struct.pack_into("<i", header, 72, len(raw))
        stored = bf.compress(bytes(raw), codec)
        if rng.random() < 0.4:
            mutable = bytearray(header)
            offset, fmt = rng.choice(HEADER_FIELDS)
            if fmt == "<q":
                value = rng.choice(INTERESTING_64)
            elif fmt == "<h":
                value = rng.choice((-1, 0, 1, 32767, -32768))
            elif fmt == "<H":
                value = rng.randrange(65536)
            else:
                value = rng.choice(INTERESTING_32)
            struct.pack_into(fmt, mutable, offset, value)
            header = mutable
        if rng.random() < 0.15:
            mutable_stored = bytearray(stored)
            mutate_bytes(rng, mutable_stored)
            stored = bytes(mutable_stored)
        fix_lengths = rng.random() < 0.9
        fix_crc = rng.random() < 0.95
        return assemble(bytes(header), stored, fix_lengths, fix_crc)


def run_case(data: bytes) -> str | None:
    """None when the case was accepted or refused with a documented error; otherwise a
    description of the finding."""
    try:
        try:
            bf.validate_batch(data, max_uncompressed_bytes=UNCOMPRESSED_LIMIT)
        except HeadwaterError as error:
            if error.code not in ALLOWED_CODES:
                return f"validate_batch: undocumented code {error.code.name}: {error.message}"
        try:
            fetched, _resume = fetched_from(TopicPartition("t", 0), data, 0, check_crcs=True)
            list(PollResult(fetched))  # what a consumer's `for record in poll()` runs
        except HeadwaterError as error:
            if error.code not in ALLOWED_CODES:
                return f"fetched_from: undocumented code {error.code.name}: {error.message}"
        try:
            decoded_records(data, 0, 4 << 20)  # a decoded-records Fetch of stored bytes
        except HeadwaterError as error:
            if error.code not in ALLOWED_CODES:
                return f"decoded_records: undocumented code {error.code.name}: {error.message}"
    except Exception:
        return traceback.format_exc()
    return None


# ------------------------------------------------------------------------------ child


def worker(seed: int, cases: int, progress_path: Path) -> int:
    """Run cases [0, cases) of ``seed``, writing the current index to ``progress_path``
    (8 bytes, memory-mapped) before each; print findings; exit 1 if any."""
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))
    maker = CaseMaker(seed)
    findings = 0
    with progress_path.open("r+b") as file, mmap.mmap(file.fileno(), 8) as progress:
        for index in range(cases):
            struct.pack_into("<q", progress, 0, index)
            finding = run_case(maker.case(index))
            if finding is not None:
                findings += 1
                print(f"FINDING seed={seed} case={index}\n{finding}", flush=True)
        struct.pack_into("<q", progress, 0, cases)
    return 1 if findings else 0


# ----------------------------------------------------------------------------- parent


def fuzz(
    seed: int,
    cases: int,
    hang_s: float,
    out: Path,
    report: Callable[[str], None] = print,
) -> bool:
    """Run the cases in a child process and watch it; True when nothing was found."""
    out.mkdir(parents=True, exist_ok=True)
    progress_path = out / f"progress-{seed}"
    progress_path.write_bytes(bytes(8))
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fuzz_batch",
            "--worker",
            "--seed",
            str(seed),
            "--cases",
            str(cases),
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    last, moved_at = -1, time.monotonic()
    try:
        while child.poll() is None:
            index = struct.unpack("<q", progress_path.read_bytes())[0]
            if index != last:
                last, moved_at = index, time.monotonic()
            elif time.monotonic() - moved_at > hang_s:
                child.kill()
                child.wait()
                _keep(seed, index, out, f"hang: no progress for {hang_s} s", report)
                return False
            time.sleep(0.1)
    finally:
        if child.poll() is None:
            child.kill()
        output = child.communicate()[0]
    if output:
        report(output)
    if child.returncode < 0:
        index = struct.unpack("<q", progress_path.read_bytes())[0]
        _keep(seed, index, out, f"crash: killed by signal {-child.returncode}", report)
        return False
    if child.returncode != 0:
        report(f"seed {seed}: findings above (exit {child.returncode})")
        return False
    report(f"seed {seed}: {cases} cases, nothing found")
    return True


def _keep(seed: int, index: int, out: Path, what: str, report: Callable[[str], None]) -> None:
    case = CaseMaker(seed).case(index)
    path = out / f"finding-seed{seed}-case{index}.hex"
    path.write_text(case.hex() + "\n")
    report(f"FINDING seed={seed} case={index}: {what}; the case is in {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock")
    parser.add_argument("--cases", type=int, default=20_000)
    parser.add_argument("--hang-s", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=Path(".build/fuzz"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    if args.worker:
        return worker(seed, args.cases, args.out / f"progress-{seed}")
    print(f"fuzzing the batch decoder: seed {seed}, {args.cases} cases", flush=True)
    return 0 if fuzz(seed, args.cases, args.hang_s, args.out) else 1


if __name__ == "__main__":
    sys.exit(main())
