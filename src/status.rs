//! `iggy-replicator status` and `iggy-replicator cluster …`: clients of the admin API.
//!
//! `status` asks one node for the cluster view, then every member for the live figures of
//! the units it runs, and renders one table (refreshed with `--watch`).

use std::collections::BTreeMap;
use std::time::Duration;

use replicator_model::NodeId;

use crate::admin::{AddMember, LiveView, StatusView};
use crate::exit::Failure;

/// Where the admin API is and how to authenticate.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ApiArgs {
    /// Admin API of any cluster member, `host:port` or `http://host:port`.
    #[arg(long, default_value = "127.0.0.1:7180", env = "REPLICATOR_API")]
    pub(crate) api: String,
}

/// Bearer token of mutating calls.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct TokenArgs {
    /// The cluster secret or the admin token.
    #[arg(long, env = "REPLICATOR_TOKEN", hide_env_values = true)]
    pub(crate) token: String,
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
        api: ApiArgs,
        #[command(flatten)]
        token: TokenArgs,
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
        api: ApiArgs,
        #[command(flatten)]
        token: TokenArgs,
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

fn base_url(api: &str) -> String {
    let trimmed = api.trim_end_matches('/');
    if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
        trimmed.to_owned()
    } else {
        format!("http://{trimmed}")
    }
}

fn http() -> Result<reqwest::Client, Failure> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| Failure::runtime(format!("cannot build an HTTP client: {e}"), "report a bug"))
}

fn unreachable(api: &str, e: reqwest::Error) -> Failure {
    Failure::runtime(
        format!("cannot reach the admin API at {api}: {e}"),
        "check --api (a member's node.api_addr) and that the node runs",
    )
}

/// Fetches `/status` from `api`.
async fn fetch_status(client: &reqwest::Client, api: &str) -> Result<StatusView, Failure> {
    let response = client
        .get(format!("{}/status", base_url(api)))
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
    let client = http()?;
    match command {
        ClusterCommand::Add {
            api,
            token,
            id,
            raft_addr,
            api_addr,
        } => {
            let response = client
                .post(format!("{}/cluster/members", base_url(&api.api)))
                .bearer_auth(&token.token)
                .json(&AddMember {
                    id,
                    raft_addr,
                    api_addr,
                })
                .send()
                .await
                .map_err(|e| unreachable(&api.api, e))?;
            mutation_result(response, "add").await
        }
        ClusterCommand::Remove { api, token, id } => {
            let response = client
                .delete(format!("{}/cluster/members/{id}", base_url(&api.api)))
                .bearer_auth(&token.token)
                .send()
                .await
                .map_err(|e| unreachable(&api.api, e))?;
            mutation_result(response, "remove").await
        }
        ClusterCommand::Status { api } => {
            let view = fetch_status(&client, &api.api).await?;
            print!("{}", render_members(&view));
            Ok(())
        }
    }
}

async fn mutation_result(response: reqwest::Response, action: &str) -> Result<(), Failure> {
    let code = response.status();
    let body = response.text().await.unwrap_or_default();
    if code.is_success() {
        print!("{body}");
        Ok(())
    } else if code == reqwest::StatusCode::UNAUTHORIZED {
        Err(Failure::runtime(
            format!("{action} refused: {}", body.trim()),
            "pass the cluster secret or admin token with --token or REPLICATOR_TOKEN",
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
    let client = http()?;
    loop {
        let view = fetch_status(&client, &api.api).await?;
        let live = collect_live(&client, &view).await;
        let table = render_units(&view, &live);
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

/// Live figures of every unit, from the members that run them (unreachable members are skipped).
async fn collect_live(client: &reqwest::Client, view: &StatusView) -> BTreeMap<String, LiveView> {
    let mut live = BTreeMap::new();
    let mut collect = |v: &StatusView| {
        for unit in &v.units {
            if let Some(l) = &unit.live {
                live.insert(unit.unit.to_string(), l.clone());
            }
        }
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
    out.push_str(&format!(
        "{:>6}  {:<22} {:<22} {:<7} {:<7} {:>6}\n",
        "node", "raft", "api", "voter", "lease", "units"
    ));
    for m in &view.members {
        out.push_str(&format!(
            "{:>6}  {:<22} {:<22} {:<7} {:<7} {:>6}\n",
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
        assert_eq!(base_url("10.0.0.1:7180"), "http://10.0.0.1:7180");
        assert_eq!(base_url("http://h:1/"), "http://h:1");
        assert_eq!(base_url("https://h:1"), "https://h:1");
    }
}
