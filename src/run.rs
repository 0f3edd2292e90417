//! `iggy-replicator run`: one cluster member until SIGTERM/SIGINT, then a drain.

use std::path::Path;

use tracing::{info, warn};

use crate::exit::Failure;
use crate::node::RunningNode;

/// Runs a node from its config file until a stop signal, then drains.
pub(crate) async fn run(config_path: &Path) -> Result<(), Failure> {
    let config = replicator_config::load_file(config_path)?;
    let node = RunningNode::start(&config, None).await?;
    wait_for_stop_signal().await;
    info!("stop signal received, draining");
    node.shutdown().await;
    Ok(())
}

/// Waits for SIGTERM or Ctrl-C (SIGINT).
pub(crate) async fn wait_for_stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the node");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
