//! The data path of one unit: a reader task polls the upstream partition at explicit offsets
//! ([`reader`]; how many messages it asks for: [`batch_size`]) and hands batches through a bounded channel to a writer task that resumes from
//! the downstream tail, checks its lease and epoch before every send, stamps provenance and
//! commits offsets ([`writer`], IO around its pure cores). Beside them: what a pair shares and
//! the batch type ([`unit`](mod@unit)), where a reader starts and what a jump in its offsets means
//! ([`offsets`]), a flow's rate limiters on this instance ([`throttle`]), the one door every
//! write to a flow's target goes through ([`target`]'s `TargetDoor`), and what a writer
//! sent since it resumed, kept for the consumer-group sync ([`translate`]'s `OffsetMap`, shared
//! in [`offset_maps`]; the sync's search of a downstream partition is in `translate` too).
//!
//! The coordinator's actors (`coordinator`) run these loops; nothing here imports the actor
//! tree, the syncs or discovery.

pub(crate) mod batch_size;
pub(crate) mod offset_maps;
pub(crate) mod offsets;
pub(crate) mod reader;
pub(crate) mod target;
pub(crate) mod throttle;
pub(crate) mod translate;
pub(crate) mod unit;
pub(crate) mod writer;
