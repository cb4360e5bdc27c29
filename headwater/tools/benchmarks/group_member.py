"""One consumer group member as its own process, for ``headwater bench groups``.

    python -m headwater.tools.benchmarks.group_member BOOTSTRAP TOPIC GROUP SESSION_MS MODE [--wait]

MODE ``track``: after each poll, prints one line ``PARTITION UNIX_MS COUNT AGE_MS`` per
partition it got records of: when, how many, and how long the oldest of them took from
its send (its create timestamp) to here. MODE ``count``: prints ``COUNT`` (the
total so far) at most every 100 ms. A line ``ready`` comes first, once subscribed. With
``--wait`` it prints ``started`` and joins only once a line comes on stdin (so that a
join is timed without the process's start). Runs until SIGTERM (commits and leaves) or
SIGKILL.
"""

from __future__ import annotations

import signal
import sys
import time
from types import FrameType

import pyarrow as pa
import pyarrow.compute as pc

from headwater.client import Consumer

_stopping = False


def _stop(signum: int, frame: FrameType | None) -> None:
    del signum, frame
    global _stopping
    _stopping = True


def main() -> None:
    bootstrap, topic, group, session_ms, mode = sys.argv[1:6]
    signal.signal(signal.SIGTERM, _stop)
    out = sys.stdout
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=50) as consumer:
        if "--wait" in sys.argv[6:]:
            print("started", file=out, flush=True)
            sys.stdin.readline()  # started and imported: join when told to
        consumer.subscribe(topic, group_id=group, session_timeout_ms=int(session_ms))
        print("ready", file=out, flush=True)
        total = 0
        last_report = 0.0
        while not _stopping:
            result = consumer.poll(timeout_ms=100)
            if mode == "track":
                now_ms = time.time_ns() // 1_000_000
                seen: dict[int, tuple[int, int]] = {}
                for batch in result.batches:
                    oldest = pc.min(batch.records.column("timestamp").cast(pa.int64())).as_py()
                    count, age = seen.get(batch.partition, (0, 0))
                    seen[batch.partition] = (
                        count + batch.records.num_rows,
                        max(age, now_ms - oldest),
                    )
                if seen:
                    out.write("".join(f"{p} {now_ms} {n} {a}\n" for p, (n, a) in seen.items()))
                    out.flush()
            else:
                total += len(result)
                now = time.monotonic()
                if now - last_report >= 0.1:
                    print(total, file=out, flush=True)
                    last_report = now
        if mode == "count":
            print(total, file=out, flush=True)


if __name__ == "__main__":
    main()
