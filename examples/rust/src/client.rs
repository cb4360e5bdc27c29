//! The calls the example makes, over tonic with its default channel settings (4 MiB
//! receive limit): connect, create a topic and wait for its leaders, look up offsets and
//! a producer id, and read a partition with FetchStream, decoding batches with this
//! crate's decoder (producing is in `producer`). Retries follow the broker's `retriable`
//! flag, within a deadline.

use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::{Instant, sleep, timeout_at};
use tonic::transport::{Channel, Endpoint};

use crate::api_error::{ApiError, code_name};
use crate::batch::{DecodeError, DecodedRecord, EncodeError, decode_batches};
use crate::proto;
use crate::proto::admin_client::AdminClient;
use crate::proto::broker_client::BrokerClient;

pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(50);
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Longest wait of one FetchStream poll; an empty answer is sent when it ends.
const FETCH_WAIT_MS: i32 = 500;

/// Why the example stopped.
#[derive(Debug)]
pub enum Error {
    /// A call failed with a status that retrying did not (or could not) cure.
    Api {
        call: String,
        error: ApiError,
    },
    /// A per-item answer carried an error code.
    Item {
        call: String,
        code: String,
        retriable: bool,
        message: String,
    },
    Connect(String),
    Decode(DecodeError),
    Encode(EncodeError),
    Timeout(String),
    /// The data came back other than it was sent.
    Check(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Api { call, error } => write!(f, "{call}: {error}"),
            Error::Item {
                call,
                code,
                retriable,
                message,
            } => {
                write!(f, "{call}: {code} (retriable {retriable}): {message}")
            }
            Error::Connect(message) => write!(f, "connect: {message}"),
            Error::Decode(error) => write!(f, "decode: {error}"),
            Error::Encode(error) => write!(f, "encode: {error}"),
            Error::Timeout(what) => write!(f, "timed out: {what}"),
            Error::Check(what) => write!(f, "check failed: {what}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<DecodeError> for Error {
    fn from(error: DecodeError) -> Self {
        Error::Decode(error)
    }
}

impl From<EncodeError> for Error {
    fn from(error: EncodeError) -> Self {
        Error::Encode(error)
    }
}

/// Connect to `bootstrap` (HOST:PORT), trying again until `deadline` while the node
/// starts. The channel keeps tonic's defaults.
pub async fn connect(bootstrap: &str, deadline: Instant) -> Result<Channel, Error> {
    let endpoint = Endpoint::from_shared(format!("http://{bootstrap}"))
        .map_err(|e| Error::Connect(format!("{bootstrap} is not HOST:PORT: {e}")))?;
    let mut backoff = BACKOFF_MIN;
    loop {
        match endpoint.connect().await {
            Ok(channel) => return Ok(channel),
            Err(error) if Instant::now() + backoff < deadline => {
                eprintln!("connect {bootstrap}: {error}; retrying");
                sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            Err(error) => return Err(Error::Connect(format!("{bootstrap}: {error}"))),
        }
    }
}

/// Run `call` until it succeeds, fails with a non-retriable status, or `deadline` comes.
pub async fn retrying<T, F, Fut>(what: &str, deadline: Instant, mut call: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    let mut backoff = BACKOFF_MIN;
    loop {
        let status = match timeout_at(deadline, call()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(status)) => status,
            Err(_) => return Err(Error::Timeout(what.to_owned())),
        };
        let error = ApiError::from_status(&status);
        if !error.is_retriable() || Instant::now() + backoff >= deadline {
            return Err(Error::Api {
                call: what.to_owned(),
                error,
            });
        }
        eprintln!("{what}: {error}; retrying");
        sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Milliseconds since the Unix epoch, by this machine's clock.
pub fn now_ms() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is past 1970");
    i64::try_from(since_epoch.as_millis()).expect("ms since 1970 fit an i64")
}

/// Create `topic` with `partitions` partitions and topic `configs` (name, value) unless
/// it exists (an existing topic is used as it is), and wait for its leaders: whether it
/// was created, and its partition count.
pub async fn ensure_topic(
    channel: &Channel,
    topic: &str,
    partitions: i32,
    configs: &[(&str, &str)],
    deadline: Instant,
) -> Result<(bool, i32), Error> {
    let created = create_topic(channel, topic, partitions, configs, deadline).await?;
    let partitions = wait_for_leaders(channel, topic, deadline).await?;
    Ok((created, partitions))
}

/// Create `topic` (see `ensure_topic`); Ok(false) when it already exists.
pub async fn create_topic(
    channel: &Channel,
    topic: &str,
    partitions: i32,
    configs: &[(&str, &str)],
    deadline: Instant,
) -> Result<bool, Error> {
    let request = proto::CreateTopicsRequest {
        topics: vec![proto::NewTopic {
            name: topic.to_owned(),
            partitions: Some(partitions),
            configs: configs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Default::default()
        }],
        validate_only: false,
    };
    let mut backoff = BACKOFF_MIN;
    loop {
        let response = retrying("CreateTopics", deadline, || {
            let mut admin = AdminClient::new(channel.clone());
            let request = request.clone();
            async move { admin.create_topics(request).await }
        })
        .await?
        .into_inner();
        let Some(result) = response.results.into_iter().next() else {
            return Err(Error::Check("CreateTopics answered no result".to_owned()));
        };
        match proto::ErrorCode::try_from(result.error_code) {
            Ok(proto::ErrorCode::None) => return Ok(true),
            Ok(proto::ErrorCode::TopicAlreadyExists) => return Ok(false),
            _ if result.retriable && Instant::now() + backoff < deadline => {
                eprintln!(
                    "CreateTopics: {} {}; retrying",
                    code_name(result.error_code),
                    result.error_message
                );
                sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            _ => {
                return Err(Error::Item {
                    call: "CreateTopics".to_owned(),
                    code: code_name(result.error_code),
                    retriable: result.retriable,
                    message: result.error_message,
                });
            }
        }
    }
}

/// The topic's partition count, once the node knows the topic and every partition has
/// a leader.
pub async fn wait_for_leaders(
    channel: &Channel,
    topic: &str,
    deadline: Instant,
) -> Result<i32, Error> {
    loop {
        let response = retrying("Metadata", deadline, || {
            let mut broker = BrokerClient::new(channel.clone());
            let request = proto::MetadataRequest {
                topics: vec![topic.to_owned()],
                include_digest: false,
            };
            async move { broker.metadata(request).await }
        })
        .await?
        .into_inner();
        if let Some(found) = response.topics.iter().find(|t| t.name == topic)
            && !found.partitions.is_empty()
            && found.partitions.iter().all(|p| p.leader >= 0)
        {
            return Ok(found.partitions.len() as i32);
        }
        if Instant::now() + BACKOFF_MIN >= deadline {
            return Err(Error::Timeout(format!(
                "leaders for every partition of {topic}"
            )));
        }
        sleep(BACKOFF_MIN).await;
    }
}

/// The high watermark of every partition (ListOffsets, latest), by partition.
pub async fn high_watermarks(
    channel: &Channel,
    topic: &str,
    deadline: Instant,
) -> Result<Vec<i64>, Error> {
    let response = retrying("ListOffsets", deadline, || {
        let mut broker = BrokerClient::new(channel.clone());
        let request = proto::ListOffsetsRequest {
            topic: topic.to_owned(),
            spec: proto::OffsetSpec::Latest as i32,
            ..Default::default()
        };
        async move { broker.list_offsets(request).await }
    })
    .await?
    .into_inner();
    let mut offsets = response.offsets;
    offsets.sort_by_key(|o| o.partition);
    Ok(offsets.into_iter().map(|o| o.offset).collect())
}

/// A new idempotent producer: (producer_id, producer_epoch).
pub async fn init_producer_id(channel: &Channel, deadline: Instant) -> Result<(i64, i16), Error> {
    let response = retrying("InitProducerId", deadline, || {
        let mut broker = BrokerClient::new(channel.clone());
        async move {
            broker
                .init_producer_id(proto::InitProducerIdRequest {})
                .await
        }
    })
    .await?
    .into_inner();
    let epoch = i16::try_from(response.producer_epoch).map_err(|_| {
        Error::Check(format!(
            "producer_epoch {} is not an int16",
            response.producer_epoch
        ))
    })?;
    Ok((response.producer_id, epoch))
}

/// Open FetchStream with `broker` and wait for its first answer: the error a bad
/// request ends with comes either as the call's status or as the stream's first item.
pub async fn first_fetch_answer(
    mut broker: BrokerClient<Channel>,
    request: proto::FetchRequest,
    deadline: Instant,
) -> Result<Result<proto::FetchResponse, ApiError>, Error> {
    let exchange = async move {
        let mut stream = broker.fetch_stream(request).await?.into_inner();
        stream
            .message()
            .await?
            .ok_or_else(|| tonic::Status::unknown("FetchStream ended without an answer"))
    };
    match timeout_at(deadline, exchange).await {
        Err(_) => Err(Error::Timeout("the first FetchStream answer".to_owned())),
        Ok(answer) => Ok(answer.map_err(|status| ApiError::from_status(&status))),
    }
}

/// A FetchStream request for batches from `offset` (default limits: max_bytes and
/// max_response_bytes 0).
pub fn fetch_request(topic: &str, partition: i32, offset: i64) -> proto::FetchRequest {
    proto::FetchRequest {
        topic: topic.to_owned(),
        partition,
        offset,
        max_wait_ms: FETCH_WAIT_MS,
        min_bytes: 1,
        format: proto::RecordFormat::Batches as i32,
        ..Default::default()
    }
}

/// Read `partition` from `start` up to `end` (exclusive) with FetchStream, decoding each
/// answer's batches; records of control batches are skipped, as are records below the
/// offset asked (the first batch may begin before it). The stream is opened again from
/// where it stopped after a retriable error.
pub async fn consume_partition(
    channel: &Channel,
    topic: &str,
    partition: i32,
    (start, end): (i64, i64),
    deadline: Instant,
) -> Result<Vec<DecodedRecord>, Error> {
    let what = format!("FetchStream {topic}-{partition}");
    let mut records = Vec::new();
    let mut next = start;
    while next < end {
        let mut stream = retrying(&what, deadline, || {
            let mut broker = BrokerClient::new(channel.clone());
            let request = fetch_request(topic, partition, next);
            async move { broker.fetch_stream(request).await }
        })
        .await?
        .into_inner();
        while next < end {
            let answer = match timeout_at(deadline, stream.message()).await {
                Err(_) => return Err(Error::Timeout(format!("{what}: at offset {next} of {end}"))),
                Ok(Ok(Some(answer))) => answer,
                Ok(Ok(None)) => break, // ended by the node: open it again
                Ok(Err(status)) => {
                    let error = ApiError::from_status(&status);
                    if !error.is_retriable() {
                        return Err(Error::Api { call: what, error });
                    }
                    eprintln!("{what}: {error}; opening it again at {next}");
                    break;
                }
            };
            for batch in decode_batches(&answer.records)? {
                if batch.header.is_control() {
                    continue;
                }
                records.extend(
                    batch
                        .records
                        .into_iter()
                        .filter(|r| r.offset >= next && r.offset < end),
                );
            }
            next = next.max(answer.next_offset);
        }
    }
    Ok(records)
}
