//! Commands that concern the server and the connection rather than its data: login and logout,
//! the client registry, stats and cluster metadata.

use super::{auth, decode, now_micros, Reply, Session, Shared};
use crate::state::{lock, read, ClientInfo};
use crate::wire::{status, Put};

/// Username length bounds of LOGIN_USER.
const USERNAME_LEN: std::ops::RangeInclusive<usize> = 3..=50;
/// Password length bounds of LOGIN_USER.
const PASSWORD_LEN: std::ops::RangeInclusive<usize> = 3..=100;

/// Mirrors the session's user into the client registry (GET_CLIENTS reports it).
fn set_client_user(shared: &Shared, session: &Session) {
    if let Some(info) = lock(&shared.state.clients).get_mut(&session.client_id) {
        info.user_id = session.user_id;
    }
}

/// Logs the session in as root (user 0) and answers with that user id, as both login commands do.
fn log_in_as_root(shared: &Shared, session: &mut Session, out: &mut Vec<u8>) -> Reply {
    session.user_id = Some(0);
    set_client_user(shared, session);
    out.put_u32(0);
    Ok(())
}

pub(super) fn login_user(
    shared: &Shared,
    session: &mut Session,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Reply {
    let (username, password) = decode(payload, |r| {
        let username = r.name()?;
        let password = r.short_str()?;
        let _version = r.long_str()?;
        let _context = r.long_str()?;
        Ok((username, password))
    })?;
    if !USERNAME_LEN.contains(&username.len()) {
        return Err(status::INVALID_USERNAME);
    }
    if !PASSWORD_LEN.contains(&password.len()) {
        return Err(status::INVALID_PASSWORD);
    }
    if username != shared.config.root_username || password != shared.config.root_password {
        return Err(status::INVALID_CREDENTIALS);
    }
    log_in_as_root(shared, session, out)
}

pub(super) fn login_with_personal_access_token(
    shared: &Shared,
    session: &mut Session,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Reply {
    let token = decode(payload, |r| r.name())?;
    match &shared.config.personal_access_token {
        Some(t) if t == token => log_in_as_root(shared, session, out),
        _ => Err(status::RESOURCE_NOT_FOUND),
    }
}

pub(super) fn logout_user(shared: &Shared, session: &mut Session) -> Reply {
    auth(session)?;
    session.user_id = None;
    set_client_user(shared, session);
    Ok(())
}

pub(super) fn get_me(shared: &Shared, session: &Session, out: &mut Vec<u8>) -> Reply {
    auth(session)?;
    let clients = lock(&shared.state.clients);
    match clients.get(&session.client_id) {
        Some(info) => {
            client_record(out, session.client_id, info, true);
            Ok(())
        }
        None => Err(status::INVALID_COMMAND),
    }
}

pub(super) fn get_client(
    shared: &Shared,
    session: &Session,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Reply {
    let id = decode(payload, |r| r.u32())?;
    auth(session)?;
    if id == 0 {
        return Err(status::INVALID_CLIENT_ID);
    }
    if let Some(info) = lock(&shared.state.clients).get(&id) {
        client_record(out, id, info, true);
    }
    Ok(())
}

pub(super) fn get_clients(shared: &Shared, session: &Session, out: &mut Vec<u8>) -> Reply {
    auth(session)?;
    let clients = lock(&shared.state.clients);
    let mut ids: Vec<&u32> = clients.keys().collect();
    ids.sort_unstable();
    for id in ids {
        client_record(out, *id, &clients[id], false);
    }
    Ok(())
}

pub(super) fn get_cluster_metadata(shared: &Shared, session: &Session, out: &mut Vec<u8>) -> Reply {
    auth(session)?;
    out.put_long_str("single-node");
    out.put_u32(1);
    out.put_long_str("iggy-node");
    out.put_long_str(&shared.config.bind.ip().to_string());
    out.put_u16(shared.port);
    // Default ports of the transports this server does not run; the real server reports the
    // configured ports of disabled transports too.
    out.put_u16(8080);
    out.put_u16(3000);
    out.put_u16(8092);
    out.put_u8(0); // leader
    out.put_u8(0); // healthy
    Ok(())
}

/// One client as GET_ME / GET_CLIENT (with its groups) and GET_CLIENTS (count only) encode it.
fn client_record(out: &mut Vec<u8>, id: u32, info: &ClientInfo, groups: bool) {
    out.put_u32(id);
    out.put_u32(info.user_id.unwrap_or(u32::MAX));
    out.put_u8(1); // TCP
    out.put_long_str(&info.address.to_string());
    out.put_u32(info.groups.len() as u32);
    if groups {
        for (s, t, g) in &info.groups {
            out.put_u32(*s);
            out.put_u32(*t);
            out.put_u32(*g);
        }
    }
}

pub(super) fn get_stats(shared: &Shared, session: &Session, out: &mut Vec<u8>) -> Reply {
    auth(session)?;
    let meta = read(&shared.state.meta);
    let (mut topics, mut partitions, mut segments, mut messages, mut size, mut groups) =
        (0u32, 0u32, 0u32, 0u64, 0u64, 0u32);
    for (_, s) in meta.streams.iter() {
        for (_, t) in s.topics.iter() {
            topics += 1;
            groups += t.groups.len() as u32;
            for p in &t.partitions {
                partitions += 1;
                let log = lock(&p.log);
                segments += log.segments().len() as u32;
                messages += log.messages_count();
                size += log.size_bytes();
            }
        }
    }
    let streams = meta.streams.len() as u32;
    drop(meta);
    let clients = lock(&shared.state.clients).len() as u32;
    let now = now_micros();
    out.put_u32(std::process::id());
    out.put_f32(0.0);
    out.put_f32(0.0);
    out.put_u64(0); // memory usage
    out.put_u64(0); // total memory
    out.put_u64(0); // available memory
    out.put_u64(now.saturating_sub(shared.started_at)); // run time µs
    out.put_u64(shared.started_at);
    out.put_u64(0); // read bytes
    out.put_u64(0); // written bytes
    out.put_u64(size);
    out.put_u32(streams);
    out.put_u32(topics);
    out.put_u32(partitions);
    out.put_u32(segments);
    out.put_u64(messages);
    out.put_u32(clients);
    out.put_u32(groups);
    out.put_long_str("localhost");
    out.put_long_str(std::env::consts::OS);
    out.put_long_str("");
    out.put_long_str("");
    out.put_long_str("0.8.0");
    out.put_u32(8000); // semver 0.8.0 as major|minor:03|patch:03
    out.put_u32(0); // cache metrics
    out.put_u32(1); // threads
    out.put_u64(0); // free disk
    out.put_u64(0); // total disk
    Ok(())
}
