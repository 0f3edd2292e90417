//! Fencing at the target clusters, the Iggy side: creating, revoking and retiring the writer
//! users of the nodes with the cluster's configured credential (which needs `manage_users`).
//! The control plane's leader drives it (`replicator_control::WriterFence`, adapted in the
//! binary); `../shared/docs/iggy-fencing.md` records why a permission change fences an open
//! session on Iggy 0.8 and 0.9.

use iggy::prelude::{GlobalPermissions, Identifier, IggyError, Permissions, UserStatus};
use replicator_model::{writer_username, NodeId, WriterLogin};
use std::collections::BTreeSet;
use std::sync::Arc;

use crate::clients::Cluster;
use crate::error::Result;
use crate::params::PipelineParams;

/// Rights of a writer user: write and read messages, read metadata. Never `manage_*`: a user
/// with `manage_streams` or `manage_topics` may send whatever its `send_messages` says, so a
/// revoke would not fence it.
fn writer_permissions() -> Permissions {
    Permissions {
        global: GlobalPermissions {
            read_streams: true,
            read_topics: true,
            poll_messages: true,
            send_messages: true,
            ..GlobalPermissions::default()
        },
        streams: None,
    }
}

/// One fenced target cluster.
struct FencedTarget {
    alias: String,
    /// Writer user names are `<prefix>-n<node>-i<incarnation>`.
    prefix: String,
    /// Connections with the configured (managing) credential.
    admin: Arc<Cluster>,
}

/// The target clusters with fencing on, reached with their configured credential.
pub struct TargetFence {
    targets: Vec<FencedTarget>,
}

/// Why fencing cannot work with the configured credential of a target.
#[derive(Debug, thiserror::Error)]
#[error("clusters.{alias}: {reason}")]
pub struct FenceSetupError {
    /// The target cluster alias.
    pub alias: String,
    /// What is wrong.
    pub reason: String,
}

impl TargetFence {
    /// The fenced targets of `params`' flows (`None` when no flow writes to a fenced target).
    pub fn new(params: &PipelineParams) -> Result<Option<Self>> {
        let aliases: BTreeSet<&str> = params.flows.iter().map(|f| f.target.as_str()).collect();
        let mut targets = Vec::new();
        for alias in aliases {
            let Some(cluster) = params.clusters.get(alias) else {
                continue;
            };
            let Some(prefix) = &cluster.writer_user_prefix else {
                continue;
            };
            let admin = Cluster::new(
                alias,
                cluster.iggy_version,
                &cluster.connection_string,
                1,
                params.operation_timeout,
            )?;
            targets.push(FencedTarget {
                alias: alias.to_owned(),
                prefix: prefix.clone(),
                admin: Arc::new(admin),
            });
        }
        Ok((!targets.is_empty()).then_some(Self { targets }))
    }

    /// Whether every cluster a flow of `params` writes to is fenced.
    #[must_use]
    pub fn covers_every_target(params: &PipelineParams) -> bool {
        params.flows.iter().all(|f| {
            params
                .clusters
                .get(&f.target)
                .is_some_and(|c| c.writer_user_prefix.is_some())
        })
    }

    /// Checks that each reachable target's configured credential may manage users (root, or
    /// global `manage_users`). A target that does not answer is skipped with a warning: the
    /// leader's fencing operations retry until it does, and say why in status and metrics.
    pub async fn check_rights(&self) -> std::result::Result<(), FenceSetupError> {
        for t in &self.targets {
            let me = t
                .admin
                .call(0, "get_me", |c| async move { c.get_me().await })
                .await;
            let user_id = match me {
                Ok(me) => me.user_id,
                Err(e) if e.is_transient() => {
                    tracing::warn!(cluster = %t.alias, error = %e, "cannot check the fencing credential now");
                    continue;
                }
                Err(e) => {
                    return Err(FenceSetupError {
                        alias: t.alias.clone(),
                        reason: format!("cannot read the configured user: {e}"),
                    })
                }
            };
            // Root (id 0) has every right and its permissions cannot change.
            if user_id == Some(0) {
                continue;
            }
            let Some(id) = user_id else {
                return Err(FenceSetupError {
                    alias: t.alias.clone(),
                    reason: "the connection is not logged in".into(),
                });
            };
            let user = t
                .admin
                .call(0, "get_user", |c| async move {
                    c.get_user(&Identifier::numeric(id)?).await
                })
                .await
                .map_err(|e| FenceSetupError {
                    alias: t.alias.clone(),
                    reason: format!("cannot read the configured user's permissions: {e}"),
                })?;
            let manages = user
                .and_then(|u| u.permissions)
                .is_some_and(|p| p.global.manage_users);
            if !manages {
                return Err(FenceSetupError {
                    alias: t.alias.clone(),
                    reason: "fencing = \"users\" needs a credential with the global manage_users permission (it creates and revokes the writer users)".into(),
                });
            }
        }
        Ok(())
    }

    /// Creates `login`'s user on every fenced target with writer rights only. A user of that
    /// name can only be left by a leader that failed before committing the identity (retired
    /// incarnations are never handed out again), so nobody ever had its password; it is
    /// deleted first, unless a session of it shows up.
    pub async fn provision(&self, login: &WriterLogin) -> std::result::Result<(), String> {
        for t in &self.targets {
            let name = login.username(&t.prefix);
            if let Some(existing) = get_user(t, &name).await? {
                if has_session(t, existing).await? {
                    return Err(format!(
                        "clusters.{}: user {name} exists and has a session",
                        t.alias
                    ));
                }
                call(t, "delete_user", |c| async move {
                    c.delete_user(&Identifier::numeric(existing)?).await
                })
                .await?;
            }
            let (user, password) = (name.clone(), login.password.clone());
            call(t, "create_user", |c| async move {
                c.create_user(
                    &user,
                    &password,
                    UserStatus::Active,
                    Some(writer_permissions()),
                )
                .await
                .map(drop)
            })
            .await?;
        }
        Ok(())
    }

    /// Takes every right of the user away (its open sessions are refused on their next
    /// request), then deactivates it (no new login). Idempotent; a missing user is fine. It is
    /// also how a stale identity is retired: its user is never deleted (see
    /// `replicator_control::WriterFence::retire`).
    pub async fn revoke(&self, node: NodeId, incarnation: u64) -> std::result::Result<(), String> {
        for t in &self.targets {
            let name = writer_username(&t.prefix, node, incarnation);
            let Some(id) = get_user(t, &name).await? else {
                continue;
            };
            call(t, "update_permissions", |c| async move {
                c.update_permissions(&Identifier::numeric(id)?, Some(Permissions::default()))
                    .await
            })
            .await?;
            call(t, "update_user", |c| async move {
                c.update_user(&Identifier::numeric(id)?, None, Some(UserStatus::Inactive))
                    .await
            })
            .await?;
        }
        Ok(())
    }

    /// Closes the connections.
    pub async fn close(&self) {
        for t in &self.targets {
            t.admin.close().await;
        }
    }
}

/// One call on `t`'s managing connection, the error as one line naming the cluster.
async fn call<T, F, Fut>(t: &FencedTarget, op: &str, f: F) -> std::result::Result<T, String>
where
    F: FnOnce(Arc<replicator_sdk::Client>) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, IggyError>>,
{
    t.admin
        .call(0, op, f)
        .await
        .map_err(|e| format!("clusters.{}: {e}: {}", t.alias, source_of(&e)))
}

fn source_of(e: &crate::Error) -> String {
    std::error::Error::source(e).map_or_else(String::new, ToString::to_string)
}

/// The id of the user named `name`, if it exists.
async fn get_user(t: &FencedTarget, name: &str) -> std::result::Result<Option<u32>, String> {
    let name = name.to_owned();
    call(t, "get_user", |c| async move {
        c.get_user(&Identifier::named(&name)?).await
    })
    .await
    .map(|u| u.map(|u| u.id))
}

/// Whether any client is logged in as user `id`.
async fn has_session(t: &FencedTarget, id: u32) -> std::result::Result<bool, String> {
    let clients = call(t, "get_clients", |c| async move { c.get_clients().await }).await?;
    Ok(clients.iter().any(|c| c.user_id == Some(id)))
}
