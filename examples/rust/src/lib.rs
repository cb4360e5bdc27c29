//! A Headwater client in Rust, written from the public contract alone: the gRPC API
//! (`proto/headwater/v1/headwater.proto`), the record batch format
//! (`docs/record-batch-format.md`) and its test vectors. See README.md.
//!
//! Pure modules (no I/O): `batch` (encoder and decoder), `codec` (zstd and LZ4 frames),
//! `murmur2` (Kafka's partitioner), `vectors` (the test vectors file). The gRPC side:
//! `client` (calls, retries by the `retriable` flag), `producer` (idempotent batches on
//! ProduceStream), `api_error` (ErrorInfo), and the commands of the binary:
//! `round_trip`, `limits`, `conformance`.

/// The Headwater API, generated from `proto/headwater/v1/headwater.proto` by build.rs.
#[allow(clippy::all, missing_docs, rustdoc::all)]
pub mod proto {
    tonic::include_proto!("headwater.v1");
}

pub mod api_error;
pub mod batch;
pub mod client;
pub mod codec;
pub mod conformance;
pub mod limits;
pub mod murmur2;
pub mod producer;
pub mod round_trip;
pub mod vectors;
