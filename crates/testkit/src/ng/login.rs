//! The register handshake of the 0.9 generation and its logout. A register body starts with the
//! client's version (protocol version, SDK name and version); the server admits only a protocol
//! it speaks, then reads the rest as username and password or, failing that, as a personal
//! access token. Every refusal is an eviction with its reason, never a status.

use super::frame;
use super::session::{Answer, NgSession, OK};
use crate::handlers::{handle, Shared};
use crate::wire::{command, status, Put};
use iggy09_binary_protocol::consensus::EvictionReason;
use iggy09_binary_protocol::requests::users::{LoginRegisterRequest, LoginRegisterWithPatRequest};
use iggy09_binary_protocol::responses::users::LoginRegisterResponse;
use iggy09_binary_protocol::{
    is_protocol_compatible, ClientVersionInfo, WireDecode, WireEncode, WireName,
    IGGY_PROTOCOL_VERSION,
};
use secrecy::ExposeSecret;
use std::sync::atomic::{AtomicU64, Ordering};

/// The server version a register answer reports.
const SERVER_VERSION: &str = "0.9.0";

/// Session numbers handed out by this process (a server's are unique while it runs).
static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// LOGIN_REGISTER and LOGIN_REGISTER_WITH_PAT.
pub(super) fn register(
    shared: &Shared,
    session: &mut NgSession,
    body: &[u8],
    out: &mut Vec<u8>,
) -> Answer {
    let Ok((version, prefix)) = ClientVersionInfo::decode(body) else {
        return Answer::Evict(EvictionReason::MalformedLogin);
    };
    if !is_protocol_compatible(version.protocol_version) {
        return Answer::Evict(EvictionReason::IncompatibleProtocol);
    }
    let tail = &body[prefix..];
    let mut credentials_rejected = false;
    if let Ok((request, _)) = LoginRegisterRequest::decode_after_prefix(version.clone(), tail) {
        // The 0.8 LOGIN_USER body: the shared handler judges the credentials.
        let mut payload = Vec::new();
        payload.put_name(request.username.as_str());
        payload.put_name(request.password.expose_secret());
        payload.put_long_str("");
        payload.put_long_str("");
        match log_in(shared, session, command::LOGIN_USER, &mut payload, out) {
            Ok(answer) => return answer,
            Err(
                status::INVALID_CREDENTIALS | status::INVALID_USERNAME | status::INVALID_PASSWORD,
            ) => {
                // A body of another shape may still read as a token: try that before refusing.
                credentials_rejected = true;
            }
            Err(code) => return Answer::Evict(refusal(code)),
        }
    }
    if let Ok((request, _)) = LoginRegisterWithPatRequest::decode_after_prefix(version, tail) {
        let mut payload = Vec::new();
        payload.put_name(request.token.expose_secret());
        return match log_in(
            shared,
            session,
            command::LOGIN_WITH_PERSONAL_ACCESS_TOKEN,
            &mut payload,
            out,
        ) {
            Ok(answer) => answer,
            // Refused as credentials first: that refusal is the one the client hears.
            Err(_) if credentials_rejected => Answer::Evict(EvictionReason::InvalidCredentials),
            Err(status::RESOURCE_NOT_FOUND) => Answer::Evict(EvictionReason::InvalidToken),
            Err(code) => Answer::Evict(refusal(code)),
        };
    }
    Answer::Evict(if credentials_rejected {
        EvictionReason::InvalidCredentials
    } else {
        EvictionReason::MalformedLogin
    })
}

/// Runs the 0.8 login `code` and, when it succeeds, binds a new session: the answer (appended
/// to `out`) is a result section and the register response.
fn log_in(
    shared: &Shared,
    session: &mut NgSession,
    code: u32,
    payload: &mut [u8],
    out: &mut Vec<u8>,
) -> Result<Answer, u32> {
    let mut scratch = Vec::new();
    let before = session.inner.user_id;
    handle(shared, &mut session.inner, code, payload, &mut scratch)?;
    let user_id = session.inner.user_id.ok_or(status::UNAUTHENTICATED)?;
    // A backup authenticates a register itself, then forwards it to the primary; with the
    // primary gone (before the view change) the forward fails and the register is refused as
    // transient, the connection left as it was.
    if let Some(refusal) = session
        .seat
        .as_ref()
        .and_then(|seat| seat.refuses_register())
    {
        session.inner.user_id = before;
        // A registry entry removed meanwhile (the user was deleted) is no error here.
        let _ = shared
            .state
            .set_client_user(session.inner.client_id, before);
        frame::result_rejected(out, refusal);
        return Ok(OK);
    }
    let bound = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
    session.bound = Some(bound);
    let response = LoginRegisterResponse {
        user_id,
        session: bound,
        server_protocol_version: IGGY_PROTOCOL_VERSION,
        server_version: WireName::new(SERVER_VERSION).map_err(|_| status::INVALID_FORMAT)?,
    };
    frame::result_ok(out);
    out.extend_from_slice(&response.to_bytes());
    Ok(OK)
}

/// The eviction reason for a login the 0.8 handler refused with `code`.
fn refusal(code: u32) -> EvictionReason {
    match code {
        status::USER_INACTIVE => EvictionReason::UserInactive,
        status::CLIENT_NOT_FOUND => EvictionReason::SessionError,
        _ => EvictionReason::InvalidCredentials,
    }
}

/// LOGOUT_USER: the session ends; the connection stays open for another register.
pub(super) fn logout(shared: &Shared, session: &mut NgSession) -> Answer {
    if session.bound.take().is_none() {
        return Answer::Evict(EvictionReason::NoSession);
    }
    let mut scratch = Vec::new();
    match handle(
        shared,
        &mut session.inner,
        command::LOGOUT_USER,
        &mut [],
        &mut scratch,
    ) {
        Ok(()) => OK,
        Err(code) => Answer::Reply(code),
    }
}
