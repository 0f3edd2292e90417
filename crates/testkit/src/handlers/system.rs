//! Commands that concern the server and the connection rather than its data: login and logout,
//! the client registry, stats and cluster metadata.

use super::common::{auth, decode, no_fields, now_micros, Reply, Request, Session, Shared};
use crate::state::{lock, read, ClientInfo};
use crate::users::{Action, UserStatus, PASSWORD_LEN, ROOT_USER_ID, USERNAME_LEN};
use crate::wire::{status, DecodeError, Ident, Put, Reader};

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
    // The server turns the username into an `Identifier` first, and a name that parses as a u32
    // becomes a numeric id: "7" logs in as user 7, whatever its name.
    let id = username
        .parse::<u32>()
        .map_or(Ident::Name(username), Ident::Numeric);
    log_in(shared, session, id, Some(password), out)
}

pub(super) fn login_with_personal_access_token(
    shared: &Shared,
    session: &mut Session,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Reply {
    let token = decode(payload, |r| r.name())?;
    match &shared.config.personal_access_token {
        // The configured token belongs to root; a token login skips the password only.
        Some(t) if t == token => log_in(shared, session, Ident::Numeric(ROOT_USER_ID), None, out),
        _ => Err(status::RESOURCE_NOT_FOUND),
    }
}

/// `login_user_with_credentials`: unknown user or wrong password 42, inactive user 47 (judged
/// before the password), then the session switches to the user (logging out a previous one)
/// and the answer is the user id. A connection whose registry entry was removed by DELETE_USER
/// gets 100 `ClientNotFound`, like the server, whose session is switched all the same.
fn log_in(
    shared: &Shared,
    session: &mut Session,
    id: Ident<'_>,
    password: Option<&str>,
    out: &mut Vec<u8>,
) -> Reply {
    let user_id = {
        let meta = read(&shared.state.meta);
        let (user_id, user) = meta
            .users
            .existing(id)
            .map_err(|_| status::INVALID_CREDENTIALS)?;
        if user.status != UserStatus::Active {
            return Err(status::USER_INACTIVE);
        }
        if password.is_some_and(|p| p != user.password) {
            return Err(status::INVALID_CREDENTIALS);
        }
        user_id
    };
    if session.user_id.is_some() {
        shared.state.set_client_user(session.client_id, None)?;
    }
    session.user_id = Some(user_id);
    shared
        .state
        .set_client_user(session.client_id, Some(user_id))?;
    out.put_u32(user_id);
    Ok(())
}

pub(super) fn logout_user(shared: &Shared, session: &mut Session) -> Reply {
    auth(session)?;
    shared.state.set_client_user(session.client_id, None)?;
    session.user_id = None;
    Ok(())
}

pub(super) fn get_me(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    req.open(no_fields)?;
    let client_id = req.session.client_id;
    let clients = lock(&req.shared.state.clients);
    let info = clients.get(&client_id).ok_or(status::CLIENT_NOT_FOUND)?;
    client_record(out, client_id, info, true);
    Ok(())
}

/// [`Request::open`], then 41 unless the user may read server information (GET_STATS,
/// GET_CLIENT(S)).
fn open_for_servers<R>(
    req: Request<'_>,
    fields: impl FnOnce(&mut Reader<'_>) -> Result<R, DecodeError>,
) -> Result<R, u32> {
    let (fields, user) = req.open(fields)?;
    read(&req.shared.state.meta)
        .users
        .check(user, Action::ReadServers)?;
    Ok(fields)
}

pub(super) fn get_client(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    let id = open_for_servers(req, |r| r.u32())?;
    if id == 0 {
        return Err(status::INVALID_CLIENT_ID);
    }
    if let Some(info) = lock(&req.shared.state.clients).get(&id) {
        client_record(out, id, info, true);
    }
    Ok(())
}

pub(super) fn get_clients(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    open_for_servers(req, no_fields)?;
    let clients = lock(&req.shared.state.clients);
    let mut ids: Vec<&u32> = clients.keys().collect();
    ids.sort_unstable();
    for id in ids {
        client_record(out, *id, &clients[id], false);
    }
    Ok(())
}

pub(super) fn get_cluster_metadata(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    req.open(no_fields)?;
    let shared = req.shared;
    out.put_long_str("single-node");
    out.put_u32(1);
    out.put_long_str("iggy-node");
    out.put_long_str(&shared.config.bind.ip().to_string());
    out.put_u16(req.session.port);
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

pub(super) fn get_stats(req: Request<'_>, out: &mut Vec<u8>) -> Reply {
    open_for_servers(req, no_fields)?;
    let shared = req.shared;
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
