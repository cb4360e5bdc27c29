//! Producing idempotent batches on ProduceStream, with retries that neither lose nor
//! duplicate a record (see `produce_idempotent`).

use std::collections::VecDeque;

use tokio::time::{Instant, sleep, timeout_at};
use tonic::transport::Channel;

use crate::api_error::{ApiError, code_name};
use crate::client::{BACKOFF_MAX, BACKOFF_MIN, Error};
use crate::proto;
use crate::proto::broker_client::BrokerClient;

/// One encoded batch waiting for its acknowledgement.
pub struct PendingBatch {
    pub partition: i32,
    pub bytes: Vec<u8>,
}

/// What `produce_idempotent` did.
#[derive(Debug, Default)]
pub struct ProduceStats {
    pub streams: usize,
    pub requests: usize,
    pub retried_batches: usize,
}

/// Send idempotent batches (per partition in sequence order) on ProduceStream with
/// acks=all, until every one is acknowledged.
///
/// Why this is safe to retry: a batch answered with an error was not appended, and the
/// leader accepts only a partition's next sequence, so after a failure every later batch
/// of that partition fails too (OUT_OF_ORDER_SEQUENCE_NUMBER) and the partition is sent
/// again from its first unacknowledged batch, byte for byte. A batch that was appended
/// but whose answer was lost (a broken stream) is recognised by its sequence and answered
/// with its original offsets (DUPLICATE_SEQUENCE_NUMBER when it is too old for that: it
/// was written).
pub async fn produce_idempotent(
    channel: &Channel,
    topic: &str,
    partitions: Vec<VecDeque<PendingBatch>>,
    deadline: Instant,
) -> Result<ProduceStats, Error> {
    let mut queues = partitions;
    let mut stats = ProduceStats::default();
    let mut backoff = BACKOFF_MIN;
    while queues.iter().any(|q| !q.is_empty()) {
        let requests: Vec<proto::ProduceRequest> = queues
            .iter()
            .flatten()
            .map(|batch| proto::ProduceRequest {
                topic: topic.to_owned(),
                partition: batch.partition,
                payload: Some(proto::produce_request::Payload::Batch(batch.bytes.clone())),
                acks: proto::Acks::All as i32,
                ..Default::default()
            })
            .collect();
        stats.streams += 1;
        stats.requests += requests.len();
        let order: Vec<i32> = requests.iter().map(|r| r.partition).collect();
        let outcome = produce_round(channel, requests, deadline).await?;
        let resend_from = first_failures(&order, &outcome, queues.len())?;
        // Drop each partition's acknowledged prefix.
        let mut position = 0;
        for (partition, queue) in queues.iter_mut().enumerate() {
            let first_index = position;
            position += queue.len();
            let acknowledged =
                resend_from[partition].map_or(queue.len(), |index| index - first_index);
            stats.retried_batches += queue.len() - acknowledged;
            queue.drain(..acknowledged);
        }
        if queues.iter().any(|q| !q.is_empty()) {
            if Instant::now() + backoff >= deadline {
                return Err(Error::Timeout(
                    "ProduceStream: batches still unacknowledged".to_owned(),
                ));
            }
            sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
    Ok(stats)
}

/// Per partition, the index (in `order`, the partitions of the requests sent) of its
/// first request that was not acknowledged, or None when all were. A refusal that is not
/// retriable is the error returned.
fn first_failures(
    order: &[i32],
    outcome: &[ItemOutcome],
    partitions: usize,
) -> Result<Vec<Option<usize>>, Error> {
    let mut resend_from: Vec<Option<usize>> = vec![None; partitions];
    for (index, partition) in order.iter().enumerate() {
        let slot = &mut resend_from[*partition as usize];
        if slot.is_some() {
            continue; // everything after a partition's first failure is sent again
        }
        match outcome.get(index) {
            Some(Ok(())) => {}
            // Written before, longer ago than the leader remembers offsets: acknowledged.
            Some(Err((code, _, _))) if code == "DUPLICATE_SEQUENCE_NUMBER" => {}
            Some(Err((code, false, message))) => {
                return Err(Error::Item {
                    call: "ProduceStream".to_owned(),
                    code: code.clone(),
                    retriable: false,
                    message: message.clone(),
                });
            }
            Some(Err(_)) | None => *slot = Some(index), // refused (retriable), or unanswered
        }
    }
    Ok(resend_from)
}

/// One answer of a ProduceStream: Ok, or (code name, retriable, message).
type ItemOutcome = Result<(), (String, bool, String)>;

/// Send `requests` on one ProduceStream and collect the answers, in order; fewer answers
/// than requests when the stream broke (a retriable status) before the end.
async fn produce_round(
    channel: &Channel,
    requests: Vec<proto::ProduceRequest>,
    deadline: Instant,
) -> Result<Vec<ItemOutcome>, Error> {
    let expected = requests.len();
    let mut broker = BrokerClient::new(channel.clone());
    let opened = timeout_at(
        deadline,
        broker.produce_stream(tokio_stream::iter(requests)),
    )
    .await;
    let mut stream = match opened {
        Err(_) => return Err(Error::Timeout("ProduceStream".to_owned())),
        Ok(Err(status)) => return broken_stream(&status, Vec::new()),
        Ok(Ok(response)) => response.into_inner(),
    };
    let mut outcomes = Vec::with_capacity(expected);
    while outcomes.len() < expected {
        match timeout_at(deadline, stream.message()).await {
            Err(_) => return Err(Error::Timeout("ProduceStream answers".to_owned())),
            Ok(Ok(Some(answer))) if answer.error_code == proto::ErrorCode::None as i32 => {
                outcomes.push(Ok(()))
            }
            Ok(Ok(Some(answer))) => {
                outcomes.push(Err((
                    code_name(answer.error_code),
                    answer.retriable,
                    answer.error_message,
                )));
            }
            Ok(Ok(None)) => break,
            Ok(Err(status)) => return broken_stream(&status, outcomes),
        }
    }
    Ok(outcomes)
}

fn broken_stream(
    status: &tonic::Status,
    outcomes: Vec<ItemOutcome>,
) -> Result<Vec<ItemOutcome>, Error> {
    let error = ApiError::from_status(status);
    if error.is_retriable() {
        eprintln!("ProduceStream: {error}; sending the unacknowledged batches again");
        Ok(outcomes)
    } else {
        Err(Error::Api {
            call: "ProduceStream".to_owned(),
            error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: &str, retriable: bool) -> ItemOutcome {
        Err((code.to_owned(), retriable, String::new()))
    }

    #[test]
    fn a_partition_is_sent_again_from_its_first_unacknowledged_batch() {
        let order = [0, 0, 0, 1, 1, 2, 2];
        let outcome = [
            Ok(()),
            refused("NOT_LEADER_OR_FOLLOWER", true),
            refused("OUT_OF_ORDER_SEQUENCE_NUMBER", false), // follows the refusal: ignored
            refused("DUPLICATE_SEQUENCE_NUMBER", false),    // written before
            Ok(()),
            Ok(()),
            // the stream broke before answering index 6
        ];
        let resend = first_failures(&order, &outcome, 3).unwrap();
        assert_eq!(resend, vec![Some(1), None, Some(6)]);
    }

    #[test]
    fn a_refusal_that_is_not_retriable_stops_the_producer() {
        let outcome = [Ok(()), refused("CORRUPT_MESSAGE", false)];
        let error = first_failures(&[0, 1], &outcome, 2).unwrap_err();
        assert!(
            matches!(error, Error::Item { ref code, .. } if code == "CORRUPT_MESSAGE"),
            "{error}"
        );
    }
}
