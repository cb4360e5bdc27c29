"""One Headwater server process: gRPC services over the partition logs of its topics."""
