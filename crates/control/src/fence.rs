//! Fencing at the target clusters: what the control plane fences with ([`Fencing`]: the target
//! clusters' side behind [`WriterFence`], which the binary implements with the SDK) and where
//! each flow writes ([`FenceTopology`]). `assign` decides what fencing needs, `fence_ops` runs
//! it on the leader (and says how fencing keeps a stale writer out).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use replicator_model::{NodeId, WriterLogin};

/// The future every [`WriterFence`] operation returns; the error is a one-line reason.
pub type FenceFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// What the leader does to the writer users on one fenced target cluster. Every operation is
/// idempotent and succeeds only once the target acknowledged it.
pub trait WriterFence: Send + Sync + 'static {
    /// Makes sure `login`'s user exists on `target`: creates it with writing rights only
    /// (send, poll, read) unless a user of that name exists, which stays as it is. An
    /// existing one is either this identity's (created by an earlier attempt, with the same
    /// derived password) or revoked, and a revoked user never gets rights back.
    fn ensure<'a>(&'a self, target: &'a str, login: &'a WriterLogin) -> FenceFuture<'a, ()>;

    /// Takes every right of `node`'s `incarnation` user on `target` away and stops it from
    /// logging in; its open sessions are refused on their next request. A missing user is
    /// created that way (no rights, inactive), so that an `ensure` of a deposed leader that
    /// arrives later finds the name taken instead of creating a user with rights. The user
    /// is never deleted: Iggy reuses user ids, so a session of a deleted user could inherit a
    /// later user's rights, and whether a user still has sessions cannot be known (on a server
    /// with several shards `GET_CLIENTS` lists only the sessions of the shard that answers).
    fn revoke<'a>(&'a self, target: &'a str, node: NodeId, incarnation: u64)
        -> FenceFuture<'a, ()>;
}

/// How the control plane fences (`ControlParams::fencing`).
#[derive(Clone)]
pub struct Fencing {
    /// The target clusters' side.
    pub fence: Arc<dyn WriterFence>,
    /// Which flows write to which fenced target at start; `Control::set_fence_topology`
    /// replaces it after a reload.
    pub topology: FenceTopology,
}

impl std::fmt::Debug for Fencing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fencing")
            .field("topology", &self.topology)
            .finish_non_exhaustive()
    }
}

/// Where each flow writes, as far as fencing goes: from this node's config, so it follows
/// reloads and restarts. On the leader it decides which targets a fence must reach, which
/// units each acknowledgement frees, and where every identity needs a user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FenceTopology {
    /// Flow name → its target's alias when that target is fenced (`None`: unfenced).
    flows: BTreeMap<String, Option<String>>,
}

impl FenceTopology {
    /// From (flow name, the alias of its target if that target has fencing on).
    pub fn new(flows: impl IntoIterator<Item = (String, Option<String>)>) -> Self {
        Self {
            flows: flows.into_iter().collect(),
        }
    }

    /// The fenced target `flow` writes to. `None` for an unfenced target and for a flow this
    /// config does not have: their units move on the lease alone.
    pub(crate) fn fenced_target(&self, flow: &str) -> Option<&str> {
        self.flows.get(flow).and_then(|t| t.as_deref())
    }

    /// Every fenced target some flow writes to.
    pub(crate) fn fenced_targets(&self) -> BTreeSet<&str> {
        self.flows.values().filter_map(|t| t.as_deref()).collect()
    }

    /// The flows writing to `target`.
    pub(crate) fn flows_into(&self, target: &str) -> Vec<String> {
        self.flows
            .iter()
            .filter(|(_, t)| t.as_deref() == Some(target))
            .map(|(flow, _)| flow.clone())
            .collect()
    }
}

/// Identities whose user exists on a target, as (target, node, incarnation).
pub(crate) type EnsuredUsers = BTreeSet<(String, NodeId, u64)>;

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    #[test]
    fn the_topology_says_where_each_flow_writes() {
        let t = FenceTopology::new([
            ("a".to_owned(), Some("eu".to_owned())),
            ("b".to_owned(), Some("ap".to_owned())),
            ("c".to_owned(), Some("eu".to_owned())),
            ("d".to_owned(), None),
        ]);
        check!(t.fenced_target("a") == Some("eu"));
        check!(t.fenced_target("d") == None);
        check!(t.fenced_target("unknown") == None);
        check!(t.fenced_targets() == BTreeSet::from(["ap", "eu"]));
        check!(t.flows_into("eu") == vec!["a".to_owned(), "c".to_owned()]);
        check!(t.flows_into("nowhere").is_empty());
    }
}
