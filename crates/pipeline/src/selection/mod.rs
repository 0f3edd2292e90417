//! What a flow copies and where it lands: [`mapping`] (`Selector`: a flow's include and
//! exclude globs, and the heartbeat topics no glob selects; the downstream stream name),
//! [`residency`] (the topics residency policies keep from a flow's target, and their record
//! for status and metrics), [`pairing`] (the flows that copy the other way of a flow: two-way
//! pairs) and [`globs`] (the glob compilers they and the group and user
//! selections share). Pure, but for the record of blocked topics; discovery, the coordinator,
//! the syncs and `verify` ask it.

pub(crate) mod globs;
pub(crate) mod mapping;
pub(crate) mod pairing;
pub(crate) mod residency;
