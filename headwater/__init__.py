"""Headwater: a partitioned, replicated commit-log broker with a gRPC API.

Subpackages (each a top-level folder of the repository, mapped into this namespace):

- ``headwater.log``: the partition log (record batch format, segments, indexes, recovery).
- ``headwater.node``: one server process (gRPC services, topic manager).
- ``headwater.client``: the Python producer, consumer and admin client.
- ``headwater.raft``: the metadata quorum.
- ``headwater.sparkconnector``: the Spark Structured Streaming source and sink.
- ``headwater.v1``: generated gRPC/protobuf stubs for ``proto/headwater/v1``.
"""

import os

__version__ = "0.1.0"

# grpcio 1.81+ with fork support on: a child of subprocess.Popen (pyspark starts its JVM
# that way, the CLI its nodes) sometimes restarts gRPC's poller on a closed epoll fd and
# dies before exec (grpc/grpc#43055; about 1 fork in 100 here with a channel busy).
# Headwater never uses gRPC across a fork, so it turns fork support off unless told
# otherwise; this takes effect when headwater is imported before grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
