"""Generated gRPC and protobuf stubs for headwater/v1 (``make proto``); never edit by hand."""
