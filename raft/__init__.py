"""The Raft metadata quorum (over pysyncobj): the voters' replicated journal of metadata
records, elections of the controller, and followers' appends. What the records mean (the
metadata model: records, image, the controller's decisions) is ``headwater.raft.metadata``."""
