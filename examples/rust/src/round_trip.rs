//! The `run` command: keyed records produced with this crate's encoder (an idempotent
//! producer, acks=all, on ProduceStream), partitioned by its murmur2, read back with
//! FetchStream and its decoder, and checked: every record exactly once, in order within
//! its partition, on the partition murmur2 picked for its key, equal to what was sent.
//!
//! The records of a run carry headers `run` (the run's id) and `seq` (its number), so a
//! run finds its own records again on a topic others write to; it reads each partition
//! from its high watermark before producing to the one after.

use std::collections::{HashSet, VecDeque};

use serde_json::{Value, json};
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::batch::{DecodedRecord, EncodeOptions, Producer, Record, RecordHeader, encode_batches};
use crate::client::{self, Error};
use crate::codec::Compression;
use crate::murmur2::partition_for_key;
use crate::producer::{self, PendingBatch};

/// Record `seq` of run `run_id`: a keyed order, a tombstone now and then, and headers
/// naming the run and the sequence (how the check finds its records again).
fn make_record(run_id: &str, seq: usize, timestamp_ms: i64) -> Record {
    let value = (seq % 101 != 100)
        .then(|| format!("{{\"order\":{seq},\"cents\":{}}}", seq * 7919 % 100_000).into_bytes());
    Record {
        key: Some(format!("customer-{}", seq % 997).into_bytes()),
        value,
        headers: vec![
            RecordHeader {
                key: "run".to_owned(),
                value: Some(run_id.as_bytes().to_vec()),
            },
            RecordHeader {
                key: "seq".to_owned(),
                value: Some(seq.to_string().into_bytes()),
            },
        ],
        timestamp_ms,
    }
}

fn header<'a>(record: &'a DecodedRecord, key: &str) -> Option<&'a [u8]> {
    record
        .headers
        .iter()
        .find(|h| h.key == key)
        .and_then(|h| h.value.as_deref())
}

/// Each partition's records (`by_partition` holds their indexes in `records`) encoded
/// into batches of at most `batch_records`, every partition's sequences from 0.
fn encode_partitions(
    records: &[Record],
    by_partition: &[Vec<usize>],
    batch_records: usize,
    options: &EncodeOptions,
) -> Result<Vec<VecDeque<PendingBatch>>, Error> {
    let mut queues = Vec::with_capacity(by_partition.len());
    for (partition, indexes) in by_partition.iter().enumerate() {
        let ordered: Vec<Record> = indexes.iter().map(|&i| records[i].clone()).collect();
        let partition = partition as i32;
        let batches = encode_batches(&ordered, batch_records, options)?;
        queues.push(
            batches
                .into_iter()
                .map(|bytes| PendingBatch { partition, bytes })
                .collect(),
        );
    }
    Ok(queues)
}

/// What `run` does: `records` keyed records to `topic` (created with `partitions` when
/// it does not exist), `batch_records` to a batch at most, bodies compressed with
/// `compression`.
#[derive(Clone, Debug)]
pub struct RoundTrip {
    pub topic: String,
    pub partitions: i32,
    pub records: usize,
    pub batch_records: usize,
    pub compression: Compression,
}

/// Produce, read back and check; the JSON summary (`ok` false when a check failed).
pub async fn run(channel: &Channel, args: &RoundTrip, deadline: Instant) -> Result<Value, Error> {
    let started = Instant::now();
    let (created, partitions) =
        client::ensure_topic(channel, &args.topic, args.partitions, &[], deadline).await?;
    let run_id = format!("{:x}-{}", client::now_ms(), std::process::id());
    let timestamp_ms = client::now_ms();
    let records: Vec<Record> = (0..args.records)
        .map(|seq| make_record(&run_id, seq, timestamp_ms))
        .collect();
    // Partition by murmur2 of the key, as Kafka's and Headwater's default partitioner.
    let mut by_partition: Vec<Vec<usize>> = vec![Vec::new(); partitions as usize];
    for (seq, record) in records.iter().enumerate() {
        let key = record.key.as_deref().expect("every record has a key");
        by_partition[partition_for_key(key, partitions as u32) as usize].push(seq);
    }
    let (producer_id, producer_epoch) = client::init_producer_id(channel, deadline).await?;
    let producer = Producer {
        producer_id,
        producer_epoch,
        base_sequence: 0,
    };
    let options = EncodeOptions {
        compression: args.compression,
        producer,
        ..Default::default()
    };
    let queues = encode_partitions(&records, &by_partition, args.batch_records, &options)?;
    let batch_count: usize = queues.iter().map(VecDeque::len).sum();
    // Our records land between the high watermarks before and after producing.
    let before = client::high_watermarks(channel, &args.topic, deadline).await?;
    let produce = producer::produce_idempotent(channel, &args.topic, queues, deadline).await?;
    let after = client::high_watermarks(channel, &args.topic, deadline).await?;
    let mut check = RunCheck::new(&records, &by_partition, &run_id);
    let mut per_partition = Vec::new();
    for partition in 0..partitions {
        let range = (before[partition as usize], after[partition as usize]);
        let consumed =
            client::consume_partition(channel, &args.topic, partition, range, deadline).await?;
        let ours = check.partition(partition, &consumed);
        per_partition.push(json!({
            "partition": partition,
            "produced": by_partition[partition as usize].len(),
            "consumed": ours,
            "start_offset": range.0,
            "end_offset": range.1,
        }));
    }
    Ok(check.summary(json!({
        "command": "run",
        "topic": args.topic,
        "created": created,
        "partitions": partitions,
        "compression": args.compression.name(),
        "producer_id": producer_id,
        "batches": batch_count,
        "produce_streams": produce.streams,
        "batches_sent_again": produce.retried_batches,
        "per_partition": per_partition,
        "elapsed_ms": started.elapsed().as_millis() as u64,
    })))
}

/// Every record produced comes back exactly once, in order within its partition, on
/// the partition murmur2 picked for its key, equal to what was sent.
struct RunCheck<'a> {
    records: &'a [Record],
    partition_of: Vec<i32>,
    run_id: &'a str,
    seen: HashSet<usize>,
    consumed: usize,
    duplicates: usize,
    out_of_order: usize,
    misplaced: usize,
    mismatched: usize,
    problems: Vec<String>,
}

impl<'a> RunCheck<'a> {
    fn new(records: &'a [Record], by_partition: &[Vec<usize>], run_id: &'a str) -> Self {
        let mut partition_of = vec![-1; records.len()];
        for (partition, seqs) in by_partition.iter().enumerate() {
            for &seq in seqs {
                partition_of[seq] = partition as i32;
            }
        }
        RunCheck {
            records,
            partition_of,
            run_id,
            seen: HashSet::new(),
            consumed: 0,
            duplicates: 0,
            out_of_order: 0,
            misplaced: 0,
            mismatched: 0,
            problems: Vec::new(),
        }
    }

    fn problem(&mut self, what: String) {
        if self.problems.len() < 10 {
            self.problems.push(what);
        }
    }

    /// Check what was read from `partition`; returns how many of the records were this
    /// run's.
    fn partition(&mut self, partition: i32, consumed: &[DecodedRecord]) -> usize {
        let mut ours = 0;
        let mut previous: Option<usize> = None;
        for record in consumed {
            if header(record, "run") != Some(self.run_id.as_bytes()) {
                continue; // another writer's record
            }
            ours += 1;
            self.consumed += 1;
            let seq = header(record, "seq")
                .and_then(|s| std::str::from_utf8(s).ok()?.parse::<usize>().ok());
            let Some(seq) = seq.filter(|&s| s < self.records.len()) else {
                self.mismatched += 1;
                self.problem(format!(
                    "offset {} of partition {partition}: no valid seq header",
                    record.offset
                ));
                continue;
            };
            if !self.seen.insert(seq) {
                self.duplicates += 1;
                self.problem(format!(
                    "record {seq} read again at offset {} of partition {partition}",
                    record.offset
                ));
                continue;
            }
            if self.partition_of[seq] != partition {
                self.misplaced += 1;
                self.problem(format!(
                    "record {seq} on partition {partition}, murmur2 says {}",
                    self.partition_of[seq]
                ));
            }
            if previous.is_some_and(|p| seq < p) {
                self.out_of_order += 1;
                self.problem(format!(
                    "record {seq} after record {} on partition {partition}",
                    previous.unwrap_or(0)
                ));
            }
            previous = Some(seq);
            let sent = &self.records[seq];
            let same = (
                &record.key,
                &record.value,
                &record.headers,
                record.timestamp_ms,
            ) == (&sent.key, &sent.value, &sent.headers, sent.timestamp_ms);
            if !same {
                self.mismatched += 1;
                self.problem(format!("record {seq} came back as {record:?}"));
            }
        }
        ours
    }

    fn summary(self, mut fields: Value) -> Value {
        let missing = self.records.len() - self.seen.len();
        let ok = missing == 0
            && self.duplicates + self.out_of_order + self.misplaced + self.mismatched == 0;
        let extra = json!({
            "ok": ok,
            "produced": self.records.len(),
            "consumed": self.consumed,
            "missing": missing,
            "duplicates": self.duplicates,
            "out_of_order": self.out_of_order,
            "misplaced": self.misplaced,
            "mismatched": self.mismatched,
            "problems": self.problems,
        });
        let object = fields.as_object_mut().expect("an object");
        object.extend(extra.as_object().expect("an object").clone());
        fields
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_finds_every_kind_of_problem() {
        let records: Vec<Record> = (0..4).map(|seq| make_record("r", seq, 5)).collect();
        let by_partition = vec![vec![0, 2], vec![1, 3]];
        let read = |seq: usize, offset: i64| DecodedRecord {
            offset,
            timestamp_ms: 5,
            key: records[seq].key.clone(),
            value: records[seq].value.clone(),
            headers: records[seq].headers.clone(),
        };
        let mut check = RunCheck::new(&records, &by_partition, "r");
        assert_eq!(
            check.partition(0, &[read(2, 0), read(0, 1), read(0, 2), read(1, 3)]),
            4
        );
        let summary = check.summary(json!({}));
        let counts = ["missing", "duplicates", "out_of_order", "misplaced"]
            .map(|k| summary[k].as_u64().unwrap());
        assert_eq!(counts, [1, 1, 1, 1]);
        assert_eq!(summary["ok"], json!(false));
    }
}
