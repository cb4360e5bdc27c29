"""asyncio producer and consumer: a record's whole client-side path on one event loop.

The threaded Producer and Consumer hand every record across several Python threads
(caller, sender, stream reader, fetch reader), and under the GIL each hand-off costs up
to a switch interval. These classes do the same work with ``grpc.aio`` on the caller's
event loop, for latency-sensitive programs (``headwater bench e2e`` uses them).

AsyncProducer: the threaded Producer's batching, ordering, limits and retry decisions, from
the same sans-I/O core (headwater.client.accumulator) driven by the event loop instead of
a sender thread; tests/test_client_engines.py runs one behaviour suite against both. It
has ``send``, ``send_batch`` and ``send_encoded``; ``linger_ms`` is 0 by default, so
records sent in one loop iteration leave together, and records sent while their
partition has a batch in flight leave together when it is answered (up to
``batch_bytes`` each). The one difference: with acks=0 a future completes when the node
answers.

AsyncConsumer: one FetchStream per assigned partition, each read by a task into one
bounded asyncio queue; ``poll`` waits on that queue. A stream that ends or fails with a
retriable error is reopened where it stopped; other errors are raised by ``poll``.

Both talk to each partition's leader directly (its address from Metadata, asked again
after a retriable error), not through the bootstrap node: a forwarded request costs one
more hop each way.

Not thread-safe: use from one event loop. The engines live in ``aio_producer`` and
``aio_consumer``, over the leader routing of ``aio_router``.
"""

from headwater.client.aio_consumer import AsyncConsumer
from headwater.client.aio_producer import AsyncProducer

__all__ = ["AsyncConsumer", "AsyncProducer"]
