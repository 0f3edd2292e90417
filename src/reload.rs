//! Config agreement and reload.
//!
//! Every node publishes a digest of each of its flows (`replicator_config::flow_digests`) to
//! the control plane, at start and after every reload ([`ConfigPublisher`]); the leader grants a
//! flow's units only to nodes whose digest equals its own, `status` lists the nodes that
//! disagree and their `/ready` answers 503 meanwhile.
//!
//! `SIGHUP` and `POST /config/reload` re-read the config file and check it like
//! `check-config`. A file that is invalid, or that changes what only a restart can apply
//! (`[node]`, `[cluster]`, `[clusters.*]`: addresses, the Raft group, the target fences), is
//! refused with the reasons and the running config stays. Otherwise the node's pipeline is
//! replaced: units of flows whose digest did not change stop after their final commit and stay
//! this node's (the next pipeline resumes them under the same epochs), units of changed and
//! removed flows are handed back; then the new pipeline starts and the new digests are
//! published.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use replicator_config::Config;
use replicator_control::Control;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// How long the publisher waits before it tries a failed publish again (no leader, say).
const PUBLISH_RETRY: Duration = Duration::from_secs(1);

/// What a reload changed, by flow name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ReloadReport {
    /// Flows new in the file: they start.
    pub(crate) added: Vec<String>,
    /// Flows gone from the file: their units are handed back.
    pub(crate) removed: Vec<String>,
    /// Flows whose config changed: handed back and started again with the new config.
    pub(crate) changed: Vec<String>,
    /// Flows left as they were: they keep their units.
    pub(crate) unchanged: Vec<String>,
    /// Whether `[pipeline]` changed (every flow's units then restart with it, kept).
    pub(crate) pipeline_changed: bool,
}

impl ReloadReport {
    /// Compares the flow digests of the running config and of the new one.
    pub(crate) fn between(
        old: &BTreeMap<String, String>,
        new: &BTreeMap<String, String>,
        pipeline_changed: bool,
    ) -> Self {
        let mut report = Self {
            pipeline_changed,
            ..Self::default()
        };
        for (flow, digest) in new {
            match old.get(flow) {
                None => report.added.push(flow.clone()),
                Some(d) if d == digest => report.unchanged.push(flow.clone()),
                Some(_) => report.changed.push(flow.clone()),
            }
        }
        report.removed = old
            .keys()
            .filter(|f| !new.contains_key(*f))
            .cloned()
            .collect();
        report
    }

    /// Whether the new config runs exactly as the old one: nothing to do.
    pub(crate) fn is_noop(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.changed.is_empty()
            && !self.pipeline_changed
    }

    /// The flows whose units the node keeps across the reload.
    pub(crate) fn kept(&self) -> BTreeSet<String> {
        self.unchanged.iter().cloned().collect()
    }

    /// One line for logs and the API answer.
    pub(crate) fn summary(&self) -> String {
        if self.is_noop() {
            return "config reloaded: nothing changed".to_owned();
        }
        let list = |flows: &[String]| {
            if flows.is_empty() {
                "-".to_owned()
            } else {
                flows.join(", ")
            }
        };
        format!(
            "config reloaded: added {}; removed {}; changed {}; unchanged {}{}",
            list(&self.added),
            list(&self.removed),
            list(&self.changed),
            list(&self.unchanged),
            if self.pipeline_changed {
                "; [pipeline] changed"
            } else {
                ""
            }
        )
    }
}

/// What in `new` only a restart applies, one reason per section or cluster (empty: the reload
/// can apply it). Sections compare with their secrets.
pub(crate) fn needs_restart(old: &Config, new: &Config) -> Vec<String> {
    let mut reasons = Vec::new();
    if old.node != new.node {
        reasons.push("[node] changed".to_owned());
    }
    if old.cluster != new.cluster {
        reasons.push("[cluster] changed".to_owned());
    }
    let aliases: BTreeSet<&String> = old.clusters.keys().chain(new.clusters.keys()).collect();
    for alias in aliases {
        if old.clusters.get(alias) != new.clusters.get(alias) {
            reasons.push(format!("[clusters.{alias}] added, removed or changed"));
        }
    }
    reasons
}

/// Publishes this node's flow digests to the control plane: the latest value set, once it
/// changed, retrying every [`PUBLISH_RETRY`] while the write fails, and again whenever the
/// applied digests are not the ones published (an earlier process's `PublishConfig`, a
/// forwarded write retried after its answer was lost, can be applied after this one's; the
/// node then works on none of the changed flows' units until it is corrected). Each value set
/// is numbered, so that a reload can wait until its own is committed. Stopped when dropped.
pub(crate) struct ConfigPublisher {
    /// The digests to publish, numbered.
    digests: watch::Sender<(u64, BTreeMap<String, String>)>,
    /// The number of the latest digests committed.
    published: watch::Receiver<u64>,
    task: JoinHandle<()>,
}

impl ConfigPublisher {
    /// Starts publishing `digests` through `control`.
    pub(crate) fn start(control: Control, digests: BTreeMap<String, String>) -> Self {
        let (tx, mut rx) = watch::channel((1, digests));
        let (done, published) = watch::channel(0);
        let task = tokio::spawn(async move {
            loop {
                let (number, current) = rx.borrow_and_update().clone();
                match control.publish_config(current).await {
                    Ok(()) => {
                        done.send_replace(number);
                        loop {
                            tokio::select! {
                                changed = rx.changed() => if changed.is_err() { return } else { break },
                                () = tokio::time::sleep(PUBLISH_RETRY) => {
                                    if !control.running_config_applied() {
                                        warn!("the applied config digests are not this node's (an earlier write applied late); publishing again");
                                        break;
                                    }
                                }
                            }
                        }
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot publish the config digests yet; retrying");
                        tokio::time::sleep(PUBLISH_RETRY).await;
                    }
                }
            }
        });
        Self {
            digests: tx,
            published,
            task,
        }
    }

    /// Publishes `digests` from now on (replacing a publish still retrying) and waits up to
    /// `wait` until they are committed; `false` if they are not yet (the publisher goes on).
    pub(crate) async fn publish(&self, digests: BTreeMap<String, String>, wait: Duration) -> bool {
        let mut number = 0;
        self.digests.send_modify(|(n, d)| {
            *n += 1;
            number = *n;
            *d = digests;
        });
        let mut published = self.published.clone();
        let committed = tokio::time::timeout(wait, published.wait_for(|n| *n >= number))
            .await
            .is_ok_and(|seen| seen.is_ok());
        committed
    }
}

impl Drop for ConfigPublisher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A reload asked through the admin API, answered by the node's run loop.
pub(crate) struct ReloadRequest {
    /// The answer: what changed, or why the running config stays.
    pub(crate) reply: oneshot::Sender<Result<ReloadReport, String>>,
}

/// The admin API's way to the run loop (none for nodes not run from a file: demo, tests).
pub(crate) type ReloadSender = mpsc::Sender<ReloadRequest>;

/// Logs a reload's outcome (SIGHUP has nobody else to tell).
pub(crate) fn log_outcome(outcome: &Result<ReloadReport, String>) {
    match outcome {
        Ok(report) => info!("{}", report.summary()),
        Err(reason) => warn!(%reason, "config reload refused; the running config stays"),
    }
}

#[cfg(test)]
mod tests {
    use replicator_config::testing::MinimalConfig;

    use super::*;

    fn digests(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(f, d)| ((*f).to_owned(), (*d).to_owned()))
            .collect()
    }

    #[test]
    fn flows_are_added_removed_changed_or_kept_by_digest() {
        let old = digests(&[("a", "1"), ("b", "2"), ("c", "3")]);
        let new = digests(&[("a", "1"), ("b", "9"), ("d", "4")]);
        let report = ReloadReport::between(&old, &new, false);
        assert_eq!(report.added, vec!["d"]);
        assert_eq!(report.removed, vec!["c"]);
        assert_eq!(report.changed, vec!["b"]);
        assert_eq!(report.kept(), BTreeSet::from(["a".to_owned()]));
        assert!(!report.is_noop());
        assert!(report.summary().contains("changed b"));
        let same = ReloadReport::between(&old, &old, false);
        assert!(same.is_noop());
        assert!(!ReloadReport::between(&old, &old, true).is_noop());
    }

    #[test]
    fn node_cluster_and_clusters_sections_need_a_restart() -> Result<(), replicator_config::Error> {
        let base = MinimalConfig::default();
        let old = base.parse()?;
        let flows_only = MinimalConfig {
            include: vec!["orders/*".into()],
            flow_extra: "batch_size = 10".into(),
            ..base.clone()
        }
        .parse()?;
        assert!(needs_restart(&old, &flows_only).is_empty());
        let moved = MinimalConfig {
            api_addr: "127.0.0.1:9".into(),
            ..base.clone()
        }
        .parse()?;
        assert_eq!(needs_restart(&old, &moved), vec!["[node] changed"]);
        let secret = MinimalConfig {
            secret: "another-secret-0123456789".into(),
            ..base.clone()
        }
        .parse()?;
        assert_eq!(needs_restart(&old, &secret), vec!["[cluster] changed"]);
        let password = MinimalConfig {
            eu_url: "iggy://iggy:other@127.0.0.1:8091".into(),
            ..base
        }
        .parse()?;
        assert_eq!(
            needs_restart(&old, &password),
            vec!["[clusters.eu] added, removed or changed"]
        );
        Ok(())
    }
}
