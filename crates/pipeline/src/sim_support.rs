//! What the deterministic simulator (`crates/sim`) drives. **Not a stable API**: it exists only
//! so that the simulator's writers decide with this crate's real pure cores (the resume plan and
//! the tail scan, the send check, the commit tracker, the consumer-group offset map) under
//! simulated time, targets and failures (and the landed check of Iggy 0.9 confirmations), and
//! its identity follower decides on refused logins as the node's does. It wraps crate-private
//! types without changing their behaviour and may change or disappear with any commit.

use std::time::{Duration, Instant};

use replicator_model::{
    CommitCounters, CommitOutcome, InitialOffset, NodeId, Offset, UnitProgress, WriterLogin,
};

use crate::datapath::translate::{Copied, Lookup, OffsetMap as Map};
use crate::datapath::writer::commit::{CommitTracker as Tracker, Settled};
use crate::datapath::writer::landed::LandedCheck as Landed;
use crate::datapath::writer::resume::{
    self, PartitionExtent, Position, ResumeFacts, TailCheck, TailEntry, TailOutcome, TailPoll,
    TailStep,
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
}

impl Default for WriterDefaults {
    fn default() -> Self {
        let p = crate::PipelineParams::new(0, Default::default(), Vec::new());
        Self {
            send_lease_margin: p.send_lease_margin,
            commit_interval: p.commit_interval,
            tail_scan_window: p.tail_scan_window,
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
    /// The first upstream offset the reader polls.
    pub from: Offset,
    /// The last upstream offset known downstream.
    pub written: Option<Offset>,
    /// The confirmed offset.
    pub confirmed: Option<Offset>,
    /// The target lost confirmed messages: they are copied again.
    pub loss: bool,
    /// The label the unit stamps and commits with.
    pub label: u64,
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
    Resume {
        from: plan.from.offset,
        written: plan.written,
        confirmed: plan.confirmed,
        loss: plan.loss.is_some(),
        label: plan.history.label(),
    }
}

/// The writer's commit bookkeeping (`writer::commit::CommitTracker`).
#[derive(Debug)]
pub struct CommitTracker(Tracker);

impl CommitTracker {
    /// A tracker at `now`; `session` when the writer commits totals (feature level 2).
    pub fn new(interval: Duration, now: Instant, session: Option<u64>) -> Self {
        Self(Tracker::new(interval, now, session))
    }

    /// Where the writer resumed.
    pub fn resumed(&mut self, written: Option<Offset>, committed: Option<Offset>) {
        self.0.resumed(written, committed);
    }

    /// The last upstream offset known downstream.
    pub fn written(&self) -> Option<Offset> {
        self.0.written()
    }

    /// Downstream holds everything up to `offset`.
    pub fn covered(&mut self, offset: Option<Offset>) {
        self.0.covered(offset);
    }

    /// `messages` were acknowledged downstream.
    pub fn sent(&mut self, messages: u64) {
        self.0.sent(messages, messages * 100);
    }

    /// A failure the writer retries.
    pub fn error(&mut self) {
        self.0.error();
    }

    /// When the next commit is due, if any.
    pub fn due_at(&self) -> Option<Instant> {
        self.0.due_at()
    }

    /// The commit to start now, if due: (offset, counters).
    pub fn start_if_due(&mut self, now: Instant) -> Option<(Offset, CommitCounters)> {
        self.0.start_if_due(now).map(|r| (r.offset, r.counters))
    }

    /// The final commit of a stopping writer.
    pub fn start_final(&mut self, now: Instant) -> Option<(Offset, CommitCounters)> {
        self.0.start_final(now).map(|r| (r.offset, r.counters))
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
}

/// Where the target says a writer's sends landed (`writer::landed::LandedCheck`): each send an
/// Iggy 0.9 target confirms must start where the writer's previous one ended.
#[derive(Debug, Default)]
pub struct LandedCheck(Landed);

impl LandedCheck {
    /// The confirmation of one send of `messages` to `partition`: where its first message
    /// landed (`None`: a target that confirms nothing, Iggy 0.8). `false`: it landed elsewhere
    /// than after the previous send, which the writer handles as an unknown outcome.
    pub fn confirm(&mut self, partition: u32, base_offset: Option<u64>, messages: u32) -> bool {
        let confirmed: Vec<replicator_sdk::Confirmed> = base_offset
            .map(|base_offset| replicator_sdk::Confirmed {
                places: vec![replicator_sdk::Place {
                    partition,
                    base_offset,
                }],
                messages,
            })
            .into_iter()
            .collect();
        self.0.confirm(partition, &confirmed).is_ok()
    }

    /// The writer re-read the tail, or a send failed.
    pub fn forget(&mut self) {
        self.0.forget();
    }
}

/// A writer's sends since it resumed, for the consumer-group sync
/// (`groups::translate::OffsetMap`).
#[derive(Debug, Clone)]
pub struct OffsetMap(Map);

impl OffsetMap {
    /// A map for a writer resuming history `label` with the downstream partition's next
    /// offset at `next_down`.
    pub fn new(label: u64, next_down: Offset, copied_before: bool) -> Self {
        Self(Map::new(label, next_down, copied_before))
    }

    /// Messages acknowledged downstream, by upstream offset, in send order.
    pub fn sent(&mut self, upstream: impl IntoIterator<Item = Offset>) {
        self.0.sent(upstream);
    }

    /// A send failed and may have been appended.
    pub fn unsure(&mut self) {
        self.0.unsure();
    }

    /// The tail re-read after an unsure send found `last` (down, up) and the partition's next
    /// offset `next_down`.
    pub fn resynced(&mut self, last: Option<(Offset, Offset)>, next_down: Offset) {
        self.0
            .resynced(last.map(|(down, up)| Copied { down, up }), next_down);
    }

    /// The newest copy recorded: (downstream offset, upstream offset). The group sync checks it
    /// against the downstream partition before it translates with the map.
    pub fn newest(&self) -> Option<(Offset, Offset)> {
        self.0.newest().map(|c| (c.down, c.up))
    }

    /// The copy of upstream offset `up`, or of the last copied offset before it, if the map
    /// knows it: (downstream offset, upstream offset).
    pub fn lookup(&self, up: Offset) -> Option<(Offset, Offset)> {
        match self.0.lookup(up) {
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
