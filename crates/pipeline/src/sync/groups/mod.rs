//! Consumer-group offset sync: the offsets that selected upstream groups stored, translated
//! exactly to the downstream partitions (see [`translate`](crate::datapath::translate)) and
//! stored for the same groups on the target, so that a consumer that switches clusters resumes
//! with the message it would have read next upstream.
//!
//! Work is shared like partitions: each node syncs the partitions of the units it owns, every
//! `flows[].consumer_group_sync_interval` (`run`); `flow promote` syncs a paused flow's every
//! partition once more from one node (`Pipeline::sync_groups`).
//!
//! Iggy stores a group's offset only from a member the partition is assigned to. So the sync
//! joins the group on the target, stores, and leaves, and only while the group has no other
//! member there: a group with members is skipped (and reported), its offsets untouched, so live
//! consumers are never disturbed. One node's sync dances run one at a time (they share the
//! writers' connections, and membership belongs to a connection). Target offsets only move
//! forward: a group that consumed further on the target is never rewound by a stale upstream
//! offset.
//!
//! The target calls go through the flow's door to its target (`datapath::target`), logged in as
//! this member's writer identity on fenced targets, and each write only while this node's
//! lease holds when its turn on the connection comes: a fenced node, or one that lost its
//! lease, cannot move a group's offset either.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use globset::GlobSet;
use replicator_model::{Offset, WorkUnit};
use replicator_sdk::types::{Consumer, Identifier, PollingStrategy};
use replicator_sdk::IggyCluster as _;
use replicator_sdk::Message;
use tokio_util::sync::CancellationToken;

use crate::clients::Cluster;
use crate::control::ControlPlane;
use crate::datapath::offset_maps::OffsetMaps;
use crate::datapath::target::{write_checked, TargetDoor};
use crate::datapath::translate::{Copied, Lookup, Search, Step};
use crate::datapath::writer::send::SendVeto;
use crate::datapath::writer::{
    confirmed_position, tail_poll, Position, ScanEnd, TailEntry, TailOutcome,
};
use crate::datapath::writer::{TailScan, TailStep};
use crate::error::{Error, Result};
use crate::params::FlowParams;
use crate::provenance::{self, History};
use crate::selection::mapping::downstream_stream;

/// Messages one poll of a search reads.
const SEARCH_PAGE: u64 = 100;

/// Most polls one search makes (a page each).
const SEARCH_POLLS: u32 = 200;

/// Most entries of [`GroupSync::found`] (cleared when full).
const FOUND_CACHE: usize = 100_000;

/// One group's translated offset on one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupOffset {
    /// Upstream stream.
    pub stream: String,
    /// Topic (same name on both sides).
    pub topic: String,
    /// Partition id (same on both sides).
    pub partition: u32,
    /// Consumer group name (same on both sides).
    pub group: String,
    /// The offset the group stored upstream (the last message it processed).
    pub upstream_offset: Offset,
    /// The offset stored for the group downstream: the copy of `upstream_offset`, or of the
    /// last copied message before it (`exact == false`; the consumer re-reads up to it).
    pub downstream_offset: Offset,
    /// Whether `downstream_offset` holds the copy of `upstream_offset` itself.
    pub exact: bool,
}

/// A group the sync left alone, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSkip {
    /// Upstream stream.
    pub stream: String,
    /// Topic.
    pub topic: String,
    /// Consumer group name.
    pub group: String,
    /// Why, e.g. "2 active members on the target".
    pub reason: String,
}

/// What one sync round of a flow did on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupSyncReport {
    /// The flow.
    pub flow: String,
    /// When the round ended, Unix milliseconds.
    pub at_unix_ms: u64,
    /// Offsets as the target has them now, per group and partition (also the ones that were
    /// already there).
    pub offsets: Vec<GroupOffset>,
    /// Offsets this round wrote on the target.
    pub stored: u64,
    /// Groups left alone.
    pub skipped: Vec<GroupSkip>,
    /// Failures (each retried next round), e.g. "orders/created: join: timeout".
    pub errors: Vec<String>,
    /// Polls the translation's searches made (offsets the writers' maps did not know).
    pub probes: u64,
}

/// The latest round of every flow on this node, and totals since start (for status and
/// metrics).
pub(crate) type GroupSyncRegistry = crate::stats::FlowStates<FlowSyncState>;

/// One flow's sync state on this node.
#[derive(Debug, Clone, Default)]
pub struct FlowSyncState {
    /// The latest round.
    pub last: GroupSyncReport,
    /// Rounds since start.
    pub runs: u64,
    /// Rounds that had at least one error.
    pub failed_runs: u64,
    /// Offsets written on the target since start.
    pub stored: u64,
}

impl FlowSyncState {
    /// Counts `report` in, and keeps it as the latest round.
    pub(crate) fn add(&mut self, report: GroupSyncReport) {
        self.runs += 1;
        self.failed_runs += u64::from(!report.errors.is_empty());
        self.stored += report.stored;
        self.last = report;
    }
}

/// Compiles a flow's group globs (`*` matches any run of characters).
pub(crate) fn group_selector(globs: &[String]) -> std::result::Result<GlobSet, (String, String)> {
    crate::selection::globs::name_globs("consumer_groups", globs)
}

/// What a sync of one flow needs.
pub(crate) struct GroupSync<C> {
    pub(crate) flow: Arc<FlowParams>,
    /// The flow's residency: groups on the topics it blocks are never touched on the target.
    pub(crate) residency: Arc<crate::selection::residency::Residency>,
    pub(crate) groups: GlobSet,
    pub(crate) source: Arc<Cluster>,
    /// The door to the flow's target: the writer identity's connections, and the lease
    /// checked right before each write there.
    pub(crate) door: Arc<TargetDoor<C>>,
    /// Confirmed progress of the units.
    pub(crate) control: C,
    /// The flow's assignments on this node (see `FlowAssignments`): the units synced.
    pub(crate) assignments: tokio::sync::watch::Receiver<Arc<Vec<replicator_model::Assignment>>>,
    pub(crate) maps: OffsetMaps,
    /// One sync dance at a time on this node (see the module docs).
    pub(crate) dance: Arc<tokio::sync::Mutex<()>>,
    pub(crate) registry: GroupSyncRegistry,
    /// Exact copies found lately, by (unit, history, upstream offset): a group that stays put
    /// costs one poll a round, not a search.
    pub(crate) found: Mutex<HashMap<(WorkUnit, u64, Offset), Copied>>,
    /// How far back the search for the newest copy reads without a confirmed offset to look
    /// for (`pipeline.tail_scan_window`, as the writers' resume).
    pub(crate) tail_scan_window: u32,
}

/// A boxed sync of one flow's given units (what `Pipeline::sync_groups` calls).
pub(crate) type SyncFn = Arc<
    dyn Fn(Vec<WorkUnit>) -> Pin<Box<dyn Future<Output = GroupSyncReport> + Send>> + Send + Sync,
>;

/// The periodic sync of one flow: every interval, the partitions this node owns.
pub(crate) async fn run<C: ControlPlane>(
    sync: Arc<GroupSync<C>>,
    seed: u64,
    cancel: CancellationToken,
) {
    use rand::{Rng, SeedableRng};
    let interval = sync.flow.consumer_group_sync_interval;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    loop {
        // Jittered over [0.75, 1.25] × interval, so that the nodes' rounds do not line up
        // (their dances on the same group would collide and skip).
        let pause = interval.mul_f64(0.75 + 0.5 * rng.gen::<f64>());
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        let units: Vec<WorkUnit> = sync
            .assignments
            .borrow()
            .iter()
            .filter(|a| !a.release_requested)
            .map(|a| a.unit.clone())
            .collect();
        if units.is_empty() {
            continue;
        }
        let report = tokio::select! {
            () = cancel.cancelled() => return,
            report = sync.sync(units) => report,
        };
        for error in &report.errors {
            tracing::warn!(flow = %sync.flow.name, error = %error, "consumer-group sync failed; retrying next round");
        }
        sync.registry.update(&sync.flow.name, |s| s.add(report));
    }
}

/// Millis since the Unix epoch (when a sync round ended; also the metadata sync's).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl<C: ControlPlane> GroupSync<C> {
    /// Syncs every selected group on `units` (all of this flow), topic by topic, except on the
    /// topics a residency policy keeps from the target (no group is created or stored there).
    pub(crate) async fn sync(&self, mut units: Vec<WorkUnit>) -> GroupSyncReport {
        let mut report = GroupSyncReport {
            flow: self.flow.name.clone(),
            ..GroupSyncReport::default()
        };
        self.residency.retain_allowed(&mut units);
        let mut topics: BTreeMap<(String, String), Vec<WorkUnit>> = BTreeMap::new();
        for unit in units {
            topics
                .entry((unit.stream.clone(), unit.topic.clone()))
                .or_default()
                .push(unit);
        }
        for ((stream, topic), units) in topics {
            if let Err(e) = self.sync_topic(&stream, &topic, &units, &mut report).await {
                report.errors.push(format!("{stream}/{topic}: {e}"));
            }
        }
        report.at_unix_ms = now_ms();
        report
    }

    async fn sync_topic(
        &self,
        stream: &str,
        topic: &str,
        units: &[WorkUnit],
        report: &mut GroupSyncReport,
    ) -> Result<()> {
        let Some(first) = units.first() else {
            return Ok(());
        };
        let slot = first.partition as usize;
        let up = TopicOn {
            cluster: &self.source,
            slot,
            ids: (ident(stream, first)?, ident(topic, first)?),
            writes: None,
        };
        let groups = up.group_names().await?;
        let mut names: Vec<String> = groups
            .into_iter()
            .filter(|name| self.groups.is_match(name))
            .collect();
        names.sort();
        if names.is_empty() {
            return Ok(());
        }
        let target = self.door.connection().ok_or_else(|| Error::WriterRevoked {
            cluster: self.flow.target.clone(),
        })?;
        let down_stream = downstream_stream(self.flow.naming, &self.flow.source, stream);
        let node_check = || self.door.node_check();
        let down = TopicOn {
            cluster: &target,
            slot,
            ids: (ident(&down_stream, first)?, up.ids.1.clone()),
            writes: Some(&node_check),
        };
        let details = down
            .details()
            .await?
            .ok_or_else(|| Error::DownstreamMissing {
                stream: down_stream.clone(),
                topic: topic.to_owned(),
                partition: first.partition,
            })?;
        let downstream: BTreeSet<u32> = details.partitions.iter().map(|p| p.id).collect();
        let mut ctx = TopicCtx {
            up,
            down,
            verified: HashMap::new(),
            newest: HashMap::new(),
            known: HashMap::new(),
            probes: 0,
            search_exhausted: 0,
        };
        for name in names {
            let group = ident(&name, first)?;
            let mut wanted: Vec<GroupOffset> = Vec::new();
            for unit in units {
                if !downstream.contains(&unit.partition) {
                    continue;
                }
                let Some(up) = ctx.up.group_offset(&group, unit.partition).await? else {
                    continue;
                };
                let Some(copy) = self.translate(&mut ctx, unit, up).await? else {
                    continue;
                };
                wanted.push(GroupOffset {
                    stream: stream.to_owned(),
                    topic: topic.to_owned(),
                    partition: unit.partition,
                    group: name.clone(),
                    upstream_offset: up,
                    downstream_offset: copy.down,
                    exact: copy.up == up,
                });
            }
            if wanted.is_empty() {
                continue;
            }
            match self.store(&ctx, &name, &group, &wanted).await? {
                Stored::Done(n) => {
                    report.stored += n;
                    report.offsets.extend(wanted);
                }
                Stored::Skipped(reason) => report.skipped.push(GroupSkip {
                    stream: stream.to_owned(),
                    topic: topic.to_owned(),
                    group: name.clone(),
                    reason,
                }),
            }
        }
        report.probes += ctx.probes;
        if ctx.search_exhausted > 0 {
            report.errors.push(format!(
                "{stream}/{topic}: {} offset translation(s) ran out of their search budget ({SEARCH_POLLS} polls of {SEARCH_PAGE}); their groups may re-read messages on the target",
                ctx.search_exhausted
            ));
        }
        Ok(())
    }

    /// The downstream copy of upstream offset `up` of `unit` (or of the last copy before it);
    /// `None` when nothing at or before it was copied.
    async fn translate(
        &self,
        ctx: &mut TopicCtx<'_>,
        unit: &WorkUnit,
        up: Offset,
    ) -> Result<Option<Copied>> {
        let Some(label) = self.history(unit) else {
            return Ok(None);
        };
        let key = (unit.clone(), label, up);
        let cached = self.found_cache().get(&key).copied();
        let found = match cached {
            // A copy found before is where it was, unless the downstream partition was
            // emptied or recreated since: one poll tells.
            Some(copy) if self.probe_one(ctx, unit, label, copy.down).await? == Some(copy) => {
                Some(copy)
            }
            _ => match self.lookup_verified(ctx, unit, label, up).await? {
                Lookup::Found(copy) => Some(copy),
                Lookup::NotCopied => None,
                Lookup::Unknown => self.search(ctx, unit, label, up).await?,
            },
        };
        if let Some(copy) = found.filter(|c| c.up == up) {
            let mut cache = self.found_cache();
            if cache.len() >= FOUND_CACHE {
                cache.clear();
            }
            cache.insert(key, copy);
        }
        if found.is_some_and(|c| c.up == up) {
            return Ok(found);
        }
        // Not copied: a message that came from the target (loop prevention skipped it) is
        // found there at the offset it carries. That is how a reverse flow translates a
        // group back to the cluster it failed over from.
        if let Some(original) = self.original_in_target(ctx, unit, up).await? {
            return Ok(Some(Copied { down: original, up }));
        }
        Ok(found)
    }

    /// The upstream history being copied for `unit`: the map's, or the confirmed one.
    fn history(&self, unit: &WorkUnit) -> Option<u64> {
        self.maps
            .label(unit)
            .or_else(|| self.control.progress(unit).map(|p| p.history_label))
    }

    /// [`OffsetMaps::lookup`], once the map's newest entry was checked against the downstream
    /// message (once per partition and round).
    async fn lookup_verified(
        &self,
        ctx: &mut TopicCtx<'_>,
        unit: &WorkUnit,
        label: u64,
        up: Offset,
    ) -> Result<Lookup> {
        let trusted = match ctx.verified.get(&unit.partition) {
            Some(trusted) => *trusted,
            None => {
                let trusted = match self.maps.newest(unit) {
                    Some((map_label, newest)) if map_label == label => {
                        let probe = self.probe_one(ctx, unit, label, newest.down).await?;
                        probe == Some(newest)
                    }
                    _ => false,
                };
                ctx.verified.insert(unit.partition, trusted);
                trusted
            }
        };
        Ok(if trusted {
            self.maps.lookup(unit, label, up)
        } else {
            Lookup::Unknown
        })
    }

    /// Searches the downstream partition (see [`Search`]) for the copy of `up`, within a
    /// budget of [`SEARCH_POLLS`] polls; past it, the best copy found so far (earlier, never
    /// later).
    async fn search(
        &self,
        ctx: &mut TopicCtx<'_>,
        unit: &WorkUnit,
        label: u64,
        up: Offset,
    ) -> Result<Option<Copied>> {
        let Some(newest) = self.newest_copy(ctx, unit, label).await? else {
            return Ok(None);
        };
        // Copies earlier searches of this round saw on the partition narrow this one down.
        let known = ctx.known.entry(unit.partition).or_default();
        if let Some(&down) = known.get(&up) {
            return Ok(Some(Copied { down, up }));
        }
        let low = known
            .range(..up)
            .next_back()
            .map(|(&up, &down)| Copied { down, up });
        let high = known
            .range(up + 1..)
            .next()
            .map(|(&up, &down)| Copied { down, up })
            .filter(|h| h.down < newest.down)
            .unwrap_or(newest);
        let mut search = Search::between(up, low, high);
        let mut polls = 0;
        loop {
            let (from, until) = match search.next() {
                Step::Done(found) => return Ok(found),
                Step::Probe { from, until } => (from, until),
            };
            let mut first = None;
            let mut at = from;
            while at < until && first.is_none() {
                if polls == SEARCH_POLLS {
                    ctx.search_exhausted += 1;
                    return Ok(search.best());
                }
                polls += 1;
                ctx.probes += 1;
                let count = u32::try_from((until - at).min(SEARCH_PAGE)).unwrap_or(1);
                let page = ctx.down.poll(unit, at, count).await?;
                let Some(last) = page.last().map(|m| m.offset) else {
                    break;
                };
                let copies: Vec<Copied> = page
                    .iter()
                    .filter(|m| m.offset < until)
                    .filter_map(|m| self.ours(m, label))
                    .collect();
                if let Some(exact) = copies.iter().find(|c| c.up == up) {
                    return Ok(Some(*exact));
                }
                let known = ctx.known.entry(unit.partition).or_default();
                for c in [copies.first(), copies.last()].into_iter().flatten() {
                    known.insert(c.up, c.down);
                }
                first = copies.first().copied();
                at = last + 1;
            }
            search.observe(from, first);
        }
    }

    /// The newest copy in the downstream partition by upstream position, not by place (once
    /// per partition and round): the writer's map's when it checked out, otherwise found as
    /// the writers' resume finds its tail ([`TailScan`]): the highest copy of the newest window
    /// that holds any, read further back while it is below the confirmed offset. A batch that
    /// landed late on top of newer copies is thus never taken for the newest, and a search
    /// never answers a place past copies of later messages.
    async fn newest_copy(
        &self,
        ctx: &mut TopicCtx<'_>,
        unit: &WorkUnit,
        label: u64,
    ) -> Result<Option<Copied>> {
        if let Some(newest) = ctx.newest.get(&unit.partition) {
            return Ok(*newest);
        }
        let mut found = None;
        if ctx.verified.get(&unit.partition) == Some(&true) {
            found = self.maps.newest(unit).map(|(_, newest)| newest);
        }
        if found.is_none() {
            found = self.scan_newest(ctx, unit, label).await?;
        }
        ctx.newest.insert(unit.partition, found);
        Ok(found)
    }

    /// [`TailScan`] over the downstream partition for the highest copy of history `label`.
    async fn scan_newest(
        &self,
        ctx: &mut TopicCtx<'_>,
        unit: &WorkUnit,
        label: u64,
    ) -> Result<Option<Copied>> {
        let history = History::from_label(label);
        let resets = history.resets;
        let reference = confirmed_position(self.control.progress(unit), history.created_at)
            .filter(|p| p.resets == resets);
        let (mut scan, mut poll) = TailScan::start(self.tail_scan_window, reference);
        loop {
            ctx.probes += 1;
            let (strategy, count) = tail_poll(poll);
            let page: Vec<TailEntry> = ctx
                .down
                .poll_with(unit, strategy, count)
                .await?
                .iter()
                .map(|m| TailEntry {
                    offset: m.offset,
                    ours: self.ours(m, label).map(|c| Position {
                        resets,
                        offset: c.up,
                    }),
                })
                .collect();
            match scan.feed(&page) {
                TailStep::Poll(next) => poll = next,
                TailStep::Done(TailOutcome::Hit(hit)) => {
                    return Ok(Some(Copied {
                        down: hit.downstream,
                        up: hit.position.offset,
                    }))
                }
                TailStep::Done(TailOutcome::Absent(end)) => {
                    if end == ScanEnd::Bound {
                        ctx.search_exhausted += 1;
                    }
                    return Ok(None);
                }
            }
        }
    }

    /// Our message exactly at downstream offset `at`, if it is ours.
    async fn probe_one(
        &self,
        ctx: &TopicCtx<'_>,
        unit: &WorkUnit,
        label: u64,
        at: Offset,
    ) -> Result<Option<Copied>> {
        let messages = ctx.down.poll(unit, at, 1).await?;
        Ok(messages
            .first()
            .filter(|m| m.offset == at)
            .and_then(|m| self.ours(m, label)))
    }

    /// A downstream message copied by this flow from history `label`, as a [`Copied`].
    fn ours(&self, m: &Message, label: u64) -> Option<Copied> {
        let found = provenance::find(m.user_headers.as_deref());
        if !found.from_source(&self.flow.source) {
            return None;
        }
        let history = History::from_label(found.history_label?);
        (history == History::from_label(label)).then_some(Copied {
            down: m.offset,
            up: found.offset?,
        })
    }

    /// When the upstream message at `up` was copied from this flow's target (one hop, so its
    /// `repl-offset` is an offset of the target), that offset.
    async fn original_in_target(
        &self,
        ctx: &TopicCtx<'_>,
        unit: &WorkUnit,
        up: Offset,
    ) -> Result<Option<Offset>> {
        let polled = ctx.up.poll(unit, up, 1).await?;
        let target = self.flow.target.as_str();
        Ok(polled.first().filter(|m| m.offset == up).and_then(|m| {
            let found = provenance::find(m.user_headers.as_deref());
            (found.from_source(target) && found.originated_in(target))
                .then_some(found.offset)
                .flatten()
        }))
    }

    /// Stores `wanted` for group `name` on the target (see the module docs).
    async fn store(
        &self,
        ctx: &TopicCtx<'_>,
        name: &str,
        group: &Identifier,
        wanted: &[GroupOffset],
    ) -> Result<Stored> {
        let down = &ctx.down;
        let _dance = self.dance.lock().await;
        match down.group(group).await? {
            Some(g) if g.members_count > 0 => {
                return Ok(Stored::Skipped(format!(
                    "{} active member(s) on the target",
                    g.members_count
                )))
            }
            Some(_) => {}
            None => match down.create_group(name).await {
                Ok(()) => tracing::info!(group = name, "created consumer group on the target"),
                // Created meanwhile by someone else: fine.
                Err(Error::Iggy { ref source, .. })
                    if source.kind() == replicator_sdk::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            },
        }
        // A look first, without joining: nothing to move forward, no dance. (What is stored
        // is decided again as the group's only member.)
        let mut behind = false;
        for w in wanted {
            let current = down.group_offset(group, w.partition).await?;
            if current.is_none_or(|c| c < w.downstream_offset) {
                behind = true;
                break;
            }
        }
        if !behind {
            return Ok(Stored::Done(0));
        }
        down.join(group).await?;
        let outcome = Self::store_as_member(down, group, wanted).await;
        let left = down.leave(group).await;
        let stored = outcome?;
        left?;
        Ok(stored)
    }

    /// Stores what in `wanted` is ahead of the target, as the group's only member. Forward
    /// only: the target's offsets are read while the sync is the only member, so that what
    /// it compares with is what it overwrites (a sync of another node, or a consumer, that
    /// joined meanwhile makes this one skip the group instead).
    async fn store_as_member(
        down: &TopicOn<'_>,
        group: &Identifier,
        wanted: &[GroupOffset],
    ) -> Result<Stored> {
        let members = down.group(group).await?.map_or(0, |g| g.members_count);
        if members != 1 {
            // A consumer joined meanwhile (or another node syncs it right now): leave it be.
            return Ok(Stored::Skipped(format!(
                "{members} members on the target while syncing"
            )));
        }
        let mut stored = 0;
        for w in wanted {
            let current = down.group_offset(group, w.partition).await?;
            if current.is_none_or(|c| c < w.downstream_offset) {
                down.store_offset(group, w.partition, w.downstream_offset)
                    .await?;
                stored += 1;
            }
        }
        Ok(Stored::Done(stored))
    }

    fn found_cache(&self) -> std::sync::MutexGuard<'_, HashMap<(WorkUnit, u64, Offset), Copied>> {
        self.found
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One topic on one cluster, through one connection slot (group membership belongs to a
/// connection, so a sync dance keeps to one slot): the Iggy calls the sync makes.
struct TopicOn<'a> {
    cluster: &'a Cluster,
    slot: usize,
    /// Stream and topic.
    ids: (Identifier, Identifier),
    /// The check of the door to the target each write there passes right before it goes out
    /// (`datapath::target`); `None` upstream, where the sync only reads.
    writes: Option<&'a (dyn Fn() -> Result<(), SendVeto> + Sync)>,
}

impl TopicOn<'_> {
    /// Runs the write `op` on the topic's connection, through the door's check when it has
    /// one.
    async fn write<T, F, Fut>(&self, op: &str, f: F) -> Result<T>
    where
        F: FnOnce(Arc<replicator_sdk::Client>) -> Fut,
        Fut: Future<Output = replicator_sdk::Result<T>>,
    {
        let check = || self.writes.map_or(Ok(()), |check| check());
        write_checked(self.cluster, self.slot, op, check, f).await
    }

    async fn details(&self) -> Result<Option<replicator_sdk::types::TopicDetails>> {
        let (s, t) = self.ids.clone();
        self.cluster
            .call(self.slot, "get_topic", |c| async move {
                c.get_topic(&s, &t).await
            })
            .await
    }

    /// Names of the topic's consumer groups.
    async fn group_names(&self) -> Result<Vec<String>> {
        let (s, t) = self.ids.clone();
        let groups = self
            .cluster
            .call(self.slot, "get_consumer_groups", |c| async move {
                c.get_consumer_groups(&s, &t).await
            })
            .await?;
        Ok(groups.into_iter().map(|g| g.name).collect())
    }

    async fn group(
        &self,
        group: &Identifier,
    ) -> Result<Option<replicator_sdk::types::ConsumerGroupDetails>> {
        let ((s, t), g) = (self.ids.clone(), group.clone());
        self.cluster
            .call(self.slot, "get_consumer_group", |c| async move {
                c.get_consumer_group(&s, &t, &g).await
            })
            .await
    }

    async fn create_group(&self, name: &str) -> Result<()> {
        let ((s, t), name) = (self.ids.clone(), name.to_owned());
        self.write("create_consumer_group", |c| async move {
            c.create_consumer_group(&s, &t, &name).await.map(|_| ())
        })
        .await
    }

    async fn join(&self, group: &Identifier) -> Result<()> {
        let ((s, t), g) = (self.ids.clone(), group.clone());
        self.write("join_consumer_group", |c| async move {
            c.join_consumer_group(&s, &t, &g).await
        })
        .await
    }

    async fn leave(&self, group: &Identifier) -> Result<()> {
        let ((s, t), g) = (self.ids.clone(), group.clone());
        self.write("leave_consumer_group", |c| async move {
            c.leave_consumer_group(&s, &t, &g).await
        })
        .await
    }

    /// The offset `group` stored on `partition` (reading needs no membership).
    async fn group_offset(&self, group: &Identifier, partition: u32) -> Result<Option<Offset>> {
        let ((s, t), consumer) = (self.ids.clone(), Consumer::group(group.clone()));
        let info = self
            .cluster
            .call(self.slot, "get_consumer_offset", |c| async move {
                c.get_consumer_offset(&consumer, &s, &t, Some(partition))
                    .await
            })
            .await?;
        Ok(info.map(|i| i.stored_offset))
    }

    /// Stores `offset` for `group` on `partition` (as a member the partition is assigned to).
    async fn store_offset(&self, group: &Identifier, partition: u32, offset: Offset) -> Result<()> {
        let ((s, t), consumer) = (self.ids.clone(), Consumer::group(group.clone()));
        self.write("store_consumer_offset", |c| async move {
            c.store_consumer_offset(&consumer, &s, &t, Some(partition), offset)
                .await
        })
        .await
    }

    /// Up to `count` messages of `unit`'s partition from offset `at`.
    async fn poll(&self, unit: &WorkUnit, at: Offset, count: u32) -> Result<Vec<Message>> {
        self.poll_with(unit, PollingStrategy::offset(at), count)
            .await
    }

    /// Up to `count` messages of `unit`'s partition, from where `strategy` says.
    async fn poll_with(
        &self,
        unit: &WorkUnit,
        strategy: PollingStrategy,
        count: u32,
    ) -> Result<Vec<Message>> {
        let (s, t) = self.ids.clone();
        let consumer = Consumer::new(ident("iggy-replicator.groups", unit)?);
        let partition = unit.partition;
        let polled = self
            .cluster
            .call(self.slot, "poll_messages (group sync)", |c| async move {
                c.poll_messages(&s, &t, Some(partition), &consumer, &strategy, count, false)
                    .await
            })
            .await?;
        Ok(polled.messages)
    }
}

/// What a sync of one topic keeps between calls.
struct TopicCtx<'a> {
    /// The upstream topic.
    up: TopicOn<'a>,
    /// The downstream topic, through the writers' connections.
    down: TopicOn<'a>,
    /// Per partition: whether the writer's map checked out this round.
    verified: HashMap<u32, bool>,
    /// Per partition: the newest copy downstream, once looked up this round.
    newest: HashMap<u32, Option<Copied>>,
    /// Per partition: copies the searches of this round saw, upstream offset → downstream.
    known: HashMap<u32, BTreeMap<Offset, Offset>>,
    /// Polls of searches.
    probes: u64,
    /// Searches that ran out of their budget (answered with an earlier copy, or none).
    search_exhausted: u64,
}

/// What storing one group's offsets came to.
enum Stored {
    /// This many offsets written.
    Done(u64),
    /// Left alone, and why.
    Skipped(String),
}

fn ident(name: &str, unit: &WorkUnit) -> Result<Identifier> {
    crate::datapath::unit::named(name, unit)
}
