//! What the deterministic simulator (`crates/sim`) drives. **Not a stable API**: it exists only
//! so that the simulator's writers are the node's writer core (`writer::core`: the resume
//! plan's outcome, the tail re-read and the loss it may reveal, send answers and the landed
//! check of Iggy 0.9 confirmations, the commit bookkeeping, the consumer-group offset map)
//! with the real tail scan and send check, under simulated time, targets and failures, and its
//! identity follower decides on refused logins as the node's does. It wraps crate-private
//! types without changing their behaviour and may change or disappear with any commit.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use replicator_model::{
    CommitOutcome, Epoch, InitialOffset, NodeId, Offset, ProgressCommit, UnitProgress, WorkUnit,
    WriterLogin,
};

use crate::backoff::Backoff;
use crate::datapath::offset_maps::lock_map;
use crate::datapath::translate::Lookup;
use crate::datapath::writer::commit::{CommitTracker as Tracker, Settled};
use crate::datapath::writer::core::{offset_map, Handled, WriterCore as Core};
use crate::datapath::writer::resume::{
    self, PartitionExtent, Position, ResumeFacts, ResumePlan, TailCheck, TailEntry, TailOutcome,
    TailPoll, TailStep,
};
use crate::datapath::writer::send::{send_verdict, SendVeto};
use crate::fencing::identity::Refusal;
use crate::ControlError;

/// The documented defaults a writer works with (the one home is [`crate::PipelineParams::new`]).
#[derive(Debug, Clone, Copy)]
pub struct WriterDefaults {
    /// A writer sends only while its lease is valid for at least this long.
    pub send_lease_margin: Duration,
    /// Shortest time between two commits of one unit.
    pub commit_interval: Duration,
    /// How far back a writer without a confirmed offset scans the downstream tail.
    pub tail_scan_window: u32,
    /// The writer's backoff between retries of a failure.
    pub backoff: crate::BackoffParams,
    /// How long a streak of failures may last before the writer gives up.
    pub retry_budget: Duration,
}

impl Default for WriterDefaults {
    fn default() -> Self {
        let p = crate::PipelineParams::new(0, Default::default(), Vec::new());
        Self {
            send_lease_margin: p.send_lease_margin,
            commit_interval: p.commit_interval,
            tail_scan_window: p.tail_scan_window,
            backoff: p.backoff,
            retry_budget: p.retry_budget,
        }
    }
}

/// Why a writer may not send now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Veto {
    /// The unit is no longer this node's under the writer's epoch: stop.
    EpochNotCurrent,
    /// The lease ends within the margin: hold the batch, look again shortly.
    LeaseExpiring,
}

/// The writer's check before every send (`writer::send::send_verdict`).
pub fn may_send(
    now: Instant,
    lease_for_epoch: Option<Instant>,
    margin: Duration,
    epoch_current: bool,
) -> Result<(), Veto> {
    send_verdict(now, lease_for_epoch, margin, || epoch_current).map_err(|v| match v {
        SendVeto::EpochNotCurrent => Veto::EpochNotCurrent,
        SendVeto::LeaseExpiring => Veto::LeaseExpiring,
    })
}

/// Least time between two identities one process gives up after refused logins
/// (`fencing::identity::MIN_ABANDON_INTERVAL`).
pub const MIN_ABANDON_INTERVAL: Duration = crate::fencing::identity::MIN_ABANDON_INTERVAL;

/// What the identity follower does with a refused login of incarnation `refused` while it
/// writes as `current` (`fencing::identity::Refusal::of`): the incarnation to give up, or
/// `None` for the late answer to a connect of an identity replaced since.
pub fn refusal_gives_up(node: NodeId, refused: u64, current: Option<u64>) -> Option<u64> {
    let current = current.map(|incarnation| WriterLogin {
        node,
        incarnation,
        password: String::new(),
    });
    match Refusal::of(refused, current.as_ref()) {
        Refusal::GiveUp(incarnation) => Some(incarnation),
        Refusal::Late => None,
    }
}

/// A downstream message as the tail scan reads it: its offset and, when this flow wrote it,
/// the upstream offset it copies (history 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Downstream offset.
    pub offset: Offset,
    /// Upstream offset (`repl-offset`), if it is a copy of ours.
    pub upstream: Option<Offset>,
}

/// The page the tail scan wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// The newest `count` messages.
    Last {
        /// How many.
        count: u32,
    },
    /// Up to `count` messages from `offset` on.
    From {
        /// First downstream offset.
        offset: Offset,
        /// How many.
        count: u32,
    },
}

impl Page {
    fn of(poll: TailPoll) -> Self {
        match poll {
            TailPoll::Last { count } => Self::Last { count },
            TailPoll::From { offset, count } => Self::From { offset, count },
        }
    }
}

/// What a finished tail scan found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tail(TailOutcome);

impl Tail {
    /// The newest copy of ours: (downstream offset, upstream offset).
    pub fn hit(&self) -> Option<(Offset, Offset)> {
        match self.0 {
            TailOutcome::Hit(h) => Some((h.downstream, h.position.offset)),
            TailOutcome::Absent(_) => None,
        }
    }

    /// The downstream partition is empty.
    pub fn empty(&self) -> bool {
        matches!(self.0, TailOutcome::Absent(resume::ScanEnd::Empty))
    }
}

/// The writer's backwards scan of the downstream partition (`writer::resume::TailScan`).
#[derive(Debug)]
pub struct TailScan(resume::TailScan);

impl TailScan {
    /// A scan bounded by `window` unless `confirmed` (an upstream offset of history 0) is
    /// given, and its first page.
    pub fn start(window: u32, confirmed: Option<Offset>) -> (Self, Page) {
        let reference = confirmed.map(|offset| Position { resets: 0, offset });
        let (scan, poll) = resume::TailScan::start(window, reference);
        (Self(scan), Page::of(poll))
    }

    /// Takes the page asked for (ascending offsets): the next page, or what the scan found.
    pub fn feed(&mut self, page: &[Seen]) -> Result<Tail, Page> {
        let entries: Vec<TailEntry> = page
            .iter()
            .map(|s| TailEntry {
                offset: s.offset,
                ours: s.upstream.map(|offset| Position { resets: 0, offset }),
            })
            .collect();
        match self.0.feed(&entries) {
            TailStep::Poll(poll) => Err(Page::of(poll)),
            TailStep::Done(outcome) => Ok(Tail(outcome)),
        }
    }
}

/// Where a unit resumes (`writer::resume::plan`, for an upstream partition that was never
/// reset, provenance on, no operator reset, initial offset `earliest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    plan: ResumePlan,
}

impl Resume {
    /// The first upstream offset the reader polls.
    pub fn from(&self) -> Offset {
        self.plan.from.offset
    }

    /// The target lost confirmed messages: they are copied again.
    pub fn loss(&self) -> bool {
        self.plan.loss.is_some()
    }
}

/// Decides where a unit resumes from its confirmed `progress`, the upstream topic's
/// `created_at`, the tail found and the upstream partition's extent (`messages`, `last`).
pub fn resume(
    progress: Option<UnitProgress>,
    created_at: u64,
    tail: Tail,
    messages: u64,
    last: Offset,
) -> Resume {
    let plan = resume::plan(&ResumeFacts {
        progress,
        created_at,
        tail: Some(tail.0),
        // The simulated upstream never refills a history: the copy at the tail is the same.
        tail_check: if tail.hit().is_some() {
            TailCheck::Same
        } else {
            TailCheck::Unknown
        },
        initial: InitialOffset::Earliest,
        extent: PartitionExtent {
            messages_count: messages,
            current_offset: last,
        },
        reset: None,
        recorded: None,
    })
    .expect("the simulated upstream is never reset");
    Resume { plan }
}

/// The writer's state between IO calls and its decisions on their answers
/// (`writer::core::WriterCore`, the one the node's writer task drives), with a consumer-group
/// offset map always on.
#[derive(Debug)]
pub struct WriterCore(Core);

impl WriterCore {
    /// The writer of `unit` under `epoch` with the writer `defaults`, created at `now`;
    /// `session` when it commits totals (feature level 2); `seed` of its backoff's jitter.
    pub fn new(
        unit: WorkUnit,
        epoch: Epoch,
        defaults: &WriterDefaults,
        now: Instant,
        session: Option<u64>,
        seed: u64,
    ) -> Self {
        Self(Core::new(
            unit,
            epoch,
            Tracker::new(defaults.commit_interval, now, session),
            Backoff::new(defaults.backoff, seed),
            defaults.retry_budget,
        ))
    }

    /// The resume decided `resume` after the scan found `tail`; `progress` the unit's
    /// confirmed progress, `next_down` the downstream partition's next offset.
    pub fn resumed(
        &mut self,
        resume: &Resume,
        tail: Tail,
        progress: Option<UnitProgress>,
        next_down: Offset,
    ) {
        let map = offset_map(&resume.plan, progress, next_down);
        self.0
            .resumed(&resume.plan, Some(tail.0), Some(Arc::new(Mutex::new(map))));
    }

    /// The last upstream offset known downstream.
    pub fn written(&self) -> Option<Offset> {
        self.0.written()
    }

    /// `Some(reference)` when the tail must be re-read before the next send: the scan looks
    /// for `reference` (an upstream offset of history 0) without a bound.
    pub fn rescan(&self) -> Option<Option<Offset>> {
        self.0
            .rescan()
            .map(|r| r.reference.map(|position| position.offset))
    }

    /// The re-read found `tail`, the partition ending at `next_down`; `false`: the target lost
    /// what it acknowledged, the pair ends.
    pub fn rescanned(&mut self, tail: Tail, next_down: Offset) -> bool {
        self.0.rescanned(tail.0, next_down).is_ok()
    }

    /// The target accepted a send of `upstream` offsets to `partition`, its first message
    /// landing at `base_offset` when the target says (Iggy 0.9). `false`: it landed elsewhere
    /// than after the previous send, which counts as an unknown outcome.
    pub fn acknowledged(
        &mut self,
        partition: u32,
        base_offset: Option<u64>,
        upstream: &[Offset],
    ) -> bool {
        let confirmed: Vec<replicator_sdk::Confirmed> = base_offset
            .map(|base_offset| replicator_sdk::Confirmed {
                places: vec![replicator_sdk::Place {
                    partition,
                    base_offset,
                }],
                messages: upstream.len() as u32,
            })
            .into_iter()
            .collect();
        self.0
            .acknowledged(partition, &confirmed, upstream.iter().copied())
            .is_ok()
    }

    /// A send failed or its answer was lost: it may have been appended.
    pub fn send_unsure(&mut self) {
        self.0.send_unsure();
    }

    /// The writer is done with a batch of `messages` (100 bytes each) sent whole, ending at
    /// upstream `last`.
    pub fn handled(&mut self, messages: u64, last: Offset) {
        self.0.handled(Handled {
            sent: Some((messages, messages * 100)),
            recopied: 0,
            last_offset: last,
            gap: false,
        });
    }

    /// A failure at `now`: how long to wait before trying again, or `None` when the writer
    /// gives up (its pair ends).
    pub fn failed(&mut self, now: Instant) -> Option<Duration> {
        self.0.failed(now)
    }

    /// A resume or a send succeeded: the next failure starts a new streak.
    pub fn succeeded(&mut self) {
        self.0.succeeded();
    }

    /// How long to hold the batch after `veto` before looking again; `None`: the writer ends.
    pub fn vetoed(&self, veto: Veto) -> Option<Duration> {
        self.0.vetoed(match veto {
            Veto::EpochNotCurrent => SendVeto::EpochNotCurrent,
            Veto::LeaseExpiring => SendVeto::LeaseExpiring,
        })
    }

    /// The commit to start at `now`, if due.
    pub fn commit_if_due(&mut self, now: Instant) -> Option<ProgressCommit> {
        self.0.commit_if_due(now)
    }

    /// The final commit of a stopping writer.
    pub fn final_commit(&mut self, now: Instant) -> Option<ProgressCommit> {
        self.0.final_commit(now)
    }

    /// The answer to the commit in flight (`None`: the call failed). `true`: fenced, stop.
    pub fn settle(&mut self, now: Instant, answer: Option<&[CommitOutcome]>) -> bool {
        let failure = ControlError {
            reason: "no answer".to_owned(),
            transient: true,
        };
        let answer = answer.ok_or(&failure);
        matches!(self.0.settle(now, answer), Settled::Fenced { .. })
    }

    /// The newest copy the offset map recorded: (downstream offset, upstream offset). The
    /// group sync checks it against the downstream partition before it translates with it.
    pub fn newest_copy(&self) -> Option<(Offset, Offset)> {
        let map = lock_map(self.0.offset_map()?);
        map.newest().map(|c| (c.down, c.up))
    }

    /// The copy of upstream offset `up`, or of the last copied offset before it, if the offset
    /// map knows it: (downstream offset, upstream offset).
    pub fn lookup(&self, up: Offset) -> Option<(Offset, Offset)> {
        let map = lock_map(self.0.offset_map()?);
        match map.lookup(up) {
            Lookup::Found(c) => Some((c.down, c.up)),
            Lookup::NotCopied | Lookup::Unknown => None,
        }
    }
}

/// A user of a two-way pair as the simulator models it: its id (ids grow with creation time),
/// whether it is active, and its rights as three bits of global permissions (read streams,
/// poll, send).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairUser {
    /// The id on its cluster.
    pub id: u32,
    /// Active (an original) or inactive (a copy, or deactivated by an operator).
    pub active: bool,
    /// The rights, three bits.
    pub rights: u8,
}

impl PairUser {
    fn copy(&self) -> crate::sync::metadata::users::UserCopy {
        use replicator_sdk::types::{GlobalPermissions, Permissions, UserStatus};
        crate::sync::metadata::users::UserCopy {
            id: self.id,
            created_at: u64::from(self.id),
            status: if self.active {
                UserStatus::Active
            } else {
                UserStatus::Inactive
            },
            permissions: Some(Permissions {
                global: GlobalPermissions {
                    read_streams: self.rights & 1 != 0,
                    poll_messages: self.rights & 2 != 0,
                    send_messages: self.rights & 4 != 0,
                    ..GlobalPermissions::default()
                },
                streams: None,
            }),
        }
    }

    fn rights_of(permissions: Option<&replicator_sdk::types::Permissions>) -> u8 {
        permissions.map_or(0, |p| {
            u8::from(p.global.read_streams)
                | u8::from(p.global.poll_messages) << 1
                | u8::from(p.global.send_messages) << 2
        })
    }
}

/// Where a user of a two-way pair is at home, as the flow from `source` to `target` decides
/// it (`sync::metadata::pair::user_home`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PairUserHome {
    /// Recorded on that side (`true`: the flow's source).
    Recorded(bool),
    /// Not recorded, found on that side: record it, then act.
    Found(bool),
    /// Not recorded and undecidable: left alone.
    Undecided,
    /// Recorded and on neither side: the record is dropped.
    Gone,
}

/// `sync::metadata::pair::user_home` for the flow from `source` to `target`.
pub fn pair_user_home(
    (source, target): (&str, &str),
    record: Option<&replicator_model::MetadataRecord>,
    up: Option<&PairUser>,
    down: Option<&PairUser>,
) -> PairUserHome {
    use crate::selection::pairing::{PairView, Side};
    use crate::sync::metadata::pair::{user_home, UserHome};
    let view = PairView::new(source, target);
    let (up, down) = (up.map(PairUser::copy), down.map(PairUser::copy));
    match user_home(&view, record, up.as_ref(), down.as_ref()) {
        UserHome::Recorded(side) => PairUserHome::Recorded(side == Side::Source),
        UserHome::Found(side) => PairUserHome::Found(side == Side::Source),
        UserHome::Undecided(_) => PairUserHome::Undecided,
        UserHome::Gone => PairUserHome::Gone,
    }
}

/// A record of an object at home on `home`, nothing agreed yet.
pub fn home_record(home: &str) -> replicator_model::MetadataRecord {
    replicator_model::MetadataRecord {
        home: home.to_owned(),
        agreed: Default::default(),
    }
}

/// A change to the target's copy of a user (`sync::metadata::users::UserAction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairUserAction {
    /// Create it inactive with these rights.
    Create(u8),
    /// Set its rights.
    SetRights(u8),
    /// Make it inactive.
    Deactivate,
    /// Delete it.
    Delete,
}

/// What the target's copy of a user needs from the flow whose source is its home
/// (`sync::metadata::users::plan`, users deleted upstream kept).
pub fn user_actions(up: Option<&PairUser>, down: Option<&PairUser>) -> Vec<PairUserAction> {
    use crate::sync::metadata::users::{plan, UserAction};
    let (up, down) = (up.map(PairUser::copy), down.map(PairUser::copy));
    plan(up.as_ref(), down.as_ref(), false)
        .0
        .into_iter()
        .map(|action| match action {
            UserAction::Create(p) => PairUserAction::Create(PairUser::rights_of(p.as_ref())),
            UserAction::SetPermissions(p) => {
                PairUserAction::SetRights(PairUser::rights_of(p.as_ref()))
            }
            UserAction::Deactivate => PairUserAction::Deactivate,
            UserAction::Delete => PairUserAction::Delete,
        })
        .collect()
}

/// One flow's decision on a topic's message expiry in a two-way pair
/// (`sync::metadata::pair::plan_settings`; the topic's other settings equal on both sides).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairExpiry {
    /// The expiry (seconds) to write on the target, if any.
    pub write: Option<u64>,
    /// The record once the write landed.
    pub record: replicator_model::MetadataRecord,
    /// The record when the target refused the write.
    pub record_if_refused: replicator_model::MetadataRecord,
    /// The two sides changed to different values since they last agreed.
    pub conflict: bool,
}

/// `sync::metadata::pair::plan_settings` for the flow from `source` to `target`, over a topic
/// whose message expiry is `up_s` seconds on the source and `down_s` on the target.
/// `older_is_source`: the source's topic was created first.
pub fn pair_expiry(
    (source, target): (&str, &str),
    (up_s, down_s): (u64, u64),
    record: Option<&replicator_model::MetadataRecord>,
    older_is_source: bool,
) -> PairExpiry {
    use crate::selection::pairing::{PairView, Side};
    use crate::sync::metadata::pair::plan_settings;
    use crate::sync::metadata::settings::TopicSettings;
    use replicator_sdk::types::{CompressionAlgorithm, IggyExpiry, MaxTopicSize};
    let settings = |s: u64| TopicSettings {
        message_expiry: IggyExpiry::ExpireDuration(Duration::from_secs(s).into()),
        max_topic_size: MaxTopicSize::Unlimited,
        compression: CompressionAlgorithm::None,
    };
    let older = if older_is_source {
        Side::Source
    } else {
        Side::Target
    };
    let view = PairView::new(source, target);
    let plan = plan_settings(
        &view,
        &settings(up_s),
        &settings(down_s),
        record,
        older,
        &Default::default(),
    );
    let expiry = replicator_model::TopicSetting::MessageExpiry;
    PairExpiry {
        write: plan.update.map(|_| up_s),
        record_if_refused: plan.record_after(&[expiry], record),
        record: plan.record,
        conflict: !plan.conflicts.is_empty(),
    }
}

/// The message expiry (seconds) `record` says both sides last agreed on.
pub fn agreed_expiry(record: Option<&replicator_model::MetadataRecord>) -> Option<u64> {
    let key = replicator_model::TopicSetting::MessageExpiry.as_str();
    record
        .and_then(|r| r.agreed.get(key))
        .map(|micros| micros / 1_000_000)
}
