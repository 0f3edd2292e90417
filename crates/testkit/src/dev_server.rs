//! The standalone server: `iggy-replicator dev-server --port 8090 [--data-dir DIR]`, so a person
//! or a script can point any Iggy 0.8-compatible client at it.

use crate::{IggyVersion, Result, TestServer, TestServerConfig};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

/// Command-line arguments of `dev-server`.
#[derive(Debug, Clone, clap::Args)]
pub struct DevServerArgs {
    /// TCP port to listen on (0 picks a free port and prints it).
    #[arg(long, default_value_t = 8090)]
    pub port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Root user name.
    #[arg(long, default_value = "iggy")]
    pub username: String,
    /// Root password.
    #[arg(long, default_value = "iggy")]
    pub password: String,
    /// Keep everything in memory only (the default when no --data-dir is given).
    #[arg(long, conflicts_with = "data_dir")]
    pub data_in_memory: bool,
    /// Persist streams, topics, messages and consumer offsets in this directory and load them
    /// again at the next start. Metadata and offsets are written atomically and fsynced;
    /// message appends are not fsynced (a killed process loses nothing, a power loss can lose
    /// the newest messages).
    #[arg(long, value_name = "PATH")]
    pub data_dir: Option<PathBuf>,
    /// The protocol generation to speak: "0.8" (SDK 0.10) or "0.9" (SDK 0.11).
    #[arg(long, default_value_t = IggyVersion::V0_8)]
    pub iggy_version: IggyVersion,
}

/// Serves until Ctrl-C or SIGTERM, then shuts down cleanly.
pub async fn run(args: DevServerArgs) -> Result<()> {
    run_until(args, wait_for_signal()).await
}

/// Serves until `shutdown` completes (what `run` does with the process signals).
pub async fn run_until(args: DevServerArgs, shutdown: impl Future<Output = ()>) -> Result<()> {
    let server = TestServer::start(config(args)).await?;
    println!(
        "iggy-compatible dev server (Iggy {}) listening on {}",
        server.iggy_version(),
        server.addr()
    );
    println!("connection string: {}", server.connection_string());
    shutdown.await;
    tracing::info!("shutting down");
    server.shutdown().await;
    Ok(())
}

fn config(args: DevServerArgs) -> TestServerConfig {
    TestServerConfig {
        root_username: args.username,
        root_password: args.password,
        bind: SocketAddr::new(args.host, args.port),
        iggy_version: args.iggy_version,
        data_dir: if args.data_in_memory {
            None
        } else {
            args.data_dir
        },
        ..TestServerConfig::default()
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM, waiting for Ctrl-C only");
                if let Err(e) = tokio::signal::ctrl_c().await {
                    tracing::warn!(error = %e, "cannot watch Ctrl-C");
                }
            }
        }
    }
    #[cfg(not(unix))]
    if let Err(e) = tokio::signal::ctrl_c().await {
        tracing::warn!(error = %e, "cannot watch Ctrl-C");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use assert2::check;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: DevServerArgs,
    }

    #[test]
    fn defaults_are_the_real_server_port_and_credentials() {
        let cli = Cli::try_parse_from(["dev-server"]).expect("defaults parse");
        let c = config(cli.args);
        check!(c.bind == SocketAddr::from(([127, 0, 0, 1], 8090)));
        check!(c.root_username == "iggy");
        check!(c.root_password == "iggy");
        check!(c.data_dir.is_none());
        check!(c.iggy_version == IggyVersion::V0_8);
    }

    #[test]
    fn the_generation_is_chosen_by_name_and_a_wrong_one_is_refused() {
        let cli = Cli::try_parse_from(["dev-server", "--iggy-version", "0.9"]).expect("0.9 parses");
        check!(config(cli.args).iggy_version == IggyVersion::V0_9);
        let wrong = Cli::try_parse_from(["dev-server", "--iggy-version", "1.0"]);
        let message = wrong.err().map(|e| e.to_string()).unwrap_or_default();
        check!(message.contains("expected \"0.8\" or \"0.9\""));
    }

    #[test]
    fn data_in_memory_conflicts_with_data_dir() {
        check!(Cli::try_parse_from(["dev-server", "--data-in-memory", "--data-dir", "x"]).is_err());
        let cli = Cli::try_parse_from(["dev-server", "--data-dir", "/tmp/x", "--port", "0"])
            .expect("parse");
        check!(config(cli.args).data_dir == Some(PathBuf::from("/tmp/x")));
    }

    #[tokio::test]
    async fn run_until_serves_until_the_shutdown_future_completes() {
        let cli = Cli::try_parse_from(["dev-server", "--port", "0"]).expect("parse");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run_until(cli.args, async {
            let _ = rx.await;
        }));
        tokio::task::yield_now().await;
        check!(tx.send(()).is_ok());
        let result = tokio::time::timeout(std::time::Duration::from_secs(10), task).await;
        check!(matches!(result, Ok(Ok(Ok(())))));
    }
}
