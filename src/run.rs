//! `iggy-replicator run`: one cluster member until SIGTERM/SIGINT, then a drain; SIGHUP
//! reloads the config file (see `reload.rs`).
//!
//! The stop signals are listened for before anything is bound, so a node obeys SIGTERM from
//! the moment its admin API answers, also while it is still starting (waiting for a quorum,
//! say): the start is given up and what already started is stopped, in reverse order. A second
//! signal during a start or a drain ends the process at once, with exit code 1. A pipeline whose
//! coordinator keeps dying (see `replicator_pipeline::Pipeline::gave_up`) stops the node with
//! exit code 1 too, for the process supervisor to start it again.

use std::path::Path;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::exit::Failure;
use crate::node::{NodeListeners, RunningNode};
use crate::reload::{ReloadReport, ReloadRequest};

/// Runs a node from its config file until a stop signal, then drains.
pub(crate) async fn run(config_path: &Path) -> Result<(), Failure> {
    let config = replicator_config::load_file(config_path)?;
    let signals = StopSignals::install();
    let stop = CancellationToken::new();
    let force = CancellationToken::new();
    let watcher = Watcher(tokio::spawn(signals.forward(stop.clone(), force.clone())));
    let outcome = tokio::select! {
        outcome = run_node(config_path, &config, &stop) => outcome,
        () = force.cancelled() => Err(Failure::runtime(
            "second stop signal: exiting without finishing the start or the drain",
            "units not released are taken over by other members once this node's lease expires",
        )),
    };
    drop(watcher);
    outcome
}

/// Binds, starts (unless `stop` comes first), runs until `stop` (reloading `config_path` on
/// SIGHUP and `POST /config/reload`, one reload at a time), drains.
async fn run_node(
    config_path: &Path,
    config: &replicator_config::Config,
    stop: &CancellationToken,
) -> Result<(), Failure> {
    let listeners = tokio::select! {
        biased;
        () = stop.cancelled() => return Ok(()),
        listeners = NodeListeners::bind(config) => listeners?,
    };
    let (reloads, mut requests) = mpsc::channel::<ReloadRequest>(4);
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            warn!(error = %e, "cannot listen for SIGHUP; reload through POST /config/reload");
            None
        }
    };
    let Some(mut node) = RunningNode::start_until(config, listeners, stop, Some(reloads)).await?
    else {
        info!("stopped while starting");
        return Ok(());
    };
    loop {
        // Asked again on every turn: a reload replaces the pipeline.
        let gave_up = node.pipeline_gave_up();
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            () = gave_up => {
                warn!("the pipeline's coordinator kept dying: stopping the node");
                node.shutdown().await;
                return Err(Failure::runtime(
                    "the pipeline's coordinator kept dying and is not restarted again",
                    "see the errors logged before; the process supervisor (systemd, Kubernetes) should start the node again",
                ));
            }
            Some(()) = recv(&mut hangups) => {
                info!(config = %config_path.display(), "SIGHUP: reloading the config");
                let outcome = reload(&mut node, config_path).await;
                crate::reload::log_outcome(&outcome);
            }
            Some(request) = requests.recv() => {
                info!(config = %config_path.display(), "reload requested through the admin API");
                let outcome = reload(&mut node, config_path).await;
                crate::reload::log_outcome(&outcome);
                let _ = request.reply.send(outcome);
            }
        }
    }
    info!("stop signal received, draining");
    node.shutdown().await;
    Ok(())
}

/// The next signal, or `None` forever when it could not be registered.
async fn recv(signal: &mut Option<Signal>) -> Option<()> {
    match signal {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// Re-reads `path`, checked like `check-config`, and applies it to `node`.
async fn reload(node: &mut RunningNode, path: &Path) -> Result<ReloadReport, String> {
    let config = replicator_config::load_file(path).map_err(|e| e.to_string())?;
    node.reload(config).await
}

/// The signal-forwarding task; aborted when dropped.
struct Watcher(JoinHandle<()>);

impl Drop for Watcher {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// SIGTERM and SIGINT (Ctrl-C), registered when installed.
struct StopSignals {
    /// SIGTERM, unless it could not be registered.
    term: Option<Signal>,
    /// SIGINT, unless it could not be registered.
    interrupt: Option<Signal>,
}

impl StopSignals {
    /// Registers both signals now (a signal that arrives later is never lost to the default
    /// action, which would end the process without a drain).
    fn install() -> Self {
        let register = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(s) => Some(s),
            Err(e) => {
                warn!(error = %e, signal = name, "cannot listen for the stop signal");
                None
            }
        };
        Self {
            term: register(SignalKind::terminate(), "SIGTERM"),
            interrupt: register(SignalKind::interrupt(), "SIGINT"),
        }
    }

    /// Waits for the next SIGTERM or SIGINT (forever when neither could be registered).
    async fn next(&mut self) {
        async fn recv(signal: &mut Option<Signal>) {
            if let Some(s) = signal {
                if s.recv().await.is_some() {
                    return;
                }
            }
            std::future::pending().await
        }
        tokio::select! {
            () = recv(&mut self.term) => {}
            () = recv(&mut self.interrupt) => {}
        }
    }

    /// Cancels `stop` at the first signal and `force` at the second.
    async fn forward(mut self, stop: CancellationToken, force: CancellationToken) {
        self.next().await;
        stop.cancel();
        self.next().await;
        warn!("second stop signal: exiting now");
        force.cancel();
    }
}
