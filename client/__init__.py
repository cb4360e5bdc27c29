"""The Python client: Producer, Consumer and Admin over Headwater's gRPC API."""
