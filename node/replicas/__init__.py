"""The partition replicas this node hosts and their replication: logs, roles, the
leader's high watermark and ISR, followers' fetching and truncation, and the pure steps
they are decided by."""
