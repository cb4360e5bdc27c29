"""This node's part in the cluster: its view of the metadata, calls to other nodes, the
controller driver, the broker's registration, heartbeats and lease, and producer ids."""
