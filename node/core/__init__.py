"""The broker's operations, written once for every front: produce, fetch, list offsets,
topic administration, quotas and the limits on long-lived calls. Plain types in and out;
no protobuf, no gRPC, no front."""
