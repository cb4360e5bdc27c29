//! The shared test vectors (docs/testvectors/record-batches.json) as Rust values: used
//! by tests/vectors.rs (against this crate's encoder and decoder) and by the
//! `conformance` command (against a live broker).
//!
//! `vectors`: valid batches with their records (key and value as hex or null, headers as
//! [key, hex or null] pairs) and header fields; `byte_exact` ones are reproduced byte
//! for byte by a conforming encoder. `rejections` (optional): invalid batches, each with
//! who refuses it (`decoder`: every reader; `broker`: a broker on produce, while readers
//! accept it) and the ErrorCode name the broker answers.

use serde_json::Value;

use crate::batch::{Producer, Record, RecordHeader};
use crate::codec::Compression;

#[derive(Clone, Debug)]
pub struct Vector {
    pub name: String,
    pub compression: Compression,
    pub byte_exact: bool,
    pub base_offset: i64,
    pub leader_epoch: i32,
    pub producer: Producer,
    pub crc: u32,
    pub attributes: u16,
    pub batch: Vec<u8>,
    /// (offset, record) in batch order.
    pub records: Vec<(i64, Record)>,
}

#[derive(Clone, Debug)]
pub struct Rejection {
    pub name: String,
    pub description: String,
    /// "decoder" or "broker".
    pub rejected_by: String,
    /// The ErrorCode name the broker answers.
    pub error: String,
    pub batch: Vec<u8>,
}

#[derive(Clone, Debug)]
pub struct VectorFile {
    pub vectors: Vec<Vector>,
    /// Empty when the file has no `rejections` list.
    pub rejections: Vec<Rejection>,
}

fn text(entry: &Value, field: &str) -> Result<String, String> {
    entry[field]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{field} is not a string in {entry}"))
}

fn int(entry: &Value, field: &str) -> Result<i64, String> {
    entry[field]
        .as_i64()
        .ok_or_else(|| format!("{field} is not an integer in {entry}"))
}

fn narrow<T: TryFrom<i64>>(entry: &Value, field: &str) -> Result<T, String> {
    T::try_from(int(entry, field)?).map_err(|_| format!("{field} is out of range in {entry}"))
}

fn hex(entry: &Value, field: &str) -> Result<Vec<u8>, String> {
    hex::decode(text(entry, field)?).map_err(|e| format!("{field}: {e}"))
}

/// Hex text, or None for JSON null.
fn hex_or_null(value: &Value) -> Result<Option<Vec<u8>>, String> {
    match value {
        Value::Null => Ok(None),
        Value::String(text) => hex::decode(text)
            .map(Some)
            .map_err(|e| format!("{text}: {e}")),
        other => Err(format!("expected hex text or null, got {other}")),
    }
}

fn record(entry: &Value) -> Result<(i64, Record), String> {
    let pairs = entry["headers"]
        .as_array()
        .ok_or_else(|| format!("headers missing in {entry}"))?;
    let mut headers = Vec::with_capacity(pairs.len());
    for pair in pairs {
        let key = pair[0]
            .as_str()
            .ok_or_else(|| format!("header key is not text in {entry}"))?;
        headers.push(RecordHeader {
            key: key.to_owned(),
            value: hex_or_null(&pair[1])?,
        });
    }
    let record = Record {
        key: hex_or_null(&entry["key"])?,
        value: hex_or_null(&entry["value"])?,
        headers,
        timestamp_ms: int(entry, "timestamp_ms")?,
    };
    Ok((int(entry, "offset")?, record))
}

fn vector(entry: &Value) -> Result<Vector, String> {
    let name = text(entry, "name")?;
    let codec = text(entry, "compression")?;
    let records = entry["records"]
        .as_array()
        .ok_or_else(|| format!("vector {name}: no records"))?;
    Ok(Vector {
        compression: Compression::parse(&codec)
            .ok_or_else(|| format!("vector {name}: codec {codec}"))?,
        byte_exact: entry["byte_exact"].as_bool().unwrap_or(false),
        base_offset: int(entry, "base_offset")?,
        leader_epoch: narrow(entry, "leader_epoch")?,
        producer: Producer {
            producer_id: int(entry, "producer_id")?,
            producer_epoch: narrow(entry, "producer_epoch")?,
            base_sequence: narrow(entry, "base_sequence")?,
        },
        crc: narrow(entry, "crc")?,
        attributes: narrow(entry, "attributes")?,
        batch: hex(entry, "batch_hex")?,
        records: records.iter().map(record).collect::<Result<_, _>>()?,
        name,
    })
}

fn rejection(entry: &Value) -> Result<Rejection, String> {
    Ok(Rejection {
        name: text(entry, "name")?,
        description: text(entry, "description").unwrap_or_default(),
        rejected_by: text(entry, "rejected_by")?,
        error: text(entry, "error")?,
        batch: hex(entry, "batch_hex")?,
    })
}

/// Parse the vectors file's text.
pub fn parse(json_text: &str) -> Result<VectorFile, String> {
    let document: Value = serde_json::from_str(json_text).map_err(|e| format!("not JSON: {e}"))?;
    let list = |name: &str| {
        document
            .get(name)
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice)
    };
    Ok(VectorFile {
        vectors: list("vectors")
            .iter()
            .map(vector)
            .collect::<Result<_, _>>()?,
        rejections: list("rejections")
            .iter()
            .map(rejection)
            .collect::<Result<_, _>>()?,
    })
}
