//! Criterion micro-benches of the control plane's commit path below Raft: the state machine
//! applying log entries that carry offset commits, and the bincode codec of those entries.
//!
//! - `apply_commit_entry/{1,16,256}`: one `CommitOffsets` entry with that many commits, applied
//!   by the sled-backed state machine (opened on a temp dir exactly as `Control::start` opens
//!   it) holding 1024 units owned by 4 members; member 1 commits its 256 units. Throughput is in
//!   commits. `apply` changes memory only (snapshots are what reaches sled), so no fsync is in
//!   these figures; the per-apply republish of member 1's assignments is.
//! - `apply_16_commits_by_units/{1024,10240}`: the same 16-commit entry applied with ten times
//!   the units in the state: the cost of an apply must not grow with the unit count (the node's
//!   assignments are republished only after entries that can change them).
//! - `commit_256/{one_entry,entry_per_commit}`: the same 256 commits coalesced into one entry,
//!   against one entry (and one `apply` call) per commit, which is what the state machine would
//!   see without the commit batcher.
//! - `codec/{encode,decode}/{1,16,256}`: an entry's bincode encoding, done once by the log store
//!   on append and again on each replication request; decoding happens when it is read back.
//!
//! Coalescing itself is not benched here: `Control::commit` queues each call into a bounded
//! channel and the node's commit batcher task concatenates whatever arrived within
//! `commit_batch_interval` into one `CommitOffsets` entry while writing it through Raft, so
//! there is no pure coalescing function to call. Its effect below Raft is `commit_256`; its
//! end-to-end effect is the root `control_commit` bench on a 3-node cluster.
//!
//! Run: `cargo bench -p replicator-control --bench state_machine` (for a quick look add
//! `-- --warm-up-time 1 --measurement-time 3`). It prints; it never fails on a number.

use std::hint::black_box;

use criterion::{
    criterion_group, criterion_main, BatchSize, Bencher, BenchmarkId, Criterion, Throughput,
};
use replicator_control::bench_support::{CommitEntry, StateMachine};
use replicator_model::{Assignment, OffsetCommit, UnitCounters, WorkUnit};

/// Members of the simulated cluster.
const MEMBERS: u64 = 4;
/// Units in the replicated state (member 1 owns a quarter of them).
const UNITS: u32 = 1024;
/// Commits per entry.
const SIZES: [usize; 3] = [1, 16, 256];

/// `n` units of one flow: topics of 16 partitions.
fn units_of(n: u32) -> Vec<WorkUnit> {
    (0..n)
        .map(|i| WorkUnit::new("us-to-eu", "orders", format!("topic-{:03}", i / 16), i % 16))
        .collect()
}

/// One commit per assignment, as a writer sends it after a 1000-message batch.
fn commits(assignments: &[Assignment], n: usize) -> Vec<OffsetCommit> {
    assignments
        .iter()
        .cycle()
        .take(n)
        .enumerate()
        .map(|(i, a)| OffsetCommit {
            unit: a.unit.clone(),
            epoch: a.epoch,
            offset: 1_000_000 + i as u64,
            history_label: 1_700_000_000_000_000,
            counters: UnitCounters {
                messages: 1000,
                bytes: 320_000,
                errors: 0,
                gaps: 0,
            },
        })
        .collect()
}

/// A state machine with the default [`UNITS`] (64 topics of 16 partitions) on a fresh temp
/// dir (the guard keeps the dir alive).
fn state_machine() -> (tempfile::TempDir, StateMachine) {
    state_machine_of(UNITS)
}

/// A state machine holding `n` units on a fresh temp dir (the guard keeps the dir alive).
fn state_machine_of(n: u32) -> (tempfile::TempDir, StateMachine) {
    let dir = tempfile::tempdir().expect("a temp dir can be created");
    let sm = StateMachine::open(dir.path(), MEMBERS, &units_of(n)).expect("a fresh data dir opens");
    (dir, sm)
}

/// Applies `entry` once outside the measurement and requires every commit of it accepted
/// (benching the fenced path by mistake would measure something else).
fn apply_accepted(sm: &mut StateMachine, entry: &CommitEntry, commits: usize) {
    let committed = sm.apply(vec![entry.clone()]).expect("apply succeeds");
    assert!(committed == commits, "every commit is accepted");
}

/// Measures applying `entry`, a fresh copy per iteration (the copy is not measured).
fn bench_apply(b: &mut Bencher<'_>, sm: &mut StateMachine, entry: &CommitEntry) {
    b.iter_batched(
        || vec![entry.clone()],
        |entries| sm.apply(entries).expect("apply succeeds"),
        BatchSize::SmallInput,
    );
}

fn apply_commit_entry(c: &mut Criterion) {
    let (_dir, mut sm) = state_machine();
    let assignments = sm.assignments();
    assert!(assignments.len() >= 256, "member 1 owns 256 units");
    let mut group = c.benchmark_group("apply_commit_entry");
    for n in SIZES {
        let entry = CommitEntry::new(sm.last_applied() + 1, commits(&assignments, n));
        apply_accepted(&mut sm, &entry, n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &entry, |b, entry| {
            bench_apply(b, &mut sm, entry);
        });
    }
    group.finish();
}

fn apply_16_commits_by_units(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply_16_commits_by_units");
    for n in [UNITS, UNITS * 10] {
        let (_dir, mut sm) = state_machine_of(n);
        let entry = CommitEntry::new(sm.last_applied() + 1, commits(&sm.assignments(), 16));
        apply_accepted(&mut sm, &entry, 16);
        group.throughput(Throughput::Elements(16));
        group.bench_with_input(BenchmarkId::from_parameter(n), &entry, |b, entry| {
            bench_apply(b, &mut sm, entry);
        });
    }
    group.finish();
}

fn commit_256(c: &mut Criterion) {
    let (_dir, mut sm) = state_machine();
    let all = commits(&sm.assignments(), 256);
    let next = sm.last_applied() + 1;
    let one_entry = CommitEntry::new(next, all.clone());
    let per_commit: Vec<CommitEntry> = (next..)
        .zip(&all)
        .map(|(i, c)| CommitEntry::new(i, vec![c.clone()]))
        .collect();
    let mut group = c.benchmark_group("commit_256");
    group.throughput(Throughput::Elements(256));
    group.bench_function("one_entry", |b| bench_apply(b, &mut sm, &one_entry));
    group.bench_function("entry_per_commit", |b| {
        b.iter_batched(
            || per_commit.clone(),
            |entries| {
                entries
                    .into_iter()
                    .map(|e| sm.apply(vec![e]).expect("apply succeeds"))
                    .sum::<usize>()
            },
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

fn codec(c: &mut Criterion) {
    let (_dir, sm) = state_machine();
    let assignments = sm.assignments();
    let mut group = c.benchmark_group("codec");
    for n in SIZES {
        let entry = CommitEntry::new(1, commits(&assignments, n));
        let bytes = entry.encode().expect("entries encode");
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("encode", n), &entry, |b, entry| {
            b.iter(|| black_box(entry).encode().expect("entries encode"));
        });
        group.bench_with_input(BenchmarkId::new("decode", n), &bytes, |b, bytes| {
            b.iter(|| CommitEntry::decode(black_box(bytes)).expect("own encoding decodes"));
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    apply_commit_entry,
    apply_16_commits_by_units,
    commit_256,
    codec
);
criterion_main!(benches);
