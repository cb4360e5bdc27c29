"""Headwater's own fault-injection ("chaos") suite, in the manner of Jepsen's Kafka tests.

- ``headwater.tools.chaos.history``: the events a run records (pure).
- ``headwater.tools.chaos.checker``: the anomalies of Jepsen's Kafka workload in a history (pure).
- ``headwater.tools.chaos.nemesis``: the plan of fault cycles drawn from a seeded rng (pure).
- ``headwater.tools.chaos.replicas``: compare a topic's replicas byte for byte below the high
  watermark (``headwater debug compare-replicas``).
- ``headwater.tools.chaos.netns``: network namespaces for the nodes and the partitions between
  them (Linux, root).
- ``headwater.tools.chaos.cluster``, ``workload``, ``runner``: the nodes, the producers and
  consumers, and the run (``python -m headwater.tools.chaos``); see docs/chaos.md.
"""
