//! `iggy-replicator status` and `iggy-replicator cluster …`: clients of the admin API.
//!
//! `status` asks one node for the cluster view, then every member for the live figures of
//! the units it runs, and renders one table (refreshed with `--watch`).

use std::collections::BTreeMap;
use std::time::Duration;

use replicator_model::NodeId;

use crate::admin::{
    AddMember, BlockedTopicView, FlowGroupsView, FlowMetadataView, LiveView, StatusView,
};
use crate::api_client::{unreachable, ApiArgs, ApiClient, MutationArgs};
use crate::exit::Failure;

/// `cluster` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub(crate) enum ClusterCommand {
    /// Add a node: it joins as a learner, catches up, then becomes a voter and takes work.
    #[command(
        after_help = "Example (start node 4 with its config first):\n  REPLICATOR_TOKEN=... iggy-replicator cluster add --api 10.0.0.1:7180 --id 4 --raft-addr 10.0.0.4:7100 --api-addr 10.0.0.4:7180"
    )]
    Add {
        #[command(flatten)]
        call: MutationArgs,
        /// The new node's id (its `[node] id`).
        #[arg(long)]
        id: NodeId,
        /// The new node's Raft address.
        #[arg(long)]
        raft_addr: String,
        /// The new node's admin API address.
        #[arg(long)]
        api_addr: String,
    },
    /// Drain a node (its partitions move to the others after a final commit) and remove it.
    #[command(
        after_help = "Example:\n  REPLICATOR_TOKEN=... iggy-replicator cluster remove --api 10.0.0.1:7180 --id 3"
    )]
    Remove {
        #[command(flatten)]
        call: MutationArgs,
        /// The node to remove.
        #[arg(long)]
        id: NodeId,
    },
    /// Show the members: voter, lease, units owned.
    #[command(after_help = "Example:\n  iggy-replicator cluster status --api 10.0.0.1:7180")]
    Status {
        #[command(flatten)]
        api: ApiArgs,
    },
}

/// Fetches `/status` from `api`.
async fn fetch_status(client: &ApiClient, api: &str) -> Result<StatusView, Failure> {
    let response = client
        .get(api, "/status")
        .send()
        .await
        .map_err(|e| unreachable(api, e))?;
    let code = response.status();
    if !code.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(Failure::runtime(
            format!("{api} answered {code}: {}", body.trim()),
            "the node may have no quorum; try another member",
        ));
    }
    response.json().await.map_err(|e| {
        Failure::runtime(
            format!("unexpected /status answer from {api}: {e}"),
            "are --api and the node the same version?",
        )
    })
}

/// Runs a `cluster` subcommand.
pub(crate) async fn cluster(command: ClusterCommand) -> Result<(), Failure> {
    match command {
        ClusterCommand::Add {
            call,
            id,
            raft_addr,
            api_addr,
        } => {
            let body = AddMember {
                id,
                raft_addr,
                api_addr,
            };
            call.send("add", |client, api| {
                client.post(api, "/cluster/members").json(&body)
            })
            .await
        }
        ClusterCommand::Remove { call, id } => {
            call.send("remove", |client, api| {
                client.delete(api, &format!("/cluster/members/{id}"))
            })
            .await
        }
        ClusterCommand::Status { api } => {
            let view = fetch_status(&api.client()?, &api.api).await?;
            print!("{}", render_members(&view));
            Ok(())
        }
    }
}

/// Runs `status`, once or every `interval` with `watch`.
pub(crate) async fn status(api: ApiArgs, watch: bool, interval: Duration) -> Result<(), Failure> {
    let client = api.client()?;
    loop {
        let view = fetch_status(&client, &api.api).await?;
        let live = collect_live(&client, &view).await;
        let table = format!(
            "{}{}{}{}",
            render_units(&view, &live.units),
            render_groups(&live.groups),
            render_metadata(&live.metadata),
            render_blocked(&live.blocked)
        );
        if watch {
            // Clear the screen and home the cursor, then redraw.
            print!("\x1b[2J\x1b[H{}", render_members(&view));
            println!("{table}");
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
        } else {
            print!("{}", render_members(&view));
            println!("{table}");
            return Ok(());
        }
    }
}

/// What every member reports of the work it runs itself.
#[derive(Default)]
struct Live {
    /// Live figures of every unit, by unit.
    units: BTreeMap<String, LiveView>,
    /// Consumer-group sync per member and flow.
    groups: Vec<FlowGroupsView>,
    /// User and topic-settings sync per member and flow.
    metadata: Vec<FlowMetadataView>,
    /// Topics residency policies keep from the flows' targets, per member.
    blocked: Vec<BlockedTopicView>,
}

/// Live figures of every unit and every member's consumer-group sync, from the members that
/// run them (unreachable members are skipped).
async fn collect_live(client: &ApiClient, view: &StatusView) -> Live {
    let mut live = Live::default();
    let mut collect = |v: &StatusView| {
        for unit in &v.units {
            if let Some(l) = &unit.live {
                live.units.insert(unit.unit.to_string(), l.clone());
            }
        }
        live.groups.extend(v.consumer_groups.iter().cloned());
        live.metadata.extend(v.metadata_sync.iter().cloned());
        live.blocked.extend(v.blocked_topics.iter().cloned());
    };
    collect(view);
    for member in view
        .members
        .iter()
        .filter(|m| m.id != view.node && !m.api_addr.is_empty())
    {
        if let Ok(v) = fetch_status(client, &member.api_addr).await {
            collect(&v);
        }
    }
    live
}

fn render_members(view: &StatusView) -> String {
    let mut out = format!(
        "cluster: leader {}  term {}  (answered by node {})\n",
        view.leader.map_or("none".to_owned(), |l| l.to_string()),
        view.term,
        view.node
    );
    // An upgrade in progress: some member supports more than the cluster runs at, so the
    // level rises once the others do.
    let level = view.feature_level;
    if view.members.iter().any(|m| m.supported_level > Some(level)) {
        let waiting: Vec<String> = view
            .members
            .iter()
            .filter(|m| m.supported_level.is_none_or(|l| l <= level))
            .map(|m| m.id.to_string())
            .collect();
        out.push_str(&format!(
            "feature level {level}: upgrade in progress, raised once node(s) {} support more\n",
            waiting.join(", ")
        ));
    }
    if view.fences_pending > 0 {
        out.push_str(&format!(
            "writer fences pending: {} (their members' partitions wait)\n",
            view.fences_pending
        ));
    }
    if let Some(error) = &view.fence_error {
        out.push_str(&format!("last fence error: {error}\n"));
    }
    for p in &view.paused_flows {
        out.push_str(&format!(
            "flow {} PAUSED ({}, {})\n",
            p.flow,
            p.requested_by,
            ago(p.at_unix_ms)
        ));
    }
    for m in view
        .members
        .iter()
        .filter(|m| !m.config_disagrees.is_empty())
    {
        out.push_str(&format!(
            "node {} CONFIG DIFFERS from the leader's for flow(s) {}: it gets none of their partitions (make the configs equal, then reload)\n",
            m.id,
            m.config_disagrees.join(", ")
        ));
    }
    for u in &view.units {
        if let Some(r) = &u.pending_reset {
            out.push_str(&format!(
                "{} RESET to offset {}{} ({}, {}): applies when its next owner starts\n",
                u.unit,
                r.reset.next,
                if r.reset.allow_duplicates {
                    ", duplicates allowed"
                } else {
                    ""
                },
                r.requested_by,
                ago(r.at_unix_ms)
            ));
        }
    }
    out.push_str(&format!(
        "{:>6}  {:<22} {:<22} {:<7} {:<7} {:>6}  {}\n",
        "node", "raft", "api", "voter", "lease", "units", "writer"
    ));
    for m in &view.members {
        let writer = match (m.writer_incarnation, m.fenced) {
            (None, _) => "-".to_owned(),
            (Some(i), false) => format!("incarnation {i}"),
            (Some(i), true) => format!("incarnation {i} FENCED"),
        };
        out.push_str(&format!(
            "{:>6}  {:<22} {:<22} {:<7} {:<7} {:>6}  {writer}\n",
            m.id,
            m.raft_addr,
            m.api_addr,
            if m.voter { "yes" } else { "no" },
            match m.lease_alive {
                Some(true) => "alive",
                Some(false) => "EXPIRED",
                None => "?",
            },
            m.units_owned
        ));
    }
    out
}

/// How long ago a Unix-milliseconds time was, e.g. `12s ago`.
fn ago(at_unix_ms: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    format!("{}s ago", now.saturating_sub(at_unix_ms) / 1000)
}

/// Every member's consumer-group sync: per group and partition the translated offsets, the
/// groups left alone and the latest errors.
fn render_groups(groups: &[FlowGroupsView]) -> String {
    if groups.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\n{:<10} {:>5} {:<20} {:<30} {:>10} {:>11} {:>6}  {}\n",
        "flow", "node", "group", "partition", "upstream", "downstream", "exact", "synced"
    );
    for g in groups {
        for o in &g.offsets {
            out.push_str(&format!(
                "{:<10} {:>5} {:<20} {:<30} {:>10} {:>11} {:>6}  {}\n",
                g.flow,
                g.node,
                o.group,
                format!("{}/{}/{}", o.stream, o.topic, o.partition),
                o.upstream_offset,
                o.downstream_offset,
                if o.exact { "yes" } else { "no" },
                ago(g.last_run_unix_ms)
            ));
        }
        for s in &g.skipped {
            out.push_str(&format!(
                "{:<10} {:>5} group {} on {}/{} skipped: {}\n",
                g.flow, g.node, s.group, s.stream, s.topic, s.reason
            ));
        }
        for e in &g.errors {
            out.push_str(&format!("{:<10} {:>5} sync error: {e}\n", g.flow, g.node));
        }
    }
    out
}

/// Every member's user and topic-settings sync: one summary line per flow, then what the
/// target still does not match (users left alone or gone upstream, permissions with no place
/// on the target, topic settings that differ) and the latest errors.
fn render_metadata(flows: &[FlowMetadataView]) -> String {
    let mut out = String::new();
    for m in flows {
        let in_sync = m
            .users
            .iter()
            .filter(|u| u.state != replicator_pipeline::UserSyncState::RemovedUpstream)
            .count();
        out.push_str(&format!(
            "\nflow {} metadata sync on node {}: {} user(s), {} topic(s), synced {}\n",
            m.flow,
            m.node,
            in_sync,
            m.topics.len(),
            ago(m.last_run_unix_ms)
        ));
        for u in &m.users {
            // At home on the target: the reverse flow's status lists it.
            let quiet = matches!(
                u.state,
                replicator_pipeline::UserSyncState::InSync
                    | replicator_pipeline::UserSyncState::HomeOnTarget
            );
            if !quiet || !u.not_translated.is_empty() {
                let state = serde_json::to_value(u.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                out.push_str(&format!("  user {}: {state}", u.name));
                if !u.not_translated.is_empty() {
                    out.push_str(&format!(
                        " (not on the target: {})",
                        u.not_translated.join("; ")
                    ));
                }
                if let Some(note) = &u.note {
                    out.push_str(&format!(" ({note})"));
                }
                out.push('\n');
            }
        }
        for t in &m.topics {
            for d in &t.differences {
                out.push_str(&format!(
                    "  topic {}/{}: {} differs (upstream {}, target {})\n",
                    t.stream, t.topic, d.setting, d.upstream, d.target
                ));
            }
            for c in &t.conflicts {
                out.push_str(&format!(
                    "  topic {}/{}: {} changed on both clusters (upstream {}, target {}): \
                     conflict, {}'s value wins{}\n",
                    t.stream,
                    t.topic,
                    c.setting,
                    c.source,
                    c.target,
                    c.winner,
                    if c.applied_here { ", applied" } else { "" }
                ));
            }
        }
        for e in &m.errors {
            out.push_str(&format!("  sync error: {e}\n"));
        }
    }
    out
}

/// One line per member and flow that residency policies keep topics of from the flow's target:
/// the topics, each with its policy.
fn render_blocked(blocked: &[BlockedTopicView]) -> String {
    let mut flows: BTreeMap<(&str, NodeId, &str), Vec<String>> = BTreeMap::new();
    for b in blocked {
        let what = if b.heartbeat {
            format!(
                "heartbeats to {}/{} (policy {})",
                b.stream, b.topic, b.policy
            )
        } else {
            format!("{}/{} (policy {})", b.stream, b.topic, b.policy)
        };
        flows
            .entry((b.flow.as_str(), b.node, b.target.as_str()))
            .or_default()
            .push(what);
    }
    if flows.is_empty() {
        return String::new();
    }
    let mut out = "\n".to_owned();
    for ((flow, node, target), topics) in flows {
        out.push_str(&format!(
            "{flow:<10} {node:>5} blocked by residency policies, not written to {target}: {}\n",
            topics.join(", ")
        ));
    }
    out
}

fn render_units(view: &StatusView, live: &BTreeMap<String, LiveView>) -> String {
    let mut out = format!(
        "\n{:<14} {:<36} {:>5} {:>7} {:>12} {:>9} {:>10} {:>9}\n",
        "flow", "stream/topic/partition", "owner", "epoch", "confirmed", "lag", "msg/s", "p99 ms"
    );
    let dash = "-".to_owned();
    for unit in view.units.iter().filter(|u| !u.retired) {
        let l = live.get(&unit.unit.to_string());
        out.push_str(&format!(
            "{:<14} {:<36} {:>5} {:>7} {:>12} {:>9} {:>10} {:>9}\n",
            unit.unit.flow,
            format!(
                "{}/{}/{}",
                unit.unit.stream, unit.unit.topic, unit.unit.partition
            ),
            unit.owner.map_or(dash.clone(), |o| o.to_string()),
            unit.epoch.0,
            unit.confirmed_offset
                .map_or(dash.clone(), |o| o.to_string()),
            l.and_then(|l| l.lag)
                .map_or(dash.clone(), |v| v.to_string()),
            l.map_or(dash.clone(), |l| format!("{:.0}", l.rate)),
            l.and_then(|l| l.latency_p99_ms)
                .map_or(dash.clone(), |v| format!("{v:.1}")),
        ));
    }
    let retired = view.units.iter().filter(|u| u.retired).count();
    if retired > 0 {
        out.push_str(&format!("({retired} retired units not shown)\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_topics_render_one_line_per_flow_and_node_with_their_policies() {
        let blocked = |node: NodeId, flow: &str, stream: &str, heartbeat: bool| BlockedTopicView {
            node,
            flow: flow.to_owned(),
            target: "us".to_owned(),
            stream: stream.to_owned(),
            topic: "events".to_owned(),
            policy: "pii-stays-in-eu".to_owned(),
            heartbeat,
        };
        assert_eq!(render_blocked(&[]), "");
        let text = render_blocked(&[
            blocked(2, "eu-to-us", "pii-users", false),
            blocked(1, "eu-to-us", "pii-users", false),
            blocked(1, "eu-to-us", "pii-cards", false),
            blocked(1, "eu-to-us", "ops", true),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "",
                "eu-to-us       1 blocked by residency policies, not written to us: \
                 pii-users/events (policy pii-stays-in-eu), pii-cards/events (policy \
                 pii-stays-in-eu), heartbeats to ops/events (policy pii-stays-in-eu)",
                "eu-to-us       2 blocked by residency policies, not written to us: \
                 pii-users/events (policy pii-stays-in-eu)",
            ]
        );
    }

    #[test]
    fn metadata_sync_renders_a_summary_and_only_what_differs() {
        use replicator_pipeline::{
            SettingConflict, SettingDifference, TopicSettingsReport, UserReport, UserSyncState,
        };
        let user = |name: &str, state, not_translated: Vec<String>| UserReport {
            name: name.to_owned(),
            state,
            not_translated,
            home: None,
            note: None,
        };
        let view = FlowMetadataView {
            node: 2,
            flow: "us-to-eu".to_owned(),
            runs: 3,
            failed_runs: 0,
            users_changed: 1,
            settings_applied: 1,
            last_run_unix_ms: 0,
            users: vec![
                user("app-a", UserSyncState::InSync, Vec::new()),
                user(
                    "app-b",
                    UserSyncState::InSync,
                    vec!["stream audit: no flow to this target copies it".into()],
                ),
                user("app-c", UserSyncState::RemovedUpstream, Vec::new()),
                UserReport {
                    home: Some("eu".into()),
                    ..user("app-d", UserSyncState::HomeOnTarget, Vec::new())
                },
                UserReport {
                    note: Some("active on both us and eu and no home recorded".into()),
                    ..user("app-e", UserSyncState::Conflict, Vec::new())
                },
            ],
            topics: vec![TopicSettingsReport {
                stream: "orders".into(),
                topic: "created".into(),
                settings: BTreeMap::new(),
                changed: Vec::new(),
                differences: vec![SettingDifference {
                    setting: "message_expiry".into(),
                    upstream: "2h".into(),
                    target: "1h".into(),
                    kept: true,
                }],
                home: Some("us".into()),
                changed_on_target: Vec::new(),
                conflicts: vec![SettingConflict {
                    setting: "compression".into(),
                    source: "gzip".into(),
                    target: "none".into(),
                    winner: "us".into(),
                    applied_here: true,
                }],
            }],
            errors: vec!["users: get_users failed".into()],
        };
        let text = render_metadata(&[view]);
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert!(lines[0]
            .starts_with("flow us-to-eu metadata sync on node 2: 4 user(s), 1 topic(s), synced "));
        assert_eq!(
            &lines[1..],
            [
                "  user app-b: in_sync (not on the target: stream audit: no flow to this target copies it)",
                "  user app-c: removed_upstream",
                "  user app-e: conflict (active on both us and eu and no home recorded)",
                "  topic orders/created: message_expiry differs (upstream 2h, target 1h)",
                "  topic orders/created: compression changed on both clusters (upstream gzip, \
                 target none): conflict, us's value wins, applied",
                "  sync error: users: get_users failed",
            ]
        );
    }
}
