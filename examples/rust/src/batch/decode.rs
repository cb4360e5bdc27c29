//! The decoder: every check of the spec's "Checks a decoder (and the broker) must make",
//! in the order of the reference decoder, so that a batch failing two checks is refused
//! with the same ErrorCode as by the broker. Nothing reads through an offset before its
//! whole offsets array is checked, and nothing is allocated per record before every
//! section was found to fit in the body.

use std::borrow::Cow;
use std::fmt;

use super::{
    ALIGNMENT, BATCH_BYTES_MAX, BatchHeader, CODEC_MASK, CRC_START, DecodedBatch, DecodedRecord,
    HEADER_BYTES, KNOWN_ATTRIBUTE_BITS, MAGIC, RECORD_COUNT_MAX, RecordHeader,
    UNCOMPRESSED_BODY_BYTES_MAX, bitmap_bytes,
};
use crate::codec::{self, Compression};

/// The decoder checks, numbered as in the spec's "Checks a decoder (and the broker)
/// must make".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// 1: at least 80 bytes.
    HeaderTruncated,
    /// 1: magic = 1.
    Magic,
    /// 1: reserved header bytes 17-19 are zero.
    ReservedHeaderBytes,
    /// 2: total size a multiple of 8, at least 80 (and within the format's ceiling).
    TotalSize,
    /// 2: total size no more than the bytes available (exactly, for one produced batch).
    BatchTruncated,
    /// 3: crc = CRC-32C of bytes [24, total size).
    Crc,
    /// 4: no unknown attribute bits (8-15).
    AttributeBits,
    /// 4: a supported codec (the broker answers UNSUPPORTED_COMPRESSION_TYPE).
    Codec,
    /// 5: record_count in [1, 2^24].
    RecordCount,
    /// 5: last_offset_delta = record_count - 1.
    LastOffsetDelta,
    /// 6: 0 <= total - 80 - body_length < 8.
    BodyLength,
    /// 7: uncompressed_body_length = body_length when uncompressed, within the reader's
    /// limit when compressed.
    UncompressedBodyLength,
    /// 7: the body decompresses to exactly uncompressed_body_length bytes (one frame).
    Decompression,
    /// 8: max_timestamp >= first_timestamp.
    MaxTimestamp,
    /// 9: every section fits in the body.
    SectionBounds,
    /// 9: every offsets array starts at 0 and never decreases.
    Offsets,
    /// 9: header keys are valid UTF-8.
    HeaderKeyUtf8,
    /// 9: no trailing bytes after the last section's padding.
    TrailingBytes,
}

impl Check {
    pub fn name(self) -> &'static str {
        match self {
            Check::HeaderTruncated => "header-truncated",
            Check::Magic => "magic",
            Check::ReservedHeaderBytes => "reserved-bytes-17-19",
            Check::TotalSize => "total-size",
            Check::BatchTruncated => "batch-truncated",
            Check::Crc => "crc",
            Check::AttributeBits => "attribute-bits",
            Check::Codec => "codec",
            Check::RecordCount => "record-count",
            Check::LastOffsetDelta => "last-offset-delta",
            Check::BodyLength => "body-length",
            Check::UncompressedBodyLength => "uncompressed-body-length",
            Check::Decompression => "decompression",
            Check::MaxTimestamp => "max-timestamp",
            Check::SectionBounds => "section-bounds",
            Check::Offsets => "offsets",
            Check::HeaderKeyUtf8 => "header-key-utf8",
            Check::TrailingBytes => "trailing-bytes",
        }
    }

    /// The ErrorCode name the broker answers for a batch failing this check.
    pub fn error_code(self) -> &'static str {
        match self {
            Check::Codec => "UNSUPPORTED_COMPRESSION_TYPE",
            _ => "CORRUPT_MESSAGE",
        }
    }
}

/// A batch failed `check`; `message` says how, with the valid range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    pub check: Check,
    /// Where the batch starts in the buffer decoded.
    pub position: usize,
    pub message: String,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({} check, batch at byte {}): {}",
            self.check.error_code(),
            self.check.name(),
            self.position,
            self.message
        )
    }
}

impl std::error::Error for DecodeError {}

struct Failure {
    check: Check,
    message: String,
}

fn failure<T>(check: Check, message: impl Into<String>) -> Result<T, Failure> {
    Err(Failure {
        check,
        message: message.into(),
    })
}

/// Parse and check the header of the batch at `position` of `buffer` (checks 1, 2, 4,
/// 5, 6, the header part of 7, and 8; not the CRC).
pub fn read_header(buffer: &[u8], position: usize) -> Result<BatchHeader, DecodeError> {
    check_header(buffer, position).map_err(|f| DecodeError {
        check: f.check,
        position,
        message: f.message,
    })
}

fn check_header(buffer: &[u8], position: usize) -> Result<BatchHeader, Failure> {
    let header = check_frame(buffer, position)?;
    check_fields(&header)?;
    Ok(header)
}

/// Checks 1 and 2: what a reader needs to find the batch's end.
fn check_frame(buffer: &[u8], position: usize) -> Result<BatchHeader, Failure> {
    let available = buffer.len().saturating_sub(position);
    if available < HEADER_BYTES {
        return failure(
            Check::HeaderTruncated,
            format!("{available} bytes left, a batch header is {HEADER_BYTES}"),
        );
    }
    let bytes = &buffer[position..];
    let header = BatchHeader::parse(&bytes[..HEADER_BYTES]);
    if header.magic != MAGIC {
        return failure(
            Check::Magic,
            format!("magic is {}, expected {MAGIC}", header.magic),
        );
    }
    if bytes[17..20] != [0, 0, 0] {
        return failure(
            Check::ReservedHeaderBytes,
            format!(
                "reserved bytes 17-19 are {:02x?}, must be zero",
                &bytes[17..20]
            ),
        );
    }
    let total = header.total_size();
    if total < HEADER_BYTES as i64
        || total % ALIGNMENT as i64 != 0
        || total > BATCH_BYTES_MAX as i64
    {
        return failure(
            Check::TotalSize,
            format!(
                "batch_length {} gives total size {total}: must be a multiple of {ALIGNMENT} in \
                 [{HEADER_BYTES}, {BATCH_BYTES_MAX}]",
                header.batch_length
            ),
        );
    }
    let total = total as usize;
    if total > available {
        return failure(
            Check::BatchTruncated,
            format!("header says {total} bytes, {available} available"),
        );
    }
    Ok(header)
}

/// Checks 4 to 8, on the header's fields.
fn check_fields(header: &BatchHeader) -> Result<(), Failure> {
    let total = header.total_size() as usize;
    let unknown = header.attributes & !KNOWN_ATTRIBUTE_BITS;
    if unknown != 0 {
        return failure(
            Check::AttributeBits,
            format!(
                "attributes {:#06x} have unknown bits {unknown:#06x} (bits 8-15 are reserved)",
                header.attributes
            ),
        );
    }
    let Some(compression) = header.compression() else {
        return failure(
            Check::Codec,
            format!(
                "codec id {} is not supported; valid: 0 (none), 3 (lz4), 4 (zstd)",
                header.attributes & CODEC_MASK
            ),
        );
    };
    if !(1..=RECORD_COUNT_MAX as i64).contains(&i64::from(header.record_count)) {
        return failure(
            Check::RecordCount,
            format!(
                "record_count {} outside [1, {RECORD_COUNT_MAX}]",
                header.record_count
            ),
        );
    }
    if header.last_offset_delta != header.record_count - 1 {
        return failure(
            Check::LastOffsetDelta,
            format!(
                "last_offset_delta {} != record_count - 1 ({})",
                header.last_offset_delta,
                header.record_count - 1
            ),
        );
    }
    let room = (total - HEADER_BYTES) as i64;
    let body_length = i64::from(header.body_length);
    if body_length < 0 || !(0..ALIGNMENT as i64).contains(&(room - body_length)) {
        return failure(
            Check::BodyLength,
            format!(
                "body_length {body_length} does not fill the batch: expected {}..={room}",
                (room - ALIGNMENT as i64 + 1).max(0)
            ),
        );
    }
    let uncompressed = header.uncompressed_body_length;
    if uncompressed < 0 || (compression == Compression::None && uncompressed != header.body_length)
    {
        return failure(
            Check::UncompressedBodyLength,
            format!(
                "uncompressed_body_length {uncompressed} inconsistent with body_length {} and codec {}",
                header.body_length,
                compression.name()
            ),
        );
    }
    if header.max_timestamp < header.first_timestamp {
        return failure(
            Check::MaxTimestamp,
            format!(
                "max_timestamp {} < first_timestamp {}",
                header.max_timestamp, header.first_timestamp
            ),
        );
    }
    Ok(())
}

/// Cuts a body into its 8-aligned sections, checking each against what is left.
struct Sections<'a> {
    body: &'a [u8],
    position: usize,
}

impl<'a> Sections<'a> {
    fn take(&mut self, size: usize, what: &str) -> Result<&'a [u8], Failure> {
        let end = self
            .position
            .checked_add(size)
            .filter(|&end| end <= self.body.len());
        let Some(end) = end else {
            return failure(
                Check::SectionBounds,
                format!(
                    "{what}: needs {size} bytes at body position {}, body has {}",
                    self.position,
                    self.body.len()
                ),
            );
        };
        let section = &self.body[self.position..end];
        self.position = end.next_multiple_of(ALIGNMENT);
        Ok(section)
    }

    /// An int32 offsets array of `count` + 1 entries, checked in full (starts at 0,
    /// never decreases) before any entry is used; its last entry is the data length.
    fn offsets(&mut self, count: usize, what: &str) -> Result<Vec<usize>, Failure> {
        // count is at most 2^31 - 1 (an int32 offset), so this cannot overflow a 64-bit
        // usize; saturating keeps a 32-bit target refusing instead of wrapping.
        let size = count.saturating_add(1).saturating_mul(4);
        let bytes = self.take(size, &format!("{what} offsets"))?;
        let mut offsets = Vec::with_capacity(count + 1);
        let mut previous = 0i32;
        for (index, word) in bytes.chunks_exact(4).enumerate() {
            let offset = i32::from_le_bytes([word[0], word[1], word[2], word[3]]);
            if index == 0 && offset != 0 {
                return failure(
                    Check::Offsets,
                    format!("{what} offsets start at {offset}, must start at 0"),
                );
            }
            if offset < previous {
                return failure(
                    Check::Offsets,
                    format!("{what} offsets decrease at entry {index}: {offset} after {previous}"),
                );
            }
            previous = offset;
            offsets.push(offset as usize);
        }
        Ok(offsets)
    }

    /// A binary column of `count` items: validity (unless never null), offsets, data.
    fn binary(
        &mut self,
        count: usize,
        what: &str,
        with_validity: bool,
    ) -> Result<BinaryColumn<'a>, Failure> {
        let validity = if with_validity {
            Some(self.take(bitmap_bytes(count), &format!("{what} validity"))?)
        } else {
            None
        };
        let offsets = self.offsets(count, what)?;
        let data = self.take(offsets[count], &format!("{what} data"))?;
        Ok(BinaryColumn {
            validity,
            offsets,
            data,
        })
    }
}

struct BinaryColumn<'a> {
    validity: Option<&'a [u8]>,
    /// Checked: start at 0, non-decreasing, last = data.len().
    offsets: Vec<usize>,
    data: &'a [u8],
}

impl<'a> BinaryColumn<'a> {
    fn is_present(&self, index: usize) -> bool {
        self.validity
            .is_none_or(|bitmap| bitmap[index / 8] & (1 << (index % 8)) != 0)
    }

    fn slot(&self, index: usize) -> &'a [u8] {
        &self.data[self.offsets[index]..self.offsets[index + 1]]
    }

    /// Item `index`, None when null (the bytes of a null slot are ignored).
    fn get(&self, index: usize) -> Option<Vec<u8>> {
        self.is_present(index).then(|| self.slot(index).to_vec())
    }
}

fn decode_body(header: &BatchHeader, body: &[u8]) -> Result<Vec<DecodedRecord>, Failure> {
    let count = header.record_count as usize;
    let mut sections = Sections { body, position: 0 };
    let keys = if header.has_keys() {
        Some(sections.binary(count, "key", true)?)
    } else {
        None
    };
    let values = sections.binary(count, "value", true)?;
    let deltas = sections.take(4 * count, "timestamp deltas")?;
    let headers = if header.has_headers() {
        let lists = sections.offsets(count, "header list")?;
        let entries = lists[count];
        let header_keys = sections.binary(entries, "header key", false)?;
        let header_values = sections.binary(entries, "header value", true)?;
        let mut keys = Vec::with_capacity(entries);
        for index in 0..entries {
            let key = std::str::from_utf8(header_keys.slot(index)).or_else(|error| {
                failure(
                    Check::HeaderKeyUtf8,
                    format!("header key {index} is not UTF-8: {error}"),
                )
            })?;
            keys.push(key);
        }
        Some((lists, keys, header_values))
    } else {
        None
    };
    if sections.position != body.len() {
        return failure(
            Check::TrailingBytes,
            format!(
                "the sections end at body position {}, the body has {} bytes",
                sections.position,
                body.len()
            ),
        );
    }
    let mut records = Vec::with_capacity(count);
    for index in 0..count {
        let delta = i32::from_le_bytes(
            deltas[4 * index..4 * index + 4]
                .try_into()
                .expect("4 bytes"),
        );
        let timestamp_ms = if header.is_log_append_time() {
            header.max_timestamp
        } else {
            // Wrapping, as the reference decoder's int64 arithmetic: the broker refuses
            // timestamps outside [0, 9999-12-31] on produce, so no stored batch is near.
            header.first_timestamp.wrapping_add(i64::from(delta))
        };
        let record_headers = match &headers {
            None => Vec::new(),
            Some((lists, keys, values)) => (lists[index]..lists[index + 1])
                .map(|entry| RecordHeader {
                    key: keys[entry].to_owned(),
                    value: values.get(entry),
                })
                .collect(),
        };
        records.push(DecodedRecord {
            offset: header.base_offset.wrapping_add(index as i64),
            timestamp_ms,
            key: keys.as_ref().and_then(|k| k.get(index)),
            value: values.get(index),
            headers: record_headers,
        });
    }
    Ok(records)
}

/// Check and decode the batch at `position` of `buffer` (which may hold more batches
/// after it). `uncompressed_bytes_max` is the reader's limit on a decompressed body.
pub fn decode_batch(
    buffer: &[u8],
    position: usize,
    uncompressed_bytes_max: usize,
) -> Result<DecodedBatch, DecodeError> {
    let error = |f: Failure| DecodeError {
        check: f.check,
        position,
        message: f.message,
    };
    let header = check_header(buffer, position).map_err(error)?;
    let batch = &buffer[position..position + header.total_size() as usize];
    let crc = crc32c::crc32c(&batch[CRC_START..]);
    if crc != header.crc {
        return Err(error(Failure {
            check: Check::Crc,
            message: format!(
                "stored crc {:#010x}, CRC-32C of bytes [24, {}) is {crc:#010x}",
                header.crc,
                batch.len()
            ),
        }));
    }
    let compression = header.compression().expect("checked by check_header");
    let stored = &batch[HEADER_BYTES..HEADER_BYTES + header.body_length as usize];
    let size = header.uncompressed_body_length as usize;
    let body = if compression == Compression::None {
        Cow::Borrowed(stored)
    } else {
        if size > uncompressed_bytes_max {
            return Err(error(Failure {
                check: Check::UncompressedBodyLength,
                message: format!(
                    "uncompressed_body_length {size} exceeds the reader's limit of {uncompressed_bytes_max} bytes"
                ),
            }));
        }
        let body = codec::decompress(stored, compression, size).map_err(|e| {
            error(Failure {
                check: Check::Decompression,
                message: e.0,
            })
        })?;
        Cow::Owned(body)
    };
    let records = decode_body(&header, &body).map_err(error)?;
    Ok(DecodedBatch { header, records })
}

/// Decode every batch of a concatenation (a Fetch answer's `records`).
pub fn decode_batches(buffer: &[u8]) -> Result<Vec<DecodedBatch>, DecodeError> {
    let mut batches = Vec::new();
    let mut position = 0;
    while position < buffer.len() {
        let batch = decode_batch(buffer, position, UNCOMPRESSED_BODY_BYTES_MAX)?;
        position += batch.header.total_size() as usize;
        batches.push(batch);
    }
    Ok(batches)
}
