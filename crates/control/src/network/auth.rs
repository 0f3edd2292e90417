//! Request authentication between members without sending the cluster secret: every request
//! carries an HMAC-SHA256 of its path, a timestamp, a nonce and its body, keyed with the
//! secret; the receiver refuses a wrong MAC, a timestamp outside [`MAX_CLOCK_SKEW`] of its own
//! clock, and a (timestamp, nonce) it has already accepted (a replay).
//!
//! Why not the secret itself in a header (as before): anyone who could read one request on
//! the wire could then join the Raft group. With a MAC a captured request is worth at most a
//! replay, which the nonce record refuses. Confidentiality of the bodies and authentication
//! of the answers need TLS.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::hmac;

use crate::params::ClusterSecret;

/// Header carrying `v1 <unix millis> <nonce hex> <mac hex>`.
pub(crate) const AUTH_HEADER: &str = "x-replicator-auth";

/// How far a request's timestamp may be from the receiver's wall clock. Members' clocks must
/// agree within it (NTP does far better); the lease logic itself never compares wall clocks.
pub(crate) const MAX_CLOCK_SKEW: Duration = Duration::from_secs(300);

/// Most (timestamp, nonce) pairs remembered; past it the oldest are forgotten first. At
/// 1,000 requests a second a ten-minute window needs 600,000.
const MAX_REMEMBERED: usize = 1 << 20;

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AuthError {
    /// No authentication header.
    #[error("no authentication header")]
    Missing,
    /// The header is not `v1 <millis> <nonce> <mac>`.
    #[error("malformed authentication header")]
    Malformed,
    /// The MAC does not match: another secret, or a changed request.
    #[error("wrong signature (another cluster secret?)")]
    BadSignature,
    /// The timestamp is too far from this node's clock.
    #[error("timestamp {skew_ms} ms away from this node's clock")]
    Stale {
        /// The difference, in milliseconds.
        skew_ms: u64,
    },
    /// This exact request was accepted before.
    #[error("replayed request")]
    Replayed,
}

/// A verified request's stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Stamp {
    /// Sender's wall clock, milliseconds since the Unix epoch.
    pub(crate) millis: u64,
    /// Random per request.
    pub(crate) nonce: u64,
}

/// Signs and verifies requests with the cluster secret.
#[derive(Clone)]
pub(crate) struct Signer {
    key: hmac::Key,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(****)")
    }
}

fn message(path: &str, stamp: Stamp, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(64 + path.len() + body.len());
    m.extend_from_slice(b"iggy-replicator rpc v1\n");
    m.extend_from_slice(path.as_bytes());
    m.extend_from_slice(format!("\n{}\n{:016x}\n", stamp.millis, stamp.nonce).as_bytes());
    m.extend_from_slice(body);
    m
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The wall clock in milliseconds since the Unix epoch.
pub(crate) fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Signer {
    pub(crate) fn new(secret: &ClusterSecret) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret.expose().as_bytes()),
        }
    }

    /// The header value for a request to `path` with `body`, stamped `stamp`.
    pub(crate) fn sign(&self, path: &str, body: &[u8], stamp: Stamp) -> String {
        let tag = hmac::sign(&self.key, &message(path, stamp, body));
        format!(
            "v1 {} {:016x} {}",
            stamp.millis,
            stamp.nonce,
            hex(tag.as_ref())
        )
    }

    /// Checks the header of a request to `path` with `body` (the MAC in constant time).
    pub(crate) fn verify(
        &self,
        path: &str,
        body: &[u8],
        header: Option<&[u8]>,
    ) -> Result<Stamp, AuthError> {
        let header = header.ok_or(AuthError::Missing)?;
        let text = std::str::from_utf8(header).map_err(|_| AuthError::Malformed)?;
        let mut parts = text.split(' ');
        let (Some("v1"), Some(millis), Some(nonce), Some(mac), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(AuthError::Malformed);
        };
        let stamp = Stamp {
            millis: millis.parse().map_err(|_| AuthError::Malformed)?,
            nonce: u64::from_str_radix(nonce, 16).map_err(|_| AuthError::Malformed)?,
        };
        let mac = unhex(mac).ok_or(AuthError::Malformed)?;
        hmac::verify(&self.key, &message(path, stamp, body), &mac)
            .map_err(|_| AuthError::BadSignature)?;
        Ok(stamp)
    }
}

/// What the server does with every inbound request before decoding it: the signature must
/// match and the stamp must be fresh and new.
pub(crate) fn authenticate(
    signer: &Signer,
    replay: &ReplayGuard,
    path: &str,
    body: &[u8],
    header: Option<&[u8]>,
    now_millis: u64,
) -> Result<(), AuthError> {
    let stamp = signer.verify(path, body, header)?;
    replay.admit(stamp, now_millis)
}

/// Remembers accepted stamps for as long as they could be replayed.
pub(crate) struct ReplayGuard {
    window: Duration,
    max: usize,
    seen: Mutex<Remembered>,
}

#[derive(Default)]
struct Remembered {
    set: HashSet<Stamp>,
    /// In arrival order, to forget the oldest first.
    order: VecDeque<Stamp>,
}

impl ReplayGuard {
    pub(crate) fn new() -> Self {
        Self::with_limits(MAX_CLOCK_SKEW, MAX_REMEMBERED)
    }

    fn with_limits(window: Duration, max: usize) -> Self {
        Self {
            window,
            max,
            seen: Mutex::new(Remembered::default()),
        }
    }

    /// Accepts `stamp` once, if it is within the window of `now_millis`.
    pub(crate) fn admit(&self, stamp: Stamp, now_millis: u64) -> Result<(), AuthError> {
        let window = u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX);
        let skew_ms = now_millis.abs_diff(stamp.millis);
        if skew_ms > window {
            return Err(AuthError::Stale { skew_ms });
        }
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Forget what can no longer be replayed (older than the window) or exceeds the bound.
        while let Some(oldest) = seen.order.front().copied() {
            let expired = now_millis.saturating_sub(oldest.millis) > window;
            if !expired && seen.order.len() < self.max {
                break;
            }
            seen.order.pop_front();
            seen.set.remove(&oldest);
        }
        if !seen.set.insert(stamp) {
            return Err(AuthError::Replayed);
        }
        seen.order.push_back(stamp);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    fn signer(secret: &str) -> Signer {
        Signer::new(&ClusterSecret::new(secret))
    }

    const T: u64 = 1_800_000_000_000;

    /// The stamp of a request sent at `millis` with `nonce`.
    fn at(millis: u64, nonce: u64) -> Stamp {
        Stamp { millis, nonce }
    }

    #[test]
    fn a_signed_request_verifies_and_the_secret_is_not_in_it() {
        let s = signer("hunter2-hunter2");
        let stamp = at(T, 42);
        let header = s.sign("/raft/append", b"body", stamp);
        check!(!header.contains("hunter2"));
        check!(s.verify("/raft/append", b"body", Some(header.as_bytes())) == Ok(stamp));
    }

    #[test]
    fn another_secret_path_body_or_stamp_is_refused() {
        let s = signer("secret-one");
        let stamp = at(T, 7);
        let header = s.sign("/raft/vote", b"body", stamp);
        let h = Some(header.as_bytes());
        check!(
            signer("secret-two").verify("/raft/vote", b"body", h) == Err(AuthError::BadSignature)
        );
        check!(s.verify("/raft/append", b"body", h) == Err(AuthError::BadSignature));
        check!(s.verify("/raft/vote", b"bodY", h) == Err(AuthError::BadSignature));
        let moved = header.replacen(&T.to_string(), &(T + 1).to_string(), 1);
        check!(
            s.verify("/raft/vote", b"body", Some(moved.as_bytes())) == Err(AuthError::BadSignature)
        );
        check!(s.verify("/raft/vote", b"body", None) == Err(AuthError::Missing));
        for bad in [
            "",
            "v1",
            "v2 1 2 3",
            "v1 x 2 ab",
            "v1 1 zz ab",
            "v1 1 2 abc",
            "v1 1 2 ab extra",
        ] {
            check!(
                s.verify("/raft/vote", b"body", Some(bad.as_bytes())) == Err(AuthError::Malformed),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_captured_request_cannot_be_replayed_nor_forged_with_another_secret() {
        let ours = signer("cluster-secret-1");
        let guard = ReplayGuard::new();
        let stamp = at(T, 99);
        let header = ours.sign("/control/write", b"cmd", stamp);
        let h = Some(header.as_bytes());
        check!(authenticate(&ours, &guard, "/control/write", b"cmd", h, T + 5) == Ok(()));
        check!(
            authenticate(&ours, &guard, "/control/write", b"cmd", h, T + 10)
                == Err(AuthError::Replayed)
        );
        let theirs = signer("cluster-secret-2").sign("/control/write", b"cmd", at(T, 100));
        check!(
            authenticate(
                &ours,
                &guard,
                "/control/write",
                b"cmd",
                Some(theirs.as_bytes()),
                T
            ) == Err(AuthError::BadSignature)
        );
    }

    #[test]
    fn a_stamp_is_accepted_once_and_only_within_the_window() {
        let guard = ReplayGuard::with_limits(Duration::from_secs(300), 1000);
        let stamp = at(T, 1);
        check!(guard.admit(stamp, T + 1_000) == Ok(()));
        check!(guard.admit(stamp, T + 2_000) == Err(AuthError::Replayed));
        check!(guard.admit(at(T, 2), T + 2_000) == Ok(()));
        // Too old or too far ahead of this node's clock.
        check!(guard.admit(at(T - 300_001, 3), T) == Err(AuthError::Stale { skew_ms: 300_001 }));
        check!(guard.admit(at(T + 300_001, 3), T) == Err(AuthError::Stale { skew_ms: 300_001 }));
        // Once the window has passed, the stamp is forgotten, and refused as stale anyway.
        check!(guard.admit(stamp, T + 300_001) == Err(AuthError::Stale { skew_ms: 300_001 }));
    }

    #[test]
    fn the_record_is_bounded_and_forgets_the_oldest_first() {
        let guard = ReplayGuard::with_limits(Duration::from_secs(300), 3);
        for nonce in 0..5 {
            check!(guard.admit(at(T, nonce), T) == Ok(()));
        }
        let seen = guard.seen.lock().map(|s| s.order.len()).unwrap_or(0);
        check!(seen == 3);
        // The most recent are still refused as replays.
        check!(guard.admit(at(T, 4), T) == Err(AuthError::Replayed));
    }
}
