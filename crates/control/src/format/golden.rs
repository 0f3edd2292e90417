//! Golden fixtures: a snapshot and a log of every released format, written once by the release
//! that introduced the format (`GOLDEN_WRITE=1 cargo test -p replicator-control golden`, which
//! never overwrites a fixture) and decoded by every later build. A failure here means a build
//! can no longer read what a released one wrote: a member of it could not join, restart or
//! install a snapshot in a cluster that ran the older release.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use assert2::check;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Membership, StoredMembership};
use replicator_model::{
    ClusterPair, CommitCounters, Epoch, MetadataChange, MetadataKey, MetadataObject,
    MetadataRecord, OffsetCommit, ProgressCommit, UnitCounters, UnitStart, WorkUnit,
};

use crate::command::ControlCommand;
use crate::format::SUPPORTED_LEVEL;
use crate::log_store::{decode_entry, encode_entry};
use crate::state_machine::SmData;
use crate::{MemberNode, TypeConfig};

fn fixture(format: u32, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("formats")
        .join(format.to_string())
        .join(name)
}

fn log_id(index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(2, 1), index)
}

fn unit(p: u32) -> WorkUnit {
    WorkUnit::new("f", "s", "t", p)
}

/// The commands whose application gives the state of the snapshot fixture of `format`: every
/// field of that format's state holds something.
fn history(format: u32) -> Vec<ControlCommand> {
    let register = |node: u64| ControlCommand::RegisterMember {
        node,
        raft_addr: format!("10.0.0.{node}:7100"),
        api_addr: format!("10.0.0.{node}:7200"),
    };
    let identity =
        |node: u64, incarnation: u64, password: &str| ControlCommand::SetWriterIdentity {
            node,
            incarnation,
            password: password.into(),
        };
    let grant = |p: u32, node: u64| ControlCommand::Grant {
        unit: unit(p),
        node,
    };
    assert!(format <= SUPPORTED_LEVEL);
    // The index of each command is its position plus one (grants' epochs follow from it).
    let mut history = vec![
        register(1),
        register(2),
        register(3),
        ControlCommand::ReportUnits {
            flow: "f".into(),
            units: (0..5).map(unit).collect(),
        },
        identity(1, 1, ""),
        identity(2, 1, "chosen-by-an-older-leader"),
        identity(3, 4, ""),
        grant(0, 1), // epoch 8
        grant(1, 2), // epoch 9
        grant(2, 2), // epoch 10
        ControlCommand::CommitOffsets {
            node: 1,
            commits: vec![OffsetCommit {
                unit: unit(0),
                epoch: Epoch(8),
                offset: 41,
                history_label: 1_700_000_000_000_000,
                counters: UnitCounters {
                    messages: 42,
                    bytes: 4200,
                    errors: 1,
                    gaps: 0,
                },
            }],
        },
        ControlCommand::RecordStart {
            node: 2,
            unit: unit(2),
            epoch: Epoch(10),
            start: UnitStart {
                next: 17,
                history_label: 1_700_000_000_000_001,
            },
        },
        ControlCommand::PublishConfig {
            node: 1,
            digests: BTreeMap::from([("f".to_owned(), "digest-of-f".to_owned())]),
        },
        ControlCommand::PublishFeatures {
            node: 1,
            level: format,
        },
        ControlCommand::PublishFeatures {
            node: 2,
            level: format,
        },
        ControlCommand::PublishFeatures {
            node: 3,
            level: format,
        },
        ControlCommand::RaiseFeatureLevel { level: format },
        // Node 2 fails: fenced, revoked on one target, replaced before the other acknowledged
        // (its units of `f` are held).
        ControlCommand::FenceMember {
            node: 2,
            incarnation: 1,
        },
        ControlCommand::FenceTarget {
            node: 2,
            incarnation: 1,
            target: "eu".into(),
            flows: vec!["g".into()],
        },
        ControlCommand::ReplaceFencedIdentity {
            node: 2,
            fenced: 1,
            incarnation: 2,
            held_flows: vec!["f".into()],
        },
        ControlCommand::RequestRelease {
            unit: unit(0),
            epoch: Epoch(8),
        },
        ControlCommand::SetFlowPaused {
            flow: "f".into(),
            paused: true,
            requested_by: "admin-api@10.0.0.9:5000".into(),
            at_unix_ms: 1_700_000_000_000,
        },
        ControlCommand::ResetTopicOffsets {
            flow: "f".into(),
            resets: vec![(unit(3), 5, 1_700_000_000_000_002)],
            allow_duplicates: false,
            requested_by: "admin-api@10.0.0.9:5000".into(),
            at_unix_ms: 1_700_000_000_001,
        },
        // Node 3 leaves: its identity turns stale, then forgotten once revoked everywhere.
        ControlCommand::RemoveMember { node: 3 },
        ControlCommand::ForgetIdentity {
            node: 3,
            incarnation: 4,
        },
    ];
    if format >= 2 {
        history.extend([
            // A writer session's totals, recorded per session.
            ControlCommand::CommitProgress {
                node: 1,
                commits: vec![ProgressCommit {
                    unit: unit(0),
                    epoch: Epoch(8),
                    offset: 52,
                    history_label: 1_700_000_000_000_000,
                    counters: CommitCounters::Totals {
                        session: 0x5e55_1011,
                        totals: UnitCounters {
                            messages: 11,
                            bytes: 1100,
                            errors: 0,
                            gaps: 1,
                        },
                    },
                }],
            },
            // Partition 4's topic is gone: retired, then forgotten.
            ControlCommand::ReportUnits {
                flow: "f".into(),
                units: (0..4).map(unit).collect(),
            },
            ControlCommand::ForgetUnits {
                units: vec![unit(4)],
            },
        ]);
    }
    if format >= 3 {
        let pair = ClusterPair::new("us", "eu");
        let key = |object| MetadataKey {
            pair: pair.clone(),
            object,
        };
        let topic = key(MetadataObject::Topic {
            stream: "s".into(),
            topic: "t".into(),
        });
        let authored_in_us = MetadataRecord {
            home: "us".into(),
            agreed: BTreeMap::from([
                ("compression".to_owned(), 2),
                ("message_expiry".to_owned(), 3_600_000_000),
            ]),
        };
        history.extend([
            // A two-way pair records a topic authored in `us` and a user authored in `eu`.
            ControlCommand::RecordMetadata {
                changes: vec![
                    MetadataChange {
                        key: topic.clone(),
                        expected: None,
                        record: Some(authored_in_us.clone()),
                    },
                    MetadataChange {
                        key: key(MetadataObject::User("app".into())),
                        expected: None,
                        record: Some(MetadataRecord {
                            home: "eu".into(),
                            agreed: BTreeMap::new(),
                        }),
                    },
                ],
            },
            // Both sides agree on a new expiry; a change from the old record loses.
            ControlCommand::RecordMetadata {
                changes: vec![
                    MetadataChange {
                        key: topic.clone(),
                        expected: Some(authored_in_us.clone()),
                        record: Some(MetadataRecord {
                            home: "us".into(),
                            agreed: BTreeMap::from([
                                ("compression".to_owned(), 2),
                                ("message_expiry".to_owned(), 7_200_000_000),
                            ]),
                        }),
                    },
                    MetadataChange {
                        key: topic,
                        expected: Some(authored_in_us),
                        record: None,
                    },
                ],
            },
        ]);
    }
    history
}

/// The state machine's data after `history(format)`, applied one command per index from 1.
fn expected_state(format: u32) -> SmData {
    let mut data = SmData::default();
    for (i, cmd) in history(format).iter().enumerate() {
        let index = i as u64 + 1;
        data.state.apply(index, cmd);
        data.last_applied = Some(log_id(index));
    }
    data.last_membership = StoredMembership::new(Some(log_id(1)), membership());
    data
}

fn membership() -> Membership<u64, MemberNode> {
    let nodes: BTreeMap<u64, MemberNode> = (1..=3)
        .map(|n| {
            (
                n,
                MemberNode {
                    raft_addr: format!("10.0.0.{n}:7100"),
                },
            )
        })
        .collect();
    Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes)
}

/// A blank entry, a membership entry, and one entry per command variant of `format`.
fn expected_entries(format: u32) -> Vec<Entry<TypeConfig>> {
    let mut payloads = vec![EntryPayload::Blank, EntryPayload::Membership(membership())];
    payloads.extend(
        crate::command::tests::golden()
            .into_iter()
            .map(|(cmd, _)| cmd)
            .filter(|cmd| cmd.level() <= format)
            .map(EntryPayload::Normal),
    );
    payloads
        .into_iter()
        .enumerate()
        .map(|(i, payload)| Entry {
            log_id: log_id(i as u64 + 1),
            payload,
        })
        .collect()
}

/// Entries as one file: each entry's stored bytes behind their length (u32, little endian).
fn log_file(entries: &[Entry<TypeConfig>]) -> Vec<u8> {
    let mut out = Vec::new();
    for entry in entries {
        let bytes = encode_entry(entry).expect("entries encode");
        out.extend_from_slice(&u32::try_from(bytes.len()).expect("small").to_le_bytes());
        out.extend_from_slice(&bytes);
    }
    out
}

fn read_log_file(mut bytes: &[u8]) -> Vec<Entry<TypeConfig>> {
    let mut out = Vec::new();
    while let Some((len, rest)) = bytes.split_first_chunk::<4>() {
        let len = u32::from_le_bytes(*len) as usize;
        let (entry, rest) = rest.split_at(len);
        out.push(decode_entry(entry).expect("a released log entry decodes"));
        bytes = rest;
    }
    out
}

/// The fixture `name` of `format`: written from `build` only under `GOLDEN_WRITE=1` and only
/// if missing (a released fixture is never rewritten); otherwise its absence fails the test.
fn read_or_write(format: u32, name: &str, build: impl FnOnce() -> Vec<u8>) -> Vec<u8> {
    let path = fixture(format, name);
    if !path.exists() && std::env::var_os("GOLDEN_WRITE").is_some() {
        std::fs::create_dir_all(path.parent().expect("has a parent")).expect("fixture dir");
        std::fs::write(&path, build()).expect("fixture written");
    }
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; every format up to {SUPPORTED_LEVEL} needs its fixtures (see the module doc)",
            path.display()
        )
    })
}

#[test]
fn every_released_snapshot_format_decodes_to_the_state_its_history_gives() {
    for format in 1..=SUPPORTED_LEVEL {
        let expected = expected_state(format);
        let bytes = read_or_write(format, "snapshot.bin", || {
            expected.encode().expect("encodes")
        });
        let data = SmData::decode(&bytes).expect("a released snapshot decodes");
        check!(data.state == expected.state, "format {format}");
        // And a cluster still at that level gets the same bytes from this build, which the
        // release of the level reads.
        check!(
            expected.encode().expect("encodes") == bytes,
            "format {format} written again"
        );
        check!(data.last_applied == expected.last_applied);
        check!(data.last_membership == expected.last_membership);
    }
}

#[test]
fn every_released_log_format_decodes_entry_by_entry() {
    for format in 1..=SUPPORTED_LEVEL {
        let expected = expected_entries(format);
        let bytes = read_or_write(format, "log.bin", || log_file(&expected));
        check!(read_log_file(&bytes) == expected, "format {format}");
    }
}

#[test]
fn the_snapshot_fixture_history_fills_every_field() {
    // A field left empty by the history would not prove its encoding is still read.
    let s = expected_state(SUPPORTED_LEVEL).state;
    check!(s.members.len() == 2);
    check!(s.units.values().any(|u| u.progress.confirmed.is_some()));
    check!(s.units.values().any(|u| u.release_requested));
    check!(!s.identities.is_empty());
    check!(!s.stale_identities.is_empty() || !s.forgotten_incarnations.is_empty());
    check!(!s.forgotten_incarnations.is_empty());
    check!(!s.paused_flows.is_empty());
    check!(!s.pending_resets.is_empty());
    check!(!s.config_digests.is_empty());
    check!(!s.recorded_starts.is_empty());
    check!(!s.reset_topics.is_empty());
    check!(!s.target_revokes.is_empty());
    check!(!s.revoke_pending.is_empty());
    check!(!s.held_units.is_empty());
    check!(s.feature_level() == SUPPORTED_LEVEL);
    check!(!s.member_levels.is_empty());
    check!(!s.session_counters.is_empty());
    check!(s.units.len() == 4, "one unit forgotten");
    check!(s.metadata.len() == 2);
    check!(s
        .metadata
        .values()
        .any(|r| r.agreed.get("message_expiry") == Some(&7_200_000_000)));
}

#[test]
fn a_snapshot_below_a_fields_level_leaves_it_out_and_reads_back_without_it() {
    // `SmData::encode` clears what the cluster's format cannot carry (which only a command of
    // a higher level fills, so a real state never holds it).
    let full = expected_state(SUPPORTED_LEVEL);
    for format in 1..SUPPORTED_LEVEL {
        let mut data = full.clone();
        data.state.feature_level = format;
        let bytes = data.encode().expect("encodes");
        check!(crate::format::open("x", &bytes).expect("opens").0 == format);
        let back = SmData::decode(&bytes).expect("decodes");
        check!(
            back.state.metadata.is_empty() == (format < 3),
            "format {format}"
        );
        check!(
            back.state.session_counters.is_empty() == (format < 2),
            "format {format}"
        );
        let mut expected = data.state.clone();
        if format < 3 {
            expected.metadata.clear();
        }
        if format < 2 {
            expected.session_counters.clear();
        }
        check!(back.state == expected, "format {format}");
    }
}
