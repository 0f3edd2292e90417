//! The standalone server: `iggy-replicator dev-server --port 8090 [--data-dir DIR]`, so a person
//! or a script can point any Iggy 0.8-compatible client at it.

use crate::{Result, TestServer, TestServerConfig};
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
}

/// Serves until Ctrl-C or SIGTERM, then shuts down cleanly.
pub async fn run(args: DevServerArgs) -> Result<()> {
    let config = TestServerConfig {
        root_username: args.username,
        root_password: args.password,
        bind: SocketAddr::new(args.host, args.port),
        data_dir: if args.data_in_memory {
            None
        } else {
            args.data_dir
        },
        ..TestServerConfig::default()
    };
    let server = TestServer::start(config).await?;
    println!("iggy-compatible dev server listening on {}", server.addr());
    println!("connection string: {}", server.connection_string());
    wait_for_signal().await;
    tracing::info!("shutting down");
    server.shutdown().await;
    Ok(())
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
