"""Headwater: a partitioned, replicated commit-log broker with a gRPC API.

Subpackages (each a top-level folder of the repository, mapped into this namespace):

- ``headwater.log``: the partition log (record batch format, segments, indexes, recovery).
- ``headwater.node``: one server process (gRPC services, topic manager).
- ``headwater.client``: the Python producer, consumer and admin client.
- ``headwater.raft``: the metadata quorum.
- ``headwater.sparkconnector``: the Spark Structured Streaming source and sink.
- ``headwater.v1``: generated gRPC/protobuf stubs for ``proto/headwater/v1``.
"""

__version__ = "0.1.0"
