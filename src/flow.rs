//! `iggy-replicator flow pause|resume|promote` and the admin API calls behind them (`flow
//! reset` is in `reset.rs`; what the node's side of both shares, in `flow_call.rs`).
//!
//! Pause and resume are one Raft entry each (`SetFlowPaused`): a paused flow's writers finish
//! the batch in flight, commit and hand their units back, and nobody gets them until it is
//! resumed. `promote` is the disaster-recovery cutover, run by the node the call reaches:
//!
//! 1. wait until every partition of the flow is copied (upstream end = confirmed offset + 1),
//!    or the deadline passes (the source may be gone: what was copied is what there is);
//! 2. pause the flow and wait until no unit of it is owned any more (every writer stopped);
//! 3. one last consumer-group sync over all its partitions, and one last metadata sync round
//!    (users, topic settings), from this node; then the users `--activate-users` gives
//!    passwords for are activated on the target;
//! 4. answer a per-partition report: upstream end, last upstream offset copied, downstream
//!    end, messages not copied (the RPO), every group's translated offsets, the users and
//!    topic settings checked, and the users activated.
//!
//! The CLI prints the report and exits 0 when everything was copied, 3 otherwise.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use replicator_control::Control;
use replicator_model::WorkUnit;
use replicator_pipeline::{
    ActivationOutcome, Cutover, GroupOffset, GroupSkip, TopicSettingsReport, UnitExtents,
    UserActivation, UserReport,
};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::admin::AdminState;
use crate::api_client::MutationArgs;
use crate::exit::Failure;
use crate::flow_call::{
    flow_call, flow_units, known_flow, requester, wait_handed_back, HAND_BACK_WAIT, PROMOTE_POLL,
};

/// How long promote waits before syncing again groups its last sync found with members on the
/// target.
const PROMOTE_GROUP_RETRY: Duration = Duration::from_secs(1);

/// `flow` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub(crate) enum FlowCommand {
    /// Pause a flow cluster-wide (persisted: it stays paused across restarts and failovers):
    /// its writers finish the batch in flight, commit and stop.
    #[command(
        after_help = "Example:\n  REPLICATOR_TOKEN=... iggy-replicator flow pause us-to-eu --api 10.0.0.1:7180"
    )]
    Pause {
        /// The flow (`flows[].name`).
        name: String,
        #[command(flatten)]
        call: MutationArgs,
    },
    /// Resume a paused flow: every partition continues exactly where it stopped.
    #[command(
        after_help = "Example:\n  REPLICATOR_TOKEN=... iggy-replicator flow resume us-to-eu --api 10.0.0.1:7180"
    )]
    Resume {
        /// The flow.
        name: String,
        #[command(flatten)]
        call: MutationArgs,
    },
    /// Cut over to the target: wait until everything is copied, pause the flow, sync its
    /// consumer groups, users and topic settings a last time, activate the users given
    /// passwords, and print what was copied per partition. Exit 0 when everything was copied,
    /// 3 when the deadline passed with messages not copied or a step failed.
    #[command(
        after_help = "Examples:\n  REPLICATOR_TOKEN=... iggy-replicator flow promote us-to-eu --api 10.0.0.1:7180\n  REPLICATOR_TOKEN=... iggy-replicator flow promote us-to-eu --timeout 5m --json"
    )]
    Promote {
        /// The flow.
        name: String,
        #[command(flatten)]
        call: MutationArgs,
        /// How long to wait for the last messages to be copied.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
        timeout: Duration,
        /// Print the report as JSON instead of tables.
        #[arg(long)]
        json: bool,
        /// A TOML file of `user = "password"` lines: each synced user it names is activated
        /// on the target with that password (README "Disaster recovery"). The passwords go to
        /// the node over the admin API (use its TLS) and from there to the target only.
        #[arg(long, value_name = "FILE")]
        activate_users: Option<std::path::PathBuf>,
    },
    /// Move where partitions of a paused flow resume: skip a backlog (`--to latest`), start
    /// at an offset, or copy a range again (`--allow-duplicates`). Recorded in the control
    /// plane with who and when; applies when the flow is resumed.
    #[command(
        after_help = "Examples:\n  REPLICATOR_TOKEN=... iggy-replicator flow pause us-to-eu --api 10.0.0.1:7180\n  REPLICATOR_TOKEN=... iggy-replicator flow reset us-to-eu --stream orders --topic created --to latest --api 10.0.0.1:7180\n  REPLICATOR_TOKEN=... iggy-replicator flow reset us-to-eu --stream orders --topic created --partition 0 --to 1200 --allow-duplicates --api 10.0.0.1:7180\n  REPLICATOR_TOKEN=... iggy-replicator flow resume us-to-eu --api 10.0.0.1:7180"
    )]
    Reset(crate::reset::ResetArgs),
}

/// Body of `POST /flows/{name}/promote`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PromoteRequest {
    /// How long to wait for the copy to complete, in milliseconds.
    pub(crate) timeout_ms: u64,
    /// Users to activate on the target, with their passwords.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) activate_users: BTreeMap<String, Password>,
}

/// A password on its way to the target: never printed.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Password(pub(crate) String);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("****")
    }
}

/// Reads an `--activate-users` file: a TOML table of user names to passwords.
fn read_activation_file(path: &std::path::Path) -> Result<BTreeMap<String, Password>, Failure> {
    let hint = "the file holds lines like `app-billing = \"the password\"`";
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::config(format!("cannot read {}: {e}", path.display())).with_hint(hint)
    })?;
    // The error names the line, never the value (it may be a password).
    let users: BTreeMap<String, String> = toml::from_str(&text).map_err(|e| {
        let at = e
            .span()
            .map(|s| format!(" at line {}", text[..s.start].lines().count().max(1)))
            .unwrap_or_default();
        Failure::config(format!(
            "{}: not a table of user = \"password\" lines{at}",
            path.display()
        ))
        .with_hint(hint)
    })?;
    for (name, password) in &users {
        if let Some(problem) = replicator_pipeline::password_problem(password) {
            return Err(Failure::config(format!(
                "{}: the password of {name}: {problem}",
                path.display()
            ))
            .with_hint(hint));
        }
    }
    Ok(users.into_iter().map(|(u, p)| (u, Password(p))).collect())
}

/// The answer of `POST /flows/{name}/promote`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PromoteReport {
    /// The flow.
    pub(crate) flow: String,
    /// Every partition was copied to its end and the final group sync had no error.
    pub(crate) complete: bool,
    /// Per partition, in unit order.
    pub(crate) partitions: Vec<PartitionReport>,
    /// Consumer groups as translated on the target by the final sync.
    pub(crate) groups: Vec<GroupView>,
    /// Groups the final sync left alone (members on the target), and why.
    pub(crate) groups_skipped: Vec<GroupSkipView>,
    /// The users the final metadata sync checked, and where each stands.
    #[serde(default)]
    pub(crate) users: Vec<UserReport>,
    /// The users `--activate-users` named, and what was done.
    #[serde(default)]
    pub(crate) users_activated: Vec<UserActivation>,
    /// The flow's topics' settings on the target after the final metadata sync.
    #[serde(default)]
    pub(crate) topic_settings: Vec<TopicSettingsReport>,
    /// Problems: partitions that could not be read, group, user or settings sync errors.
    pub(crate) errors: Vec<String>,
}

/// One partition in [`PromoteReport`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PartitionReport {
    pub(crate) stream: String,
    pub(crate) topic: String,
    pub(crate) partition: u32,
    /// Next offset upstream (`None`: the source could not be read and this node never saw
    /// the partition's end).
    pub(crate) upstream_end: Option<u64>,
    /// `upstream_end` is the end this node's reader last saw, not read now (the source could
    /// not be read): messages appended upstream after that are unknown.
    #[serde(default)]
    pub(crate) upstream_end_last_seen: bool,
    /// The last upstream offset copied (confirmed).
    pub(crate) last_copied: Option<u64>,
    /// Next offset downstream.
    pub(crate) downstream_end: Option<u64>,
    /// Messages not copied (`None`: unknown, the source could not be read).
    pub(crate) not_copied: Option<u64>,
}

/// One translated group offset (serialisable form of [`GroupOffset`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct GroupView {
    pub(crate) group: String,
    pub(crate) stream: String,
    pub(crate) topic: String,
    pub(crate) partition: u32,
    pub(crate) upstream_offset: u64,
    pub(crate) downstream_offset: u64,
    pub(crate) exact: bool,
}

impl From<&GroupOffset> for GroupView {
    fn from(g: &GroupOffset) -> Self {
        Self {
            group: g.group.clone(),
            stream: g.stream.clone(),
            topic: g.topic.clone(),
            partition: g.partition,
            upstream_offset: g.upstream_offset,
            downstream_offset: g.downstream_offset,
            exact: g.exact,
        }
    }
}

/// A group left alone (serialisable form of [`GroupSkip`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct GroupSkipView {
    pub(crate) group: String,
    pub(crate) stream: String,
    pub(crate) topic: String,
    pub(crate) reason: String,
}

impl From<&GroupSkip> for GroupSkipView {
    fn from(s: &GroupSkip) -> Self {
        Self {
            group: s.group.clone(),
            stream: s.stream.clone(),
            topic: s.topic.clone(),
            reason: s.reason.clone(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The admin API side.

/// `POST /flows/{name}/pause` and `/resume`.
pub(crate) async fn set_paused(
    state: &AdminState,
    headers: &HeaderMap,
    name: &str,
    paused: bool,
) -> Response {
    let action = if paused { "pause" } else { "resume" };
    let control = match state.control_for(headers, action) {
        Ok(control) => control,
        Err(answer) => return *answer,
    };
    if let Err(answer) = known_flow(state, name) {
        return *answer;
    }
    info!(flow = name, paused, "flow {action} requested");
    match control
        .set_flow_paused(name, paused, requester(action))
        .await
    {
        Ok(()) => (
            StatusCode::OK,
            format!(
                "flow {name} {}\n",
                if paused { "paused" } else { "resumed" }
            ),
        )
            .into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot {action} flow {name}: {e}\n"),
        )
            .into_response(),
    }
}

/// `POST /flows/{name}/promote`.
pub(crate) async fn promote(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Json(body): Json<PromoteRequest>,
) -> Response {
    let (control, cutover) = match flow_call(&state, &headers, "promote", &name) {
        Ok(parts) => parts,
        Err(answer) => return *answer,
    };
    let timeout = Duration::from_millis(body.timeout_ms);
    info!(flow = %name, ?timeout, "promote requested");
    let last_seen = state.last_seen_upstream_ends();
    let passwords: BTreeMap<String, String> = body
        .activate_users
        .into_iter()
        .map(|(user, p)| (user, p.0))
        .collect();
    match run_promote(&control, &cutover, &name, timeout, &last_seen, &passwords).await {
        Ok(report) => Json(report).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("promote of flow {name} failed: {e}\n"),
        )
            .into_response(),
    }
}

/// Messages of a partition not copied: `None` when the source could not be read.
fn not_copied(extents: &UnitExtents, confirmed: Option<u64>) -> Option<u64> {
    let up = extents.upstream.as_ref().ok()?;
    Some(match confirmed {
        Some(c) => up.next_offset.saturating_sub(c + 1),
        None => up.messages,
    })
}

/// Messages not copied below the upstream end `end` this node's reader last saw.
fn not_copied_below(end: u64, confirmed: Option<u64>) -> u64 {
    end.saturating_sub(confirmed.map_or(0, |c| c + 1))
}

/// The cutover (see the module docs); `last_seen` holds the upstream ends this node's readers
/// last saw, per unit (the estimate of what is missing when the source cannot be read).
pub(crate) async fn run_promote(
    control: &Control,
    cutover: &Cutover,
    flow: &str,
    timeout: Duration,
    last_seen: &BTreeMap<WorkUnit, u64>,
    passwords: &BTreeMap<String, String>,
) -> Result<PromoteReport, String> {
    let deadline = Instant::now() + timeout;
    // 1. Wait for the copy to reach the end of every partition.
    loop {
        let units = flow_units(control, flow).await?;
        let ids: Vec<WorkUnit> = units.iter().map(|(u, _)| u.clone()).collect();
        let extents = cutover.extents(flow, &ids).await;
        let done = !units.is_empty()
            && units
                .iter()
                .zip(&extents)
                .all(|((_, confirmed), e)| not_copied(e, *confirmed) == Some(0));
        if done || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(PROMOTE_POLL).await;
    }
    // 2. Pause, and wait until every writer handed its unit back.
    control
        .set_flow_paused(flow, true, requester("promote"))
        .await
        .map_err(|e| e.to_string())?;
    let drained_by = deadline.max(Instant::now()) + HAND_BACK_WAIT;
    let mut errors = Vec::new();
    if let Err(owned) = wait_handed_back(control, flow, drained_by, |_| true).await {
        errors.push(format!(
            "{owned} partition(s) still owned after the pause; their last messages may still be written"
        ));
    }
    // 3. Final figures and the last group sync.
    let units = flow_units(control, flow).await?;
    let ids: Vec<WorkUnit> = units.iter().map(|(u, _)| u.clone()).collect();
    let extents = cutover.extents(flow, &ids).await;
    let mut groups = cutover.sync_groups(flow, ids.clone()).await;
    if groups.as_ref().is_some_and(|g| !g.skipped.is_empty()) {
        // Another member's periodic round, begun before the pause applied there, may have
        // been a member of a group for a moment: look once more before reporting it.
        tokio::time::sleep(PROMOTE_GROUP_RETRY).await;
        groups = cutover.sync_groups(flow, ids.clone()).await;
    }
    let metadata = cutover.promote_metadata(flow, passwords).await;
    let mut partitions = Vec::new();
    for ((unit, confirmed), e) in units.iter().zip(&extents) {
        for (side, result) in [("upstream", &e.upstream), ("downstream", &e.downstream)] {
            if let Err(error) = result {
                errors.push(format!("{unit}: {side}: {error}"));
            }
        }
        let seen = last_seen.get(unit).copied();
        let (upstream_end, upstream_end_last_seen, missing) = match &e.upstream {
            Ok(x) => (Some(x.next_offset), false, not_copied(e, *confirmed)),
            // The source is gone: what this node's reader last saw is a lower bound.
            Err(_) => (
                seen,
                seen.is_some(),
                seen.map(|end| not_copied_below(end, *confirmed)),
            ),
        };
        partitions.push(PartitionReport {
            stream: unit.stream.clone(),
            topic: unit.topic.clone(),
            partition: unit.partition,
            upstream_end,
            upstream_end_last_seen,
            last_copied: *confirmed,
            downstream_end: e.downstream.as_ref().ok().map(|x| x.next_offset),
            not_copied: missing,
        });
    }
    let (group_views, skipped) = match &groups {
        Some(report) => {
            errors.extend(report.errors.iter().cloned());
            (
                report.offsets.iter().map(GroupView::from).collect(),
                report.skipped.iter().map(GroupSkipView::from).collect(),
            )
        }
        None => (Vec::new(), Vec::new()),
    };
    let (users, users_activated, topic_settings) = match metadata {
        Some((report, activated, activation_errors)) => {
            errors.extend(report.errors.iter().map(|e| format!("metadata sync: {e}")));
            errors.extend(activation_errors);
            (report.users, activated, report.topics)
        }
        None => (Vec::new(), Vec::new(), Vec::new()),
    };
    let complete = !partitions.is_empty()
        && partitions
            .iter()
            .all(|p| p.not_copied == Some(0) && !p.upstream_end_last_seen)
        && errors.is_empty();
    if !complete {
        warn!(flow, "promote ends incomplete");
    }
    Ok(PromoteReport {
        flow: flow.to_owned(),
        complete,
        partitions,
        groups: group_views,
        groups_skipped: skipped,
        users,
        users_activated,
        topic_settings,
        errors,
    })
}

// ---------------------------------------------------------------------------------------------
// The CLI side.

/// Runs a `flow` subcommand.
pub(crate) async fn run(command: FlowCommand) -> Result<(), Failure> {
    match command {
        FlowCommand::Pause { name, call } => {
            call.send("pause", |client, api| {
                client.post(api, &format!("/flows/{name}/pause"))
            })
            .await
        }
        FlowCommand::Resume { name, call } => {
            call.send("resume", |client, api| {
                client.post(api, &format!("/flows/{name}/resume"))
            })
            .await
        }
        FlowCommand::Reset(args) => crate::reset::run(args).await,
        FlowCommand::Promote {
            name,
            call,
            timeout,
            json,
            activate_users,
        } => {
            let body = PromoteRequest {
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                activate_users: match activate_users {
                    Some(path) => read_activation_file(&path)?,
                    None => BTreeMap::new(),
                },
            };
            // The call lasts the timeout, the drain and the final sync.
            let (report, answer): (PromoteReport, _) = call
                .post_for(
                    timeout + HAND_BACK_WAIT + Duration::from_secs(60),
                    "promote",
                    &format!("/flows/{name}/promote"),
                    &body,
                )
                .await?;
            if json {
                println!("{answer}");
            } else {
                print!("{}", render(&report));
            }
            if report.complete {
                Ok(())
            } else {
                Err(Failure::not_exact(format!(
                    "flow {name} is paused, but the cutover is incomplete: {}",
                    incomplete_reason(&report)
                ))
                .with_hint(
                    "the report above says what was not copied; run promote again to wait longer, or accept it (the flow stays paused)",
                ))
            }
        }
    }
}

fn incomplete_reason(report: &PromoteReport) -> String {
    let missing: u64 = report.partitions.iter().filter_map(|p| p.not_copied).sum();
    let unknown = report
        .partitions
        .iter()
        .filter(|p| p.not_copied.is_none())
        .count();
    let mut parts = Vec::new();
    if missing > 0 {
        parts.push(format!("{missing} message(s) not copied"));
    }
    if unknown > 0 {
        parts.push(format!(
            "{unknown} partition(s) unreadable upstream (messages not copied unknown)"
        ));
    }
    if !report.errors.is_empty() {
        parts.push(format!("{} error(s)", report.errors.len()));
    }
    if parts.is_empty() {
        parts.push("no partitions".into());
    }
    parts.join(", ")
}

/// The report as tables.
pub(crate) fn render(report: &PromoteReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let show = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
    let _ = writeln!(out, "flow {} paused", report.flow);
    let label = |s: &str, t: &str, p: u32| format!("{s}/{t}/{p}");
    let w = report
        .partitions
        .iter()
        .map(|p| label(&p.stream, &p.topic, p.partition).len())
        .max()
        .unwrap_or(0)
        .max(9);
    let _ = writeln!(
        out,
        "{:<w$} {:>14} {:>12} {:>16} {:>11}",
        "PARTITION", "UPSTREAM END", "LAST COPIED", "DOWNSTREAM END", "NOT COPIED"
    );
    let seen = |v: Option<u64>, last_seen: bool| {
        if last_seen {
            format!("≥{}", show(v))
        } else {
            show(v)
        }
    };
    for p in &report.partitions {
        let _ = writeln!(
            out,
            "{:<w$} {:>14} {:>12} {:>16} {:>11}",
            label(&p.stream, &p.topic, p.partition),
            seen(p.upstream_end, p.upstream_end_last_seen),
            show(p.last_copied),
            show(p.downstream_end),
            seen(p.not_copied, p.upstream_end_last_seen),
        );
    }
    if report.partitions.iter().any(|p| p.upstream_end_last_seen) {
        let _ = writeln!(
            out,
            "≥: the source could not be read; the end this node last saw (anything appended later is unknown)"
        );
    }
    if !report.groups.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<20} {:<w$} {:>10} {:>12} {:>6}",
            "GROUP", "PARTITION", "UPSTREAM", "DOWNSTREAM", "EXACT"
        );
        for g in &report.groups {
            let _ = writeln!(
                out,
                "{:<20} {:<w$} {:>10} {:>12} {:>6}",
                g.group,
                label(&g.stream, &g.topic, g.partition),
                g.upstream_offset,
                g.downstream_offset,
                if g.exact { "yes" } else { "no" }
            );
        }
    }
    for s in &report.groups_skipped {
        let _ = writeln!(
            out,
            "group {} on {}/{} not synced: {}",
            s.group, s.stream, s.topic, s.reason
        );
    }
    for u in &report.users_activated {
        let _ = writeln!(out, "user {}: {}", u.name, activation_text(u.outcome));
    }
    let kept: Vec<&UserReport> = report
        .users
        .iter()
        .filter(|u| !u.not_translated.is_empty())
        .collect();
    for u in kept {
        let _ = writeln!(
            out,
            "user {}: permissions not on the target: {}",
            u.name,
            u.not_translated.join("; ")
        );
    }
    for t in &report.topic_settings {
        for d in &t.differences {
            let _ = writeln!(
                out,
                "topic {}/{}: {} differs (upstream {}, target {})",
                t.stream, t.topic, d.setting, d.upstream, d.target
            );
        }
    }
    for e in &report.errors {
        let _ = writeln!(out, "problem: {e}");
    }
    out
}

fn activation_text(outcome: ActivationOutcome) -> &'static str {
    match outcome {
        ActivationOutcome::Activated => "activated on the target with the given password",
        ActivationOutcome::ActivatedFromTargetCopy => {
            "activated on the target with the given password and the permissions of its copy \
             there (the source could not be read)"
        }
        ActivationOutcome::AlreadyActive => "already active on the target (password unchanged)",
        ActivationOutcome::InactiveUpstream => "inactive upstream, left inactive",
        ActivationOutcome::NotSynced => "not a user this flow syncs, left alone",
        ActivationOutcome::Unknown => "not on the target and the source cannot be read",
        ActivationOutcome::InvalidPassword => {
            "left as it was: Iggy refuses the password given (too short or too long)"
        }
        ActivationOutcome::Failed => "activation failed (see the problems below)",
    }
}
