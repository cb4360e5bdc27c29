"""Headwater's own fault-injection ("chaos") suite, in the manner of Jepsen's Kafka tests.

- ``headwater.chaos.history``: the events a run records (pure).
- ``headwater.chaos.checker``: the anomalies of Jepsen's Kafka workload in a history (pure).
- ``headwater.chaos.nemesis``: the plan of fault cycles drawn from a seeded rng (pure).
- ``headwater.chaos.replicas``: compare a topic's replicas byte for byte below the high
  watermark (``headwater debug compare-replicas``).
- ``headwater.chaos.netns``: network namespaces for the nodes and the partitions between
  them (Linux, root).
- ``headwater.chaos.cluster``, ``workload``, ``runner``: the nodes, the producers and
  consumers, and the run (``python -m headwater.chaos``); see docs/chaos.md.
"""
