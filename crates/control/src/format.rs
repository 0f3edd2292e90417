//! Versioned formats and the cluster's feature level.
//!
//! Every log entry and snapshot this crate stores starts with its *format*: the feature level
//! whose shape it has. A cluster runs at one *feature level* (kept in the replicated state, as
//! Kafka keeps `metadata.version`): no member writes a command, nor a snapshot, that needs a
//! higher level than the cluster's, so a member of an older release still reads everything
//! the others write. Each member publishes the highest level its build supports
//! (`PublishFeatures`); the leader raises the cluster's level once every member supports the
//! next one (`RaiseFeatureLevel`). A level is never lowered.
//!
//! Levels, one per change of what is written (a released level never changes meaning):
//!
//! | level | release | adds |
//! |---|---|---|
//! | 1 | v0.1.0 | every command up to `RaiseFeatureLevel`, the snapshot of that release |
//! | 2 | v0.2.0 | `CommitProgress` (session totals: counters that count once), `ForgetUnits`; the snapshot gains `session_counters`; a member stopping gracefully writes `LeaveMember` before it drains, since members of this release register anew at their start when they find themselves `Leaving` |
//! | 3 | v0.2.0 | `RecordMetadata` (two-way metadata records); the snapshot gains `metadata` |
//! | 4 | v0.2.0 | nothing in the log or the snapshot: writers stamp the compact provenance format, which members of earlier releases cannot read in a downstream tail |
//!
//! A state that never recorded a level (written before levels existed) is at level 1. Data
//! without a format header was written before formats were versioned: it reads as format 0
//! (see `SmData::decode`).

use crate::command::ControlCommand;
use crate::error::{Error, Result};
use crate::state::ControlState;

/// The highest feature level this build reads and writes.
pub const SUPPORTED_LEVEL: u32 = 4;

/// The level from which two-way pairs keep metadata records (`RecordMetadata`), and the
/// release that introduced it.
pub(crate) const METADATA_LEVEL: (u32, &str) = (3, "v0.2.0");

/// The level from which writers stamp the compact provenance format (see
/// `Control::stamps_compact_provenance`), and the release that introduced it.
pub(crate) const COMPACT_PROVENANCE_LEVEL: (u32, &str) = (4, "v0.2.0");

/// The level from which a member stopping gracefully marks itself `Leaving` before it drains
/// (see `Control::begin_leaving`), and the release that introduced it: a member of an earlier
/// release would not register anew after its restart and stay `Leaving`, without units.
pub(crate) const LEAVING_AT_DRAIN_LEVEL: (u32, &str) = (2, "v0.2.0");

/// The level of a state that never recorded one: the first release's.
pub(crate) const BASELINE_LEVEL: u32 = 1;

/// First byte of a format header. bincode's standard configuration never starts an encoded
/// log entry or snapshot with it (both start with an unsigned varint or an option tag, and
/// 255 is neither), so data without a header is recognised as format 0.
const HEADER_MARK: u8 = 0xff;

/// `payload` (bincode) behind a header naming its `format`.
pub(crate) fn seal(format: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(HEADER_MARK);
    out.extend_from_slice(&format.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The format of sealed `bytes` and their payload; data without a header is format 0. A
/// format above [`SUPPORTED_LEVEL`] is an error naming both: the data was written by a newer
/// release (a downgrade, or a member of an older release in a cluster at a higher level).
pub(crate) fn open<'a>(what: &'static str, bytes: &'a [u8]) -> Result<(u32, &'a [u8])> {
    let Some((&HEADER_MARK, rest)) = bytes.split_first() else {
        return Ok((0, bytes));
    };
    let (format, payload) = rest.split_first_chunk::<4>().ok_or_else(|| Error::Codec {
        what,
        reason: "truncated format header".into(),
    })?;
    let format = u32::from_le_bytes(*format);
    if format > SUPPORTED_LEVEL {
        return Err(Error::Codec {
            what,
            reason: format!(
                "written in format {format}, this build reads formats up to {SUPPORTED_LEVEL}: \
                 run a release that supports feature level {format} (see README, Upgrading)"
            ),
        });
    }
    Ok((format, payload))
}

impl ControlCommand {
    /// The lowest feature level at which the cluster may write this command.
    pub(crate) fn level(&self) -> u32 {
        match self {
            ControlCommand::Batch(cmds) => cmds
                .iter()
                .map(ControlCommand::level)
                .max()
                .unwrap_or(BASELINE_LEVEL),
            ControlCommand::CommitProgress { .. } | ControlCommand::ForgetUnits { .. } => 2,
            ControlCommand::RecordMetadata { .. } => METADATA_LEVEL.0,
            _ => BASELINE_LEVEL,
        }
    }
}

/// The levels whose snapshot gained a field at the end of `ControlState` (the end of `SmData`
/// too), in the order of the fields: `session_counters` (level 2), then `metadata` (level 3).
/// Every such field is a collection only commands of its level fill.
const SNAPSHOT_FIELDS_ADDED_AT: [u32; 2] = [2, 3];

/// How many of the last fields of the current `SmData` snapshot `format` (1 or above) lacks.
fn snapshot_fields_missing(format: u32) -> usize {
    SNAPSHOT_FIELDS_ADDED_AT
        .iter()
        .filter(|added| **added > format)
        .count()
}

/// The bincode of a `SmData` of the current shape as snapshot `format` has it. Each format is
/// the next one without the last field that level added (see `SNAPSHOT_FIELDS_ADDED_AT`):
/// format 2 is format 3 without `ControlState::metadata`, format 1 is format 2 without
/// `ControlState::session_counters`. Below its level such a field is empty (only commands of
/// its level fill it, and `SmData::encode` clears it otherwise) and encodes as one zero byte,
/// which is dropped.
pub(crate) fn snapshot_payload(format: u32, mut current: Vec<u8>) -> Vec<u8> {
    let missing = snapshot_fields_missing(format);
    debug_assert!(
        current.len() >= missing && current[current.len() - missing..].iter().all(|b| *b == 0),
        "a field format {format} lacks is not empty"
    );
    current.truncate(current.len().saturating_sub(missing));
    current
}

/// A snapshot payload of `format` in the current shape (see [`snapshot_payload`]): one zero
/// byte (an empty collection) per last field the format lacks.
pub(crate) fn current_snapshot_payload(format: u32, payload: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    match snapshot_fields_missing(format) {
        0 => std::borrow::Cow::Borrowed(payload),
        missing => {
            let mut current = payload.to_vec();
            current.resize(payload.len() + missing, 0);
            std::borrow::Cow::Owned(current)
        }
    }
}

impl ControlState {
    /// The cluster's feature level.
    pub(crate) fn feature_level(&self) -> u32 {
        self.feature_level.max(BASELINE_LEVEL)
    }

    /// The level the leader may raise the cluster to now: the lowest level every member
    /// supports, if above the current one. `None` while a member has not published its level
    /// (it may be of a release that supports none above the baseline).
    pub(crate) fn level_to_raise(&self) -> Option<u32> {
        let lowest = self
            .members
            .keys()
            .map(|node| self.member_levels.get(node).copied())
            .min()??;
        (lowest > self.feature_level()).then_some(lowest)
    }
}

#[cfg(test)]
mod golden;

#[cfg(test)]
mod tests {
    use assert2::{assert, check};

    use super::*;

    #[test]
    fn sealed_bytes_open_to_their_format_and_payload() {
        let sealed = seal(1, b"abc");
        let (format, payload) = open("x", &sealed).expect("opens");
        check!(format == 1);
        check!(payload == b"abc");
    }

    #[test]
    fn bytes_without_a_header_are_format_0() {
        // A bincode log entry starts with the term's varint, a snapshot with an option tag.
        for legacy in [&[0u8, 1, 2][..], &[1, 9], &[250], &[]] {
            check!(open("x", legacy).expect("opens") == (0, legacy));
        }
    }

    #[test]
    fn a_newer_format_is_refused_with_both_versions_named() {
        let err = open("log entry", &seal(SUPPORTED_LEVEL + 1, b"")).expect_err("newer");
        let text = err.to_string();
        check!(text.contains(&format!("format {}", SUPPORTED_LEVEL + 1)));
        check!(text.contains(&format!("up to {SUPPORTED_LEVEL}")));
        assert!(open("x", &[HEADER_MARK, 1, 0]).is_err(), "truncated header");
    }

    #[test]
    fn the_level_rises_to_what_every_member_supports() {
        let mut state = ControlState::default();
        check!(state.level_to_raise() == None, "no members");
        for node in [1, 2] {
            state.apply(
                node,
                &ControlCommand::RegisterMember {
                    node,
                    raft_addr: String::new(),
                    api_addr: String::new(),
                },
            );
        }
        state.member_levels.insert(1, 3);
        check!(state.level_to_raise() == None, "node 2 published nothing");
        state.member_levels.insert(2, 2);
        check!(state.level_to_raise() == Some(2));
        state.feature_level = 2;
        check!(state.level_to_raise() == None, "already there");
        state.member_levels.insert(2, BASELINE_LEVEL);
        check!(state.level_to_raise() == None, "never lowered");
        check!(state.feature_level() == 2);
    }
}
