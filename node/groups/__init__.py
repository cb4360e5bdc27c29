"""Consumer groups: the group records of ``__consumer_offsets``, the group image
they replay into, and the assignors. Pure: the coordinator that drives them does the I/O."""
