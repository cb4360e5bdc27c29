"""The cluster metadata model, replicated through the Raft quorum (``headwater.raft``):
its records, the image they replay into and the controller's decisions. Pure: no I/O."""
