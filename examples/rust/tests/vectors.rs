//! The shared test vectors, docs/testvectors/record-batches.json, against this crate's
//! encoder and decoder:
//!
//! - every entry of `vectors` decodes, header fields and records equal to the listed
//!   ones, field by field;
//! - every `byte_exact` vector is reproduced byte for byte by the encoder from its
//!   records and header fields;
//! - every entry of `rejections` (when the list is there) with `rejected_by: "decoder"`
//!   is refused with its `error`, and every one with `rejected_by: "broker"` decodes (the
//!   broker refuses it on produce; a reader must not).

use std::path::PathBuf;

use headwater_example::batch::{DecodedBatch, EncodeOptions, Record, decode_batches, encode_batch};
use headwater_example::vectors::{self, Vector, VectorFile};

fn load() -> VectorFile {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/testvectors/record-batches.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    vectors::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn decode_single(vector: &Vector) -> DecodedBatch {
    let mut batches =
        decode_batches(&vector.batch).unwrap_or_else(|e| panic!("vector {}: {e}", vector.name));
    assert_eq!(batches.len(), 1, "vector {} is one batch", vector.name);
    batches.remove(0)
}

#[test]
fn every_vector_decodes_to_its_records() {
    let file = load();
    assert!(!file.vectors.is_empty(), "no vectors");
    for vector in &file.vectors {
        let name = &vector.name;
        let header = decode_single(vector).header;
        assert_eq!(
            header.base_offset, vector.base_offset,
            "vector {name}: base_offset"
        );
        assert_eq!(
            header.leader_epoch, vector.leader_epoch,
            "vector {name}: leader_epoch"
        );
        assert_eq!(
            header.producer_id, vector.producer.producer_id,
            "vector {name}: producer_id"
        );
        assert_eq!(
            header.producer_epoch, vector.producer.producer_epoch,
            "vector {name}: producer_epoch"
        );
        assert_eq!(
            header.base_sequence, vector.producer.base_sequence,
            "vector {name}: base_sequence"
        );
        assert_eq!(header.crc, vector.crc, "vector {name}: crc");
        assert_eq!(
            header.attributes, vector.attributes,
            "vector {name}: attributes"
        );
        let batch = decode_single(vector);
        assert_eq!(
            batch.records.len(),
            vector.records.len(),
            "vector {name}: record count"
        );
        for (index, (got, (offset, want))) in batch.records.iter().zip(&vector.records).enumerate()
        {
            let at = format!("vector {name}, record {index}");
            assert_eq!(got.offset, *offset, "{at}: offset");
            assert_eq!(got.timestamp_ms, want.timestamp_ms, "{at}: timestamp_ms");
            assert_eq!(got.key, want.key, "{at}: key");
            assert_eq!(got.value, want.value, "{at}: value");
            assert_eq!(got.headers, want.headers, "{at}: headers");
        }
    }
}

#[test]
fn byte_exact_vectors_are_reproduced_by_the_encoder() {
    let file = load();
    let exact: Vec<&Vector> = file.vectors.iter().filter(|v| v.byte_exact).collect();
    assert!(!exact.is_empty(), "no byte_exact vectors");
    for vector in exact {
        let options = EncodeOptions {
            compression: vector.compression,
            base_offset: vector.base_offset,
            leader_epoch: vector.leader_epoch,
            producer: vector.producer,
        };
        let records: Vec<Record> = vector.records.iter().map(|(_, r)| r.clone()).collect();
        let encoded = encode_batch(&records, &options)
            .unwrap_or_else(|e| panic!("vector {}: {e}", vector.name));
        assert_eq!(
            hex::encode(&encoded),
            hex::encode(&vector.batch),
            "vector {}: bytes",
            vector.name
        );
    }
}

#[test]
fn rejections_are_refused_by_whom_they_name() {
    for rejection in &load().rejections {
        let name = &rejection.name;
        let result = decode_batches(&rejection.batch);
        match rejection.rejected_by.as_str() {
            "decoder" => {
                let error =
                    result.expect_err(&format!("rejection {name}: the decoder accepted it"));
                assert_eq!(
                    error.check.error_code(),
                    rejection.error,
                    "rejection {name}: {error}"
                );
                println!("rejection {name}: {error}");
            }
            "broker" => {
                if let Err(error) = result {
                    panic!(
                        "rejection {name} is the broker's to refuse, but the decoder did: {error}"
                    );
                }
            }
            other => panic!("rejection {name}: unknown rejected_by {other:?}"),
        }
    }
}
