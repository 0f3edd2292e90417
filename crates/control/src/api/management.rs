//! Cluster membership: bootstrap from the initial member list, add and remove members.
//!
//! Bootstrap rule: only the node with the lowest id in `initial_members` initialises, only
//! while its own Raft state is uninitialised, only once a majority of the initial members
//! (itself included) answers the authenticated ping, and only if none of them is already
//! initialised (a wiped node never founds a second cluster). All initial members become
//! voters. Restarts are idempotent: an initialised node skips bootstrap.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::network::{paths, PingReply};
use crate::node::NodeInner;
use crate::MemberNode;

/// Runs the bootstrap rule until the cluster is initialised or bootstrap is not this node's job.
pub(crate) async fn run_bootstrap(node: Arc<NodeInner>) {
    if node.initial_members.keys().next() != Some(&node.id) {
        return;
    }
    let mut attempt = 0u64;
    loop {
        match node.raft.is_initialized().await {
            Ok(false) => {}
            Ok(true) | Err(_) => return,
        }
        attempt += 1;
        let mut reachable = 1usize;
        let mut peer_initialized = None;
        for (id, addr) in node
            .initial_members
            .iter()
            .filter(|(id, _)| **id != node.id)
        {
            match node
                .peers
                .call::<(), PingReply>(*id, addr, paths::PING, &(), node.timing.rpc_timeout)
                .await
            {
                Ok(p) => {
                    reachable += 1;
                    if p.initialized {
                        peer_initialized = Some(*id);
                    }
                }
                Err(e) => {
                    tracing::debug!(node = %node.id, peer = %id, error = %e, "bootstrap ping failed")
                }
            }
        }
        if let Some(peer) = peer_initialized {
            tracing::info!(node = %node.id, peer = %peer, "a peer already belongs to a cluster; not bootstrapping");
            return;
        }
        if reachable * 2 > node.initial_members.len() {
            let members: BTreeMap<_, _> = node
                .initial_members
                .iter()
                .map(|(id, addr)| {
                    (
                        *id,
                        MemberNode {
                            raft_addr: addr.clone(),
                        },
                    )
                })
                .collect();
            match node.raft.initialize(members).await {
                Ok(()) => {
                    tracing::info!(node = %node.id, voters = node.initial_members.len(), "initialised the cluster")
                }
                Err(e) => {
                    tracing::info!(node = %node.id, error = %e, "cluster already initialised")
                }
            }
            return;
        }
        tracing::warn!(node = %node.id, attempt, reachable, "waiting for a majority of initial members to bootstrap");
        tokio::select! {
            () = node.cancel.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}
