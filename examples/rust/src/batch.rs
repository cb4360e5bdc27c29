//! Record batch format v1 (docs/record-batch-format.md): an encoder and a decoder, pure
//! functions over byte slices (no I/O).
//!
//! Layout, all integers little-endian; the 80-byte header:
//!
//! ```text
//! off size field                     off size field
//!   0   8  base_offset                 40   8  first_timestamp (ms)
//!   8   4  batch_length (total - 12)   48   8  max_timestamp (ms)
//!  12   4  leader_epoch                56   8  producer_id
//!  16   1  magic = 1                   64   4  base_sequence
//!  17   3  reserved, zero (checked)    68   2  producer_epoch
//!  20   4  crc: CRC-32C of [24, total) 70   2  reserved
//!  24   2  attributes                  72   4  uncompressed_body_length
//!  26   2  reserved                    76   4  reserved
//!  28   4  record_count                80      body (body_length bytes), zero padding
//!  32   4  last_offset_delta                   to a multiple of 8
//!  36   4  body_length
//! ```
//!
//! The body (after decompression) is Apache Arrow's layout, every section padded with
//! zeros to a multiple of 8: [has keys] key validity, key offsets (int32 × n+1), key
//! data; value validity, value offsets, value data; timestamp deltas (int32 × n);
//! [has headers] header list offsets (int32 × n+1), header key offsets and data (UTF-8,
//! never null), header value validity, offsets and data.
//!
//! Rules this module follows, as the spec states them:
//! - CRC-32C is the standard Castagnoli CRC (preset and final xor 0xFFFFFFFF, reflected;
//!   "123456789" gives 0xE3069283), over bytes [24, total size).
//! - Validity bitmaps: bit i (LSB first) is 1 when item i is present. The encoder writes
//!   0 for bits at or past the item count; the decoder ignores them (older batches have
//!   them set).
//! - A null item's slot is empty when encoded; the decoder ignores the bytes of a null
//!   slot.
//! - Has keys (bit 6) is set exactly when some key is non-null, has headers (bit 7)
//!   exactly when some record has a header; the decoder accepts either bit with no key
//!   or header behind it.
//! - The decoder rejects non-zero reserved bytes 17-19 and attribute bits 8-15, and
//!   ignores reserved bytes 26-27, 70-71 and 76-79 (the broker refuses those on produce;
//!   the encoder writes zeros).
//! - Timestamp deltas are int32: `encode_batches` splits records whose timestamps span
//!   more than that from the first of a batch.
//!
//! Every check of the spec's "Checks a decoder (and the broker) must make" is made by
//! `decode_batch`, and a failure is a `DecodeError` naming the `Check`.

use std::fmt;
use std::ops::Range;

use crate::codec::{self, Compression};

mod decode;

pub use decode::{Check, DecodeError, decode_batch, decode_batches, read_header};

pub const HEADER_BYTES: usize = 80;
/// base_offset and batch_length: what a reader needs to find the next batch.
pub const LENGTH_PREFIX_BYTES: usize = 12;
pub const CRC_START: usize = 24;
pub const ALIGNMENT: usize = 8;
pub const MAGIC: u8 = 1;
pub const RECORD_COUNT_MAX: usize = 1 << 24;
/// The format's own ceiling (int32 lengths); topics set far lower max_message_bytes.
pub const BATCH_BYTES_MAX: usize = (1 << 31) - 8;
/// Largest body a reader decompresses when it knows no topic limit (as the Python
/// client: the largest max_message_bytes a topic may set).
pub const UNCOMPRESSED_BODY_BYTES_MAX: usize = 1 << 30;

const CODEC_MASK: u16 = 0x0007;
const LOG_APPEND_TIME_BIT: u16 = 0x0008;
const TRANSACTIONAL_BIT: u16 = 0x0010;
const CONTROL_BIT: u16 = 0x0020;
const HAS_KEYS_BIT: u16 = 0x0040;
const HAS_HEADERS_BIT: u16 = 0x0080;
const KNOWN_ATTRIBUTE_BITS: u16 = 0x00FF;

// ------------------------------------------------------------------------------ types

/// One record header: a UTF-8 key and a value that may be null.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub key: String,
    pub value: Option<Vec<u8>>,
}

/// One record to encode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub key: Option<Vec<u8>>,
    /// None is a tombstone.
    pub value: Option<Vec<u8>>,
    pub headers: Vec<RecordHeader>,
    /// Create time, ms since the Unix epoch.
    pub timestamp_ms: i64,
}

/// One decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedRecord {
    pub offset: i64,
    pub timestamp_ms: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<RecordHeader>,
}

/// The producer fields of a header: all -1 for a plain batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Producer {
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// Sequence number of the batch's first record, in [0, 2^31 - 1].
    pub base_sequence: i32,
}

impl Producer {
    pub const NONE: Producer = Producer {
        producer_id: -1,
        producer_epoch: -1,
        base_sequence: -1,
    };

    pub fn is_idempotent(&self) -> bool {
        self.producer_id >= 0
    }

    /// The fields of the batch that follows one of `records` records (sequences wrap at
    /// 2^31).
    pub fn after(&self, records: usize) -> Producer {
        if !self.is_idempotent() {
            return *self;
        }
        let next = (i64::from(self.base_sequence) + records as i64) % (1i64 << 31);
        Producer {
            base_sequence: next as i32,
            ..*self
        }
    }
}

/// What the encoder writes besides the records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeOptions {
    pub compression: Compression,
    /// Producers write 0 (the broker assigns it).
    pub base_offset: i64,
    /// Producers write -1 (the broker assigns it).
    pub leader_epoch: i32,
    pub producer: Producer,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            compression: Compression::None,
            base_offset: 0,
            leader_epoch: -1,
            producer: Producer::NONE,
        }
    }
}

/// The decoded 80-byte header of one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub leader_epoch: i32,
    pub magic: u8,
    pub crc: u32,
    pub attributes: u16,
    pub record_count: i32,
    pub last_offset_delta: i32,
    pub body_length: i32,
    pub first_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub base_sequence: i32,
    pub producer_epoch: i16,
    pub uncompressed_body_length: i32,
}

impl BatchHeader {
    fn parse(bytes: &[u8]) -> BatchHeader {
        let i64_at = |at: usize| i64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let i32_at = |at: usize| i32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        BatchHeader {
            base_offset: i64_at(0),
            batch_length: i32_at(8),
            leader_epoch: i32_at(12),
            magic: bytes[16],
            crc: u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes")),
            attributes: u16::from_le_bytes([bytes[24], bytes[25]]),
            record_count: i32_at(28),
            last_offset_delta: i32_at(32),
            body_length: i32_at(36),
            first_timestamp: i64_at(40),
            max_timestamp: i64_at(48),
            producer_id: i64_at(56),
            base_sequence: i32_at(64),
            producer_epoch: i16::from_le_bytes([bytes[68], bytes[69]]),
            uncompressed_body_length: i32_at(72),
        }
    }

    /// Bytes of the whole batch: 12 + batch_length (may be nonsense before `read_header`
    /// checked it).
    pub fn total_size(&self) -> i64 {
        LENGTH_PREFIX_BYTES as i64 + i64::from(self.batch_length)
    }

    /// One past the batch's last offset.
    pub fn next_offset(&self) -> i64 {
        self.base_offset + i64::from(self.last_offset_delta) + 1
    }

    pub fn compression(&self) -> Option<Compression> {
        Compression::from_id(self.attributes & CODEC_MASK)
    }

    pub fn has_keys(&self) -> bool {
        self.attributes & HAS_KEYS_BIT != 0
    }

    pub fn has_headers(&self) -> bool {
        self.attributes & HAS_HEADERS_BIT != 0
    }

    pub fn is_log_append_time(&self) -> bool {
        self.attributes & LOG_APPEND_TIME_BIT != 0
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL_BIT != 0
    }

    /// A control batch (reserved; none are written today): consumers skip its records.
    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL_BIT != 0
    }
}

/// One decoded batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedBatch {
    pub header: BatchHeader,
    pub records: Vec<DecodedRecord>,
}

// ----------------------------------------------------------------------------- errors

/// Inputs no batch can hold (the caller's mistakes; `encode_batches` avoids them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// A batch holds 1 to 2^24 records.
    RecordCount(usize),
    /// Record `index`'s timestamp is more than an int32 of ms from the first's.
    TimestampSpan { index: usize, delta_ms: i64 },
    /// A section or the batch is larger than int32 lengths allow.
    TooLarge(usize),
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::RecordCount(n) => {
                write!(f, "a batch holds 1 to {RECORD_COUNT_MAX} records, got {n}")
            }
            EncodeError::TimestampSpan { index, delta_ms } => write!(
                f,
                "record {index} is {delta_ms} ms from the batch's first timestamp; deltas are int32"
            ),
            EncodeError::TooLarge(bytes) => {
                write!(
                    f,
                    "{bytes} bytes exceed the format's int32 lengths ({BATCH_BYTES_MAX})"
                )
            }
        }
    }
}

impl std::error::Error for EncodeError {}

// ----------------------------------------------------------------------------- encode

fn pad_to_alignment(out: &mut Vec<u8>) {
    let padded = out.len().next_multiple_of(ALIGNMENT);
    out.resize(padded, 0);
}

pub(crate) fn bitmap_bytes(count: usize) -> usize {
    count.div_ceil(8)
}

/// A binary column: [validity bitmap], int32 offsets, data; each padded. Null items get
/// empty slots; bitmap bits past the count stay 0.
fn put_binary_column<'a>(
    out: &mut Vec<u8>,
    items: impl ExactSizeIterator<Item = Option<&'a [u8]>> + Clone,
    with_validity: bool,
) -> Result<(), EncodeError> {
    let count = items.len();
    if with_validity {
        let start = out.len();
        out.resize(start + bitmap_bytes(count), 0);
        for (index, item) in items.clone().enumerate() {
            if item.is_some() {
                out[start + index / 8] |= 1 << (index % 8);
            }
        }
        pad_to_alignment(out);
    }
    let mut end = 0usize;
    out.extend_from_slice(&0i32.to_le_bytes());
    for item in items.clone() {
        end += item.map_or(0, <[u8]>::len);
        let end_i32 = i32::try_from(end).map_err(|_| EncodeError::TooLarge(end))?;
        out.extend_from_slice(&end_i32.to_le_bytes());
    }
    pad_to_alignment(out);
    for item in items.flatten() {
        out.extend_from_slice(item);
    }
    pad_to_alignment(out);
    Ok(())
}

fn put_offsets(out: &mut Vec<u8>, counts: impl Iterator<Item = usize>) -> Result<(), EncodeError> {
    let mut end = 0usize;
    out.extend_from_slice(&0i32.to_le_bytes());
    for count in counts {
        end += count;
        let end_i32 = i32::try_from(end).map_err(|_| EncodeError::TooLarge(end))?;
        out.extend_from_slice(&end_i32.to_le_bytes());
    }
    pad_to_alignment(out);
    Ok(())
}

/// The uncompressed body of `records` and its attribute bits (has keys, has headers).
fn encode_body(records: &[Record], first_timestamp: i64) -> Result<(Vec<u8>, u16), EncodeError> {
    let mut body = Vec::new();
    let mut attributes = 0u16;
    if records.iter().any(|r| r.key.is_some()) {
        attributes |= HAS_KEYS_BIT;
        put_binary_column(&mut body, records.iter().map(|r| r.key.as_deref()), true)?;
    }
    put_binary_column(&mut body, records.iter().map(|r| r.value.as_deref()), true)?;
    for (index, record) in records.iter().enumerate() {
        let delta = record
            .timestamp_ms
            .checked_sub(first_timestamp)
            .and_then(|delta_ms| i32::try_from(delta_ms).ok())
            .ok_or(EncodeError::TimestampSpan {
                index,
                delta_ms: record.timestamp_ms.wrapping_sub(first_timestamp),
            })?;
        body.extend_from_slice(&delta.to_le_bytes());
    }
    pad_to_alignment(&mut body);
    if records.iter().any(|r| !r.headers.is_empty()) {
        attributes |= HAS_HEADERS_BIT;
        put_offsets(&mut body, records.iter().map(|r| r.headers.len()))?;
        let headers: Vec<&RecordHeader> = records.iter().flat_map(|r| &r.headers).collect();
        put_binary_column(
            &mut body,
            headers.iter().map(|h| Some(h.key.as_bytes())),
            false,
        )?;
        put_binary_column(&mut body, headers.iter().map(|h| h.value.as_deref()), true)?;
    }
    Ok((body, attributes))
}

/// Encode `records` (1 to 2^24, timestamps within an int32 of ms of the first) into one
/// batch, byte for byte as Headwater's reference encoder does for uncompressed batches.
pub fn encode_batch(records: &[Record], options: &EncodeOptions) -> Result<Vec<u8>, EncodeError> {
    let count = records.len();
    if !(1..=RECORD_COUNT_MAX).contains(&count) {
        return Err(EncodeError::RecordCount(count));
    }
    let first_timestamp = records[0].timestamp_ms;
    let max_timestamp = records
        .iter()
        .map(|r| r.timestamp_ms)
        .max()
        .expect("at least one record");
    let (body, has_bits) = encode_body(records, first_timestamp)?;
    let stored = codec::compress(&body, options.compression);
    let total = (HEADER_BYTES + stored.len()).next_multiple_of(ALIGNMENT);
    if total > BATCH_BYTES_MAX {
        return Err(EncodeError::TooLarge(total));
    }
    let mut batch = Vec::with_capacity(total);
    let count_i32 = count as i32; // <= 2^24
    batch.extend_from_slice(&options.base_offset.to_le_bytes());
    batch.extend_from_slice(&((total - LENGTH_PREFIX_BYTES) as i32).to_le_bytes());
    batch.extend_from_slice(&options.leader_epoch.to_le_bytes());
    batch.extend_from_slice(&[MAGIC, 0, 0, 0]);
    batch.extend_from_slice(&[0; 4]); // crc, written last
    batch.extend_from_slice(&(options.compression as u16 | has_bits).to_le_bytes());
    batch.extend_from_slice(&[0; 2]);
    batch.extend_from_slice(&count_i32.to_le_bytes());
    batch.extend_from_slice(&(count_i32 - 1).to_le_bytes());
    batch.extend_from_slice(&(stored.len() as i32).to_le_bytes());
    batch.extend_from_slice(&first_timestamp.to_le_bytes());
    batch.extend_from_slice(&max_timestamp.to_le_bytes());
    batch.extend_from_slice(&options.producer.producer_id.to_le_bytes());
    batch.extend_from_slice(&options.producer.base_sequence.to_le_bytes());
    batch.extend_from_slice(&options.producer.producer_epoch.to_le_bytes());
    batch.extend_from_slice(&[0; 2]);
    let body_len = i32::try_from(body.len()).map_err(|_| EncodeError::TooLarge(body.len()))?;
    batch.extend_from_slice(&body_len.to_le_bytes());
    batch.extend_from_slice(&[0; 4]);
    debug_assert_eq!(batch.len(), HEADER_BYTES);
    batch.extend_from_slice(&stored);
    batch.resize(total, 0);
    let crc = crc32c::crc32c(&batch[CRC_START..]);
    batch[20..24].copy_from_slice(&crc.to_le_bytes());
    Ok(batch)
}

/// Cut `records` into runs that each fit one batch: at most `records_max` records
/// (capped at 2^24), every timestamp within an int32 of ms of the run's first.
pub fn batch_ranges(records: &[Record], records_max: usize) -> Vec<Range<usize>> {
    let records_max = records_max.clamp(1, RECORD_COUNT_MAX);
    let mut ranges = Vec::new();
    let mut start = 0;
    for (index, record) in records.iter().enumerate() {
        let first = records[start].timestamp_ms;
        let fits = record
            .timestamp_ms
            .checked_sub(first)
            .is_some_and(|delta| i32::try_from(delta).is_ok());
        if index > start && (!fits || index - start == records_max) {
            ranges.push(start..index);
            start = index;
        }
    }
    if start < records.len() {
        ranges.push(start..records.len());
    }
    ranges
}

/// Encode `records` into as many batches as the format needs (see `batch_ranges`); an
/// idempotent producer's base_sequence advances from one batch to the next.
pub fn encode_batches(
    records: &[Record],
    records_max: usize,
    options: &EncodeOptions,
) -> Result<Vec<Vec<u8>>, EncodeError> {
    let mut options = *options;
    let mut batches = Vec::new();
    for range in batch_ranges(records, records_max) {
        let count = range.len();
        batches.push(encode_batch(&records[range], &options)?);
        options.producer = options.producer.after(count);
    }
    Ok(batches)
}

#[cfg(test)]
mod tests;
