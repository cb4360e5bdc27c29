//! Body codecs of the batch format (attribute bits 0-2): none (0), LZ4 frame (3) and
//! Zstandard frame (4). Pure functions over byte slices.
//!
//! Decompression follows what docs/record-batch-format.md asks of every reader:
//!
//! - the stored body starts with a frame of its codec (not a skippable frame, not an LZ4
//!   legacy frame or raw block; no dictionaries); bytes after that first frame are
//!   ignored (a producer may not send them, and the broker refuses them on produce, but
//!   brokers before 2026-11 stored some);
//! - a content size in the frame header is optional, but when present it must equal the
//!   batch header's `uncompressed_body_length`, and is checked before decompressing;
//! - output is written into a buffer of exactly `uncompressed_body_length` bytes, and a
//!   frame that would produce more is refused at the point it runs out of room: a body
//!   that expands to gigabytes costs no more memory than the batch header admits (the
//!   caller checks that against its own limit first).
//!
//! Content checksums (and LZ4 block checksums) are verified when a frame has them.
//!
//! Zstandard is libzstd (the `zstd` crate, as the broker's Python side uses); LZ4 frames
//! are walked here, block by block, and each block is decompressed by `lz4_flex` straight
//! into its place in the output, with the frame's checksums verified when it has them.

use std::fmt;

use twox_hash::XxHash32;
use zstd::zstd_safe;

/// A body codec: the value of attribute bits 0-2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None = 0,
    Lz4 = 3,
    Zstd = 4,
}

impl Compression {
    /// The codec with id `id`, or None for ids the format does not support (1 gzip and
    /// 2 snappy among them).
    pub fn from_id(id: u16) -> Option<Self> {
        match id {
            0 => Some(Self::None),
            3 => Some(Self::Lz4),
            4 => Some(Self::Zstd),
            _ => None,
        }
    }

    /// Parse a codec name (`none`, `lz4`, `zstd`).
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "none" => Some(Self::None),
            "lz4" => Some(Self::Lz4),
            "zstd" => Some(Self::Zstd),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        }
    }
}

/// Why a stored body did not decompress to exactly the size its header states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError(pub String);

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn fail<T>(message: impl Into<String>) -> Result<T, CodecError> {
    Err(CodecError(message.into()))
}

/// Zstandard level used by `compress` (libzstd's default).
const ZSTD_LEVEL: i32 = 3;

/// Compress `body` with `compression` (an uncompressed body is returned as is).
pub fn compress(body: &[u8], compression: Compression) -> Vec<u8> {
    match compression {
        Compression::None => body.to_vec(),
        Compression::Zstd => {
            zstd::bulk::compress(body, ZSTD_LEVEL).expect("zstd compresses any input at level 3")
        }
        Compression::Lz4 => {
            use std::io::Write;
            let info = lz4_flex::frame::FrameInfo::new().content_size(Some(body.len() as u64));
            let mut encoder = lz4_flex::frame::FrameEncoder::with_frame_info(info, Vec::new());
            encoder
                .write_all(body)
                .expect("writing to a Vec cannot fail");
            encoder.finish().expect("writing to a Vec cannot fail")
        }
    }
}

/// Decompress `stored` into exactly `size` bytes (see the module docs for the checks).
/// The caller has checked `size` against its limit.
pub fn decompress(
    stored: &[u8],
    compression: Compression,
    size: usize,
) -> Result<Vec<u8>, CodecError> {
    match compression {
        Compression::None if stored.len() == size => Ok(stored.to_vec()),
        Compression::None => fail(format!(
            "uncompressed body is {} bytes, header says {size}",
            stored.len()
        )),
        Compression::Zstd => decompress_zstd(stored, size),
        Compression::Lz4 => decompress_lz4(stored, size),
    }
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let word = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([word[0], word[1], word[2], word[3]]))
}

// ------------------------------------------------------------------------------- zstd

const ZSTD_MAGIC: u32 = 0xFD2F_B528;

fn decompress_zstd(stored: &[u8], size: usize) -> Result<Vec<u8>, CodecError> {
    match read_u32(stored, 0) {
        Some(ZSTD_MAGIC) => {}
        Some(magic @ 0x184D_2A50..=0x184D_2A5F) => {
            return fail(format!(
                "zstd body starts with a skippable frame (magic {magic:#010x}): a body is \
                 exactly one Zstandard frame"
            ));
        }
        Some(magic) => {
            return fail(format!(
                "zstd body starts with {magic:#010x}, not the Zstandard frame magic {ZSTD_MAGIC:#010x}"
            ));
        }
        None => {
            return fail(format!(
                "zstd body of {} bytes is too short for a frame",
                stored.len()
            ));
        }
    }
    let frame_bytes = zstd_safe::find_frame_compressed_size(stored).or_else(|code| {
        fail(format!(
            "zstd frame is malformed or truncated: {}",
            zstd_safe::get_error_name(code)
        ))
    })?;
    // Bytes after the first frame are not read (see the module docs).
    let stored = &stored[..frame_bytes];
    if let Some(dictionary) = zstd_safe::get_dict_id_from_frame(stored) {
        return fail(format!(
            "zstd frame names dictionary {dictionary}: batches use none"
        ));
    }
    match zstd_safe::get_frame_content_size(stored) {
        Ok(Some(declared)) if declared != size as u64 => {
            return fail(format!(
                "zstd frame declares {declared} bytes, header says uncompressed_body_length={size}"
            ));
        }
        Ok(_) => {}
        Err(_) => return fail("zstd frame header is unreadable"),
    }
    let mut out = vec![0u8; size];
    // A `[u8]` destination has room for exactly `size` bytes: libzstd stops there.
    let written = zstd_safe::decompress(out.as_mut_slice(), stored).or_else(|code| {
        fail(format!(
            "zstd body does not decompress into uncompressed_body_length={size} bytes: {}",
            zstd_safe::get_error_name(code)
        ))
    })?;
    if written != size {
        return fail(format!(
            "zstd body decompresses to {written} bytes, header says uncompressed_body_length={size}"
        ));
    }
    Ok(out)
}

// -------------------------------------------------------------------------------- lz4

const LZ4_MAGIC: u32 = 0x184D_2204;
const LZ4_LEGACY_MAGIC: u32 = 0x184C_2102;
/// How far back a block of a linked-block frame may copy from the blocks before it.
const LZ4_WINDOW_BYTES: usize = 64 << 10;

/// What the frame descriptor (FLG and BD bytes, content size, header checksum) says.
struct Lz4Descriptor {
    blocks_independent: bool,
    block_checksums: bool,
    content_checksum: bool,
    block_bytes_max: usize,
    /// Offset of the first block in the frame.
    blocks_start: usize,
}

fn lz4_descriptor(stored: &[u8], size: usize) -> Result<Lz4Descriptor, CodecError> {
    match read_u32(stored, 0) {
        Some(LZ4_MAGIC) => {}
        Some(LZ4_LEGACY_MAGIC) => {
            return fail("lz4 body is a legacy frame: the frame format is required");
        }
        Some(magic @ 0x184D_2A50..=0x184D_2A5F) => {
            return fail(format!(
                "lz4 body starts with a skippable frame (magic {magic:#010x}): a body is exactly one LZ4 frame"
            ));
        }
        Some(magic) => {
            return fail(format!(
                "lz4 body starts with {magic:#010x}, not the LZ4 frame magic {LZ4_MAGIC:#010x} \
                 (a raw LZ4 block is not accepted)"
            ));
        }
        None => {
            return fail(format!(
                "lz4 body of {} bytes is too short for a frame",
                stored.len()
            ));
        }
    }
    let (Some(&flg), Some(&bd)) = (stored.get(4), stored.get(5)) else {
        return fail("lz4 frame descriptor is truncated");
    };
    if flg >> 6 != 0b01 {
        return fail(format!("lz4 frame version is {}, expected 1", flg >> 6));
    }
    if flg & 0x02 != 0 || bd & 0x8F != 0 {
        return fail(format!(
            "lz4 frame descriptor has reserved bits set (FLG {flg:#04x}, BD {bd:#04x})"
        ));
    }
    if flg & 0x01 != 0 {
        return fail("lz4 frame names a dictionary: batches use none");
    }
    let block_bytes_max = match (bd >> 4) & 0x07 {
        4 => 64 << 10,
        5 => 256 << 10,
        6 => 1 << 20,
        7 => 4 << 20,
        other => {
            return fail(format!(
                "lz4 block maximum size code {other} is invalid (4 to 7)"
            ));
        }
    };
    let has_content_size = flg & 0x08 != 0;
    let descriptor_end = if has_content_size { 14 } else { 6 };
    let Some(&header_checksum) = stored.get(descriptor_end) else {
        return fail("lz4 frame descriptor is truncated");
    };
    if has_content_size {
        let declared = u64::from_le_bytes(stored[6..14].try_into().expect("8 bytes"));
        if declared != size as u64 {
            return fail(format!(
                "lz4 frame declares {declared} bytes, header says uncompressed_body_length={size}"
            ));
        }
    }
    let expected = (XxHash32::oneshot(0, &stored[4..descriptor_end]) >> 8) as u8;
    if header_checksum != expected {
        return fail(format!(
            "lz4 frame descriptor checksum is {header_checksum:#04x}, computed {expected:#04x}"
        ));
    }
    Ok(Lz4Descriptor {
        blocks_independent: flg & 0x20 != 0,
        block_checksums: flg & 0x10 != 0,
        content_checksum: flg & 0x04 != 0,
        block_bytes_max,
        blocks_start: descriptor_end + 1,
    })
}

fn decompress_lz4(stored: &[u8], size: usize) -> Result<Vec<u8>, CodecError> {
    let frame = lz4_descriptor(stored, size)?;
    let mut out = vec![0u8; size];
    let mut written = 0usize;
    let mut position = frame.blocks_start;
    for block_index in 0.. {
        let Some(word) = read_u32(stored, position) else {
            return fail(format!(
                "lz4 frame is truncated before block {block_index} (no end mark)"
            ));
        };
        position += 4;
        if word == 0 {
            break; // the end mark
        }
        let stored_raw = word & 0x8000_0000 != 0;
        let length = (word & 0x7FFF_FFFF) as usize;
        if length > frame.block_bytes_max {
            return fail(format!(
                "lz4 block {block_index} is {length} bytes, more than the frame's block size {}",
                frame.block_bytes_max
            ));
        }
        let Some(data) = stored.get(position..position + length) else {
            return fail(format!("lz4 block {block_index} is truncated"));
        };
        position += length;
        if frame.block_checksums {
            let Some(checksum) = read_u32(stored, position) else {
                return fail(format!("lz4 block {block_index} checksum is truncated"));
            };
            position += 4;
            if checksum != XxHash32::oneshot(0, data) {
                return fail(format!("lz4 block {block_index} checksum does not match"));
            }
        }
        let room = frame.block_bytes_max.min(size - written);
        let produced = if stored_raw {
            if length > room {
                return fail(format!(
                    "lz4 body holds more than uncompressed_body_length={size} bytes (block {block_index})"
                ));
            }
            out[written..written + length].copy_from_slice(data);
            length
        } else {
            let (before, after) = out.split_at_mut(written);
            let target = &mut after[..room];
            let result = if frame.blocks_independent {
                lz4_flex::block::decompress_into(data, target)
            } else {
                let window = &before[before.len().saturating_sub(LZ4_WINDOW_BYTES)..];
                lz4_flex::block::decompress_into_with_dict(data, target, window)
            };
            result.or_else(|error| {
                fail(format!(
                    "lz4 block {block_index} does not decompress into the {room} bytes left of \
                     uncompressed_body_length={size}: {error}"
                ))
            })?
        };
        written += produced;
    }
    if frame.content_checksum {
        let Some(checksum) = read_u32(stored, position) else {
            return fail("lz4 content checksum is truncated");
        };
        if checksum != XxHash32::oneshot(0, &out[..written]) {
            return fail("lz4 content checksum does not match");
        }
    }
    // Bytes after the frame (its end mark and content checksum) are not read (see the
    // module docs).
    if written != size {
        return fail(format!(
            "lz4 body decompresses to {written} bytes, header says uncompressed_body_length={size}"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect()
    }

    #[test]
    fn round_trips() {
        let body = sample();
        for codec in [Compression::None, Compression::Lz4, Compression::Zstd] {
            let stored = compress(&body, codec);
            assert_eq!(
                decompress(&stored, codec, body.len()).unwrap(),
                body,
                "{codec:?}"
            );
        }
    }

    #[test]
    fn refuses_a_wrong_size_before_and_while_decompressing() {
        let body = sample();
        for codec in [Compression::Lz4, Compression::Zstd] {
            let stored = compress(&body, codec);
            let error = decompress(&stored, codec, body.len() - 1).unwrap_err();
            assert!(error.0.contains("declares"), "{codec:?}: {error}");
        }
        // Without a content size in the frame, the limit stops decompression itself.
        let stored = zstd::stream::encode_all(&body[..], 3).unwrap();
        assert!(matches!(
            zstd_safe::get_frame_content_size(&stored),
            Ok(None)
        ));
        let error = decompress(&stored, Compression::Zstd, 1000).unwrap_err();
        assert!(error.0.contains("does not decompress into"), "{error}");
        let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
        std::io::Write::write_all(&mut encoder, &body).unwrap();
        let stored = encoder.finish().unwrap();
        let error = decompress(&stored, Compression::Lz4, 1000).unwrap_err();
        assert!(error.0.contains("does not decompress into"), "{error}");
        assert_eq!(
            decompress(&stored, Compression::Lz4, body.len()).unwrap(),
            body
        );
    }

    #[test]
    fn reads_linked_lz4_blocks_with_checksums() {
        use lz4_flex::frame::{BlockMode, BlockSize, FrameEncoder, FrameInfo};
        let body = sample();
        for mode in [BlockMode::Linked, BlockMode::Independent] {
            let info = FrameInfo::new()
                .block_mode(mode)
                .block_size(BlockSize::Max64KB)
                .block_checksums(true)
                .content_checksum(true);
            let mut encoder = FrameEncoder::with_frame_info(info, Vec::new());
            std::io::Write::write_all(&mut encoder, &body).unwrap();
            let mut stored = encoder.finish().unwrap();
            assert_eq!(
                decompress(&stored, Compression::Lz4, body.len()).unwrap(),
                body
            );
            let last = stored.len() - 1;
            stored[last] ^= 1; // the content checksum
            let error = decompress(&stored, Compression::Lz4, body.len()).unwrap_err();
            assert!(error.0.contains("content checksum"), "{error}");
        }
    }

    #[test]
    fn reads_the_first_frame_and_ignores_what_follows() {
        let body = sample();
        for codec in [Compression::Lz4, Compression::Zstd] {
            let mut stored = compress(&body, codec);
            let frame = stored.clone();
            stored.extend_from_slice(&frame);
            stored.extend_from_slice(&[0u8; 8]);
            assert_eq!(
                decompress(&stored, codec, body.len()).unwrap(),
                body,
                "{codec:?}"
            );
        }
    }

    #[test]
    fn refuses_a_raw_lz4_block() {
        let body = sample();
        let raw = lz4_flex::block::compress(&body);
        let error = decompress(&raw, Compression::Lz4, body.len()).unwrap_err();
        assert!(error.0.contains("not the LZ4 frame magic"), "{error}");
    }
}
