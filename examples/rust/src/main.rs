//! `headwater-example`: a Headwater client in Rust, built on tonic with its default
//! channel settings and this crate's own batch encoder, decoder and murmur2 partitioner.
//! Every command prints one JSON line on stdout (diagnostics go to stderr) and exits 0
//! when what it demonstrates held, 1 when a check failed, 2 on an error.
//!
//! ```text
//! headwater-example [run] --bootstrap HOST:PORT --topic NAME [--partitions 3] [--records 10000]
//!                   [--batch-records 1000] [--compression none|lz4|zstd] [--timeout-s 120]
//! headwater-example bad-partition --bootstrap HOST:PORT --topic NAME [--partitions 3]
//! headwater-example large-batch --bootstrap HOST:PORT --topic NAME [--batch-mib 6]
//! headwater-example conformance --bootstrap HOST:PORT --topic NAME [--vectors PATH]
//! ```

use std::process::ExitCode;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;
use tonic::transport::Channel;

use headwater_example::client::{self, Error};
use headwater_example::codec::Compression;
use headwater_example::round_trip::{self, RoundTrip};
use headwater_example::{conformance, limits, vectors};

const USAGE: &str = "usage: headwater-example [run|bad-partition|large-batch|conformance] \
--bootstrap HOST:PORT --topic NAME [--partitions N] [--records N] [--batch-records N] \
[--compression none|lz4|zstd] [--batch-mib N] [--vectors PATH] [--timeout-s N]";
/// The shared test vectors, where this crate sits in a Headwater checkout.
const VECTORS_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../docs/testvectors/record-batches.json"
);

#[derive(Debug)]
struct Args {
    command: String,
    bootstrap: String,
    topic: String,
    partitions: Option<i32>,
    records: usize,
    batch_records: usize,
    compression: Compression,
    batch_mib: usize,
    vectors: String,
    timeout: Duration,
}

fn parse_args(mut raw: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args {
        command: "run".to_owned(),
        bootstrap: String::new(),
        topic: String::new(),
        partitions: None,
        records: 10_000,
        batch_records: 1_000,
        compression: Compression::None,
        batch_mib: 6,
        vectors: VECTORS_PATH.to_owned(),
        timeout: Duration::from_secs(120),
    };
    let mut first = true;
    while let Some(flag) = raw.next() {
        if first && !flag.starts_with("--") {
            args.command = flag;
            first = false;
            continue;
        }
        first = false;
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_owned());
        }
        let value = raw
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{flag} {value}: not a number"))
        };
        match flag.as_str() {
            "--bootstrap" => args.bootstrap = value.clone(),
            "--topic" => args.topic = value.clone(),
            "--vectors" => args.vectors = value.clone(),
            "--partitions" => {
                args.partitions = Some(i32::try_from(number()?).map_err(|e| e.to_string())?)
            }
            "--records" => args.records = number()?,
            "--batch-records" => args.batch_records = number()?.max(1),
            "--batch-mib" => args.batch_mib = number()?.max(1),
            "--timeout-s" => args.timeout = Duration::from_secs(number()? as u64),
            "--compression" => {
                args.compression = Compression::parse(&value)
                    .ok_or(format!("--compression {value}: none, lz4 or zstd"))?;
            }
            _ => return Err(format!("unknown option {flag}\n{USAGE}")),
        }
    }
    if args.bootstrap.is_empty() || args.topic.is_empty() {
        return Err(format!("--bootstrap and --topic are required\n{USAGE}"));
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let result = runtime.block_on(async {
        let deadline = Instant::now() + args.timeout;
        let channel = client::connect(&args.bootstrap, deadline).await?;
        let topic = &args.topic;
        match args.command.as_str() {
            "run" => {
                let round_trip = RoundTrip {
                    topic: topic.clone(),
                    partitions: args.partitions.unwrap_or(3),
                    records: args.records,
                    batch_records: args.batch_records,
                    compression: args.compression,
                };
                round_trip::run(&channel, &round_trip, deadline).await
            }
            "bad-partition" => {
                let partitions = args.partitions.unwrap_or(3);
                limits::bad_partition(&channel, topic, partitions, deadline).await
            }
            "large-batch" => limits::large_batch(&channel, topic, args.batch_mib, deadline).await,
            "conformance" => conformance(&channel, &args, deadline).await,
            other => Err(Error::Check(format!("unknown command {other:?}\n{USAGE}"))),
        }
    });
    match result {
        Ok(summary) => {
            println!("{summary}");
            if summary["ok"] == json!(true) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(error) => {
            eprintln!("headwater-example {}: {error}", args.command);
            println!(
                "{}",
                json!({"ok": false, "command": args.command, "error": error.to_string()})
            );
            ExitCode::from(2)
        }
    }
}

async fn conformance(channel: &Channel, args: &Args, deadline: Instant) -> Result<Value, Error> {
    let text = std::fs::read_to_string(&args.vectors)
        .map_err(|e| Error::Check(format!("{}: {e}", args.vectors)))?;
    let file = vectors::parse(&text).map_err(|e| Error::Check(format!("{}: {e}", args.vectors)))?;
    client::ensure_topic(channel, &args.topic, 1, &[], deadline).await?;
    conformance::run(channel, &args.topic, &file, deadline).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Result<Args, String> {
        parse_args(line.split_whitespace().map(str::to_owned))
    }

    #[test]
    fn parses_the_documented_command_lines() {
        let run = args("--bootstrap 127.0.0.1:7700 --topic orders").unwrap();
        assert_eq!(
            (run.command.as_str(), run.records, run.partitions),
            ("run", 10_000, None)
        );
        let bad = args("bad-partition --bootstrap h:1 --topic t --partitions 5").unwrap();
        assert_eq!(
            (bad.command.as_str(), bad.partitions),
            ("bad-partition", Some(5))
        );
        let large =
            args("large-batch --bootstrap h:1 --topic t --batch-mib 7 --compression zstd").unwrap();
        assert_eq!((large.batch_mib, large.compression), (7, Compression::Zstd));
        assert!(args("--topic t").is_err());
        assert!(args("--bootstrap h:1 --topic t --records many").is_err());
        assert!(args("--bootstrap h:1 --topic t --color blue").is_err());
    }
}
