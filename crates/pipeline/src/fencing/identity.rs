//! Which connections a writer sends with: on a target cluster with fencing on, the node's
//! current writer identity (see `replicator_model::WriterLogin`); otherwise the cluster's
//! configured credential.
//!
//! The control plane publishes the identity; [`follow`] turns every change into a fresh set of
//! connections and closes the previous set for good (never opened again), so that nothing
//! this node sends after a fence or a rejoin goes out under an identity that is no longer its
//! current one. A pair resolves its writer's connections when it starts: with no identity yet
//! (or a fenced one) the unit waits, and the coordinator retries on the next change.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use replicator_model::WriterLogin;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::clients::{Cluster, LoginRefusals};
use crate::control::ControlPlane;
use crate::error::Result;
use crate::fencing::handover::Handover;
use crate::params::ClusterParams;

/// One target cluster as writers see it.
enum Target {
    /// Fencing off: the cluster's shared connections (configured credential).
    Shared(Arc<Cluster>),
    /// Fencing on: connections logged in as the current identity, if there is one.
    Fenced {
        params: ClusterParams,
        prefix: String,
        current: Option<Arc<Cluster>>,
    },
}

/// The writers' connections to every target cluster, swapped whenever this node's writer
/// identity changes.
pub(crate) struct WriterTargets {
    targets: Mutex<BTreeMap<String, Target>>,
    /// Bumped on every swap, so the coordinator can retry units that waited for an identity.
    version: watch::Sender<u64>,
    /// Where the fenced targets report the incarnation of each refused login (see [`follow`]).
    refused: tokio::sync::mpsc::Sender<u64>,
    /// The other end, held by the [`follow`] running now (a follower restarted after a panic
    /// takes it again).
    refusals: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<u64>>,
    /// The login the fenced targets were last switched to (`None` before the first switch),
    /// so that a restarted [`follow`] does not replace connections that are already right.
    applied: Mutex<Option<Option<WriterLogin>>>,
    /// Bound of every call on the writers' connections.
    timeout: Duration,
    /// By when every send of this node's earlier writers has landed (see [`Handover`]).
    earlier_sends_landed_by: Instant,
}

impl WriterTargets {
    /// Targets for `clusters` (alias → params); `shared` holds the clusters' configured
    /// connections, used as they are for the targets without fencing. Built when the pipeline
    /// starts, after every earlier writer of this node ended: their sends have landed
    /// `send_lease_margin` later.
    pub(crate) fn new(
        clusters: &BTreeMap<String, ClusterParams>,
        shared: &BTreeMap<String, Arc<Cluster>>,
        timeout: Duration,
        send_lease_margin: Duration,
    ) -> Self {
        let targets = clusters
            .iter()
            .filter_map(|(alias, params)| {
                let target = match &params.writer_user_prefix {
                    Some(prefix) => Target::Fenced {
                        params: params.clone(),
                        prefix: prefix.clone(),
                        current: None,
                    },
                    None => Target::Shared(shared.get(alias)?.clone()),
                };
                Some((alias.clone(), target))
            })
            .collect();
        let (refused, refusals) = tokio::sync::mpsc::channel(REFUSALS_QUEUED);
        Self {
            targets: Mutex::new(targets),
            version: watch::channel(0).0,
            refused,
            refusals: tokio::sync::Mutex::new(refusals),
            applied: Mutex::new(None),
            timeout,
            earlier_sends_landed_by: Instant::now() + send_lease_margin,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Target>> {
        self.targets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The connections a writer of a flow into `alias` uses now; `None` while this node has no
    /// usable identity for a fenced target.
    pub(crate) fn current(&self, alias: &str) -> Option<Arc<Cluster>> {
        match self.lock().get(alias)? {
            Target::Shared(cluster) => Some(cluster.clone()),
            Target::Fenced { current, .. } => current.clone(),
        }
    }

    /// Whether a unit of a flow into `alias` that this node owns may be taken up or handed
    /// back at `now` (see [`Handover`]).
    pub(crate) fn handover(&self, alias: &str, now: Instant) -> Handover {
        let identity = match self.lock().get(alias) {
            Some(Target::Fenced { current, .. }) => Some(current.is_some()),
            Some(Target::Shared(_)) | None => None,
        };
        Handover::at(now, self.earlier_sends_landed_by, identity)
    }

    /// Changes whenever the writers' connections were swapped.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// The fenced targets' connection sets in use now (to close them for good when the
    /// pipeline stops).
    pub(crate) fn fenced_clusters(&self) -> Vec<Arc<Cluster>> {
        self.lock()
            .values()
            .filter_map(|t| match t {
                Target::Fenced { current, .. } => current.clone(),
                Target::Shared(_) => None,
            })
            .collect()
    }

    /// The login the fenced targets were last switched to (`None` before the first switch).
    fn applied(&self) -> Option<Option<WriterLogin>> {
        self.applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Switches every fenced target to `login` (or to nothing) and returns the sets it replaced.
    fn switch(&self, login: Option<&WriterLogin>) -> Result<Vec<Arc<Cluster>>> {
        let mut replaced = Vec::new();
        {
            let mut targets = self.lock();
            for (alias, target) in targets.iter_mut() {
                let Target::Fenced {
                    params,
                    prefix,
                    current,
                } = target
                else {
                    continue;
                };
                let next = match login {
                    Some(login) => {
                        let username = login.username(prefix);
                        let cluster = Cluster::with_login(
                            &format!("{alias} (as {username})"),
                            params.iggy_version,
                            &params.connection_string,
                            params.connections,
                            self.timeout,
                            &username,
                            &login.password,
                        )?
                        .with_far_connections(params.far_connections);
                        let refusals = LoginRefusals::new(login.incarnation, self.refused.clone());
                        Some(Arc::new(cluster.notify_login_refused(refusals)))
                    }
                    None => None,
                };
                if let Some(old) = std::mem::replace(current, next) {
                    replaced.push(old);
                }
            }
        }
        *self
            .applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(login.cloned());
        self.version.send_modify(|v| *v += 1);
        Ok(replaced)
    }
}

/// Least time between two identities one process gives up (see [`follow`]).
pub(crate) const MIN_ABANDON_INTERVAL: Duration = Duration::from_secs(30);

/// Refused logins reported and not yet read by [`follow`]; more are dropped (a refused
/// identity is refused again at its next connect).
const REFUSALS_QUEUED: usize = 16;

/// What [`follow`] does with a refused login of identity `refused`, given the identity it
/// writes as now (`current`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The current identity: give it up for the next one.
    GiveUp(u64),
    /// A late answer to a connect of an identity replaced since (or of none): the current
    /// identity is not in question.
    Late,
}

impl Refusal {
    pub(crate) fn of(refused: u64, current: Option<&WriterLogin>) -> Self {
        match current {
            Some(login) if login.incarnation == refused => Refusal::GiveUp(refused),
            _ => Refusal::Late,
        }
    }
}

/// Follows this node's writer identity until `cancel`: every change swaps the fenced targets'
/// connections and closes the old ones for good. When a fenced target refuses the current
/// identity's login (its user is missing there, e.g. the target lost its data, or was created
/// under another cluster secret, or is inactive, revoked by an earlier replicator cluster that
/// used the same `writer_user_prefix`), retrying cannot help: the identity is given up through
/// `control`, so that the leader fences it and provisions the next one, whose users it creates.
pub(crate) async fn follow<C: ControlPlane>(
    targets: Arc<WriterTargets>,
    control: C,
    cancel: CancellationToken,
) {
    let mut logins = control.writer_login();
    let Ok(mut refusals) = targets.refusals.try_lock() else {
        tracing::error!("the writer identity is followed twice; this follower stops");
        return;
    };
    let mut last_abandoned: Option<std::time::Instant> = None;
    // A control plane without writer identities closes the channel at once: the login never
    // changes then, and the follower runs on (until `cancel`) as its supervisor expects.
    let mut logins_open = true;
    loop {
        let login = logins.borrow_and_update().clone();
        if targets.applied().as_ref() != Some(&login) {
            match targets.switch(login.as_ref()) {
                Ok(replaced) => {
                    match &login {
                        Some(l) => {
                            tracing::info!(
                                incarnation = l.incarnation,
                                "writing as a new writer identity"
                            )
                        }
                        None => {
                            tracing::info!("no writer identity: writers to fenced targets wait")
                        }
                    }
                    for old in replaced {
                        // Its calls fail from now on; closing its connections may wait for a
                        // connect in progress to an unreachable target (the connect timeout),
                        // which must not hold up writing as the next identity elsewhere.
                        old.refuse_calls();
                        tokio::spawn(tracing::Instrument::in_current_span(async move {
                            old.close().await
                        }));
                    }
                }
                Err(e) => tracing::error!(error = %e, "cannot prepare the writer connections"),
            }
        }
        tokio::select! {
            () = cancel.cancelled() => break,
            changed = logins.changed(), if logins_open => logins_open = changed.is_ok(),
            Some(refused) = refusals.recv() => {
                let applied = targets.applied();
                let current = applied.as_ref().and_then(Option::as_ref);
                let incarnation = match Refusal::of(refused, current) {
                    Refusal::GiveUp(incarnation) => incarnation,
                    Refusal::Late => {
                        tracing::debug!(
                            refused,
                            current = current.map(|l| l.incarnation),
                            "a fenced target refused a replaced writer identity's login late; the current one stays"
                        );
                        continue;
                    }
                };
                // A target that keeps refusing every new identity (a misconfiguration) must not
                // make this node burn through incarnations, each leaving a user behind.
                if last_abandoned.is_some_and(|at| at.elapsed() < MIN_ABANDON_INTERVAL) {
                    tracing::warn!(
                        incarnation,
                        "a fenced target refused this node's writer login again; not giving another identity up yet"
                    );
                    continue;
                }
                last_abandoned = Some(std::time::Instant::now());
                tracing::warn!(
                    incarnation,
                    "a fenced target refused this node's writer login: giving the identity up for a new one"
                );
                match control.abandon_writer_identity(incarnation).await {
                    Ok(_) => {}
                    // The next refusal asks again.
                    Err(e) => tracing::warn!(error = %e.reason, "could not give the writer identity up"),
                }
            }
        }
    }
    for cluster in targets.fenced_clusters() {
        cluster.close_for_good().await;
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;
    use replicator_model::IggyVersion;
    use replicator_sdk::IggyCluster as _;

    fn params(prefix: Option<&str>) -> ClusterParams {
        let mut p = ClusterParams::new("iggy://admin:pw@127.0.0.1:1");
        p.writer_user_prefix = prefix.map(str::to_owned);
        p
    }

    #[test]
    fn only_a_refusal_of_the_current_identity_gives_it_up() {
        let login = |incarnation| WriterLogin {
            node: 1,
            incarnation,
            password: "pw".into(),
        };
        check!(Refusal::of(4, Some(&login(4))) == Refusal::GiveUp(4));
        // The late answer of a connect as the fenced i3, after the node moved to i4.
        check!(Refusal::of(3, Some(&login(4))) == Refusal::Late);
        check!(Refusal::of(3, None) == Refusal::Late);
    }

    #[tokio::test]
    async fn fenced_targets_follow_the_identity_and_close_the_old_connections_for_good() {
        let t = Duration::from_secs(1);
        let shared: BTreeMap<String, Arc<Cluster>> = ["plain", "fenced"]
            .into_iter()
            .map(|a| {
                let c = Cluster::new(a, IggyVersion::V0_8, "iggy://admin:pw@127.0.0.1:1", 1, t)
                    .expect("valid");
                (a.to_owned(), Arc::new(c))
            })
            .collect();
        let clusters = BTreeMap::from([
            ("plain".to_owned(), params(None)),
            ("fenced".to_owned(), params(Some("repl"))),
        ]);
        let targets = WriterTargets::new(&clusters, &shared, t, Duration::ZERO);
        check!(targets.current("plain").is_some());
        check!(targets.current("fenced").is_none());
        let login = |incarnation| WriterLogin {
            node: 1,
            incarnation,
            password: "pw".into(),
        };
        check!(targets.switch(Some(&login(1))).expect("valid").is_empty());
        let first = targets.current("fenced").expect("an identity");
        check!(first.alias().contains("repl-n1-i1"));
        let replaced = targets.switch(None).expect("valid");
        check!(replaced.len() == 1);
        check!(targets.current("fenced").is_none());
        replaced[0].close_for_good().await;
        let call = first
            .call(0, "ping", |c| async move { c.ping().await })
            .await;
        check!(matches!(call, Err(crate::Error::WriterRevoked { .. })));
        check!(*targets.subscribe().borrow() == 2);
    }
}
