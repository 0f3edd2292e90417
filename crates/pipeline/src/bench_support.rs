//! What `benches/hot_path.rs` drives. **Not a stable API**: it exists only for the criterion
//! benches of this crate, wraps the writer's crate-private batch conversion without changing it,
//! and may change or disappear with any commit.

use replicator_model::Offset;
use replicator_sdk::Message;

/// A batch as the reader hands it to the writer.
#[derive(Debug)]
pub struct Batch(crate::datapath::unit::Batch);

impl Batch {
    /// A batch of polled messages (offsets and timestamps set) with no gap before it;
    /// `None` when `messages` is empty.
    pub fn new(messages: Vec<Message>) -> Option<Self> {
        crate::datapath::unit::Batch::new(messages, None).map(Self)
    }

    /// The messages: as polled, or once prepared the ones the writer would send.
    pub fn messages(&self) -> &[Message] {
        &self.0.messages
    }
}

/// What the writer's batch conversion needs besides the batch (the writer resolves these
/// from its flow and its resume point).
#[derive(Debug, Clone, Copy)]
pub struct PrepareParams<'a> {
    /// Last upstream offset already downstream, e.g. `None`; messages up to it are dropped.
    pub last_written: Option<Offset>,
    /// The flow's source alias, stamped as provenance source, e.g. `us`.
    pub source: &'a str,
    /// The flow's target alias, e.g. `eu`; messages that originated there are skipped.
    pub target: &'a str,
    /// Whether to stamp provenance and skip messages that originated in the target.
    pub provenance: bool,
    /// The provenance format stamped.
    pub format: crate::provenance::Format,
    /// Label of the upstream history copied (a topic's creation time in µs for one never
    /// reset), e.g. `1_700_000_000_000_000`.
    pub history_label: u64,
}

/// The writer's batch conversion, in place, and the 0.8 request it sends: leaves in `batch`
/// the messages it would send and returns the request (provenance is written into it, as the
/// 0.8 adapter does), or `Err(offset)` of a message whose headers would exceed Iggy's limit
/// with provenance added.
pub fn prepare(
    batch: &mut Batch,
    p: &PrepareParams<'_>,
) -> std::result::Result<bytes::Bytes, Offset> {
    let stamper = p
        .provenance
        .then(|| crate::provenance::Stamper::new(p.source, p.history_label, p.format));
    let params = crate::datapath::writer::PrepareParams {
        last_written: p.last_written,
        target: p.target,
        stamper: stamper.as_ref(),
    };
    crate::datapath::writer::prepare(&mut batch.0, &params)?;
    let id = replicator_sdk::types::Identifier::default();
    Ok(replicator_sdk::bench_support::encode_send_v08(
        &id,
        &id,
        &replicator_sdk::types::Partitioning::partition_id(0),
        &batch.0.messages,
        stamper
            .as_ref()
            .map(|s| s as &dyn replicator_sdk::HeadersTail),
    )
    .expect("ids the wire carries"))
}
