"""Child processes started while gRPC is busy: pyspark launches its JVM with
subprocess.Popen and a preexec_fn, and with gRPC's fork support on (grpcio 1.81+) about 1
child in 100 died before exec with "epoll_wait error: Bad file descriptor" (it failed
every Spark test of one CI run)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import signal, subprocess, threading
import headwater
import grpc
from headwater.v1 import headwater_pb2 as pb, headwater_pb2_grpc as pb_grpc

stub = pb_grpc.BrokerStub(grpc.insecure_channel("127.0.0.1:1"))

def busy():
    while True:
        try:
            stub.Metadata(pb.MetadataRequest(), timeout=0.01)
        except grpc.RpcError:
            pass

threading.Thread(target=busy, daemon=True).start()
failed = []
for _ in range(FORKS):
    child = subprocess.Popen(
        ["/bin/true"],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _, err = child.communicate()
    if child.returncode != 0 or err:
        failed.append(err.decode(errors="replace")[-200:])
print(len(failed), failed[:1])
"""


def test_children_started_beside_busy_grpc_channels_all_exec() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.replace("FORKS", "400")],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    assert done.stdout.startswith("0 "), done.stdout
