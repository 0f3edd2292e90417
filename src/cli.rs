//! The subcommands and their arguments. Each `--help` carries examples.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::exit::Failure;
use crate::logging::LogFormat;

/// Highly available replication of Apache Iggy topics between clusters.
#[derive(Debug, Parser)]
#[command(name = "iggy-replicator", version, about, long_about = None)]
pub(crate) struct Cli {
    /// Log line format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    pub(crate) log_format: LogFormat,
    /// Log filter (e.g. `info`, `debug`, `replicator_pipeline=debug`); default `RUST_LOG` or `info`.
    #[arg(long, global = true)]
    pub(crate) log_level: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// See it work: two in-process Iggy servers, a three-node replicator cluster, a producer,
    /// a node killed halfway, and a final verification. Needs nothing installed.
    #[command(
        after_help = "Examples:\n  iggy-replicator demo\n  iggy-replicator demo --messages 500000 --rate 50000\n  iggy-replicator demo --source-url iggy://iggy:iggy@127.0.0.1:8090 --target-url iggy://iggy:iggy@127.0.0.1:8091\n  iggy-replicator demo --migrate   # an Iggy 0.8 source, an Iggy 0.9 target"
    )]
    #[cfg(feature = "dev-tools")]
    Demo(crate::demo::DemoArgs),
    /// Check a config file and exit: 0 when valid, 2 with every problem listed otherwise.
    #[command(
        after_help = "Example:\n  iggy-replicator check-config --config /etc/iggy-replicator/replicator.toml"
    )]
    CheckConfig {
        /// The node's config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Run one replicator node (a member of the Raft cluster) until SIGTERM/Ctrl-C, then drain;
    /// SIGHUP reloads the config file.
    #[command(
        after_help = "Examples:\n  REPLICATOR_SECRET=... iggy-replicator run --config /etc/iggy-replicator/replicator.toml\n  kill -HUP <pid>   # reload the edited config file (or POST /config/reload)"
    )]
    Run {
        /// The node's config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Compare upstream and downstream partition by partition; exit 0 only for an exact copy (3 otherwise).
    #[command(
        after_help = "Examples:\n  iggy-replicator verify --config replicator.toml\n  iggy-replicator verify --config replicator.toml --flow us-to-eu --wait 60s"
    )]
    Verify {
        /// A node's config file (its clusters and flows are used).
        #[arg(long, short)]
        config: PathBuf,
        /// Only this flow (default: every flow).
        #[arg(long)]
        flow: Option<String>,
        /// Keep re-checking for up to this long while the downstream catches up (e.g. `30s`).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
        wait: std::time::Duration,
    },
    /// Show the cluster: members, and every partition with owner, epoch, confirmed offset, lag,
    /// rate and latency (refreshed live with --watch).
    #[command(
        after_help = "Examples:\n  iggy-replicator status --api 10.0.0.1:7180\n  iggy-replicator status --watch --interval 2s"
    )]
    Status {
        #[command(flatten)]
        api: crate::api_client::ApiArgs,
        /// Redraw until Ctrl-C.
        #[arg(long)]
        watch: bool,
        /// Refresh period with --watch.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
        interval: std::time::Duration,
    },
    /// Change or show the cluster's membership through a member's admin API.
    #[command(
        subcommand,
        after_help = "Examples:\n  iggy-replicator cluster status --api 10.0.0.1:7180\n  REPLICATOR_TOKEN=... iggy-replicator cluster remove --api 10.0.0.1:7180 --id 3"
    )]
    Cluster(crate::status::ClusterCommand),
    /// Pause, resume, reset or promote (cut over) a flow through a member's admin API.
    #[command(
        subcommand,
        after_help = "Examples:\n  REPLICATOR_TOKEN=... iggy-replicator flow pause us-to-eu --api 10.0.0.1:7180\n  REPLICATOR_TOKEN=... iggy-replicator flow promote us-to-eu --api 10.0.0.1:7180"
    )]
    Flow(crate::flow::FlowCommand),
    /// Run the Iggy-compatible test server (speaks the Iggy 0.8 TCP protocol) for local experiments.
    #[command(
        after_help = "Examples:\n  iggy-replicator dev-server --port 8090 --data-in-memory\n  iggy-replicator dev-server --port 8091 --iggy-version 0.9"
    )]
    #[cfg(feature = "dev-tools")]
    DevServer(replicator_testkit::dev_server::DevServerArgs),
    /// Print every metric family `/metrics` exports, one `<family> <type>` per line (for the
    /// deploy checks: dashboards and alerts must query only these).
    #[command(hide = true)]
    MetricNames,
}

/// Runs one subcommand to completion.
pub(crate) async fn dispatch(command: Command) -> Result<(), Failure> {
    match command {
        Command::CheckConfig { config } => {
            let loaded = replicator_config::load_file(&config)?;
            println!(
                "{}: valid (node {}, {} flow(s), {} cluster alias(es))",
                config.display(),
                loaded.node.id,
                loaded.flows.len(),
                loaded.clusters.len()
            );
            Ok(())
        }
        #[cfg(feature = "dev-tools")]
        Command::Demo(args) => crate::demo::run(args).await,
        Command::Run { config } => crate::run::run(&config).await,
        Command::Verify { config, flow, wait } => {
            crate::verify::run(&config, flow.as_deref(), wait).await
        }
        Command::Status {
            api,
            watch,
            interval,
        } => crate::status::status(api, watch, interval).await,
        Command::Cluster(command) => crate::status::cluster(command).await,
        Command::Flow(command) => crate::flow::run(command).await,
        #[cfg(feature = "dev-tools")]
        Command::DevServer(args) => replicator_testkit::dev_server::run(args)
            .await
            .map_err(|e| Failure::runtime(format!("dev server failed: {e}"), "is the port free?")),
        Command::MetricNames => {
            let families = crate::metrics::families().map_err(|e| {
                Failure::runtime(format!("cannot render the metrics: {e}"), "this is a bug")
            })?;
            for (family, kind) in families {
                println!("{family} {kind}");
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// Every command an operator can run shows examples under `--help`.
    #[test]
    fn every_visible_command_has_examples() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for sub in command.get_subcommands().filter(|c| !c.is_hide_set()) {
                let path = format!("{path} {}", sub.get_name());
                let help = sub
                    .get_after_help()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                if !help.contains("Example") {
                    missing.push(path.clone());
                }
                walk(sub, &path, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "iggy-replicator", &mut missing);
        assert!(missing.is_empty(), "no examples in --help of: {missing:?}");
    }
}
