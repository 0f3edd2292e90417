//! Fencing at the target clusters, the Iggy side: creating, revoking and retiring the writer
//! users of the nodes with the cluster's configured credential (which needs `manage_users`).
//! The control plane's leader drives it (`replicator_control::WriterFence`, adapted in the
//! binary); `../shared/docs/iggy-fencing.md` records why a permission change fences an open
//! session on Iggy 0.8 and 0.9.

use replicator_model::{writer_username, NodeId, WriterLogin};
use replicator_sdk::types::{GlobalPermissions, Identifier, Permissions, UserStatus};
use replicator_sdk::IggyCluster as _;
use std::collections::{BTreeMap, BTreeSet};
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

/// Connections of a target's managing credential: a revoke's two changes go out at once, one
/// on each, so a fence costs one round trip to the target (which counts in every failover,
/// and between regions a round trip is 20–250 ms).
const ADMIN_CONNECTIONS: usize = 2;

/// One fenced target cluster.
struct FencedTarget {
    alias: String,
    /// Writer user names are `<prefix>-n<node>-i<incarnation>`.
    prefix: String,
    /// Connections with the configured (managing) credential.
    admin: Arc<Cluster>,
}

/// The clusters with fencing on, reached with their configured credential (connections open
/// on first use). Every such cluster is here, whether a flow writes to it now or not: a reload
/// may add a flow into it, and the control plane decides which ones a fence must reach
/// (`replicator_control::FenceTopology`).
pub struct TargetFence {
    targets: BTreeMap<String, FencedTarget>,
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
    /// The clusters of `params` with fencing on (`None` when there is none).
    pub fn new(params: &PipelineParams) -> Result<Option<Self>> {
        let mut targets = BTreeMap::new();
        for (alias, cluster) in &params.clusters {
            let Some(prefix) = &cluster.writer_user_prefix else {
                continue;
            };
            let admin = Cluster::new(
                alias,
                cluster.iggy_version,
                &cluster.connection_string,
                ADMIN_CONNECTIONS,
                params.operation_timeout,
            )?;
            let target = FencedTarget {
                alias: alias.clone(),
                prefix: prefix.clone(),
                admin: Arc::new(admin),
            };
            targets.insert(alias.clone(), target);
        }
        Ok((!targets.is_empty()).then_some(Self { targets }))
    }

    /// The fenced target each flow of `params` writes to (`None`: its target is unfenced):
    /// what the control plane fences with (`replicator_control::FenceTopology`).
    #[must_use]
    pub fn flow_targets(params: &PipelineParams) -> Vec<(String, Option<String>)> {
        params
            .flows
            .iter()
            .map(|f| {
                let fenced = params
                    .clusters
                    .get(&f.target)
                    .is_some_and(|c| c.writer_user_prefix.is_some());
                (f.name.clone(), fenced.then(|| f.target.clone()))
            })
            .collect()
    }

    fn target(&self, alias: &str) -> std::result::Result<&FencedTarget, String> {
        self.targets
            .get(alias)
            .ok_or_else(|| format!("clusters.{alias}: not a cluster with fencing on"))
    }

    /// Checks that the configured credential of each reachable target of `aliases` may manage
    /// users (root, or global `manage_users`). A target that does not answer is skipped with a
    /// warning: the leader's fencing operations retry until it does, and say why in status
    /// and metrics.
    pub async fn check_rights(
        &self,
        aliases: &BTreeSet<String>,
    ) -> std::result::Result<(), FenceSetupError> {
        for t in self.targets.values().filter(|t| aliases.contains(&t.alias)) {
            check_rights(t).await?;
        }
        Ok(())
    }

    /// Creates `login`'s user on `alias` with writer rights only, unless a user of that name
    /// exists: it is then either this identity's (an earlier attempt created it with the same
    /// derived password) or revoked by a fence, and a revoked user never gets rights back.
    pub async fn ensure(
        &self,
        alias: &str,
        login: &WriterLogin,
    ) -> std::result::Result<(), String> {
        let t = self.target(alias)?;
        // A leader ensures every identity's user when it starts leading: from then on the
        // revoke of a failover finds all its connections open (across regions a connect and
        // a login are two round trips more on every failover). Also done at start
        // (`check_rights`); this covers a target the start could not reach.
        t.admin.open_slots_ahead();
        let name = login.username(&t.prefix);
        if get_user(t, &name).await?.is_some() {
            return Ok(());
        }
        let (user, password) = (name.clone(), login.password.clone());
        let created = call(t, "create_user", |c| async move {
            c.create_user(
                &user,
                &password,
                UserStatus::Active,
                Some(writer_permissions()),
            )
            .await
            .map(drop)
        })
        .await;
        match created {
            Ok(()) => Ok(()),
            // Created meanwhile (another attempt, or a fence's tombstone): as above.
            Err(_) if get_user(t, &name).await?.is_some() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Takes every right of the user away on `alias` (its open sessions are refused on their
    /// next request), then deactivates it (no new login). A missing user is created that way,
    /// with a password nobody knows, so that a late `ensure` (of a deposed leader) finds the
    /// name taken. Idempotent. It is also how a stale identity is revoked for good: its user is
    /// never deleted (see `replicator_control::WriterFence::revoke`).
    pub async fn revoke(
        &self,
        alias: &str,
        node: NodeId,
        incarnation: u64,
    ) -> std::result::Result<(), String> {
        let t = self.target(alias)?;
        let name = writer_username(&t.prefix, node, incarnation);
        // The user nearly always exists (`ensure` created it before its node could write):
        // both changes by name, at once. Anything else (no such user, an error) takes the
        // path below, which repeats them; both are idempotent.
        match revoke_by_name(t, &name).await {
            Ok(()) => return Ok(()),
            Err(e) => {
                tracing::debug!(user = %name, error = %e, "revoke by name failed; looking the user up")
            }
        }
        let id = match get_user(t, &name).await? {
            Some(id) => id,
            None => {
                let (user, password) = (name.clone(), unknown_password());
                let created = call(t, "create_user", |c| async move {
                    c.create_user(
                        &user,
                        &password,
                        UserStatus::Inactive,
                        Some(Permissions::default()),
                    )
                    .await
                    .map(drop)
                })
                .await;
                match (created, get_user(t, &name).await?) {
                    (Ok(()), _) => return Ok(()),
                    // Created meanwhile by a late `ensure`: revoke it below.
                    (Err(_), Some(id)) => id,
                    (Err(e), None) => return Err(e),
                }
            }
        };
        let user = Identifier::numeric(id).map_err(|e| format!("user id {id}: {e}"))?;
        take_rights_and_deactivate(t, user).await
    }

    /// Closes the connections.
    pub async fn close(&self) {
        for t in self.targets.values() {
            t.admin.close().await;
        }
    }
}

/// Checks that `t`'s configured credential may manage users (see `TargetFence::check_rights`).
async fn check_rights(t: &FencedTarget) -> std::result::Result<(), FenceSetupError> {
    // Any member may lead next and fence the leader it follows now: its managing connections
    // are open before that (see `TargetFence::ensure`).
    t.admin.open_slots_ahead();
    let me = t
        .admin
        .call(0, "get_me", |c| async move { c.get_me().await })
        .await;
    let user_id = match me {
        Ok(me) => me.user_id,
        Err(e) if e.is_transient() => {
            tracing::warn!(cluster = %t.alias, error = %e, "cannot check the fencing credential now");
            return Ok(());
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
        return Ok(());
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
    Ok(())
}

/// 32 random hex digits (from the OS's generator): the password of a user created revoked,
/// which nobody ever uses.
fn unknown_password() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One call on `t`'s first managing connection, the error as one line naming the cluster.
async fn call<T, F, Fut>(t: &FencedTarget, op: &str, f: F) -> std::result::Result<T, String>
where
    F: FnOnce(Arc<replicator_sdk::Client>) -> Fut,
    Fut: std::future::Future<Output = replicator_sdk::Result<T>>,
{
    call_on(t, 0, op, f).await
}

/// [`call`] on the managing connection `slot` (below [`ADMIN_CONNECTIONS`]).
async fn call_on<T, F, Fut>(
    t: &FencedTarget,
    slot: usize,
    op: &str,
    f: F,
) -> std::result::Result<T, String>
where
    F: FnOnce(Arc<replicator_sdk::Client>) -> Fut,
    Fut: std::future::Future<Output = replicator_sdk::Result<T>>,
{
    t.admin
        .call(slot, op, f)
        .await
        .map_err(|e| format!("clusters.{}: {e}: {}", t.alias, source_of(&e)))
}

fn source_of(e: &crate::Error) -> String {
    std::error::Error::source(e).map_or_else(String::new, ToString::to_string)
}

/// Revokes the existing user `name` (see [`TargetFence::revoke`]).
async fn revoke_by_name(t: &FencedTarget, name: &str) -> std::result::Result<(), String> {
    let user = Identifier::named(name).map_err(|e| format!("user name {name:?}: {e}"))?;
    take_rights_and_deactivate(t, user).await
}

/// Takes every right from `user` and deactivates it, the two changes at once on the two
/// managing connections. Their order does not matter: either one alone already stops the
/// user's writes (no right to send, or no new session), and the revoke is done only once both
/// are acknowledged.
async fn take_rights_and_deactivate(
    t: &FencedTarget,
    user: Identifier,
) -> std::result::Result<(), String> {
    let (for_rights, for_status) = (user.clone(), user);
    let rights = call_on(t, 0, "update_permissions", |c| async move {
        c.update_permissions(&for_rights, Some(Permissions::default()))
            .await
    });
    let status = call_on(t, 1, "update_user", |c| async move {
        c.update_user(&for_status, None, Some(UserStatus::Inactive))
            .await
    });
    let (rights, status) = tokio::join!(rights, status);
    rights.and(status)
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
