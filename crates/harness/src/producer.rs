//! Producers: [`PacedProducer`] writes at a rate (a scenario's steady traffic, the demo's
//! stream), [`produce_bulk`] writes a range of messages per partition as fast as the server
//! takes them (a topic to catch up on, a test's data set).

use std::collections::BTreeMap;
use std::ops::Range;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use iggy::prelude::{HeaderKey, HeaderValue, Identifier, IggyMessage, Partitioning};
use replicator_sdk::Client;
use replicator_sdk::IggyCluster as _;
use replicator_sdk::Message;
use tokio::task::JoinHandle;

use crate::{connect, Endpoint, Error, Result, Target, TestResult};

/// How long one send may take before it counts as failed.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// What a producer's messages look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageShape {
    /// Payload size in bytes, e.g. 256.
    pub payload_bytes: usize,
    /// Text that starts every payload, followed by the message id and padded with `.` (e.g.
    /// `"demo message"`); `None`: one shared filler payload, nothing formatted per message.
    pub label: Option<String>,
    /// One user header on every message, e.g. `("kind", "ha-test")`.
    pub header: Option<(String, String)>,
}

impl MessageShape {
    /// Payloads of `payload_bytes` filler bytes, no header.
    #[must_use]
    pub fn filler(payload_bytes: usize) -> Self {
        Self {
            payload_bytes,
            label: None,
            header: None,
        }
    }
}

/// The messages of one [`MessageShape`], with its header and filler built once.
struct Encoder {
    /// Payload size in bytes.
    payload_bytes: usize,
    /// Payload prefix.
    label: Option<String>,
    /// The shared payload when there is no label.
    filler: Bytes,
    /// The user headers of every message.
    headers: Option<BTreeMap<HeaderKey, HeaderValue>>,
}

impl Encoder {
    fn new(shape: &MessageShape) -> Result<Self> {
        let headers = match &shape.header {
            Some((key, value)) => Some(BTreeMap::from([(
                HeaderKey::from_str(key)?,
                HeaderValue::from_str(value)?,
            )])),
            None => None,
        };
        Ok(Self {
            payload_bytes: shape.payload_bytes,
            label: shape.label.clone(),
            filler: Bytes::from(vec![b'.'; shape.payload_bytes]),
            headers,
        })
    }

    fn message(&self, id: u128) -> Result<IggyMessage> {
        let payload = match &self.label {
            Some(label) => {
                let mut text = format!("{label} {id} ").into_bytes();
                text.resize(self.payload_bytes.max(text.len()), b'.');
                Bytes::from(text)
            }
            None => self.filler.clone(),
        };
        let builder = IggyMessage::builder().id(id).payload(payload);
        Ok(match &self.headers {
            Some(headers) => builder.user_headers(headers.clone()).build()?,
            None => builder.build()?,
        })
    }
}

/// What a [`PacedProducer`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerParams {
    /// The server produced to.
    pub server: Endpoint,
    /// The partitions written to, round robin, `batch` messages to each in turn.
    pub targets: Vec<Target>,
    /// Messages per second offered, e.g. 1600. A round that falls behind is made up in the
    /// next ones; paused time is not.
    pub rate: u64,
    /// Stop after offering this many messages; `None`: until [`PacedProducer::stop`].
    pub total: Option<u64>,
    /// Messages to one target before the next one, e.g. 1 (message by message) or 100.
    pub batch: u64,
    /// Time between two rounds of sends, e.g. 10 ms.
    pub tick: Duration,
    /// What the messages look like.
    pub shape: MessageShape,
    /// Count a failed send (a restarting server, a dropped connection) and go on instead of
    /// ending with its error. Its messages are not sent again, so ids stay unique whether or
    /// not the server stored them. When the server is a cluster named by several seeds, the
    /// producer then connects anew through them (to a new primary after a view change).
    pub tolerate_send_errors: bool,
}

impl ProducerParams {
    /// `rate` messages per second to `targets` on `server`, message by message, every 10 ms,
    /// 256-byte filler payloads, until stopped, failing at the first failed send.
    pub fn new(server: impl Into<Endpoint>, targets: Vec<Target>, rate: u64) -> Self {
        Self {
            server: server.into(),
            targets,
            rate,
            total: None,
            batch: 1,
            tick: Duration::from_millis(10),
            shape: MessageShape::filler(256),
            tolerate_send_errors: false,
        }
    }
}

/// What a producer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProducerReport {
    /// Messages acknowledged by the server.
    pub produced: u64,
    /// Sends that failed and were skipped (only with `tolerate_send_errors`).
    pub failed_sends: u64,
}

/// A producer task writing messages with ids unique in the run (1, 2, …) at a fixed rate.
/// Dropping it aborts the task.
pub struct PacedProducer {
    /// Set by [`PacedProducer::stop`].
    stop: Arc<AtomicBool>,
    /// While set, the producer skips its rounds.
    paused: Arc<AtomicBool>,
    /// Messages acknowledged so far.
    produced: Arc<AtomicU64>,
    /// The producing task; taken by [`PacedProducer::stop`].
    task: Option<JoinHandle<Result<ProducerReport>>>,
}

impl PacedProducer {
    /// Starts producing.
    pub fn start(params: ProducerParams) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let produced = Arc::new(AtomicU64::new(0));
        let flags = Flags {
            stop: stop.clone(),
            paused: paused.clone(),
            produced: produced.clone(),
        };
        let task = tokio::spawn(produce(params, flags));
        Self {
            stop,
            paused,
            produced,
            task: Some(task),
        }
    }

    /// Stops sending until [`PacedProducer::resume`] (a round under way finishes).
    pub fn pause(&self) {
        self.paused.store(true, Ordering::Relaxed);
    }

    /// Sends again after [`PacedProducer::pause`].
    pub fn resume(&self) {
        self.paused.store(false, Ordering::Relaxed);
    }

    /// Messages acknowledged so far.
    #[must_use]
    pub fn produced(&self) -> u64 {
        self.produced.load(Ordering::Relaxed)
    }

    /// Whether the producer has ended (its total offered, or a failed send).
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Stops producing (at once, or after its total) and reports, or returns the error that
    /// ended it.
    pub async fn stop(mut self) -> Result<ProducerReport> {
        self.stop.store(true, Ordering::Relaxed);
        match self.task.take() {
            Some(task) => task.await?,
            None => Ok(ProducerReport::default()),
        }
    }
}

impl Drop for PacedProducer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// What the producing task shares with its [`PacedProducer`].
struct Flags {
    /// Stop at the next round.
    stop: Arc<AtomicBool>,
    /// Skip rounds.
    paused: Arc<AtomicBool>,
    /// Messages acknowledged.
    produced: Arc<AtomicU64>,
}

async fn produce(params: ProducerParams, flags: Flags) -> Result<ProducerReport> {
    let mut report = ProducerReport::default();
    if params.targets.is_empty() || params.rate == 0 {
        return Ok(report);
    }
    let mut client = Some(connect(&params.server).await?);
    // A cluster named by several seeds: after a failed send the producer connects anew through
    // them (the SDK's own reconnect would keep knocking on the seed it was on, which may be a
    // dead primary). One server: the SDK's reconnect rides out its restart.
    let reseed = replicator_model::seed_urls(&params.server.url).len() > 1;
    let ids: Vec<(Identifier, Identifier)> = params
        .targets
        .iter()
        .map(|t| Ok((Identifier::named(&t.stream)?, Identifier::named(&t.topic)?)))
        .collect::<Result<_>>()?;
    let encoder = Encoder::new(&params.shape)?;
    let (batch, total) = (params.batch.max(1), params.total.unwrap_or(u64::MAX));
    let (mut offered, mut owed) = (0u64, 0f64);
    let (mut cursor, mut in_batch, mut next_id) = (0usize, 0u64, 1u128);
    let mut ticker = tokio::time::interval(params.tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = Instant::now();
    while !flags.stop.load(Ordering::Relaxed) && offered < total {
        ticker.tick().await;
        let now = Instant::now();
        let paused = flags.paused.load(Ordering::Relaxed);
        if !paused {
            owed += params.rate as f64 * (now - last).as_secs_f64();
        }
        last = now;
        if paused {
            continue;
        }
        let due = (owed as u64).min(total - offered);
        owed -= due as f64;
        offered += due;
        let mut batches: BTreeMap<usize, Vec<Message>> = BTreeMap::new();
        for _ in 0..due {
            batches
                .entry(cursor)
                .or_default()
                .push(Message::from(encoder.message(next_id)?));
            next_id += 1;
            in_batch += 1;
            if in_batch == batch {
                in_batch = 0;
                cursor = (cursor + 1) % ids.len();
            }
        }
        for (index, mut messages) in batches {
            let connected = match client {
                Some(ref connected) => connected,
                // Reconnecting after a failure: a send that cannot connect counts as failed
                // and the next one tries again.
                None => match tokio::time::timeout(SEND_TIMEOUT, connect(&params.server)).await {
                    Ok(Ok(fresh)) => client.insert(fresh),
                    _ => {
                        report.failed_sends += 1;
                        continue;
                    }
                },
            };
            let (stream, topic) = &ids[index];
            let partitioning = Partitioning::partition_id(params.targets[index].partition);
            let count = messages.len() as u64;
            let sent = tokio::time::timeout(
                SEND_TIMEOUT,
                connected.send_messages(stream, topic, &partitioning, &mut messages),
            )
            .await;
            match sent {
                Ok(Ok(_)) => {
                    report.produced += count;
                    flags.produced.fetch_add(count, Ordering::Relaxed);
                }
                _ if params.tolerate_send_errors => {
                    report.failed_sends += 1;
                    if reseed {
                        if let Some(failed) = client.take() {
                            let _ = failed.shutdown().await;
                        }
                    }
                }
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => {
                    return Err(Error::timed_out(
                        "a send",
                        format!("{SEND_TIMEOUT:?} passed"),
                    ))
                }
            }
        }
    }
    if let Some(client) = client {
        let _ = client.shutdown().await;
    }
    Ok(report)
}

/// Where [`produce_bulk`] writes and how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bulk {
    /// Stream name.
    pub stream: String,
    /// Topic name.
    pub topic: String,
    /// Partition ids written, one after the other.
    pub partitions: Vec<u32>,
    /// Sequence numbers of the messages of every partition, e.g. `0..1000`.
    pub range: Range<u64>,
    /// Messages per send, e.g. 1000.
    pub batch: u64,
}

/// Sends [`Bulk::range`] to every partition of `bulk` through `client`, in order, `batch`
/// messages per send; `message(partition, seq)` builds each message (with SDK 0.10's builder,
/// or as the replicator's own [`Message`]).
pub async fn produce_bulk<E, F, M>(client: &Client, bulk: &Bulk, mut message: F) -> TestResult
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
    F: FnMut(u32, u64) -> std::result::Result<M, E>,
    M: Into<Message>,
{
    let (stream, topic) = (
        Identifier::named(&bulk.stream)?,
        Identifier::named(&bulk.topic)?,
    );
    let batch = bulk.batch.max(1);
    for partition in &bulk.partitions {
        let mut seq = bulk.range.start;
        while seq < bulk.range.end {
            let end = (seq + batch).min(bulk.range.end);
            let mut messages = (seq..end)
                .map(|s| message(*partition, s).map(Into::into).map_err(Into::into))
                .collect::<TestResult<Vec<Message>>>()?;
            client
                .send_messages(
                    &stream,
                    &topic,
                    &Partitioning::partition_id(*partition),
                    &mut messages,
                )
                .await?;
            seq = end;
        }
    }
    Ok(())
}
