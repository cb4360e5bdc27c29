"""One-shot reads of offset ranges: ``LogReader.fetch`` asks a partition's leader for the
whole record batches from an offset, without a consumer's streams or positions.

For jobs that plan their own ranges (the Spark connector reads [from, until) per input
partition; tools scan a partition's batch headers). The records stay encoded, as stored
(docs/record-batch-format.md); ``headwater.log.batch.decode_batches`` turns them into
Arrow record batches and ``iter_headers`` reads only the headers.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from headwater.client.connection import Cluster
from headwater.shared.tls import ClientSecurity
from headwater.v1 import headwater_pb2 as pb

FETCH_BYTES_DEFAULT: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class FetchedRange:
    """What one fetch returned for ``topic``/``partition`` from ``offset``.

    ``records`` are whole record batches, concatenated: the first may begin before
    ``offset`` (a batch is never split), so skip records below it. ``next_offset`` is the
    offset to fetch next (``offset`` when nothing was returned); records are readable in
    [``log_start_offset``, ``high_watermark``).
    """

    topic: str
    partition: int
    offset: int
    records: bytes
    next_offset: int
    high_watermark: int
    log_start_offset: int


class LogReader:
    def __init__(
        self,
        bootstrap: str | Sequence[str] | None = None,
        *,
        request_timeout_s: float = 30.0,
        retry_s: float = 30.0,
        cluster: Cluster | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        """``cluster`` shares another client's connections and metadata cache (then
        ``bootstrap`` and ``request_timeout_s`` are its own); closing this reader does not
        close a shared cluster."""
        self._owns_cluster = cluster is None
        self.cluster = cluster or Cluster(
            bootstrap, request_timeout_s=request_timeout_s, security=security
        )
        self.retry_s = retry_s

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = FETCH_BYTES_DEFAULT,
        max_wait_ms: int = 0,
    ) -> FetchedRange:
        """Batches from ``offset``: about ``max_bytes`` (at least one whole batch), waiting
        up to ``max_wait_ms`` when none is readable yet. Sent to the partition's leader and
        retried while leadership moves, for up to ``retry_s``.

        Raises HeadwaterError: OFFSET_OUT_OF_RANGE when ``offset`` is outside
        [log start, high watermark]; UNKNOWN_TOPIC_OR_PARTITION (no such topic);
        PARTITION_OUT_OF_RANGE (no such partition); the last retriable error
        when ``retry_s`` runs out.
        """
        request = pb.FetchRequest(
            topic=topic,
            partition=partition,
            offset=offset,
            max_bytes=max_bytes,
            max_wait_ms=max_wait_ms,
            min_bytes=1,
            max_response_bytes=self.cluster.message_bytes_max,
        )
        timeout_s = self.cluster.request_timeout_s + max_wait_ms / 1000

        def run(address: str) -> pb.FetchResponse:
            response: pb.FetchResponse = self.cluster.broker(address).Fetch(
                request, timeout=timeout_s
            )
            return response

        response = self.cluster.call_leader(topic, partition, run, retry_s=self.retry_s)
        return FetchedRange(
            topic,
            partition,
            offset,
            response.records,
            response.next_offset,
            response.high_watermark,
            response.log_start_offset,
        )

    def close(self) -> None:
        if self._owns_cluster:
            self.cluster.close()
