//! Consumer-group commands: create, list, delete, join and leave, and completing a member's
//! pending revocations once the group has committed what it polled.

use super::common::{
    query_topic, resolve_topic, topic_for, topic_mut, topic_ref, topic_request, Reply, Request,
    Session, Shared,
};
use crate::group;
use crate::group::Group;
use crate::state::{lock, read, write, Meta, Partition};
use crate::users::Action;
use crate::wire::{status, DecodeError, Ident, Put, Reader};
use std::sync::Arc;

fn group_record(out: &mut Vec<u8>, id: usize, g: &Group) {
    out.put_u32(id as u32);
    out.put_u32(g.partitions.len() as u32);
    out.put_u32(g.members.len() as u32);
    out.put_name(&g.name);
}

/// The stream, topic and group identifiers of a group-level request.
type GroupRequest<'a> = (Ident<'a>, Ident<'a>, Ident<'a>);

fn group_request<'a>(r: &mut Reader<'a>) -> Result<GroupRequest<'a>, DecodeError> {
    Ok((r.ident()?, r.ident()?, r.ident()?))
}

/// Resolves stream, topic and group, or 1009 / 2010 / 5000.
fn resolve_group(meta: &Meta, (s, t, g): GroupRequest<'_>) -> Result<(usize, usize, usize), u32> {
    let (sid, tid) = resolve_topic(meta, s, t)?;
    let gid = topic_ref(meta, sid, tid)?
        .find_group(g)
        .ok_or(status::CONSUMER_GROUP_ID_NOT_FOUND)?;
    Ok((sid, tid, gid))
}

/// [`resolve_group`], then 41 unless `user` may read the topic (every consumer-group right is
/// the topic's read right, judged once the group was found).
fn group_for(
    meta: &Meta,
    user: u32,
    request: GroupRequest<'_>,
) -> Result<(usize, usize, usize), u32> {
    let (sid, tid, gid) = resolve_group(meta, request)?;
    meta.users
        .check(user, Action::ReadTopic(sid as u32, tid as u32))?;
    Ok((sid, tid, gid))
}

pub(super) fn get_consumer_group(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    req.query(group_request, |meta, user, request| {
        // `query_consumer_group`: a missing stream, topic or group answers empty.
        if resolve_group(meta, request).is_err() {
            return Ok(());
        }
        let (sid, tid, gid) = group_for(meta, user, request)?;
        let group = topic_ref(meta, sid, tid)?
            .groups
            .get(gid)
            .ok_or(status::CONSUMER_GROUP_ID_NOT_FOUND)?;
        group_record(out, gid, group);
        for (_, m) in group.members.iter() {
            out.put_u32(m.id as u32);
            out.put_u32(m.partitions.len() as u32);
            for p in &m.partitions {
                out.put_u32(*p);
            }
        }
        Ok(())
    })
}

pub(super) fn get_consumer_groups(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    req.query(topic_request, |meta, user, (s, t)| {
        if let Some((_, _, topic)) = query_topic(meta, user, s, t, Action::ReadTopic)? {
            for (gid, g) in topic.groups.iter() {
                group_record(out, gid, g);
            }
        }
        Ok(())
    })
}

pub(super) fn create_consumer_group(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    req.change(
        |r| Ok((r.ident()?, r.ident()?, r.name()?)),
        |meta, user, (s, t, name)| {
            let (sid, tid) = topic_for(meta, user, s, t, Action::ReadTopic)?;
            let topic = topic_mut(meta, sid, tid)?;
            if topic.groups.iter().any(|(_, g)| g.name == name) {
                return Err(status::CONSUMER_GROUP_NAME_ALREADY_EXISTS);
            }
            let group = Group {
                name: name.to_owned(),
                partitions: (0..topic.partitions.len() as u32).collect(),
                members: Default::default(),
                assignment_changes: 0,
            };
            let gid = topic.groups.insert(group);
            if let Some(g) = topic.groups.get(gid) {
                group_record(out, gid, g);
            }
            Ok(())
        },
    )
}

pub(super) fn delete_consumer_group(req: Request<'_>) -> Reply {
    req.change(group_request, |meta, user, request| {
        let (sid, tid, gid) = group_for(meta, user, request)?;
        let topic = topic_mut(meta, sid, tid)?;
        topic.groups.remove(gid);
        for (pid, p) in topic.partitions.iter().enumerate() {
            let mut log = lock(&p.log);
            let had = log.group_offsets.remove(&(gid as u32)).is_some();
            log.group_last_polled.remove(&(gid as u32));
            if had {
                if let Some(store) = &req.shared.store {
                    store.offsets_changed(sid, tid, pid, &log);
                }
            }
        }
        req.shared
            .state
            .forget_groups(|s, t, g| (s, t, g) == (sid, tid, gid));
        Ok(())
    })
}

pub(super) fn join_consumer_group(req: Request<'_>) -> Reply {
    let Request {
        shared, session, ..
    } = req;
    let (request, user) = req.open(group_request)?;
    let live = shared.state.live_client_ids();
    let mut meta = write(&shared.state.meta);
    let (sid, tid, gid) = group_for(&meta, user, request)?;
    let topic = topic_mut(&mut meta, sid, tid)?;
    let partitions = topic.partitions.clone();
    if let Some(group) = topic.groups.get_mut(gid) {
        group::join(group, session.client_id, &live, &|p| {
            can_complete(&partitions, gid as u32, p)
        });
    }
    drop(meta);
    let key = (sid as u32, tid as u32, gid as u32);
    if let Some(info) = lock(&shared.state.clients).get_mut(&session.client_id) {
        if !info.groups.contains(&key) {
            info.groups.push(key);
        }
    }
    Ok(())
}

pub(super) fn leave_consumer_group(req: Request<'_>) -> Reply {
    let Request {
        shared, session, ..
    } = req;
    let (request, user) = req.open(group_request)?;
    let mut meta = write(&shared.state.meta);
    let (sid, tid, gid) = group_for(&meta, user, request)?;
    let topic = topic_mut(&mut meta, sid, tid)?;
    let left = topic
        .groups
        .get_mut(gid)
        .and_then(|group| group::leave(group, session.client_id))
        .ok_or(status::CONSUMER_GROUP_MEMBER_NOT_FOUND)?;
    for p in left {
        if let Some(part) = topic.partitions.get(p as usize) {
            lock(&part.log).group_last_polled.remove(&(gid as u32));
        }
    }
    drop(meta);
    let key = (sid as u32, tid as u32, gid as u32);
    if let Some(info) = lock(&shared.state.clients).get_mut(&session.client_id) {
        info.groups.retain(|x| *x != key);
    }
    Ok(())
}

/// SYNC_CONSUMER_GROUP (0.9 only): the group's assignment changes (the answer's `generation`)
/// and the partitions the calling member may poll. `None` (the 0.9 server's empty answer)
/// when the request does not decode, the stream, topic or group is missing, or the caller is
/// not a member. The request is scoped to the caller itself, so no right is checked.
pub(crate) fn sync_consumer_group(
    shared: &Shared,
    session: &Session,
    payload: &[u8],
) -> Option<(u64, Vec<u32>)> {
    let request = group_request(&mut Reader::new(payload)).ok()?;
    let meta = read(&shared.state.meta);
    let (sid, tid, gid) = resolve_group(&meta, request).ok()?;
    let group = topic_ref(&meta, sid, tid).ok()?.groups.get(gid)?;
    group::assignment(group, session.client_id)
}

/// After a group commit: moves partitions whose revocation can now complete.
pub(super) fn complete_group_revocations(shared: &Shared, sid: usize, tid: usize, gid: usize) {
    let mut meta = write(&shared.state.meta);
    let Ok(topic) = topic_mut(&mut meta, sid, tid) else {
        return;
    };
    let partitions = topic.partitions.clone();
    if let Some(g) = topic.groups.get_mut(gid) {
        group::complete_revocations(g, &|p| can_complete(&partitions, gid as u32, p));
    }
}

/// A revocation can complete when the group never polled the partition or committed at least
/// the last polled offset.
fn can_complete(partitions: &[Arc<Partition>], gid: u32, partition: u32) -> bool {
    let Some(p) = partitions.get(partition as usize) else {
        return true;
    };
    let log = lock(&p.log);
    match log.group_last_polled.get(&gid) {
        None => true,
        Some(polled) => log.group_offsets.get(&gid).is_some_and(|c| c >= polled),
    }
}
