//! Request authentication between members without sending the cluster secret: every request
//! carries an HMAC-SHA256, keyed with the secret, of its path, its receiver (node id and boot
//! id), a timestamp, a nonce and its body. The receiver refuses a wrong MAC, a request signed
//! for another node or for another run of itself, a timestamp outside [`MAX_CLOCK_SKEW`] of
//! its own clock, and a (timestamp, nonce) it has already accepted.
//!
//! Why not the secret itself in a header (as before): anyone who could read one request on
//! the wire could then join the Raft group. With a MAC a captured request is worth at most a
//! replay, and every replay is refused:
//! - to the node it was sent to, in the same run: by that run's nonce record
//!   ([`ReplayGuard`]);
//! - to another node: the MAC names the receiver's node id;
//! - to the same node after it restarted, whose nonce record lives in memory and starts
//!   empty: the MAC names the receiver's *boot id*, a random number every run of the server
//!   draws at start ([`BootId`]), so a request signed for one run is refused by every later
//!   one. (A record kept on disk instead would cost a write per request.)
//!
//! Confidentiality of the bodies and authentication of the answers need TLS.
//!
//! # Learning a receiver's boot id
//! A sender cannot know a receiver's boot id before it asks. A request that is valid but
//! signed for another boot id (or for [`BootId::UNKNOWN`], what a sender signs for before it
//! knows one; no run draws it) or another node id is answered `409 Conflict` with
//! [`RECEIVER_HEADER`] naming the receiver's node id and current boot id. The sender
//! remembers it per peer address and sends the request once more, signed for it
//! (`client::PeerClient`). So the first request to a peer, and the first one after the peer
//! restarted, costs one more round trip; nothing else changes. Members ping each other every
//! `client::PEER_WARM_INTERVAL` so that this round trip is not paid on an election's path.
//!
//! That answer is not authenticated, only the requests are. Whoever can forge it (someone on
//! the path, without TLS) can make a sender sign its one retry for a wrong node or boot id:
//! the real receiver refuses that retry and the call fails, a denial of service the same
//! party could cause by dropping the packets. It cannot make a receiver accept anything:
//! acceptance depends on the receiver's own node id and boot id and on a MAC that needs the
//! secret. Nor can it prepare a replay by making senders sign for a boot id it chose: a later
//! run of the receiver would have to draw that same number (1 in 2^64). The boot id is no
//! secret (every request carries it in clear), only the name of one run's nonce record, and
//! it is answered only to a request whose MAC is valid.
//!
//! # Wire format and versions
//! [`AUTH_HEADER`] is `v2 <receiver node id> <receiver boot id> <unix millis> <nonce> <mac>`
//! (boot id and nonce 16 hex digits, the MAC 64), the MAC over [`message`]. The `v1` header
//! of earlier versions, which names no receiver, is refused ([`AuthError::Version1`]):
//! accepting it would reopen both replays above. A member signing `v1` and a member of this
//! version refuse each other's requests, so a cluster crosses this change by stopping every
//! member and then starting them all on the new version (README, "Upgrading"); a rolling
//! upgrade stalls at the first upgraded member, which never finds a leader.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use replicator_model::NodeId;
use ring::hmac;

use crate::params::ClusterSecret;

/// Header carrying `v2 <node id> <boot id> <unix millis> <nonce> <mac>` (see the module docs).
pub(crate) const AUTH_HEADER: &str = "x-replicator-auth";

/// Header of a `409` answer to a request signed for another receiver: the answering
/// [`Receiver`], `<node id> <boot id>`.
pub(crate) const RECEIVER_HEADER: &str = "x-replicator-receiver";

/// How far a request's timestamp may be from the receiver's wall clock. Members' clocks must
/// agree within it (NTP does far better); the lease logic itself never compares wall clocks.
pub(crate) const MAX_CLOCK_SKEW: Duration = Duration::from_secs(300);

/// Most (timestamp, nonce) pairs remembered; past it the oldest are forgotten first. At
/// 1,000 requests a second a ten-minute window needs 600,000.
const MAX_REMEMBERED: usize = 1 << 20;

/// One run of a server process: drawn at random when the server starts, so that a request
/// signed for one run is refused by every later run of the same node, whose nonce record
/// cannot know what the earlier run accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct BootId(pub(crate) u64);

impl BootId {
    /// What a sender signs for before it knows the receiver's boot id; never drawn, so
    /// always refused, with the current boot id in the answer.
    pub(crate) const UNKNOWN: BootId = BootId(0);

    /// A fresh random boot id, never [`Self::UNKNOWN`].
    pub(crate) fn draw() -> Self {
        loop {
            let id = BootId(rand::random());
            if id != Self::UNKNOWN {
                return id;
            }
        }
    }
}

impl std::fmt::Display for BootId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The receiver a request is signed for: a node, in one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Receiver {
    /// The receiving node.
    pub(crate) node: NodeId,
    /// The run of its server the request is meant for.
    pub(crate) boot: BootId,
}

impl Receiver {
    /// The value of [`RECEIVER_HEADER`]: `<node id> <boot id>`.
    pub(crate) fn to_header(self) -> String {
        format!("{} {}", self.node, self.boot)
    }

    /// Reads a [`RECEIVER_HEADER`] value; `None` when it is not `<node id> <boot id>`.
    pub(crate) fn from_header(value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?;
        let (node, boot) = text.split_once(' ')?;
        Some(Receiver {
            node: node.parse().ok()?,
            boot: BootId(u64::from_str_radix(boot, 16).ok()?),
        })
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AuthError {
    /// No authentication header.
    #[error("no authentication header")]
    Missing,
    /// A `v1` header: a member of an older version, whose requests name no receiver.
    #[error(
        "v1 authentication header (a member of an older version; v1 names no receiver and is \
         refused: stop every member and start them all on this version)"
    )]
    Version1,
    /// The header is not `v2 <node> <boot> <millis> <nonce> <mac>`.
    #[error("malformed authentication header")]
    Malformed,
    /// The MAC does not match: another secret, or a changed request.
    #[error("wrong signature (another cluster secret?)")]
    BadSignature,
    /// Signed for another node: sent to the wrong address, or replayed from another node's
    /// traffic.
    #[error("addressed to node {to}, this is node {this}")]
    OtherNode {
        /// The node the request is signed for.
        to: NodeId,
        /// This node.
        this: NodeId,
    },
    /// Signed before the sender learnt this run's boot id (the first request to this run).
    #[error(
        "signed for an unknown run of this node (the sender has not learnt boot id {current} yet)"
    )]
    UnknownRun {
        /// This run's boot id.
        current: BootId,
    },
    /// Signed for another run of this node: the sender knows only an earlier run, or the
    /// request was captured before this node restarted and is being replayed.
    #[error("signed for an earlier run of this node (boot id {signed}, this run is {current})")]
    EarlierRun {
        /// The boot id the request is signed for.
        signed: BootId,
        /// This run's boot id.
        current: BootId,
    },
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

impl AuthError {
    /// Whether the request was signed correctly but for another receiver, so that the server
    /// answers with its own [`Receiver`] (`409`, [`RECEIVER_HEADER`]) for the sender to sign
    /// again. Unknown and earlier runs are routine: every first contact, and the first
    /// request from each peer after this node restarted.
    pub(crate) fn is_other_receiver(&self) -> bool {
        matches!(
            self,
            AuthError::OtherNode { .. }
                | AuthError::UnknownRun { .. }
                | AuthError::EarlierRun { .. }
        )
    }
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

/// What the MAC covers. Every field but the body has a fixed format without newlines (the
/// path is one of ours), so no two requests share a message.
fn message(path: &str, to: Receiver, stamp: Stamp, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(96 + path.len() + body.len());
    m.extend_from_slice(b"iggy-replicator rpc v2\n");
    m.extend_from_slice(path.as_bytes());
    m.extend_from_slice(
        format!(
            "\n{}\n{}\n{}\n{:016x}\n",
            to.node, to.boot, stamp.millis, stamp.nonce
        )
        .as_bytes(),
    );
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

    /// The header value for a request to `path` with `body`, for `to`, stamped `stamp`.
    pub(crate) fn sign(&self, path: &str, body: &[u8], to: Receiver, stamp: Stamp) -> String {
        let tag = hmac::sign(&self.key, &message(path, to, stamp, body));
        format!(
            "v2 {} {} {} {:016x} {}",
            to.node,
            to.boot,
            stamp.millis,
            stamp.nonce,
            hex(tag.as_ref())
        )
    }

    /// Checks the header of a request to `path` with `body` (the MAC in constant time);
    /// returns the receiver the request is signed for and its stamp, which the caller still
    /// has to check.
    pub(crate) fn verify(
        &self,
        path: &str,
        body: &[u8],
        header: Option<&[u8]>,
    ) -> Result<(Receiver, Stamp), AuthError> {
        let header = header.ok_or(AuthError::Missing)?;
        let text = std::str::from_utf8(header).map_err(|_| AuthError::Malformed)?;
        let mut parts = text.split(' ');
        let version = parts.next();
        if version == Some("v1") {
            return Err(AuthError::Version1);
        }
        let (Some("v2"), Some(node), Some(boot), Some(millis), Some(nonce), Some(mac), None) = (
            version,
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(AuthError::Malformed);
        };
        let hex64 = |text: &str| u64::from_str_radix(text, 16).map_err(|_| AuthError::Malformed);
        let to = Receiver {
            node: node.parse().map_err(|_| AuthError::Malformed)?,
            boot: BootId(hex64(boot)?),
        };
        let stamp = Stamp {
            millis: millis.parse().map_err(|_| AuthError::Malformed)?,
            nonce: hex64(nonce)?,
        };
        let mac = unhex(mac).ok_or(AuthError::Malformed)?;
        hmac::verify(&self.key, &message(path, to, stamp, body), &mac)
            .map_err(|_| AuthError::BadSignature)?;
        Ok((to, stamp))
    }
}

/// What a server checks every inbound request against before decoding it: the signature,
/// that it is signed for this node and this run, and that its stamp is fresh and new. One per
/// run of a server: its boot id names its nonce record, which is why they live and die
/// together.
pub(crate) struct InboundGuard {
    me: Receiver,
    replay: ReplayGuard,
}

impl InboundGuard {
    /// A new run of `node`'s server, with a fresh boot id and an empty nonce record.
    pub(crate) fn new(node: NodeId) -> Self {
        Self::with(
            Receiver {
                node,
                boot: BootId::draw(),
            },
            ReplayGuard::new(),
        )
    }

    fn with(me: Receiver, replay: ReplayGuard) -> Self {
        Self { me, replay }
    }

    /// This run, as requests must name it.
    pub(crate) fn me(&self) -> Receiver {
        self.me
    }

    /// Accepts a request to `path` with `body` and `header` once, if it is signed with the
    /// secret for this node and run and stamped within [`MAX_CLOCK_SKEW`] of `now_millis`.
    /// The receiver is checked before the stamp, so a request for another run is answered
    /// with this run's boot id (and retried) even when it is stale, and is never recorded.
    pub(crate) fn authenticate(
        &self,
        signer: &Signer,
        path: &str,
        body: &[u8],
        header: Option<&[u8]>,
        now_millis: u64,
    ) -> Result<(), AuthError> {
        let (to, stamp) = signer.verify(path, body, header)?;
        if to.node != self.me.node {
            return Err(AuthError::OtherNode {
                to: to.node,
                this: self.me.node,
            });
        }
        if to.boot == BootId::UNKNOWN {
            return Err(AuthError::UnknownRun {
                current: self.me.boot,
            });
        }
        if to.boot != self.me.boot {
            return Err(AuthError::EarlierRun {
                signed: to.boot,
                current: self.me.boot,
            });
        }
        self.replay.admit(stamp, now_millis)
    }
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
    const BOOT_A: BootId = BootId(0xa1a1_a1a1_a1a1_a1a1);
    const BOOT_B: BootId = BootId(0xb2b2_b2b2_b2b2_b2b2);

    /// The stamp of a request sent at `millis` with `nonce`.
    fn at(millis: u64, nonce: u64) -> Stamp {
        Stamp { millis, nonce }
    }

    /// Node `node` in the run `boot`.
    fn node(node: NodeId, boot: BootId) -> Receiver {
        Receiver { node, boot }
    }

    /// The server of `node` in the run `boot`, with a fresh nonce record.
    fn server(id: NodeId, boot: BootId) -> InboundGuard {
        InboundGuard::with(node(id, boot), ReplayGuard::new())
    }

    #[test]
    fn a_signed_request_verifies_and_the_secret_is_not_in_it() {
        let s = signer("hunter2-hunter2");
        let stamp = at(T, 42);
        let header = s.sign("/raft/append", b"body", node(2, BOOT_A), stamp);
        check!(!header.contains("hunter2"));
        check!(header.starts_with("v2 2 a1a1a1a1a1a1a1a1 1800000000000 000000000000002a "));
        check!(
            s.verify("/raft/append", b"body", Some(header.as_bytes()))
                == Ok((node(2, BOOT_A), stamp))
        );
    }

    #[test]
    fn another_secret_path_body_stamp_or_receiver_is_refused() {
        let s = signer("secret-one");
        let stamp = at(T, 7);
        let header = s.sign("/raft/vote", b"body", node(2, BOOT_A), stamp);
        let h = Some(header.as_bytes());
        check!(
            signer("secret-two").verify("/raft/vote", b"body", h) == Err(AuthError::BadSignature)
        );
        check!(s.verify("/raft/append", b"body", h) == Err(AuthError::BadSignature));
        check!(s.verify("/raft/vote", b"bodY", h) == Err(AuthError::BadSignature));
        // The stamp and the receiver in clear cannot be changed without the MAC noticing.
        let edits = [
            (T.to_string(), (T + 1).to_string()),
            ("v2 2 ".to_string(), "v2 3 ".to_string()),
            (BOOT_A.to_string(), BOOT_B.to_string()),
        ];
        for (from, to) in edits {
            let moved = header.replacen(&from, &to, 1);
            check!(moved != header);
            check!(
                s.verify("/raft/vote", b"body", Some(moved.as_bytes()))
                    == Err(AuthError::BadSignature),
                "{moved}"
            );
        }
        check!(s.verify("/raft/vote", b"body", None) == Err(AuthError::Missing));
        for bad in [
            "",
            "v2",
            "v3 2 1 1 2 ab",
            "v2 x 1 1 2 ab",
            "v2 2 zz 1 2 ab",
            "v2 2 1 x 2 ab",
            "v2 2 1 1 zz ab",
            "v2 2 1 1 2 abc",
            "v2 2 1 1 2 ab extra",
            "v2 1 2 ab",
        ] {
            check!(
                s.verify("/raft/vote", b"body", Some(bad.as_bytes())) == Err(AuthError::Malformed),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_v1_header_from_an_older_member_is_refused_and_says_so() {
        // What a member of the previous version sends: no receiver in it, so it could be
        // replayed to any node and to any run; refused whatever its MAC.
        let s = signer("secret-one");
        let v1 = format!("v1 {T} 000000000000002a {}", "00".repeat(32));
        let refused = s.verify("/raft/vote", b"body", Some(v1.as_bytes()));
        check!(refused == Err(AuthError::Version1));
        check!(refused.unwrap_err().to_string().contains("older version"));
    }

    #[test]
    fn a_request_signed_for_node_2_is_refused_at_node_3() {
        let s = signer("cluster-secret-1");
        let node3 = server(3, BOOT_A);
        let header = s.sign("/control/write", b"cmd", node(2, BOOT_A), at(T, 1));
        let refused = node3.authenticate(&s, "/control/write", b"cmd", Some(header.as_bytes()), T);
        check!(refused == Err(AuthError::OtherNode { to: 2, this: 3 }));
        let refused = refused.unwrap_err();
        check!(refused.to_string() == "addressed to node 2, this is node 3");
        check!(refused.is_other_receiver());
        // Node 2 itself takes it.
        let node2 = server(2, BOOT_A);
        check!(
            node2.authenticate(&s, "/control/write", b"cmd", Some(header.as_bytes()), T) == Ok(())
        );
    }

    #[test]
    fn a_request_signed_for_boot_a_is_refused_in_boot_b_and_before_the_boot_id_is_known() {
        let s = signer("cluster-secret-1");
        let run_b = server(2, BOOT_B);
        let for_a = s.sign("/raft/append", b"entries", node(2, BOOT_A), at(T, 1));
        let refused = run_b.authenticate(&s, "/raft/append", b"entries", Some(for_a.as_bytes()), T);
        check!(
            refused
                == Err(AuthError::EarlierRun {
                    signed: BOOT_A,
                    current: BOOT_B
                })
        );
        check!(refused
            .unwrap_err()
            .to_string()
            .contains("signed for an earlier run of this node"));
        // A first contact: the sender signs for the unknown boot id and learns the current one.
        let first = s.sign(
            "/raft/append",
            b"entries",
            node(2, BootId::UNKNOWN),
            at(T, 2),
        );
        let refused = run_b.authenticate(&s, "/raft/append", b"entries", Some(first.as_bytes()), T);
        check!(refused == Err(AuthError::UnknownRun { current: BOOT_B }));
        check!(refused.is_err_and(|e| e.is_other_receiver()));
        // Signed again for the boot id in the answer: accepted.
        let again = s.sign("/raft/append", b"entries", run_b.me(), at(T, 3));
        check!(
            run_b.authenticate(&s, "/raft/append", b"entries", Some(again.as_bytes()), T) == Ok(())
        );
    }

    #[test]
    fn a_fresh_run_refuses_a_request_captured_by_the_previous_one() {
        let s = signer("cluster-secret-1");
        let before = InboundGuard::new(2);
        let captured = s.sign("/control/write", b"cmd", before.me(), at(T, 5));
        let h = Some(captured.as_bytes());
        check!(before.authenticate(&s, "/control/write", b"cmd", h, T + 10) == Ok(()));
        check!(
            before.authenticate(&s, "/control/write", b"cmd", h, T + 20)
                == Err(AuthError::Replayed)
        );
        // Node 2 restarts: its nonce record is empty, but the request names the old run.
        let after = InboundGuard::new(2);
        check!(after.me().node == 2);
        check!(after.me().boot != before.me().boot);
        check!(
            after.authenticate(&s, "/control/write", b"cmd", h, T + 30)
                == Err(AuthError::EarlierRun {
                    signed: before.me().boot,
                    current: after.me().boot
                })
        );
    }

    #[test]
    fn a_drawn_boot_id_is_never_the_unknown_one_and_runs_differ() {
        let drawn: HashSet<BootId> = (0..1000).map(|_| BootId::draw()).collect();
        check!(drawn.len() == 1000);
        check!(!drawn.contains(&BootId::UNKNOWN));
    }

    #[test]
    fn the_receiver_header_round_trips_and_refuses_garbage() {
        let me = node(7, BOOT_A);
        check!(me.to_header() == "7 a1a1a1a1a1a1a1a1");
        check!(Receiver::from_header(me.to_header().as_bytes()) == Some(me));
        for bad in ["", "7", "7 zz", "x a1", "7 a1 extra", "7  a1"] {
            check!(Receiver::from_header(bad.as_bytes()) == None, "{bad}");
        }
    }

    #[test]
    fn a_captured_request_cannot_be_replayed_nor_forged_with_another_secret() {
        let ours = signer("cluster-secret-1");
        let node2 = server(2, BOOT_A);
        let header = ours.sign("/control/write", b"cmd", node2.me(), at(T, 99));
        let h = Some(header.as_bytes());
        check!(node2.authenticate(&ours, "/control/write", b"cmd", h, T + 5) == Ok(()));
        check!(
            node2.authenticate(&ours, "/control/write", b"cmd", h, T + 10)
                == Err(AuthError::Replayed)
        );
        let theirs =
            signer("cluster-secret-2").sign("/control/write", b"cmd", node2.me(), at(T, 100));
        check!(
            node2.authenticate(&ours, "/control/write", b"cmd", Some(theirs.as_bytes()), T)
                == Err(AuthError::BadSignature)
        );
        // A stale request for this run is refused as stale, not answered with the boot id.
        let old = ours.sign("/control/write", b"cmd", node2.me(), at(T - 300_001, 101));
        check!(
            node2.authenticate(&ours, "/control/write", b"cmd", Some(old.as_bytes()), T)
                == Err(AuthError::Stale { skew_ms: 300_001 })
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
