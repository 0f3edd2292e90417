//! User sync, the decisions: how an upstream user's permissions read on the target (stream and
//! topic ids are the cluster's own, so they are translated by name through the flows' naming
//! and selection), and what the target's copy of a user needs.
//!
//! A synced user is created on the target **inactive**, with a random password nobody keeps:
//! Iggy never reveals a password, so the target cannot have the upstream one. It stays inactive
//! until `flow promote --activate-users` gives it the password the operator chose (see
//! [`activation`]); until then the sync keeps its permissions equal to upstream's and
//! deactivates it if upstream does, but never activates it.

use std::collections::{BTreeMap, BTreeSet};

use replicator_sdk::types::{Permissions, StreamPermissions, UserStatus};
use serde::{Deserialize, Serialize};

use super::catalog::{Catalog, CatalogStream, Route};

/// Upstream permissions as the target must have them, and what could not be translated.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Translated {
    /// `None`: no permissions at all.
    pub(crate) permissions: Option<Permissions>,
    /// Stream or topic permissions the target has no place for, e.g. `"stream audit: no flow
    /// to this target copies it"`.
    pub(crate) not_translated: Vec<String>,
}

/// Translates `permissions` of the upstream catalog `up` to the target catalog `down`: global
/// permissions as they are; a stream's to every downstream stream a route copies one of its
/// topics to; a topic's to its copy. What has no place on the target is left out and named.
pub(crate) fn translate(
    permissions: Option<&Permissions>,
    up: &Catalog,
    down: &Catalog,
    routes: &[Route],
) -> Translated {
    let mut not_translated = Vec::new();
    let Some(permissions) = permissions else {
        return Translated {
            permissions: None,
            not_translated,
        };
    };
    let mut streams: BTreeMap<usize, StreamPermissions> = BTreeMap::new();
    for (&up_id, granted) in permissions.streams.iter().flatten() {
        let Some(stream) = u32::try_from(up_id).ok().and_then(|id| up.streams.get(&id)) else {
            not_translated.push(format!("stream #{up_id}: not found upstream"));
            continue;
        };
        let targets: Vec<String> = copying(routes, stream)
            .map(|r| r.downstream(&stream.name))
            .collect();
        if targets.is_empty() {
            not_translated.push(format!(
                "stream {}: no flow to this target copies it",
                stream.name
            ));
            continue;
        }
        for target in targets {
            let Some(down_id) = down.stream_id(&target) else {
                not_translated.push(format!(
                    "stream {}: {target} is not on the target yet",
                    stream.name
                ));
                continue;
            };
            let mut copy = granted.clone();
            copy.topics = None;
            let mut topics = BTreeMap::new();
            for (&topic_up_id, topic_granted) in granted.topics.iter().flatten() {
                let Some(topic) = u32::try_from(topic_up_id)
                    .ok()
                    .and_then(|id| stream.topics.get(&id))
                else {
                    not_translated.push(format!(
                        "stream {}: topic #{topic_up_id}: not found upstream",
                        stream.name
                    ));
                    continue;
                };
                let copied = routes.iter().any(|r| {
                    r.downstream(&stream.name) == target
                        && r.selector.matches(&stream.name, &topic.name)
                });
                match down.topic_id(&target, &topic.name) {
                    Some(id) if copied => {
                        topics.insert(id as usize, topic_granted.clone());
                    }
                    _ if !copied => not_translated.push(format!(
                        "topic {}/{}: no flow to this target copies it",
                        stream.name, topic.name
                    )),
                    _ => not_translated.push(format!(
                        "topic {}/{}: not on the target yet",
                        stream.name, topic.name
                    )),
                }
            }
            copy.topics = (!topics.is_empty()).then_some(topics);
            streams.insert(down_id as usize, copy);
        }
    }
    not_translated.sort();
    not_translated.dedup();
    Translated {
        permissions: Some(Permissions {
            global: permissions.global.clone(),
            streams: (!streams.is_empty()).then_some(streams),
        }),
        not_translated,
    }
}

/// The routes of `routes` that copy a topic of the upstream `stream`.
fn copying<'r>(routes: &'r [Route], stream: &'r CatalogStream) -> impl Iterator<Item = &'r Route> {
    routes.iter().filter(|r| {
        stream
            .topics
            .values()
            .any(|t| r.selector.matches(&stream.name, &t.name))
    })
}

/// The target streams (by id) that a route of `routes` copies some upstream stream into: the
/// streams whose rights the sync derives from upstream. Rights on any other target stream are
/// the target's own (a stream only the target has, or one no such flow copies into).
pub(crate) fn managed_streams(up: &Catalog, down: &Catalog, routes: &[Route]) -> BTreeSet<u32> {
    up.streams
        .values()
        .flat_map(|stream| {
            copying(routes, stream).filter_map(|r| down.stream_id(&r.downstream(&stream.name)))
        })
        .collect()
}

/// `wanted` (upstream's rights, translated) with the rights the target's copy (`there`) holds
/// on streams outside `managed`, which the sync did not derive and leaves as they are.
pub(crate) fn keeping_target_rights(
    wanted: Option<Permissions>,
    there: Option<&Permissions>,
    managed: &BTreeSet<u32>,
) -> Option<Permissions> {
    let own: BTreeMap<usize, StreamPermissions> = there
        .and_then(|p| p.streams.as_ref())
        .into_iter()
        .flatten()
        .filter(|(id, _)| u32::try_from(**id).map_or(true, |id| !managed.contains(&id)))
        .map(|(id, rights)| (*id, rights.clone()))
        .collect();
    if own.is_empty() {
        return wanted;
    }
    let mut wanted = wanted.unwrap_or_default();
    wanted.streams.get_or_insert_with(BTreeMap::new).extend(own);
    Some(wanted)
}

/// Permissions with empty maps as none, so that what a server answers compares equal to what
/// was sent.
pub(crate) fn normalized(permissions: Option<&Permissions>) -> Option<Permissions> {
    let mut p = permissions?.clone();
    if let Some(streams) = p.streams.as_mut() {
        for stream in streams.values_mut() {
            if stream.topics.as_ref().is_some_and(BTreeMap::is_empty) {
                stream.topics = None;
            }
        }
    }
    if p.streams.as_ref().is_some_and(BTreeMap::is_empty) {
        p.streams = None;
    }
    Some(p)
}

/// A user as one side has it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct UserCopy {
    /// The user's numeric id on its cluster.
    pub(crate) id: u32,
    /// When it was created there, µs (in a two-way pair, the older of two namesakes is the
    /// original when nothing else tells).
    pub(crate) created_at: u64,
    pub(crate) status: UserStatus,
    /// On the target: as stored; upstream: translated to the target.
    pub(crate) permissions: Option<Permissions>,
}

/// A change to the target's copy of a user.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum UserAction {
    /// Create it inactive with these permissions.
    Create(Option<Permissions>),
    /// Set its permissions.
    SetPermissions(Option<Permissions>),
    /// Make it inactive.
    Deactivate,
    /// Delete it (gone upstream, inactive here, and the flow deletes such users).
    Delete,
}

/// Where a user stands after a round, as status shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserSyncState {
    /// The target's copy matches upstream.
    InSync,
    /// Created on the target this round (inactive).
    Created,
    /// Permissions or status changed this round.
    Updated,
    /// Gone upstream, kept on the target (`delete_users_removed_upstream` is off, or the
    /// target's copy is active).
    RemovedUpstream,
    /// Gone upstream and deleted on the target this round.
    Deleted,
    /// Another flow to the same target, from another source, selects the same name; or, in a
    /// two-way pair, nothing tells which side is the user's home (see the report's note): left
    /// alone.
    Conflict,
    /// In a two-way pair: authored on this flow's target (its source holds a copy), so the
    /// reverse flow syncs it; this flow leaves it alone.
    HomeOnTarget,
    /// The round's change failed (see the round's errors); retried next round.
    Failed,
}

/// What the target's copy needs: `upstream` is `None` when the user is gone upstream.
pub(crate) fn plan(
    upstream: Option<&UserCopy>,
    target: Option<&UserCopy>,
    delete_removed: bool,
) -> (Vec<UserAction>, UserSyncState) {
    match (upstream, target) {
        (Some(up), None) => (
            vec![UserAction::Create(up.permissions.clone())],
            UserSyncState::Created,
        ),
        (Some(up), Some(down)) => {
            let mut actions = Vec::new();
            if normalized(up.permissions.as_ref()) != normalized(down.permissions.as_ref()) {
                actions.push(UserAction::SetPermissions(up.permissions.clone()));
            }
            if up.status == UserStatus::Inactive && down.status == UserStatus::Active {
                actions.push(UserAction::Deactivate);
            }
            let state = if actions.is_empty() {
                UserSyncState::InSync
            } else {
                UserSyncState::Updated
            };
            (actions, state)
        }
        (None, Some(down)) if delete_removed && down.status == UserStatus::Inactive => {
            (vec![UserAction::Delete], UserSyncState::Deleted)
        }
        (None, Some(_)) => (Vec::new(), UserSyncState::RemovedUpstream),
        (None, None) => (Vec::new(), UserSyncState::InSync),
    }
}

/// Why Iggy would refuse `password` for a user (its length, as the SDKs check it before they
/// send), or `None`. Checked before a synced user's inactive copy is replaced, so that a
/// refused password never costs the copy.
pub fn password_problem(password: &str) -> Option<String> {
    use replicator_sdk::types::{MAX_PASSWORD_LENGTH, MIN_PASSWORD_LENGTH};
    let length = password.chars().count();
    (!(MIN_PASSWORD_LENGTH..=MAX_PASSWORD_LENGTH).contains(&length)).then(|| {
        format!(
            "a password must have {MIN_PASSWORD_LENGTH} to {MAX_PASSWORD_LENGTH} characters, this one has {length}"
        )
    })
}

/// What `flow promote --activate-users` does with one user it was given a password for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Activation {
    /// Replace the target's inactive copy (a password cannot be set without the current one,
    /// which nobody knows) with an active user of the same name, these permissions and the
    /// given password.
    Replace(Option<Permissions>),
    /// Create it active with these permissions and the password (it was not on the target).
    Create(Option<Permissions>),
    /// Leave it: the reason is reported.
    Leave(ActivationOutcome),
}

/// The outcome of one user's activation, as `flow promote` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActivationOutcome {
    /// Active on the target with the given password now.
    Activated,
    /// Active on the target with the given password now, with the permissions of the target's
    /// copy: the source could not be read (see the promote report's problems).
    ActivatedFromTargetCopy,
    /// Already active on the target: left alone, its password unchanged.
    AlreadyActive,
    /// Inactive upstream: left inactive.
    InactiveUpstream,
    /// Not a user this flow syncs (no `users` glob selects it, or it is the replicator's own).
    NotSynced,
    /// Neither on the target nor readable upstream: nothing to create it from.
    Unknown,
    /// The password given is one Iggy refuses (see [`password_problem`]): nothing changed.
    InvalidPassword,
    /// The change failed (see the report's errors).
    Failed,
}

/// Decides one activation. `upstream`: `None` when the user is not upstream, or the source
/// cannot be read (`source_read` false), in which case the target's copy is all there is.
pub(crate) fn activation(
    synced: bool,
    password: &str,
    source_read: bool,
    upstream: Option<&UserCopy>,
    target: Option<&UserCopy>,
) -> Activation {
    if !synced {
        return Activation::Leave(ActivationOutcome::NotSynced);
    }
    if password_problem(password).is_some() {
        return Activation::Leave(ActivationOutcome::InvalidPassword);
    }
    if upstream.is_some_and(|u| u.status == UserStatus::Inactive) {
        return Activation::Leave(ActivationOutcome::InactiveUpstream);
    }
    match (upstream, target) {
        (_, Some(down)) if down.status == UserStatus::Active => {
            Activation::Leave(ActivationOutcome::AlreadyActive)
        }
        // Upstream's permissions are the newer when it can be read; the final sync round just
        // wrote them to the target's copy anyway.
        (Some(up), Some(_)) => Activation::Replace(up.permissions.clone()),
        (None, Some(down)) if !source_read => Activation::Replace(down.permissions.clone()),
        // Read upstream and not there: deleted upstream; the flow does not sync it any more.
        (None, Some(_)) => Activation::Leave(ActivationOutcome::NotSynced),
        (Some(up), None) => Activation::Create(up.permissions.clone()),
        (None, None) => Activation::Leave(ActivationOutcome::Unknown),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rights_on_streams_the_sync_does_not_manage_are_kept() {
        let rights = |read| StreamPermissions {
            read_stream: read,
            ..StreamPermissions::default()
        };
        let there = Permissions {
            streams: Some(BTreeMap::from([(1, rights(true)), (9, rights(true))])),
            ..Permissions::default()
        };
        let wanted = Permissions {
            streams: Some(BTreeMap::from([(1, rights(false))])),
            ..Permissions::default()
        };
        let managed = BTreeSet::from([1]);
        let kept = keeping_target_rights(Some(wanted), Some(&there), &managed);
        let streams = kept.and_then(|p| p.streams).unwrap_or_default();
        // Stream 1 follows upstream; stream 9, which no flow copies into, stays.
        assert_eq!(
            streams,
            BTreeMap::from([(1, rights(false)), (9, rights(true))])
        );
        assert_eq!(keeping_target_rights(None, None, &managed), None);
    }
    use crate::selection::mapping::Selector;
    use crate::sync::metadata::catalog::{CatalogStream, CatalogTopic};
    use replicator_model::Naming;
    use replicator_sdk::types::{GlobalPermissions, TopicPermissions};

    /// A stream of a test catalog: id, name, topics (id, name).
    type TestStream<'a> = (u32, &'a str, &'a [(u32, &'a str)]);

    fn catalog(streams: &[TestStream<'_>]) -> Catalog {
        Catalog {
            streams: streams
                .iter()
                .map(|(id, name, topics)| {
                    (
                        *id,
                        CatalogStream {
                            name: (*name).to_owned(),
                            topics: topics
                                .iter()
                                .map(|(tid, t)| {
                                    (
                                        *tid,
                                        CatalogTopic {
                                            name: (*t).to_owned(),
                                            settings: None,
                                            partitions: 1,
                                            replication_factor: 1,
                                            created_at: 0,
                                        },
                                    )
                                })
                                .collect(),
                        },
                    )
                })
                .collect(),
        }
    }

    fn route(include: &str, naming: Naming) -> Route {
        Route {
            selector: Selector::new(&[include.to_owned()], &[]).unwrap(),
            naming,
            source: "us".into(),
        }
    }

    fn read_topic() -> TopicPermissions {
        TopicPermissions {
            read_topic: true,
            poll_messages: true,
            ..TopicPermissions::default()
        }
    }

    fn perms(streams: Vec<(usize, StreamPermissions)>) -> Permissions {
        Permissions {
            global: GlobalPermissions {
                read_streams: true,
                ..GlobalPermissions::default()
            },
            streams: Some(streams.into_iter().collect()),
        }
    }

    #[test]
    fn stream_and_topic_ids_are_translated_by_name_through_the_naming() {
        let up = catalog(&[
            (1, "orders", &[(1, "created"), (2, "paid")]),
            (2, "audit", &[(1, "log")]),
        ]);
        let down = catalog(&[(7, "us.orders", &[(3, "paid"), (4, "created")])]);
        let granted = StreamPermissions {
            send_messages: true,
            topics: Some(BTreeMap::from([(1, read_topic()), (2, read_topic())])),
            ..StreamPermissions::default()
        };
        let p = perms(vec![
            (1, granted.clone()),
            (2, StreamPermissions::default()),
        ]);
        let t = translate(Some(&p), &up, &down, &[route("orders/*", Naming::Prefix)]);
        let expected = perms(vec![(
            7,
            StreamPermissions {
                topics: Some(BTreeMap::from([(4, read_topic()), (3, read_topic())])),
                ..granted
            },
        )]);
        assert!(t.permissions == Some(expected), "{t:?}");
        assert!(
            t.not_translated == vec!["stream audit: no flow to this target copies it".to_owned()]
        );
    }

    #[test]
    fn a_topic_the_flow_does_not_copy_is_named_not_granted() {
        let up = catalog(&[(1, "orders", &[(1, "created"), (2, "secret")])]);
        let down = catalog(&[(5, "orders", &[(1, "created")])]);
        let granted = StreamPermissions {
            topics: Some(BTreeMap::from([(2, read_topic())])),
            ..StreamPermissions::default()
        };
        let t = translate(
            Some(&perms(vec![(1, granted)])),
            &up,
            &down,
            &[route("orders/created", Naming::Identity)],
        );
        let streams = t.permissions.unwrap().streams.unwrap();
        assert!(streams[&5].topics.is_none());
        assert!(
            t.not_translated
                == vec!["topic orders/secret: no flow to this target copies it".to_owned()]
        );
    }

    #[test]
    fn a_stream_not_yet_created_on_the_target_is_named() {
        let up = catalog(&[(1, "orders", &[(1, "created")])]);
        let t = translate(
            Some(&perms(vec![(1, StreamPermissions::default())])),
            &up,
            &Catalog::default(),
            &[route("*/*", Naming::Identity)],
        );
        assert!(t.permissions.unwrap().streams.is_none());
        assert!(
            t.not_translated == vec!["stream orders: orders is not on the target yet".to_owned()]
        );
    }

    fn user(status: UserStatus, p: Option<Permissions>) -> UserCopy {
        UserCopy {
            created_at: 0,
            id: 3,
            status,
            permissions: p,
        }
    }

    #[test]
    fn the_plan_creates_updates_deactivates_and_never_activates() {
        let p = Some(perms(vec![]));
        let active = user(UserStatus::Active, p.clone());
        let (a, s) = plan(Some(&active), None, false);
        assert!(a == vec![UserAction::Create(p.clone())] && s == UserSyncState::Created);
        let inactive_down = user(UserStatus::Inactive, p.clone());
        assert!(
            plan(Some(&active), Some(&inactive_down), false) == (vec![], UserSyncState::InSync)
        );
        let down_other = user(UserStatus::Inactive, None);
        let (a, _) = plan(Some(&active), Some(&down_other), false);
        assert!(a == vec![UserAction::SetPermissions(p.clone())]);
        let up_inactive = user(UserStatus::Inactive, p.clone());
        let (a, s) = plan(Some(&up_inactive), Some(&active), false);
        assert!(a == vec![UserAction::Deactivate] && s == UserSyncState::Updated);
    }

    #[test]
    fn a_user_gone_upstream_is_deleted_only_when_asked_and_inactive() {
        let inactive = user(UserStatus::Inactive, None);
        let active = user(UserStatus::Active, None);
        assert!(plan(None, Some(&inactive), false) == (vec![], UserSyncState::RemovedUpstream));
        assert!(
            plan(None, Some(&inactive), true) == (vec![UserAction::Delete], UserSyncState::Deleted)
        );
        assert!(plan(None, Some(&active), true) == (vec![], UserSyncState::RemovedUpstream));
    }

    #[test]
    fn empty_maps_compare_equal_to_none() {
        let mut p = perms(vec![(
            1,
            StreamPermissions {
                topics: Some(BTreeMap::new()),
                ..StreamPermissions::default()
            },
        )]);
        let n = normalized(Some(&p)).unwrap();
        assert!(n.streams.unwrap()[&1].topics.is_none());
        p.streams = Some(BTreeMap::new());
        assert!(normalized(Some(&p)).unwrap().streams.is_none());
    }

    #[test]
    fn activation_follows_upstream_status_and_the_targets_copy() {
        let p = Some(perms(vec![]));
        let up = user(UserStatus::Active, p.clone());
        let down = user(UserStatus::Inactive, None);
        let pw = "a-password";
        assert!(
            activation(false, pw, true, Some(&up), Some(&down))
                == Activation::Leave(ActivationOutcome::NotSynced)
        );
        // A password Iggy would refuse never costs the inactive copy.
        assert!(
            activation(true, "ab", true, Some(&up), Some(&down))
                == Activation::Leave(ActivationOutcome::InvalidPassword)
        );
        assert!(password_problem("ab").is_some() && password_problem(&"x".repeat(101)).is_some());
        assert!(password_problem("abc").is_none());
        assert!(
            activation(true, pw, true, Some(&up), Some(&down)) == Activation::Replace(p.clone())
        );
        assert!(activation(true, pw, true, Some(&up), None) == Activation::Create(p.clone()));
        let up_off = user(UserStatus::Inactive, None);
        assert!(
            activation(true, pw, true, Some(&up_off), Some(&down))
                == Activation::Leave(ActivationOutcome::InactiveUpstream)
        );
        // The source is gone: the target's copy is what there is.
        let down_p = user(UserStatus::Inactive, p.clone());
        assert!(activation(true, pw, false, None, Some(&down_p)) == Activation::Replace(p));
        assert!(
            activation(true, pw, false, None, None)
                == Activation::Leave(ActivationOutcome::Unknown)
        );
        let live = user(UserStatus::Active, None);
        assert!(
            activation(true, pw, false, None, Some(&live))
                == Activation::Leave(ActivationOutcome::AlreadyActive)
        );
    }
}
