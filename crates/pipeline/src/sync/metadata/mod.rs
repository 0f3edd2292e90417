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

pub(crate) mod settings;
pub(crate) mod users;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use globset::GlobSet;
use iggy::prelude::{Identifier, UserStatus};
use iggy_common::UserInfo;
use rand::distributions::{Alphanumeric, DistString};
use replicator_model::{Naming, TopicSetting};
use replicator_sdk::IggyCluster as _;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use self::settings::{SettingDifference, TopicSettings};
use self::users::{Activation, ActivationOutcome, UserAction, UserCopy, UserSyncState};
use crate::clients::Cluster;
use crate::control::ControlPlane;
use crate::discovery::FirstUnit;
use crate::error::{Error, Result};
use crate::params::{FlowParams, PipelineParams};
use crate::selection::mapping::{downstream_stream, Selector};

/// The root user's id on every Iggy server: never synced.
const ROOT_USER_ID: u32 = 0;

/// How often a node that does not run a flow's rounds looks whether it now does.
const RUNNER_CHECK: Duration = Duration::from_secs(1);

/// Compiles a flow's user globs (`*` matches any run of characters).
pub(crate) fn user_selector(globs: &[String]) -> std::result::Result<GlobSet, (String, String)> {
    crate::selection::globs::name_globs("users", globs)
}

/// The streams and topics of one cluster, by id (what permissions name).
#[derive(Debug, Clone, Default)]
pub(crate) struct Catalog {
    pub(crate) streams: BTreeMap<u32, CatalogStream>,
}

/// One stream of a [`Catalog`].
#[derive(Debug, Clone)]
pub(crate) struct CatalogStream {
    pub(crate) name: String,
    pub(crate) topics: BTreeMap<u32, CatalogTopic>,
}

/// One topic of a [`CatalogStream`].
#[derive(Debug, Clone)]
pub(crate) struct CatalogTopic {
    pub(crate) name: String,
    /// `None` only in tests that need names alone.
    pub(crate) settings: Option<TopicSettings>,
    pub(crate) partitions: u32,
    pub(crate) replication_factor: u8,
}

impl Catalog {
    /// The id of the stream named `name`.
    pub(crate) fn stream_id(&self, name: &str) -> Option<u32> {
        self.streams
            .iter()
            .find_map(|(id, s)| (s.name == name).then_some(*id))
    }

    /// The id of `stream/topic`.
    pub(crate) fn topic_id(&self, stream: &str, topic: &str) -> Option<u32> {
        self.topic(stream, topic).map(|(_, id, _)| id)
    }

    /// `stream/topic` with its ids.
    fn topic(&self, stream: &str, topic: &str) -> Option<(u32, u32, &CatalogTopic)> {
        let sid = self.stream_id(stream)?;
        let (tid, t) = self.streams[&sid]
            .topics
            .iter()
            .find(|(_, t)| t.name == topic)?;
        Some((sid, *tid, t))
    }

    /// Reads every stream and topic of `cluster`.
    async fn read(cluster: &Cluster) -> Result<Self> {
        let streams = cluster
            .call(0, "get_streams", |c| async move { c.get_streams().await })
            .await?;
        let mut catalog = Self::default();
        for stream in streams {
            let id = Identifier::numeric(stream.id).map_err(|e| iggy_error(cluster, "id", e))?;
            let details = cluster
                .call(0, "get_stream", |c| async move { c.get_stream(&id).await })
                .await?;
            let Some(details) = details else { continue };
            let topics = details
                .topics
                .iter()
                .map(|t| {
                    (
                        t.id,
                        CatalogTopic {
                            name: t.name.clone(),
                            settings: Some(TopicSettings::of(t)),
                            partitions: t.partitions_count,
                            replication_factor: t.replication_factor,
                        },
                    )
                })
                .collect();
            catalog.streams.insert(
                details.id,
                CatalogStream {
                    name: details.name,
                    topics,
                },
            );
        }
        Ok(catalog)
    }
}

fn iggy_error(cluster: &Cluster, op: &str, source: impl Into<replicator_sdk::Error>) -> Error {
    Error::Iggy {
        cluster: cluster.alias().to_owned(),
        op: op.to_owned(),
        source: source.into(),
    }
}

/// How one flow places upstream topics on the target: what it copies, and under which stream.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    pub(crate) selector: Selector,
    pub(crate) naming: Naming,
    /// The source alias (prefix naming).
    pub(crate) source: String,
}

impl Route {
    /// The downstream name of upstream `stream`.
    pub(crate) fn downstream(&self, stream: &str) -> String {
        downstream_stream(self.naming, &self.source, stream)
    }
}

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
    /// on purpose: extra partitions, failed updates (kept settings are not counted).
    pub fn settings_drift(&self) -> u64 {
        self.last
            .topics
            .iter()
            .filter(|t| t.differences.iter().any(|d| !d.kept))
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
            let first = first_unit
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            let runner = first
                .is_some_and(|unit| assignments.borrow().iter().any(|a| a.unit == unit))
                && control.lease_valid_until().is_some();
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
        match (
            Catalog::read(&self.source).await,
            Catalog::read(&self.target).await,
        ) {
            (Ok(up), Ok(down)) => {
                self.sync_settings(&up, &down, &mut report).await;
                if !self.flow.users.is_empty() {
                    if let Err(e) = self.sync_users(&up, &down, &mut report).await {
                        report.errors.push(format!("users: {}", describe(&e)));
                    }
                }
            }
            (Err(e), _) | (_, Err(e)) => report.errors.push(describe(&e)),
        }
        report.at_unix_ms = crate::sync::groups::now_ms();
        report
    }

    async fn sync_settings(&self, up: &Catalog, down: &Catalog, report: &mut MetadataSyncReport) {
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
                let plan = settings::plan(&wanted, &has, &self.flow.keep_target_settings);
                let mut entry = TopicSettingsReport {
                    stream: down_stream.clone(),
                    topic: topic.name.clone(),
                    settings: BTreeMap::new(),
                    changed: Vec::new(),
                    differences: plan.kept,
                };
                let mut now = has;
                if let Some(update) = plan.update {
                    let mut refused = Vec::new();
                    match self
                        .update_topic(sid, tid, &topic.name, there, update)
                        .await
                    {
                        Ok(()) => {
                            now = update;
                            entry.changed = plan.changed.clone();
                        }
                        // One setting the target refuses (a 0.9 server refuses a size cap
                        // below the topic's segment size) must not hold back the others:
                        // each is tried on its own.
                        Err(_) if plan.changed.len() > 1 => {
                            for &setting in &plan.changed {
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
                        Err(e) => refused.extend(plan.changed.first().map(|&s| (s, e))),
                    }
                    for (setting, e) in refused {
                        report.errors.push(format!(
                            "topic {down_stream}/{}: update of {setting}: {}",
                            topic.name,
                            describe(&e)
                        ));
                        entry.differences.push(SettingDifference {
                            setting: setting.as_str().to_owned(),
                            upstream: wanted.render(setting),
                            target: has.render(setting),
                            kept: false,
                        });
                    }
                    if !entry.changed.is_empty() {
                        tracing::info!(stream = %down_stream, topic = %topic.name, changed = ?entry.changed, "topic settings applied on the target");
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

    /// The users of `cluster` (listed in `listed`) the flow selects, with their permissions
    /// (upstream ones translated to the target when `translate_to` is given).
    async fn users_of(
        &self,
        cluster: &Cluster,
        listed: &[UserInfo],
        protected: &BTreeSet<String>,
        translate_to: Option<(&Catalog, &Catalog)>,
        not_translated: &mut BTreeMap<String, Vec<String>>,
    ) -> Result<Users> {
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
                Some((up, down)) => {
                    let t =
                        users::translate(details.permissions.as_ref(), up, down, &self.siblings);
                    not_translated.insert(user.username.clone(), t.not_translated);
                    t.permissions
                }
                None => details.permissions,
            };
            users.insert(
                user.username.clone(),
                UserCopy {
                    id: details.id,
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
        report: &mut MetadataSyncReport,
    ) -> Result<()> {
        let (up_listing, down_listing) = (
            Self::list(&self.source).await?,
            Self::list(&self.target).await?,
        );
        let protected: BTreeSet<String> =
            up_listing.own.union(&down_listing.own).cloned().collect();
        let mut not_translated = BTreeMap::new();
        let upstream = self
            .users_of(
                &self.source,
                &up_listing.users,
                &protected,
                Some((up, down)),
                &mut not_translated,
            )
            .await?;
        let target = self
            .users_of(
                &self.target,
                &down_listing.users,
                &protected,
                None,
                &mut BTreeMap::new(),
            )
            .await?;
        let names: BTreeSet<&String> = upstream.keys().chain(target.keys()).collect();
        for name in names {
            let mut entry = UserReport {
                name: name.clone(),
                state: UserSyncState::InSync,
                not_translated: not_translated.remove(name).unwrap_or_default(),
            };
            if self.rivals.iter().any(|g| g.is_match(name.as_str())) {
                entry.state = UserSyncState::Conflict;
                report.users.push(entry);
                continue;
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
        // The source may be gone (that is what a failover is for): then the target's copies
        // are what there is.
        let up_listing = Self::list(&self.source).await.ok();
        let mut protected = down_listing.own.clone();
        protected.extend(up_listing.iter().flat_map(|l| l.own.iter().cloned()));
        let upstream = match (
            up_listing,
            Catalog::read(&self.source).await,
            Catalog::read(&self.target).await,
        ) {
            (Some(listing), Ok(up), Ok(down)) => self
                .users_of(
                    &self.source,
                    &listing.users,
                    &protected,
                    Some((&up, &down)),
                    &mut BTreeMap::new(),
                )
                .await
                .ok(),
            _ => None,
        };
        let target = match self
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
            let outcome = match decision {
                Activation::Leave(outcome) => outcome,
                Activation::Replace(permissions) => {
                    match self
                        .replace(name, password, target.get(name), permissions)
                        .await
                    {
                        Ok(()) => ActivationOutcome::Activated,
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
            if outcome == ActivationOutcome::Activated {
                tracing::info!(user = %name, "user activated on the target");
            }
            done.push(UserActivation {
                name: name.clone(),
                outcome,
            });
        }
        (done, errors)
    }

    /// Replaces the inactive copy with an active user: delete, then create. Run again after a
    /// failure in between, it finds no copy and creates one.
    async fn replace(
        &self,
        name: &str,
        password: &str,
        there: Option<&UserCopy>,
        permissions: Option<iggy::prelude::Permissions>,
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
        permissions: Option<iggy::prelude::Permissions>,
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
