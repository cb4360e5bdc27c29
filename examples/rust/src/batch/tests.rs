//! Unit tests of the batch encoder and decoder: round trips, the rules the decoder must
//! tolerate, and one failing case per decoder check. (The test vectors shared with the
//! other implementations are in tests/vectors.rs.)

use super::*;

const T0: i64 = 1_700_000_000_000;

fn record(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(&str, Option<&[u8]>)],
    timestamp_ms: i64,
) -> Record {
    Record {
        key: key.map(<[u8]>::to_vec),
        value: value.map(<[u8]>::to_vec),
        headers: headers
            .iter()
            .map(|(k, v)| RecordHeader {
                key: (*k).to_owned(),
                value: v.map(<[u8]>::to_vec),
            })
            .collect(),
        timestamp_ms,
    }
}

fn decode_one(batch: &[u8]) -> Result<DecodedBatch, DecodeError> {
    let decoded = decode_batches(batch)?;
    assert_eq!(decoded.len(), 1);
    Ok(decoded.into_iter().next().unwrap())
}

fn fix_crc(batch: &mut [u8]) {
    let crc = crc32c::crc32c(&batch[CRC_START..]);
    batch[20..24].copy_from_slice(&crc.to_le_bytes());
}

/// A batch around a hand-made uncompressed `body` (padded here), with a correct CRC.
fn wrap_body(attributes: u16, count: i32, body: &[u8]) -> Vec<u8> {
    let mut batch = encode_batch(
        &[record(None, Some(b"x"), &[], T0)],
        &EncodeOptions::default(),
    )
    .unwrap();
    batch.truncate(HEADER_BYTES);
    batch.extend_from_slice(body);
    batch.resize(batch.len().next_multiple_of(8), 0);
    let total = batch.len() as i32;
    batch[8..12].copy_from_slice(&(total - 12).to_le_bytes());
    batch[24..26].copy_from_slice(&attributes.to_le_bytes());
    batch[28..32].copy_from_slice(&count.to_le_bytes());
    batch[32..36].copy_from_slice(&(count - 1).to_le_bytes());
    batch[36..40].copy_from_slice(&(body.len() as i32).to_le_bytes());
    batch[72..76].copy_from_slice(&(body.len() as i32).to_le_bytes());
    fix_crc(&mut batch);
    batch
}

fn words(values: &[i32]) -> Vec<u8> {
    let mut out: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    out.resize(out.len().next_multiple_of(8), 0);
    out
}

fn padded(bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out.resize(out.len().next_multiple_of(8), 0);
    out
}

/// Body of two records with values "ab" and "c", no keys, no headers, deltas 0.
fn two_values_body() -> Vec<u8> {
    [
        padded(&[0b11]),
        words(&[0, 2, 3]),
        padded(b"abc"),
        words(&[0, 0]),
    ]
    .concat()
}

fn mixed_records() -> Vec<Record> {
    vec![
        record(Some(b"k0"), Some(b"v0"), &[("trace", Some(b"abc"))], T0),
        record(None, None, &[], T0 + 5),
        record(
            Some(b"k2"),
            Some(b""),
            &[("a", None), ("b", Some(b""))],
            T0 - 10,
        ),
    ]
}

fn assert_rejected(batch: &[u8], check: Check) {
    let error = decode_batches(batch).expect_err("decoder accepted a bad batch");
    assert_eq!(error.check, check, "{error}");
}

#[test]
fn crc32c_is_the_standard_castagnoli_crc() {
    assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
}

#[test]
fn round_trips_every_codec() {
    let records = mixed_records();
    for compression in [Compression::None, Compression::Lz4, Compression::Zstd] {
        let options = EncodeOptions {
            compression,
            base_offset: 42,
            leader_epoch: 3,
            ..EncodeOptions::default()
        };
        let batch = encode_batch(&records, &options).unwrap();
        assert_eq!(batch.len() % 8, 0);
        let decoded = decode_one(&batch).unwrap();
        assert_eq!(decoded.header.attributes, compression as u16 | 0xC0);
        assert_eq!(decoded.header.max_timestamp, T0 + 5);
        assert_eq!(decoded.header.next_offset(), 45);
        for (index, (got, want)) in decoded.records.iter().zip(&records).enumerate() {
            assert_eq!(got.offset, 42 + index as i64);
            assert_eq!(got.timestamp_ms, want.timestamp_ms);
            assert_eq!(
                (&got.key, &got.value, &got.headers),
                (&want.key, &want.value, &want.headers)
            );
        }
    }
}

#[test]
fn encodes_the_worked_example_with_zero_bits_past_the_count() {
    let batch = encode_batch(
        &[record(None, Some(b"hello"), &[], T0)],
        &EncodeOptions::default(),
    )
    .unwrap();
    assert_eq!(batch.len(), 112);
    assert_eq!(&batch[8..12], &100i32.to_le_bytes());
    assert_eq!(&batch[24..26], &[0, 0], "no keys, no headers, no codec");
    assert_eq!(
        &batch[80..88],
        &[0x01, 0, 0, 0, 0, 0, 0, 0],
        "validity: record 0 only"
    );
    assert_eq!(&batch[88..96], &words(&[0, 5])[..]);
    assert_eq!(&batch[96..101], b"hello");
    assert_eq!(&batch[104..112], &[0; 8]);
    assert_eq!(
        u32::from_le_bytes(batch[20..24].try_into().unwrap()),
        crc32c::crc32c(&batch[24..])
    );
}

#[test]
fn null_items_get_empty_slots_and_attribute_bits_follow_the_records() {
    let batch = encode_batch(
        &[
            record(None, None, &[], T0),
            record(None, Some(b"v"), &[], T0),
        ],
        &EncodeOptions::default(),
    )
    .unwrap();
    assert_eq!(batch[24] & 0xC0, 0, "no key and no header: neither bit");
    assert_eq!(batch[80], 0b10, "value 0 is null");
    assert_eq!(
        &batch[88..100],
        &words(&[0, 0, 1])[..12],
        "null slot is empty"
    );
}

#[test]
fn ignores_bitmap_bits_past_the_count_and_bytes_of_null_slots() {
    let mut body = two_values_body();
    body[0] = 0xFE; // value 0 null, value 1 present, bits 2-7 set
    let decoded = decode_one(&wrap_body(0, 2, &body)).unwrap();
    assert_eq!(
        decoded.records[0].value, None,
        "a null slot's bytes are ignored"
    );
    assert_eq!(decoded.records[1].value.as_deref(), Some(&b"c"[..]));
}

#[test]
fn accepts_has_keys_and_has_headers_with_nothing_behind_them() {
    let keys = [padded(&[0]), words(&[0, 0, 0]), Vec::new()].concat();
    let headers = [
        words(&[0, 0, 0]),
        words(&[0]),
        Vec::new(),
        Vec::new(),
        words(&[0]),
        Vec::new(),
    ]
    .concat();
    let body = [keys, two_values_body(), headers].concat();
    let decoded = decode_one(&wrap_body(0xC0, 2, &body)).unwrap();
    for record in &decoded.records {
        assert_eq!((&record.key, record.headers.len()), (&None, 0));
    }
}

#[test]
fn ignores_reserved_bytes_outside_the_header_check() {
    let mut batch = encode_batch(&mixed_records(), &EncodeOptions::default()).unwrap();
    for at in [26, 27, 70, 71, 76, 77, 78, 79] {
        batch[at] = 0xAA;
    }
    fix_crc(&mut batch);
    assert_eq!(decode_one(&batch).unwrap().records.len(), 3);
}

#[test]
fn log_append_time_gives_every_record_the_max_timestamp_and_control_batches_decode() {
    let mut batch = encode_batch(&mixed_records(), &EncodeOptions::default()).unwrap();
    batch[24] |= 0x08 | 0x20;
    fix_crc(&mut batch);
    let decoded = decode_one(&batch).unwrap();
    assert!(decoded.header.is_control() && decoded.header.is_log_append_time());
    assert!(decoded.records.iter().all(|r| r.timestamp_ms == T0 + 5));
}

#[test]
fn decodes_a_concatenation_and_names_the_position_of_a_bad_batch() {
    let first = encode_batch(&mixed_records(), &EncodeOptions::default()).unwrap();
    let options = EncodeOptions {
        base_offset: 3,
        compression: Compression::Zstd,
        ..EncodeOptions::default()
    };
    let second = encode_batch(&mixed_records(), &options).unwrap();
    let both = [first.clone(), second].concat();
    let decoded = decode_batches(&both).unwrap();
    assert_eq!(decoded.iter().map(|b| b.records.len()).sum::<usize>(), 6);
    let error = decode_batches(&both[..both.len() - 8]).unwrap_err();
    assert_eq!(
        (error.check, error.position),
        (Check::BatchTruncated, first.len())
    );
}

#[test]
fn splits_where_timestamps_leave_int32_and_advances_sequences() {
    let far = T0 + i64::from(i32::MAX) + 1;
    let records = vec![
        record(None, Some(b"a"), &[], T0),
        record(None, Some(b"b"), &[], T0 + i64::from(i32::MAX)),
        record(None, Some(b"c"), &[], far),
        record(None, Some(b"d"), &[], far + i64::from(i32::MIN)),
        record(None, Some(b"e"), &[], far + i64::from(i32::MIN) - 1),
    ];
    assert_eq!(batch_ranges(&records, 100), vec![0..2, 2..4, 4..5]);
    assert_eq!(batch_ranges(&records[..2], 1), vec![0..1, 1..2]);
    let error = encode_batch(&records, &EncodeOptions::default()).unwrap_err();
    assert_eq!(
        error,
        EncodeError::TimestampSpan {
            index: 2,
            delta_ms: i64::from(i32::MAX) + 1
        }
    );
    let producer = Producer {
        producer_id: 7,
        producer_epoch: 0,
        base_sequence: i32::MAX - 1,
    };
    let options = EncodeOptions {
        producer,
        ..EncodeOptions::default()
    };
    let batches = encode_batches(&records, 100, &options).unwrap();
    let sequences: Vec<i32> = batches
        .iter()
        .map(|b| i32::from_le_bytes(b[64..68].try_into().unwrap()))
        .collect();
    assert_eq!(sequences, vec![i32::MAX - 1, 0, 2], "wraps at 2^31");
    let decoded: Vec<i64> = batches
        .iter()
        .flat_map(|b| decode_one(b).unwrap().records)
        .map(|r| r.timestamp_ms)
        .collect();
    assert_eq!(
        decoded,
        records.iter().map(|r| r.timestamp_ms).collect::<Vec<_>>()
    );
}

#[test]
fn refuses_what_no_batch_holds() {
    assert_eq!(
        encode_batch(&[], &EncodeOptions::default()).unwrap_err(),
        EncodeError::RecordCount(0)
    );
}

// ------------------------------------------------------------------ one case per check

fn good() -> Vec<u8> {
    wrap_body(0, 2, &two_values_body())
}

/// `good()` changed by `edit`, with the CRC computed again.
fn edited(edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut batch = good();
    edit(&mut batch);
    fix_crc(&mut batch);
    batch
}

#[test]
fn the_good_batch_decodes() {
    let decoded = decode_one(&good()).unwrap();
    let values: Vec<_> = decoded
        .records
        .iter()
        .map(|r| r.value.clone().unwrap())
        .collect();
    assert_eq!(values, vec![b"ab".to_vec(), b"c".to_vec()]);
}

#[test]
fn check_1_header() {
    assert_rejected(&good()[..79], Check::HeaderTruncated);
    assert_rejected(&edited(|b| b[16] = 2), Check::Magic);
    let mut batch = good();
    batch[18] = 1; // outside the CRC
    assert_rejected(&batch, Check::ReservedHeaderBytes);
}

#[test]
fn check_2_total_size() {
    assert_rejected(&edited(|b| b[8] -= 4), Check::TotalSize);
    assert_rejected(
        &edited(|b| b[8..12].copy_from_slice(&60i32.to_le_bytes())),
        Check::TotalSize,
    );
    assert_rejected(
        &edited(|b| b[8..12].copy_from_slice(&(-12i32).to_le_bytes())),
        Check::TotalSize,
    );
    let batch = good();
    assert_rejected(&batch[..batch.len() - 8], Check::BatchTruncated);
}

#[test]
fn check_3_crc() {
    let mut batch = good();
    batch[100] ^= 1;
    assert_rejected(&batch, Check::Crc);
}

#[test]
fn check_4_attributes_and_codec() {
    assert_rejected(&edited(|b| b[25] = 0x01), Check::AttributeBits);
    for codec in [1, 2, 5, 7] {
        let batch = edited(|b| b[24] = codec);
        assert_rejected(&batch, Check::Codec);
        assert_eq!(
            decode_batches(&batch).unwrap_err().check.error_code(),
            "UNSUPPORTED_COMPRESSION_TYPE"
        );
    }
}

#[test]
fn check_5_record_count() {
    let set = |count: i32, last: i32| {
        edited(move |b| {
            b[28..32].copy_from_slice(&count.to_le_bytes());
            b[32..36].copy_from_slice(&last.to_le_bytes());
        })
    };
    assert_rejected(&set(0, -1), Check::RecordCount);
    assert_rejected(&set((1 << 24) + 1, 1 << 24), Check::RecordCount);
    assert_rejected(&set(2, 0), Check::LastOffsetDelta);
    // A count the body cannot hold fails on the sections, before anything is allocated.
    assert_rejected(&set(1 << 24, (1 << 24) - 1), Check::SectionBounds);
}

#[test]
fn check_6_body_length() {
    let set = |length: i32| edited(move |b| b[36..40].copy_from_slice(&length.to_le_bytes()));
    assert_rejected(&set(40 - 8), Check::BodyLength);
    assert_rejected(&set(48), Check::BodyLength);
    assert_rejected(&set(-1), Check::BodyLength);
}

#[test]
fn check_7_uncompressed_body_length() {
    assert_rejected(
        &edited(|b| b[72..76].copy_from_slice(&39i32.to_le_bytes())),
        Check::UncompressedBodyLength,
    );
    let zstd = EncodeOptions {
        compression: Compression::Zstd,
        ..EncodeOptions::default()
    };
    let batch = encode_batch(&mixed_records(), &zstd).unwrap();
    let set = |size: i32| {
        let mut b = batch.clone();
        b[72..76].copy_from_slice(&size.to_le_bytes());
        fix_crc(&mut b);
        b
    };
    assert_rejected(&set(-8), Check::UncompressedBodyLength);
    assert_rejected(&set(8), Check::Decompression);
    let error = decode_batch(&batch, 0, 16).unwrap_err();
    assert_eq!(
        error.check,
        Check::UncompressedBodyLength,
        "over the reader's limit: {error}"
    );
}

#[test]
fn check_8_max_timestamp() {
    assert_rejected(
        &edited(|b| b[48..56].copy_from_slice(&(T0 - 1).to_le_bytes())),
        Check::MaxTimestamp,
    );
}

#[test]
fn check_9_sections() {
    let body = two_values_body();
    let with_body = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut b = body.clone();
        edit(&mut b);
        wrap_body(0, 2, &b)
    };
    assert_rejected(&with_body(&|b| b[8] = 1), Check::Offsets);
    assert_rejected(&with_body(&|b| b[12] = 4), Check::Offsets);
    assert_rejected(&with_body(&|b| b[16] = 9), Check::SectionBounds);
    assert_rejected(&with_body(&|b| b.truncate(36)), Check::SectionBounds);
    assert_rejected(
        &with_body(&|b| b.extend_from_slice(&[0; 8])),
        Check::TrailingBytes,
    );
    let mut utf8 = encode_batch(
        &[record(None, None, &[("k\u{e9}", None)], T0)],
        &EncodeOptions::default(),
    )
    .unwrap();
    let at = utf8
        .windows(3)
        .position(|w| w == "k\u{e9}".as_bytes())
        .unwrap();
    utf8[at + 1] = 0xFF;
    fix_crc(&mut utf8);
    assert_rejected(&utf8, Check::HeaderKeyUtf8);
}

/// Hostile input: random bytes changed in valid batches (every codec), with the CRC made
/// right again half of the time so the body checks run, never panic the decoder; they
/// decode or fail a check.
#[test]
fn corrupted_batches_fail_a_check_and_never_panic() {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let originals: Vec<Vec<u8>> = [Compression::None, Compression::Lz4, Compression::Zstd]
        .into_iter()
        .map(|compression| {
            let options = EncodeOptions {
                compression,
                ..EncodeOptions::default()
            };
            encode_batch(&mixed_records(), &options).unwrap()
        })
        .collect();
    let mut rejected = 0;
    for round in 0..20_000 {
        let mut batch = originals[round % originals.len()].clone();
        for _ in 0..=(next() % 3) {
            let at = (next() as usize) % batch.len();
            batch[at] ^= 1 << (next() % 8);
        }
        if next() % 2 == 0 {
            fix_crc(&mut batch);
        }
        if decode_batches(&batch).is_err() {
            rejected += 1;
        }
    }
    assert!(
        rejected > 10_000,
        "only {rejected} of 20000 corrupted batches were refused"
    );
}
