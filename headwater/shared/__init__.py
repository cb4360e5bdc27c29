"""What clients and servers both need, and nothing else: the error model and its gRPC
mapping, topic names and limits, addresses, ACL, credential, SCRAM and quota rules, TLS
settings and the channels' reconnect options, Kafka's key partitioner, cancellation and
log lines at a bounded rate. Each module imports only this package and the generated
stubs (``tests/test_layers.py``)."""
