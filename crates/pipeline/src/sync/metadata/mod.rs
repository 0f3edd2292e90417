//! Metadata sync: what applications need on the target besides their messages and group
//! offsets. Per flow, every `flows[].metadata_sync_interval`:
//! - **topic settings** ([`settings`]): message expiry, maximum size and compression of every
//!   topic the flow copies follow upstream, except those `flows[].keep_target_settings` keeps;
//! - **users** ([`users`]): the upstream users `flows[].users` selects exist on the target with
//!   their permissions translated to the target's streams and topics, inactive until
//!   `flow promote --activate-users` activates them with the passwords the operator gives.
//!   Passwords are never read, logged or stored: the target's copy is created with a random
//!   one that is dropped at once.
//!
//! One node per flow runs the rounds: the node that owns the flow's first unit (the smallest
//! of the set discovery last found). Ownership moves on failover, so the rounds move with it;
//! a paused flow has no owner and no rounds, so nothing reverts what applications change on a
//! promoted target. `flow promote` runs one last round from the node it is asked on
//! ([`MetadataSync::round`], [`MetadataSync::activate`]).
//!
//! Every call goes through the flow's admin connections (the configured credentials, which
//! need `manage_users` on the target for user sync and `manage_topics`/`manage_streams` for
//! settings), never a writer identity. The replicator's own users (the root, the users the
//! connections log in as, and writer identities) are never synced.

pub(crate) mod catalog;
pub(crate) mod pair;
pub(crate) mod settings;
pub(crate) mod users;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use globset::GlobSet;
use rand::distributions::{Alphanumeric, DistString};
use replicator_model::{ClusterPair, MetadataChange, MetadataObject, MetadataRecord, TopicSetting};
use replicator_sdk::types::UserInfo;
use replicator_sdk::types::{Identifier, UserStatus};
use replicator_sdk::IggyCluster as _;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use self::catalog::{iggy_error, Catalog, CatalogTopic, Route};
use self::pair::{SettingConflict, UserHome};
use self::settings::{SettingDifference, TopicSettings};
use self::users::{Activation, ActivationOutcome, UserAction, UserCopy, UserSyncState};
use crate::clients::Cluster;
use crate::control::{ControlError, ControlPlane};
use crate::discovery::FirstUnit;
use crate::error::{Error, Result};
use crate::params::{FlowParams, PipelineParams};
use crate::selection::mapping::Selector;
// `pub`: `pipeline.rs` compiles the user globs through this path.
pub(crate) use crate::selection::pairing::user_selector;
use crate::selection::pairing::{PairView, Pairing, Side};

/// The root user's id on every Iggy server: never synced.
const ROOT_USER_ID: u32 = 0;

/// Failed reads of the source in a row after which `flow promote --activate-users` takes the
/// source for lost and activates users from the target's copies (documented in README,
/// "Disaster recovery").
const SOURCE_LOST_AFTER: u32 = 3;

/// The pause between two of those reads.
const SOURCE_READ_PAUSE: Duration = Duration::from_secs(1);

/// How often a node that does not run a flow's rounds looks whether it now does.
const RUNNER_CHECK: Duration = Duration::from_secs(1);

/// What one round of a flow's metadata sync did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataSyncReport {
    /// The flow.
    pub flow: String,
    /// When the round ended, Unix milliseconds.
    pub at_unix_ms: u64,
    /// The users the flow syncs, by name.
    pub users: Vec<UserReport>,
    /// The topics the flow copies, as their settings are on the target after the round.
    pub topics: Vec<TopicSettingsReport>,
    /// Failures (each retried next round), e.g. "user app-1: create: timed out".
    pub errors: Vec<String>,
}

/// One user in a [`MetadataSyncReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserReport {
    /// The user name (the same on both clusters).
    pub name: String,
    /// Where it stands.
    pub state: UserSyncState,
    /// Permissions the target has no place for (not copied streams or topics).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_translated: Vec<String>,
    /// In a two-way pair: the alias of the cluster where the user is authored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<String>,
    /// Why the user is left alone (a conflict), or what else an operator should know.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// One topic in a [`MetadataSyncReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicSettingsReport {
    /// The downstream stream.
    pub stream: String,
    /// The topic.
    pub topic: String,
    /// The settings on the target after the round, e.g. `{"message_expiry": "1h"}`.
    pub settings: BTreeMap<String, String>,
    /// Settings this round changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<TopicSetting>,
    /// Differences left: settings the flow keeps, more partitions on the target, or an update
    /// that failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub differences: Vec<SettingDifference>,
    /// In a two-way pair: the alias of the cluster where the topic is authored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<String>,
    /// In a two-way pair: settings an operator changed on the target since the pair last
    /// agreed, which the reverse flow carries to this flow's source.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed_on_target: Vec<TopicSetting>,
    /// In a two-way pair: settings changed on both sides to different values since the pair
    /// last agreed, and which side's value wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<SettingConflict>,
}

/// One user's activation by `flow promote --activate-users`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserActivation {
    /// The user name.
    pub name: String,
    /// What was done.
    pub outcome: ActivationOutcome,
}

/// One flow's metadata sync state on this node.
#[derive(Debug, Clone, Default)]
pub struct MetadataSyncState {
    /// The latest round this node ran.
    pub last: MetadataSyncReport,
    /// Rounds since start.
    pub runs: u64,
    /// Rounds with at least one error.
    pub failed_runs: u64,
    /// Users created, changed or deleted on the target since start.
    pub users_changed: u64,
    /// Topic updates applied on the target since start.
    pub settings_applied: u64,
    /// Conflicts of a two-way pair this node resolved since start: a setting changed on both
    /// sides (the home's value applied), counted by the flow that applied it.
    pub conflicts_resolved: u64,
}

impl MetadataSyncState {
    /// Users of the latest round the target does not match and the sync cannot fix without
    /// an operator: conflicts, failures, and users gone upstream but kept on the target.
    /// (Permissions with no place on the target are shown in status, not counted: a user may
    /// well have rights on streams the flow does not copy.)
    pub fn user_drift(&self) -> u64 {
        self.last
            .users
            .iter()
            .filter(|u| {
                matches!(
                    u.state,
                    UserSyncState::Conflict
                        | UserSyncState::Failed
                        | UserSyncState::RemovedUpstream
                )
            })
            .count() as u64
    }

    /// Topics of the latest round whose settings on the target differ from upstream other than
    /// on purpose: extra partitions, failed updates, conflicts of a two-way pair (kept
    /// settings, and changes on their way through the reverse flow, are not counted).
    pub fn settings_drift(&self) -> u64 {
        self.last
            .topics
            .iter()
            .filter(|t| t.differences.iter().any(|d| !d.kept) || !t.conflicts.is_empty())
            .count() as u64
    }
}

/// The latest round of every flow this node ran, and totals since start.
pub(crate) type MetadataSyncRegistry = crate::stats::FlowStates<MetadataSyncState>;

impl MetadataSyncState {
    /// Counts `report` in, and keeps it as the latest round.
    pub(crate) fn add(&mut self, report: MetadataSyncReport) {
        self.runs += 1;
        self.failed_runs += u64::from(!report.errors.is_empty());
        self.users_changed += report
            .users
            .iter()
            .filter(|u| {
                matches!(
                    u.state,
                    UserSyncState::Created | UserSyncState::Updated | UserSyncState::Deleted
                )
            })
            .count() as u64;
        self.settings_applied += report
            .topics
            .iter()
            .filter(|t| !t.changed.is_empty())
            .count() as u64;
        self.conflicts_resolved += report
            .topics
            .iter()
            .flat_map(|t| &t.conflicts)
            .filter(|c| c.applied_here)
            .count() as u64;
        self.last = report;
    }
}

/// What one flow's metadata sync needs.
pub(crate) struct MetadataSync {
    pub(crate) flow: Arc<FlowParams>,
    /// This flow's placement of topics.
    pub(crate) route: Route,
    /// Every flow from the same source to the same target (this one included): a user's
    /// permissions are translated through all of them, so that flows sharing a user agree.
    pub(crate) siblings: Vec<Route>,
    /// The flow's user globs.
    pub(crate) users: GlobSet,
    /// User globs of flows to the same target from another source: a name both select is a
    /// conflict, left alone.
    pub(crate) rivals: Vec<GlobSet>,
    /// Name prefixes of writer identities (never synced).
    pub(crate) writer_prefixes: Vec<String>,
    pub(crate) source: Arc<Cluster>,
    pub(crate) target: Arc<Cluster>,
    pub(crate) registry: MetadataSyncRegistry,
    /// The flow's two-way pair, when flows copy back from its target to its source.
    pub(crate) pair: Option<Arc<Pairing>>,
    /// Where the pair's records are kept (the control plane).
    pub(crate) records: Arc<dyn Records>,
}

/// The control plane's records of two-way pairs, as the metadata sync and discovery use them
/// (an object-safe view of [`ControlPlane::metadata_records`] and
/// [`ControlPlane::record_metadata`]).
pub(crate) trait Records: Send + Sync {
    /// See [`ControlPlane::metadata_records`].
    fn records(&self, pair: &ClusterPair) -> Option<BTreeMap<MetadataObject, MetadataRecord>>;
    /// See [`ControlPlane::record_metadata`].
    fn record(
        &self,
        changes: Vec<MetadataChange>,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = std::result::Result<Vec<bool>, ControlError>> + Send>,
    >;
}

impl<C: ControlPlane> Records for C {
    fn records(&self, pair: &ClusterPair) -> Option<BTreeMap<MetadataObject, MetadataRecord>> {
        self.metadata_records(pair)
    }

    fn record(
        &self,
        changes: Vec<MetadataChange>,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = std::result::Result<Vec<bool>, ControlError>> + Send>,
    > {
        let control = self.clone();
        Box::pin(async move { control.record_metadata(changes).await })
    }
}

impl MetadataSync {
    /// The sync of `flow`, with the routes and user globs of the other flows that share its
    /// target.
    pub(crate) fn new(
        flow: &Arc<FlowParams>,
        flows: &BTreeMap<String, Arc<FlowParams>>,
        selectors: &BTreeMap<String, Selector>,
        params: &PipelineParams,
        (source, target): (Arc<Cluster>, Arc<Cluster>),
        registry: MetadataSyncRegistry,
        records: Arc<dyn Records>,
    ) -> Result<Self> {
        let route_of = |f: &FlowParams| Route {
            selector: selectors.get(&f.name).cloned().unwrap_or_else(|| {
                Selector::new(&[], &[]).unwrap_or_else(|_| unreachable!("no globs"))
            }),
            naming: f.naming,
            source: f.source.clone(),
        };
        let invalid = |(field, reason): (String, String)| Error::InvalidParams {
            field: format!("flows[{}].{field}", flow.name),
            reason,
        };
        let mut rivals = Vec::new();
        for other in flows.values() {
            if other.target == flow.target && other.source != flow.source && !other.users.is_empty()
            {
                rivals.push(user_selector(&other.users).map_err(invalid)?);
            }
        }
        Ok(Self {
            flow: flow.clone(),
            route: route_of(flow),
            siblings: flows
                .values()
                .filter(|f| f.source == flow.source && f.target == flow.target)
                .map(|f| route_of(f))
                .collect(),
            users: user_selector(&flow.users).map_err(invalid)?,
            rivals,
            writer_prefixes: params
                .clusters
                .values()
                .filter_map(|c| c.writer_user_prefix.clone())
                .collect(),
            source,
            target,
            registry,
            pair: Pairing::of(flow, flows, selectors)
                .map_err(invalid)?
                .map(Arc::new),
            records,
        })
    }
}

/// Runs `sync`'s rounds while this node runs them (see the module docs), until `cancel`.
pub(crate) async fn run<C: ControlPlane>(
    sync: Arc<MetadataSync>,
    control: C,
    assignments: tokio::sync::watch::Receiver<Arc<Vec<replicator_model::Assignment>>>,
    first_unit: FirstUnit,
    cancel: CancellationToken,
) {
    let span = tracing::info_span!("metadata_sync", flow = %sync.flow.name);
    async move {
        let mut was_runner = false;
        loop {
            let runner = crate::discovery::runs_flow_metadata(&first_unit, &assignments, &control);
            if runner != was_runner {
                tracing::info!(
                    runner,
                    "metadata sync of the flow {}",
                    if runner {
                        "runs here"
                    } else {
                        "runs elsewhere"
                    }
                );
                was_runner = runner;
            }
            let pause = if runner {
                let report = sync.round().await;
                for error in &report.errors {
                    tracing::warn!(%error, "metadata sync");
                }
                sync.registry.update(&sync.flow.name, |s| s.add(report));
                sync.flow.metadata_sync_interval
            } else {
                RUNNER_CHECK.min(sync.flow.metadata_sync_interval)
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
    .instrument(span)
    .await;
}

/// A flow's pair and its records as one round read them (`None`: the control plane cannot
/// keep them yet).
type PairRecords<'a> = (
    &'a Pairing,
    Option<BTreeMap<MetadataObject, MetadataRecord>>,
);

/// Why a pair's objects are left alone while the control plane keeps no records.
const NO_RECORDS: &str = "two-way pair: left alone until the control plane keeps the pair's \
     metadata records (every member running a release with feature level 3; see README, \
     Upgrading)";

/// The side whose topic was created first (the home when none is recorded); on a tie the
/// pair's first alias, so that both flows of the pair decide alike.
fn older_side(view: &PairView, source_created: u64, target_created: u64) -> Side {
    match source_created.cmp(&target_created) {
        std::cmp::Ordering::Less => Side::Source,
        std::cmp::Ordering::Greater => Side::Target,
        std::cmp::Ordering::Equal if view.pair.first == view.source => Side::Source,
        std::cmp::Ordering::Equal => Side::Target,
    }
}

/// An error with its causes, for reports.
fn describe(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The users one side has, with permissions, by name (protected users left out).
type Users = BTreeMap<String, UserCopy>;

/// One cluster's users, listed once per round.
struct Listing {
    users: Vec<UserInfo>,
    /// The root's name and the name of the user the connection logs in as: never synced.
    own: BTreeSet<String>,
}

impl MetadataSync {
    /// One round: topic settings, then users. Never fails: what went wrong is in the report.
    pub(crate) async fn round(&self) -> MetadataSyncReport {
        let mut report = MetadataSyncReport {
            flow: self.flow.name.clone(),
            ..MetadataSyncReport::default()
        };
        // Read once per round: a record written by this round's changes is read next round.
        let pair = self
            .pair
            .as_deref()
            .map(|p| (p, self.records.records(&p.view.pair)));
        match (
            Catalog::read(&self.source).await,
            Catalog::read(&self.target).await,
        ) {
            (Ok(up), Ok(down)) => {
                self.sync_settings(&up, &down, pair.as_ref(), &mut report)
                    .await;
                if !self.flow.users.is_empty() {
                    if let Err(e) = self
                        .sync_users(&up, &down, pair.as_ref(), &mut report)
                        .await
                    {
                        report.errors.push(format!("users: {}", describe(&e)));
                    }
                }
            }
            (Err(e), _) | (_, Err(e)) => report.errors.push(describe(&e)),
        }
        report.at_unix_ms = crate::sync::groups::now_ms();
        report
    }

    async fn sync_settings(
        &self,
        up: &Catalog,
        down: &Catalog,
        pair: Option<&PairRecords<'_>>,
        report: &mut MetadataSyncReport,
    ) {
        let mut changes = Vec::new();
        for stream in up.streams.values() {
            let down_stream = self.route.downstream(&stream.name);
            for topic in stream.topics.values() {
                if !self.route.selector.matches(&stream.name, &topic.name) {
                    continue;
                }
                // Not mirrored yet: discovery creates it with upstream's settings.
                let Some((sid, tid, there)) = down.topic(&down_stream, &topic.name) else {
                    continue;
                };
                let (Some(wanted), Some(has)) = (topic.settings, there.settings) else {
                    continue;
                };
                let mut entry = TopicSettingsReport {
                    stream: down_stream.clone(),
                    topic: topic.name.clone(),
                    settings: BTreeMap::new(),
                    changed: Vec::new(),
                    differences: Vec::new(),
                    home: None,
                    changed_on_target: Vec::new(),
                    conflicts: Vec::new(),
                };
                let paired = pair.filter(|(p, _)| p.pairs_topic(&stream.name, &topic.name));
                // What to send, the settings it changes, and (in a pair) the record to keep
                // once it landed.
                let (update, changed, pair_plan) = match paired {
                    None => {
                        let plan = settings::plan(&wanted, &has, &self.flow.keep_target_settings);
                        entry.differences = plan.kept;
                        (plan.update, plan.changed, None)
                    }
                    Some((_, None)) => {
                        report.errors.push(format!(
                            "topic {down_stream}/{}: {}",
                            topic.name, NO_RECORDS
                        ));
                        (None, Vec::new(), None)
                    }
                    Some((pairing, Some(records))) => {
                        let object = MetadataObject::Topic {
                            stream: stream.name.clone(),
                            topic: topic.name.clone(),
                        };
                        let record = records.get(&object);
                        let older = older_side(&pairing.view, topic.created_at, there.created_at);
                        let keep = pairing.kept(
                            &self.flow.keep_target_settings,
                            &stream.name,
                            &topic.name,
                        );
                        let plan =
                            pair::plan_settings(&pairing.view, &wanted, &has, record, older, &keep);
                        entry.differences = plan.kept.clone();
                        entry.home = Some(plan.record.home.clone());
                        entry.changed_on_target = plan.left_to_reverse.clone();
                        entry.conflicts = plan.conflicts.clone();
                        for conflict in &plan.conflicts {
                            tracing::warn!(
                                stream = %down_stream, topic = %topic.name,
                                setting = %conflict.setting, source = %conflict.source,
                                target = %conflict.target, winner = %conflict.winner,
                                "topic setting changed on both clusters of a two-way pair: \
                                 the home's value wins"
                            );
                        }
                        let (update, changed) = (plan.update, plan.changed.clone());
                        (
                            update,
                            changed,
                            Some((pairing, object, record.cloned(), plan)),
                        )
                    }
                };
                let mut now = has;
                let mut refused = Vec::new();
                if let Some(update) = update {
                    match self
                        .update_topic(sid, tid, &topic.name, there, update)
                        .await
                    {
                        Ok(()) => {
                            now = update;
                            entry.changed = changed.clone();
                        }
                        // One setting the target refuses (a 0.9 server refuses a size cap
                        // below the topic's segment size) must not hold back the others:
                        // each is tried on its own.
                        Err(_) if changed.len() > 1 => {
                            for &setting in &changed {
                                let one = now.with(setting, &wanted);
                                match self.update_topic(sid, tid, &topic.name, there, one).await {
                                    Ok(()) => {
                                        now = one;
                                        entry.changed.push(setting);
                                    }
                                    Err(e) => refused.push((setting, e)),
                                }
                            }
                        }
                        Err(e) => refused.extend(changed.first().map(|&s| (s, e))),
                    }
                    for (setting, e) in &refused {
                        report.errors.push(format!(
                            "topic {down_stream}/{}: update of {setting}: {}",
                            topic.name,
                            describe(e)
                        ));
                        entry.differences.push(SettingDifference {
                            setting: setting.as_str().to_owned(),
                            upstream: wanted.render(*setting),
                            target: has.render(*setting),
                            kept: false,
                        });
                    }
                    if !entry.changed.is_empty() {
                        tracing::info!(stream = %down_stream, topic = %topic.name, changed = ?entry.changed, "topic settings applied on the target");
                    }
                }
                if let Some((pairing, object, before, plan)) = pair_plan {
                    let refused: Vec<TopicSetting> = refused.iter().map(|(s, _)| *s).collect();
                    let after = plan.record_after(&refused, before.as_ref());
                    if before.as_ref() != Some(&after) {
                        changes.push(MetadataChange {
                            key: pairing.key(object),
                            expected: before,
                            record: Some(after),
                        });
                    }
                }
                if there.partitions > topic.partitions {
                    entry.differences.push(SettingDifference {
                        setting: "partitions".into(),
                        upstream: topic.partitions.to_string(),
                        target: there.partitions.to_string(),
                        kept: false,
                    });
                }
                entry.settings = replicator_model::TopicSetting::ALL
                    .iter()
                    .map(|&s| (s.as_str().to_owned(), now.render(s)))
                    .collect();
                report.topics.push(entry);
            }
        }
        self.record(changes, report).await;
    }

    /// Writes `changes` to the pair's records; what was not applied (another round decided
    /// from the same record first) is decided again next round.
    async fn record(&self, changes: Vec<MetadataChange>, report: &mut MetadataSyncReport) {
        if changes.is_empty() {
            return;
        }
        let count = changes.len();
        match self.records.record(changes).await {
            Ok(applied) => {
                let stale = applied.iter().filter(|a| !**a).count();
                if stale > 0 {
                    tracing::debug!(
                        stale,
                        count,
                        "two-way pair records changed since this round read them"
                    );
                }
            }
            Err(e) => report
                .errors
                .push(format!("two-way pair records: {}", e.reason)),
        }
    }
    async fn update_topic(
        &self,
        sid: u32,
        tid: u32,
        name: &str,
        there: &CatalogTopic,
        to: TopicSettings,
    ) -> Result<()> {
        let ids = (Identifier::numeric(sid), Identifier::numeric(tid));
        let (Ok(s), Ok(t)) = ids else {
            return Ok(());
        };
        let (name, factor) = (name.to_owned(), there.replication_factor);
        self.target
            .call(0, "update_topic", |c| async move {
                c.update_topic(
                    &s,
                    &t,
                    &name,
                    to.compression,
                    Some(factor),
                    to.message_expiry,
                    to.max_topic_size,
                )
                .await
            })
            .await
    }

    /// Whether the flow syncs the user `name` (its globs select it and it is not one of the
    /// replicator's own).
    fn selects(&self, name: &str, protected: &BTreeSet<String>) -> bool {
        self.users.is_match(name)
            && !protected.contains(name)
            && !self
                .writer_prefixes
                .iter()
                .any(|p| replicator_model::is_writer_username(p, name))
    }

    /// Every user of `cluster` (one listing serves both the replicator's own names and the
    /// users the flow selects).
    async fn list(cluster: &Cluster) -> Result<Listing> {
        let me = cluster
            .call(0, "get_me", |c| async move { c.get_me().await })
            .await?;
        let users = cluster
            .call(0, "get_users", |c| async move { c.get_users().await })
            .await?;
        let own_id = me.user_id.unwrap_or(ROOT_USER_ID);
        let own = users
            .iter()
            .filter(|u| u.id == own_id || u.id == ROOT_USER_ID)
            .map(|u| u.username.clone())
            .collect();
        Ok(Listing { users, own })
    }

    /// The users of `cluster` (listed in `listed`) the flow selects, with their permissions.
    /// With `translate_to` (the source's and target's catalogs and the target's users),
    /// upstream's are translated to the target, keeping the rights the target's copies hold
    /// on streams the sync does not manage ([`users::keeping_target_rights`]).
    async fn users_of(
        &self,
        cluster: &Cluster,
        listed: &[UserInfo],
        protected: &BTreeSet<String>,
        translate_to: Option<(&Catalog, &Catalog, &Users)>,
        not_translated: &mut BTreeMap<String, Vec<String>>,
    ) -> Result<Users> {
        let managed = translate_to
            .map(|(up, down, _)| users::managed_streams(up, down, &self.siblings))
            .unwrap_or_default();
        let mut users = Users::new();
        for user in listed
            .iter()
            .filter(|u| self.selects(&u.username, protected))
        {
            let id = Identifier::numeric(user.id).map_err(|e| iggy_error(cluster, "id", e))?;
            let details = cluster
                .call(0, "get_user", |c| async move { c.get_user(&id).await })
                .await?;
            let Some(details) = details else { continue };
            let permissions = match translate_to {
                Some((up, down, target)) => {
                    let t =
                        users::translate(details.permissions.as_ref(), up, down, &self.siblings);
                    not_translated.insert(user.username.clone(), t.not_translated);
                    let there = target
                        .get(&user.username)
                        .and_then(|u| u.permissions.as_ref());
                    users::keeping_target_rights(t.permissions, there, &managed)
                }
                None => details.permissions,
            };
            users.insert(
                user.username.clone(),
                UserCopy {
                    id: details.id,
                    created_at: details.created_at.as_micros(),
                    status: details.status,
                    permissions,
                },
            );
        }
        Ok(users)
    }

    async fn sync_users(
        &self,
        up: &Catalog,
        down: &Catalog,
        pair: Option<&PairRecords<'_>>,
        report: &mut MetadataSyncReport,
    ) -> Result<()> {
        let (up_listing, down_listing) = (
            Self::list(&self.source).await?,
            Self::list(&self.target).await?,
        );
        let protected: BTreeSet<String> =
            up_listing.own.union(&down_listing.own).cloned().collect();
        let mut not_translated = BTreeMap::new();
        let target = self
            .users_of(
                &self.target,
                &down_listing.users,
                &protected,
                None,
                &mut BTreeMap::new(),
            )
            .await?;
        let upstream = self
            .users_of(
                &self.source,
                &up_listing.users,
                &protected,
                Some((up, down, &target)),
                &mut not_translated,
            )
            .await?;
        let names: BTreeSet<&String> = upstream.keys().chain(target.keys()).collect();
        let homes = match pair {
            Some((pairing, Some(records))) => {
                self.user_homes(pairing, records, &names, (&upstream, &target), report)
                    .await
            }
            _ => BTreeMap::new(),
        };
        for name in names {
            let mut entry = UserReport {
                name: name.clone(),
                state: UserSyncState::InSync,
                not_translated: not_translated.remove(name).unwrap_or_default(),
                home: None,
                note: None,
            };
            if self.rivals.iter().any(|g| g.is_match(name.as_str())) {
                entry.state = UserSyncState::Conflict;
                report.users.push(entry);
                continue;
            }
            if let Some((pairing, records)) = pair.filter(|(p, _)| p.pairs_user(name)) {
                let view = &pairing.view;
                match (records, homes.get(name)) {
                    (None, _) => {
                        report.errors.push(format!("user {name}: {NO_RECORDS}"));
                        entry.state = UserSyncState::Failed;
                    }
                    (_, Some(UserHome::Recorded(side) | UserHome::Found(side))) => {
                        entry.home = Some(view.alias(*side).to_owned());
                        if *side == Side::Target {
                            // Authored on the target: the reverse flow syncs it from there.
                            entry.state = UserSyncState::HomeOnTarget;
                        }
                    }
                    (_, Some(UserHome::Undecided(why))) => {
                        entry.state = UserSyncState::Conflict;
                        entry.note = Some(why.clone());
                    }
                    (_, Some(UserHome::Gone) | None) => {
                        entry.state = UserSyncState::Failed;
                        entry.note = Some("its home is not decided yet".into());
                    }
                }
                if entry.home.as_deref() != Some(view.source.as_str()) {
                    report.users.push(entry);
                    continue;
                }
            }
            let (actions, state) = users::plan(
                upstream.get(name),
                target.get(name),
                self.flow.delete_users_removed_upstream,
            );
            entry.state = state;
            for action in actions {
                if let Err(e) = self.apply(name, target.get(name), action).await {
                    report.errors.push(format!("user {name}: {}", describe(&e)));
                    entry.state = UserSyncState::Failed;
                    break;
                }
            }
            if matches!(
                entry.state,
                UserSyncState::Created | UserSyncState::Updated | UserSyncState::Deleted
            ) {
                tracing::info!(user = %name, state = ?entry.state, "user synced to the target");
            }
            report.users.push(entry);
        }
        Ok(())
    }

    /// Where each user `names` holds that both flows of the pair sync is at home. Homes not
    /// recorded yet are recorded first (a compare-and-set: if the other flow recorded one at
    /// the same time, this round leaves the user for the next); records of users gone from
    /// both sides are dropped.
    async fn user_homes<'n>(
        &self,
        pairing: &Pairing,
        records: &BTreeMap<MetadataObject, MetadataRecord>,
        names: &BTreeSet<&'n String>,
        (upstream, target): (&Users, &Users),
        report: &mut MetadataSyncReport,
    ) -> BTreeMap<&'n String, UserHome> {
        let mut homes = BTreeMap::new();
        let (mut changes, mut found) = (Vec::new(), Vec::new());
        for &name in names.iter().filter(|n| pairing.pairs_user(n)) {
            let object = MetadataObject::User(name.clone());
            let record = records.get(&object);
            let home = pair::user_home(&pairing.view, record, upstream.get(name), target.get(name));
            if let UserHome::Found(side) = home {
                changes.push(MetadataChange {
                    key: pairing.key(object),
                    expected: None,
                    record: Some(pairing.view.home_at(side)),
                });
                found.push(name);
            }
            homes.insert(name, home);
        }
        for (object, record) in records {
            if let MetadataObject::User(name) = object {
                if !names.contains(name) && pairing.pairs_user(name) {
                    changes.push(MetadataChange {
                        key: pairing.key(object.clone()),
                        expected: Some(record.clone()),
                        record: None,
                    });
                }
            }
        }
        if changes.is_empty() {
            return homes;
        }
        let undecided = |why: String| UserHome::Undecided(why);
        match self.records.record(changes).await {
            Ok(applied) => {
                for (name, applied) in found.into_iter().zip(applied) {
                    if !applied {
                        homes.insert(
                            name,
                            undecided("its home was recorded by the other flow of the pair at the same time: decided again next round".into()),
                        );
                    }
                }
            }
            Err(e) => {
                report
                    .errors
                    .push(format!("two-way pair records: {}", e.reason));
                for name in found {
                    homes.insert(
                        name,
                        undecided(format!("its home could not be recorded: {}", e.reason)),
                    );
                }
            }
        }
        homes
    }

    async fn apply(&self, name: &str, there: Option<&UserCopy>, action: UserAction) -> Result<()> {
        let id = there.map(|u| Identifier::numeric(u.id));
        let id = match id {
            Some(Ok(id)) => Some(id),
            Some(Err(e)) => return Err(iggy_error(&self.target, "id", e)),
            None => None,
        };
        let name = name.to_owned();
        match (action, id) {
            (UserAction::Create(permissions), _) => {
                // Nobody may log in as it before promote: a random password, dropped here.
                let password = Alphanumeric.sample_string(&mut rand::rngs::OsRng, 32);
                self.target
                    .call(0, "create_user", |c| async move {
                        c.create_user(&name, &password, UserStatus::Inactive, permissions)
                            .await
                            .map(|_| ())
                    })
                    .await
            }
            (UserAction::SetPermissions(permissions), Some(id)) => {
                self.target
                    .call(0, "update_permissions", |c| async move {
                        c.update_permissions(&id, permissions).await
                    })
                    .await
            }
            (UserAction::Deactivate, Some(id)) => {
                self.target
                    .call(0, "update_user", |c| async move {
                        c.update_user(&id, None, Some(UserStatus::Inactive)).await
                    })
                    .await
            }
            (UserAction::Delete, Some(id)) => {
                self.target
                    .call(
                        0,
                        "delete_user",
                        |c| async move { c.delete_user(&id).await },
                    )
                    .await
            }
            // A change to a user the target does not have: the plan never makes one.
            (_, None) => Ok(()),
        }
    }

    /// Activates the users `passwords` names on the target (`flow promote --activate-users`,
    /// see [`users::activation`]). Passwords go to the target and nowhere else.
    pub(crate) async fn activate(
        &self,
        passwords: &BTreeMap<String, String>,
    ) -> (Vec<UserActivation>, Vec<String>) {
        let mut errors = Vec::new();
        let mut done = Vec::new();
        if passwords.is_empty() {
            return (done, errors);
        }
        let down_listing = match Self::list(&self.target).await {
            Ok(listing) => listing,
            Err(e) => {
                errors.push(format!("activate users: {}", describe(&e)));
                return (done, errors);
            }
        };
        let mut protected = down_listing.own.clone();
        let mut target = match self
            .users_of(
                &self.target,
                &down_listing.users,
                &protected,
                None,
                &mut BTreeMap::new(),
            )
            .await
        {
            Ok(t) => t,
            Err(e) => {
                errors.push(format!("activate users: {}", describe(&e)));
                return (done, errors);
            }
        };
        // The source may be gone (that is what a failover is for): then the target's copies
        // are what there is. One failed read does not say so (a live source that answers late
        // once would have its deliberately inactive users activated from their copies): only
        // `SOURCE_LOST_AFTER` failed reads in a row do.
        let mut upstream = None;
        let mut last_error = String::new();
        for attempt in 1..=SOURCE_LOST_AFTER {
            match self.read_upstream_users(&target).await {
                Ok((users, own)) => {
                    target.retain(|name, _| !own.contains(name));
                    protected.extend(own);
                    upstream = Some(users);
                    break;
                }
                Err(e) => last_error = describe(&e),
            }
            if attempt < SOURCE_LOST_AFTER {
                tokio::time::sleep(SOURCE_READ_PAUSE).await;
            }
        }
        if upstream.is_none() {
            errors.push(format!(
                "activate users: the source {} could not be read in {SOURCE_LOST_AFTER} attempts \
                 {} s apart (last: {last_error}): users were activated from the target's copies",
                self.flow.source,
                SOURCE_READ_PAUSE.as_secs()
            ));
        }
        for (name, password) in passwords {
            let synced = self.selects(name, &protected)
                && !self.rivals.iter().any(|g| g.is_match(name.as_str()));
            let decision = users::activation(
                synced,
                password,
                upstream.is_some(),
                upstream.as_ref().and_then(|u| u.get(name)),
                target.get(name),
            );
            let activated = if upstream.is_some() {
                ActivationOutcome::Activated
            } else {
                ActivationOutcome::ActivatedFromTargetCopy
            };
            let outcome = match decision {
                Activation::Leave(outcome) => outcome,
                Activation::Replace(permissions) => {
                    match self
                        .replace(name, password, target.get(name), permissions)
                        .await
                    {
                        Ok(()) => activated,
                        Err(e) => {
                            errors.push(format!("activate user {name}: {}", describe(&e)));
                            ActivationOutcome::Failed
                        }
                    }
                }
                Activation::Create(permissions) => {
                    match self.create_active(name, password, permissions).await {
                        Ok(()) => ActivationOutcome::Activated,
                        Err(e) => {
                            errors.push(format!("activate user {name}: {}", describe(&e)));
                            ActivationOutcome::Failed
                        }
                    }
                }
            };
            if matches!(
                outcome,
                ActivationOutcome::Activated | ActivationOutcome::ActivatedFromTargetCopy
            ) {
                tracing::info!(user = %name, ?outcome, "user activated on the target");
            }
            done.push(UserActivation {
                name: name.clone(),
                outcome,
            });
        }
        (done, errors)
    }

    /// `flow promote`: the target is where applications run from now on, so in a two-way pair
    /// it becomes the home of every user and topic this flow syncs (the reverse flow then
    /// syncs them, and a conflict is decided for the target). Errors are for the report.
    pub(crate) async fn take_homes(&self) -> Vec<String> {
        let Some(pairing) = self.pair.as_deref() else {
            return Vec::new();
        };
        let Some(records) = self.records.records(&pairing.view.pair) else {
            return vec![format!(
                "homes not moved to {}: {NO_RECORDS}",
                self.flow.target
            )];
        };
        let changes: Vec<MetadataChange> = records
            .into_iter()
            .filter(|(object, record)| {
                record.home != pairing.view.target
                    && match object {
                        MetadataObject::User(name) => pairing.pairs_user(name),
                        MetadataObject::Topic { stream, topic } => {
                            pairing.pairs_topic(stream, topic)
                        }
                    }
            })
            .map(|(object, record)| MetadataChange {
                key: pairing.key(object),
                record: Some(MetadataRecord {
                    home: pairing.view.target.clone(),
                    agreed: record.agreed.clone(),
                }),
                expected: Some(record),
            })
            .collect();
        if changes.is_empty() {
            return Vec::new();
        }
        let count = changes.len();
        match self.records.record(changes).await {
            Ok(applied) if applied.iter().all(|a| *a) => {
                tracing::info!(count, home = %pairing.view.target, "two-way pair: homes moved to the promoted target");
                Vec::new()
            }
            Ok(applied) => vec![format!(
                "{} of {count} homes not moved to {}: their records changed meanwhile; run promote again",
                applied.iter().filter(|a| !**a).count(),
                pairing.view.target
            )],
            Err(e) => vec![format!(
                "homes not moved to {}: {}",
                pairing.view.target, e.reason
            )],
        }
    }

    /// The users of the source the flow selects, translated to the target (whose users are
    /// `target`), and the source's own users (never synced).
    async fn read_upstream_users(&self, target: &Users) -> Result<(Users, BTreeSet<String>)> {
        let listing = Self::list(&self.source).await?;
        let up = Catalog::read(&self.source).await?;
        let down = Catalog::read(&self.target).await?;
        let users = self
            .users_of(
                &self.source,
                &listing.users,
                &listing.own,
                Some((&up, &down, target)),
                &mut BTreeMap::new(),
            )
            .await?;
        Ok((users, listing.own))
    }

    /// Replaces the inactive copy with an active user: delete, then create. Run again after a
    /// failure in between, it finds no copy and creates one.
    async fn replace(
        &self,
        name: &str,
        password: &str,
        there: Option<&UserCopy>,
        permissions: Option<replicator_sdk::types::Permissions>,
    ) -> Result<()> {
        if let Some(there) = there {
            self.apply(name, Some(there), UserAction::Delete).await?;
        }
        self.create_active(name, password, permissions).await
    }

    async fn create_active(
        &self,
        name: &str,
        password: &str,
        permissions: Option<replicator_sdk::types::Permissions>,
    ) -> Result<()> {
        let (name, password) = (name.to_owned(), password.to_owned());
        self.target
            .call(0, "create_user", |c| async move {
                c.create_user(&name, &password, UserStatus::Active, permissions)
                    .await
                    .map(|_| ())
            })
            .await
    }
}
