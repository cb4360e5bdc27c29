"""``headwater bench``: the project's benchmark commands, loaded only when a ``bench``
command runs (``headwater serve`` never imports them).

- ``perf``: ``bench produce|consume|e2e``, throughput and latency against a running node;
- ``cluster``: ``bench cluster`` and ``bench replication``, on 3 nodes they start;
- ``spark``: ``bench spark``, the connector against Parquet on a node it starts.

They talk to nodes through the client API only (``headwater.client``) and start nodes with
``headwater.tools.devcluster``.
"""
