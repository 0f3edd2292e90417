//! What a flow keeps in step on its target besides the messages, and the failover that relies
//! on it: [`groups`] syncs the selected consumer groups' offsets, translated exactly to the
//! downstream partitions; [`metadata`] syncs the selected users (inactive until a promote
//! activates them) and the topics' settings; [`cutover`] is what `flow promote` asks of the
//! data plane (partition extents on both sides, one group and one metadata round now, the
//! users' activation). Each sync runs as one task per flow and node beside the actor tree and
//! reads what the data path records (`datapath::offset_maps`) and its tail scan; nothing below
//! imports it.

pub(crate) mod cutover;
pub(crate) mod groups;
pub(crate) mod metadata;
