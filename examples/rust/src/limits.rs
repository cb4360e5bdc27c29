//! Two limits a client meets, and how Headwater reports them through a stock gRPC
//! client (tonic with its default channel settings):
//!
//! - `bad-partition`: a partition number past the topic's count is refused with an
//!   ErrorInfo that says it is not retriable (PARTITION_OUT_OF_RANGE);
//! - `large-batch`: a batch larger than the client's receive limit (tonic's default
//!   4 MiB) is refused by the broker with FETCH_RESPONSE_TOO_LARGE, an ErrorInfo naming
//!   the size to raise the limits to, instead of being sent and failing in the client's
//!   transport; with the channel's `max_decoding_message_size` and the request's
//!   `max_response_bytes` both raised, it arrives.

use serde_json::{Value, json};
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::api_error::ApiError;
use crate::batch::{DecodedRecord, EncodeOptions, Record, decode_batches, encode_batch};
use crate::client::{self, Error};
use crate::proto;
use crate::proto::broker_client::BrokerClient;

const MIB: usize = 1 << 20;
/// What `large-batch` raises both limits to: the channel's receive limit and the
/// request's max_response_bytes.
pub const RAISED_RESPONSE_BYTES: usize = 16 * MIB;
/// The topic config `large-batch` creates its topic with: brokers default to batches
/// that fit a stock client's 4 MiB (4 MiB - 1 KiB), so a larger one needs a topic that
/// takes it.
const TOPIC_MESSAGE_BYTES_MAX: &str = "8388608";

/// Fetch partition number `partitions` (one past the last): the broker must refuse it
/// with a non-retriable error, told by ErrorInfo.
pub async fn bad_partition(
    channel: &Channel,
    topic: &str,
    partitions: i32,
    deadline: Instant,
) -> Result<Value, Error> {
    let (_, partitions) = client::ensure_topic(channel, topic, partitions, &[], deadline).await?;
    let request = client::fetch_request(topic, partitions, 0);
    let answer =
        client::first_fetch_answer(BrokerClient::new(channel.clone()), request, deadline).await?;
    let error = match answer {
        Ok(response) => {
            return Ok(json!({
                "ok": false,
                "command": "bad-partition",
                "problem": format!("partition {partitions} of {partitions} was answered: {response:?}"),
            }));
        }
        Err(error) => error,
    };
    let retriable = error.info.as_ref().and_then(|i| i.retriable);
    let (ok, note) = match error.reason() {
        Some("PARTITION_OUT_OF_RANGE") if retriable == Some(false) => {
            (true, "non-retriable, as it must be")
        }
        Some("PARTITION_OUT_OF_RANGE") => (false, "PARTITION_OUT_OF_RANGE must not be retriable"),
        Some("UNKNOWN_TOPIC_OR_PARTITION") => (
            true,
            "accepted from brokers without PARTITION_OUT_OF_RANGE; they flag it retriable, so a \
             client retries a request that cannot succeed",
        ),
        _ => (
            false,
            "expected PARTITION_OUT_OF_RANGE (or UNKNOWN_TOPIC_OR_PARTITION from older brokers)",
        ),
    };
    if let Some(reason) = error.reason().filter(|r| *r != "PARTITION_OUT_OF_RANGE") {
        eprintln!("bad-partition: the broker answered {reason}: {note}");
    }
    Ok(json!({
        "ok": ok,
        "command": "bad-partition",
        "topic": topic,
        "partitions": partitions,
        "partition_asked": partitions,
        "error": error.to_json(),
        "note": note,
    }))
}

/// `count` values of `bytes` each, from a fixed xorshift stream (not compressible).
fn large_values(count: usize, bytes: usize) -> Vec<Vec<u8>> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..count)
        .map(|_| {
            (0..bytes)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect()
        })
        .collect()
}

/// Produce `batch` to partition 0 of `topic`: its base offset. A retry after a broken
/// connection may append it twice; the caller reads from the offset answered.
async fn produce_one(
    channel: &Channel,
    topic: &str,
    batch: &[u8],
    deadline: Instant,
) -> Result<i64, Error> {
    let produced = client::retrying("Produce", deadline, || {
        let mut broker = BrokerClient::new(channel.clone());
        let request = proto::ProduceRequest {
            topic: topic.to_owned(),
            partition: 0,
            payload: Some(proto::produce_request::Payload::Batch(batch.to_vec())),
            acks: proto::Acks::All as i32,
            ..Default::default()
        };
        async move { broker.produce(request).await }
    })
    .await?
    .into_inner();
    let result = produced.results.first();
    result
        .map(|r| r.base_offset)
        .ok_or(Error::Check("Produce answered no result".to_owned()))
}

/// A fetch's outcome as JSON: its error, or how much arrived.
fn outcome_json(answer: &Result<proto::FetchResponse, ApiError>) -> Value {
    match answer {
        Ok(response) => json!({"answered": true, "bytes": response.records.len()}),
        Err(error) => error.to_json(),
    }
}

/// Whether `answer` holds `sent`, from `base_offset` on.
fn arrived_json(
    answer: &Result<proto::FetchResponse, ApiError>,
    base_offset: i64,
    sent: &[Record],
) -> Result<Value, Error> {
    let response = match answer {
        Err(error) => return Ok(json!({"ok": false, "error": error.to_json()})),
        Ok(response) => response,
    };
    let end = base_offset + sent.len() as i64;
    let decoded: Vec<DecodedRecord> = decode_batches(&response.records)?
        .into_iter()
        .flat_map(|b| b.records)
        .filter(|r| (base_offset..end).contains(&r.offset))
        .collect();
    let same = decoded.len() == sent.len()
        && decoded
            .iter()
            .zip(sent)
            .all(|(got, sent)| got.value == sent.value);
    Ok(json!({"ok": same, "records": decoded.len(), "bytes": response.records.len()}))
}

/// Produce one batch of about `batch_mib` MiB, then fetch it three ways: with default
/// settings (the broker refuses with FETCH_RESPONSE_TOO_LARGE, an ErrorInfo), with
/// max_response_bytes raised but the channel's receive limit not (tonic refuses the
/// message itself: a transport error), and with both raised to 16 MiB (it arrives).
pub async fn large_batch(
    channel: &Channel,
    topic: &str,
    batch_mib: usize,
    deadline: Instant,
) -> Result<Value, Error> {
    let configs = [("max_message_bytes", TOPIC_MESSAGE_BYTES_MAX)];
    client::ensure_topic(channel, topic, 1, &configs, deadline).await?;
    let value_bytes = 64 << 10;
    let count = (batch_mib * MIB).div_ceil(value_bytes);
    let timestamp_ms = client::now_ms();
    let records: Vec<Record> = large_values(count, value_bytes)
        .into_iter()
        .map(|value| Record {
            key: None,
            value: Some(value),
            headers: Vec::new(),
            timestamp_ms,
        })
        .collect();
    let batch = encode_batch(&records, &EncodeOptions::default())?;
    let base_offset = produce_one(channel, topic, &batch, deadline).await?;
    let request = client::fetch_request(topic, 0, base_offset);
    let stock = BrokerClient::new(channel.clone());
    let default = client::first_fetch_answer(stock.clone(), request.clone(), deadline).await?;
    let default_ok = matches!(
        &default,
        Err(e) if e.reason() == Some("FETCH_RESPONSE_TOO_LARGE") && !e.is_retriable()
    );
    let raised_request = proto::FetchRequest {
        max_response_bytes: RAISED_RESPONSE_BYTES as i32,
        ..request
    };
    let mismatched = client::first_fetch_answer(stock, raised_request.clone(), deadline).await?;
    let raised_client =
        BrokerClient::new(channel.clone()).max_decoding_message_size(RAISED_RESPONSE_BYTES);
    let raised = client::first_fetch_answer(raised_client, raised_request, deadline).await?;
    let raised_json = arrived_json(&raised, base_offset, &records)?;
    Ok(json!({
        "ok": default_ok && raised_json["ok"] == json!(true),
        "command": "large-batch",
        "topic": topic,
        "batch_bytes": batch.len(),
        "records": count,
        "base_offset": base_offset,
        "default_limits": outcome_json(&default),
        "max_response_bytes_raised_only": outcome_json(&mismatched),
        "both_raised": raised_json,
        "raised_bytes": RAISED_RESPONSE_BYTES,
    }))
}
