"""The metadata quorum (Raft via pysyncobj): records, the metadata image, the controller.

Not built yet: a single node keeps its topic metadata in ``node.topic_store``; the quorum
replaces it in the cluster work.
"""
