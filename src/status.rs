//! `iggy-replicator status` and `iggy-replicator cluster …`: clients of the admin API.
//!
//! `status` asks one node for the cluster view, then every member for the live figures of
//! the units it runs, and renders one table (refreshed with `--watch`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use replicator_model::NodeId;

use crate::admin::{
    AddMember, BlockedTopicView, FlowGroupsView, FlowMetadataView, LiveView, StatusView,
};
use crate::exit::Failure;

/// Where the admin API is and how to reach it.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ApiArgs {
    /// Admin API of any cluster member, `host:port`, `http://host:port` or `https://host:port`.
    #[arg(long, default_value = "127.0.0.1:7180", env = "REPLICATOR_API")]
    pub(crate) api: String,
    /// PEM CA that signed the admin API's certificate (`[node.api_tls]`); a `host:port`
    /// address is then reached over https.
    #[arg(long, env = "REPLICATOR_CA_FILE")]
    pub(crate) ca_file: Option<PathBuf>,
    /// PEM client certificate, when the admin API requires one (`client_ca_file`).
    #[arg(long, env = "REPLICATOR_CERT_FILE", requires = "key_file")]
    pub(crate) cert_file: Option<PathBuf>,
    /// The client certificate's PEM private key.
    #[arg(long, env = "REPLICATOR_KEY_FILE", requires = "cert_file")]
    pub(crate) key_file: Option<PathBuf>,
}

/// An HTTP client for the admin API of every member, and the scheme a bare `host:port` gets.
pub(crate) struct ApiClient {
    http: reqwest::Client,
    scheme: &'static str,
}

impl ApiArgs {
    /// The client these arguments describe; unreadable files are config errors (exit 2).
    pub(crate) fn client(&self) -> Result<ApiClient, Failure> {
        self.client_with_timeout(Duration::from_secs(60))
    }

    /// Like [`ApiArgs::client`], with calls bounded by `timeout`.
    pub(crate) fn client_with_timeout(&self, timeout: Duration) -> Result<ApiClient, Failure> {
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read(path)
                .map_err(|e| Failure::config(format!("{flag} {}: {e}", path.display())))
        };
        let mut builder = reqwest::Client::builder().timeout(timeout);
        if let Some(ca) = &self.ca_file {
            let cert = reqwest::Certificate::from_pem(&read("--ca-file", ca)?)
                .map_err(|e| Failure::config(format!("--ca-file {}: {e}", ca.display())))?;
            builder = builder.tls_certs_only([cert]);
        }
        if let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) {
            let mut pem = read("--cert-file", cert)?;
            pem.extend(read("--key-file", key)?);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| Failure::config(format!("--cert-file/--key-file: {e}")))?;
            builder = builder.identity(identity);
        }
        let http = builder.build().map_err(|e| {
            Failure::runtime(format!("cannot build an HTTP client: {e}"), "report a bug")
        })?;
        Ok(ApiClient {
            http,
            scheme: if self.ca_file.is_some() {
                "https"
            } else {
                "http"
            },
        })
    }
}

impl ApiClient {
    /// `path` on the admin API at `api` (a bare `host:port` gets this client's scheme).
    fn url(&self, api: &str, path: &str) -> String {
        format!("{}{path}", base_url(api, self.scheme))
    }

    /// A POST of `path` on the admin API at `api`.
    pub(crate) fn post(&self, api: &str, path: &str) -> reqwest::RequestBuilder {
        self.http.post(self.url(api, path))
    }
}

/// Where a mutating call goes, and its bearer token.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct MutationArgs {
    #[command(flatten)]
    pub(crate) api: ApiArgs,
    /// The admin token (`cluster.admin_token`; the cluster secret is not accepted).
    #[arg(long, env = "REPLICATOR_TOKEN", hide_env_values = true)]
    pub(crate) token: String,
}

impl MutationArgs {
    /// Sends the request `build` makes for `action` with the bearer token, and prints the
    /// answer (a refusal or a failure is the error).
    pub(crate) async fn send(
        &self,
        action: &str,
        build: impl FnOnce(&ApiClient, &str) -> reqwest::RequestBuilder,
    ) -> Result<(), Failure> {
        let body = self
            .call_json(Duration::from_secs(60), action, build)
            .await?;
        print!("{body}");
        Ok(())
    }

    /// POSTs `body` as JSON to `path` for `action`, bounded by `timeout`, and decodes the
    /// answer as a `T` (also returned as the raw text, for `--json`).
    pub(crate) async fn post_for<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        timeout: Duration,
        action: &str,
        path: &str,
        body: &B,
    ) -> Result<(T, String), Failure> {
        let answer = self
            .call_json(timeout, action, |client, api| {
                client.post(api, path).json(body)
            })
            .await?;
        let decoded = serde_json::from_str(&answer).map_err(|e| {
            Failure::runtime(
                format!("{action} answered something unexpected: {e}"),
                "is the node the same version as this command?",
            )
        })?;
        Ok((decoded, answer))
    }

    /// Like [`MutationArgs::send`], bounded by `timeout`, returning the answer's body.
    pub(crate) async fn call_json(
        &self,
        timeout: Duration,
        action: &str,
        build: impl FnOnce(&ApiClient, &str) -> reqwest::RequestBuilder,
    ) -> Result<String, Failure> {
        let client = self.api.client_with_timeout(timeout)?;
        let response = build(&client, &self.api.api)
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| unreachable(&self.api.api, e))?;
        mutation_result(response, action).await
    }
}

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

fn base_url(api: &str, scheme: &str) -> String {
    let trimmed = api.trim_end_matches('/');
    if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
        trimmed.to_owned()
    } else {
        format!("{scheme}://{trimmed}")
    }
}

fn unreachable(api: &str, e: reqwest::Error) -> Failure {
    Failure::runtime(
        format!("cannot reach the admin API at {api}: {e}"),
        "check --api (a member's node.api_addr) and that the node runs",
    )
}

/// Fetches `/status` from `api`.
async fn fetch_status(client: &ApiClient, api: &str) -> Result<StatusView, Failure> {
    let response = client
        .http
        .get(client.url(api, "/status"))
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
                client
                    .http
                    .post(client.url(api, "/cluster/members"))
                    .json(&body)
            })
            .await
        }
        ClusterCommand::Remove { call, id } => {
            call.send("remove", |client, api| {
                client
                    .http
                    .delete(client.url(api, &format!("/cluster/members/{id}")))
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

/// The body of a successful mutating call; a refusal or a failure is the error.
async fn mutation_result(response: reqwest::Response, action: &str) -> Result<String, Failure> {
    let code = response.status();
    let body = response.text().await.unwrap_or_default();
    if code.is_success() {
        Ok(body)
    } else if code == reqwest::StatusCode::CONFLICT || code == reqwest::StatusCode::NOT_FOUND {
        Err(Failure::runtime(
            format!("{action} refused: {}", body.trim()),
            "the answer above says why",
        ))
    } else if code == reqwest::StatusCode::UNAUTHORIZED {
        Err(Failure::runtime(
            format!("{action} refused: {}", body.trim()),
            "pass cluster.admin_token with --token or REPLICATOR_TOKEN",
        ))
    } else {
        Err(Failure::runtime(
            format!("{action} failed ({code}): {}", body.trim()),
            "see `iggy-replicator cluster status` and the nodes' logs",
        ))
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
    fn base_url_adds_scheme_and_trims_slash() {
        assert_eq!(base_url("10.0.0.1:7180", "http"), "http://10.0.0.1:7180");
        assert_eq!(base_url("10.0.0.1:7180", "https"), "https://10.0.0.1:7180");
        assert_eq!(base_url("http://h:1/", "https"), "http://h:1");
        assert_eq!(base_url("https://h:1", "http"), "https://h:1");
    }

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

    type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

    /// A CA and a certificate it signed for `san`: (CA PEM, cert PEM, key PEM).
    fn signed(
        ca: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
        san: &str,
    ) -> Result<(String, String), rcgen::Error> {
        let key = rcgen::KeyPair::generate()?;
        let cert = rcgen::CertificateParams::new(vec![san.to_owned()])?.signed_by(&key, ca)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    fn ca() -> Result<rcgen::CertifiedIssuer<'static, rcgen::KeyPair>, rcgen::Error> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate()?)
    }

    #[tokio::test]
    async fn the_cli_reaches_an_admin_api_that_requires_client_certificates() -> TestResult {
        use std::sync::Arc;

        use replicator_control::tls::{ServerTls, ServerTlsFiles};
        use tokio_util::sync::CancellationToken;

        use crate::admin::{serve, AdminState, NodeParts};
        use crate::metrics::Metrics;

        let dir = tempfile::tempdir()?;
        let write = |name: &str, text: &str| -> std::io::Result<PathBuf> {
            let path = dir.path().join(name);
            std::fs::write(&path, text)?;
            Ok(path)
        };
        let server_ca = ca()?;
        let client_ca = ca()?;
        let (cert, key) = signed(&server_ca, "127.0.0.1")?;
        let (client_cert, client_key) = signed(&client_ca, "operator")?;
        let files = ServerTlsFiles {
            cert_file: write("api.crt", &cert)?,
            key_file: write("api.key", &key)?,
            client_ca_file: Some(write("clients.crt", &client_ca.pem())?),
        };
        let config = replicator_config::parse_str(
            "[node]\nid = 1\ndata_dir = \"/tmp/unused\"\nraft_addr = \"127.0.0.1:1\"\napi_addr = \"127.0.0.1:2\"\n[cluster]\nsecret = \"0123456789abcdef\"\n",
            "test",
            |_| None,
        )?;
        let state = AdminState::new(
            Arc::new(NodeParts::new(Arc::from(Vec::new()))),
            Arc::new(Metrics::new()),
            &config,
            None,
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let api = listener.local_addr()?.to_string();
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            state,
            stop.clone(),
            Some(ServerTls::open(files)?),
        ));

        let args =
            |cert_file: Option<PathBuf>, key_file: Option<PathBuf>| -> std::io::Result<ApiArgs> {
                Ok(ApiArgs {
                    api: api.clone(),
                    ca_file: Some(write("server-ca.crt", &server_ca.pem())?),
                    cert_file,
                    key_file,
                })
            };
        let operator = args(
            Some(write("operator.crt", &client_cert)?),
            Some(write("operator.key", &client_key)?),
        )?
        .client()
        .map_err(|f| format!("{f:?}"))?;
        let health = operator
            .http
            .get(operator.url(&api, "/health"))
            .send()
            .await?;
        assert_eq!(health.status(), reqwest::StatusCode::OK);
        // Without a client certificate the handshake fails; plain HTTP gets no answer.
        let anonymous = args(None, None)?.client().map_err(|f| format!("{f:?}"))?;
        assert!(anonymous
            .http
            .get(anonymous.url(&api, "/health"))
            .send()
            .await
            .is_err());
        let plain = reqwest::Client::new()
            .get(format!("http://{api}/health"))
            .send()
            .await;
        assert!(plain.is_err() || plain.is_ok_and(|r| !r.status().is_success()));

        stop.cancel();
        server.await?;
        Ok(())
    }
}
