//! The `conformance` command: the shared test vectors against a live broker, through a
//! stock tonic client.
//!
//! - Every valid vector (but idempotent ones, whose producer id the cluster never
//!   allocated) is produced with unary Produce and accepted; fetched back, the stored
//!   batch equals the vector byte for byte except base_offset and leader_epoch (which the
//!   broker assigns), and decodes to the vector's records.
//! - Every rejection, whether a decoder's or only the broker's to make, is refused by
//!   unary Produce with its ErrorCode (read from ErrorInfo) and not flagged retriable.
//! - All of them again on one ProduceStream: each answer carries the same code in
//!   `error_code` (NONE for the valid ones), and the stream goes on after a refusal.

use serde_json::{Value, json};
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::api_error::{ApiError, code_name};
use crate::batch::decode_batches;
use crate::client::{self, Error};
use crate::proto;
use crate::proto::broker_client::BrokerClient;
use crate::vectors::{Vector, VectorFile};

fn produce_request(topic: &str, batch: &[u8]) -> proto::ProduceRequest {
    proto::ProduceRequest {
        topic: topic.to_owned(),
        partition: 0,
        payload: Some(proto::produce_request::Payload::Batch(batch.to_vec())),
        acks: proto::Acks::All as i32,
        ..Default::default()
    }
}

/// Unary Produce: Ok(base_offset) or the refusal. Retriable errors are retried.
async fn produce(
    channel: &Channel,
    topic: &str,
    batch: &[u8],
    deadline: Instant,
) -> Result<Result<i64, ApiError>, Error> {
    let answer = client::retrying("Produce", deadline, || {
        let mut broker = BrokerClient::new(channel.clone());
        let request = produce_request(topic, batch);
        async move { broker.produce(request).await }
    })
    .await;
    match answer {
        Ok(response) => {
            let result = response.into_inner().results.into_iter().next();
            result
                .map(|r| Ok(r.base_offset))
                .ok_or(Error::Check("Produce answered no result".to_owned()))
        }
        Err(Error::Api { error, .. }) => Ok(Err(error)),
        Err(other) => Err(other),
    }
}

/// Fetch the batch stored at `base_offset` and compare it with `vector`.
async fn check_stored(
    channel: &Channel,
    topic: &str,
    vector: &Vector,
    base_offset: i64,
    deadline: Instant,
) -> Result<Vec<String>, Error> {
    let request = client::fetch_request(topic, 0, base_offset);
    let answer =
        client::first_fetch_answer(BrokerClient::new(channel.clone()), request, deadline).await?;
    let response = answer.map_err(|error| Error::Api {
        call: "FetchStream".to_owned(),
        error,
    })?;
    let mut problems = Vec::new();
    let Some(stored) = response.records.get(..vector.batch.len()) else {
        return Ok(vec![format!(
            "fetched {} bytes, the batch is {}",
            response.records.len(),
            vector.batch.len()
        )]);
    };
    let mut expected = vector.batch.clone();
    expected[0..8].copy_from_slice(&base_offset.to_le_bytes());
    expected[12..16].copy_from_slice(&stored[12..16]); // the leader's epoch
    if stored != expected.as_slice() {
        problems.push(
            "stored bytes differ from the vector beyond base_offset and leader_epoch".to_owned(),
        );
    }
    let decoded = decode_batches(stored)?;
    let records = decoded.into_iter().flat_map(|b| b.records);
    for (got, (offset, want)) in records.zip(&vector.records) {
        let same = got.offset - base_offset == offset - vector.base_offset
            && (got.timestamp_ms, &got.key, &got.value, &got.headers)
                == (want.timestamp_ms, &want.key, &want.value, &want.headers);
        if !same {
            problems.push(format!(
                "record at offset {} decodes to {got:?}",
                got.offset
            ));
        }
    }
    Ok(problems)
}

/// (code name, retriable, message) of each answer of one ProduceStream carrying `batches`.
async fn produce_stream(
    channel: &Channel,
    topic: &str,
    batches: &[&[u8]],
    deadline: Instant,
) -> Result<Vec<(String, bool, String)>, Error> {
    let requests: Vec<proto::ProduceRequest> =
        batches.iter().map(|b| produce_request(topic, b)).collect();
    let mut broker = BrokerClient::new(channel.clone());
    let exchange = async move {
        let mut stream = broker
            .produce_stream(tokio_stream::iter(requests))
            .await?
            .into_inner();
        let mut answers = Vec::new();
        while let Some(answer) = stream.message().await? {
            answers.push((
                code_name(answer.error_code),
                answer.retriable,
                answer.error_message,
            ));
        }
        Ok::<_, tonic::Status>(answers)
    };
    match tokio::time::timeout_at(deadline, exchange).await {
        Err(_) => Err(Error::Timeout("ProduceStream".to_owned())),
        Ok(Err(status)) => Err(Error::Api {
            call: "ProduceStream".to_owned(),
            error: ApiError::from_status(&status),
        }),
        Ok(Ok(answers)) => Ok(answers),
    }
}

pub async fn run(
    channel: &Channel,
    topic: &str,
    file: &VectorFile,
    deadline: Instant,
) -> Result<Value, Error> {
    let (valid, skipped): (Vec<&Vector>, Vec<&Vector>) = file
        .vectors
        .iter()
        .partition(|v| v.producer.producer_id < 0);
    let mut all_ok = true;
    let mut vector_results = Vec::new();
    for vector in &valid {
        let (produce_code, problems) =
            match produce(channel, topic, &vector.batch, deadline).await? {
                Ok(base_offset) => (
                    "NONE".to_owned(),
                    check_stored(channel, topic, vector, base_offset, deadline).await?,
                ),
                Err(error) => (
                    error.reason().unwrap_or("transport").to_owned(),
                    vec![error.to_string()],
                ),
            };
        let ok = produce_code == "NONE" && problems.is_empty();
        all_ok &= ok;
        vector_results.push(
            json!({"name": vector.name, "ok": ok, "produce": produce_code, "problems": problems}),
        );
    }
    let mut rejection_results = Vec::new();
    for rejection in &file.rejections {
        let refusal = produce(channel, topic, &rejection.batch, deadline)
            .await?
            .err();
        let reason = refusal
            .as_ref()
            .map_or("NONE", |e| e.reason().unwrap_or("transport"));
        let retriable = refusal.as_ref().is_some_and(ApiError::is_retriable);
        let ok = reason == rejection.error && !retriable;
        all_ok &= ok;
        rejection_results.push(json!({
            "name": rejection.name,
            "rejected_by": rejection.rejected_by,
            "expected": rejection.error,
            "ok": ok,
            "produce": reason,
            "retriable": retriable,
            "message": refusal.map(|e| e.message),
        }));
    }
    // The same batches on one stream, in one go.
    let batches: Vec<&[u8]> = valid
        .iter()
        .map(|v| v.batch.as_slice())
        .chain(file.rejections.iter().map(|r| r.batch.as_slice()))
        .collect();
    let expected: Vec<&str> = valid
        .iter()
        .map(|_| "NONE")
        .chain(file.rejections.iter().map(|r| r.error.as_str()))
        .collect();
    let answers = produce_stream(channel, topic, &batches, deadline).await?;
    let mut stream_problems = Vec::new();
    if answers.len() != expected.len() {
        stream_problems.push(format!(
            "{} answers to {} requests",
            answers.len(),
            expected.len()
        ));
    }
    let names = valid
        .iter()
        .map(|v| v.name.as_str())
        .chain(file.rejections.iter().map(|r| r.name.as_str()));
    for ((name, want), (code, retriable, message)) in names.zip(&expected).zip(&answers) {
        if code != want || *retriable {
            stream_problems.push(format!(
                "{name}: answered {code} (retriable {retriable}, {message:?}), expected {want}"
            ));
        }
    }
    all_ok &= stream_problems.is_empty();
    Ok(json!({
        "ok": all_ok,
        "command": "conformance",
        "topic": topic,
        "vectors": vector_results,
        "rejections": rejection_results,
        "stream_answers": answers.len(),
        "stream_problems": stream_problems,
        "skipped": skipped.iter().map(|v| format!("{}: idempotent (producer id {} was never allocated by this cluster)", v.name, v.producer.producer_id)).collect::<Vec<_>>(),
    }))
}
