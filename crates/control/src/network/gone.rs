//! Evidence that a peer's process is gone, from the way calls to it fail.
//!
//! A member that stops renewing is fenced after `fence_after` (ARCHITECTURE.md, "Never two
//! owners"): on one site that is most of a follower's failover, and across regions more. A
//! process that died (`kill -9`, a crash, an OOM kill) says so sooner: its host's kernel
//! refuses new connections to its port and closes or resets the open ones, and the leader's
//! next heartbeat meets that within one heartbeat interval. A frozen process, a cut link or a
//! slow one show nothing of the kind (their calls time out), and keep the renewal clock alone.
//!
//! One such failure is not taken as proof: two in a row, with no answer between them, are
//! (openraft retries an unreachable follower after the backoff `client::Connection` gives,
//! one heartbeat interval at first). The leader may then fence the member at once
//! (`LeaderView::peers_gone`); being wrong costs a move of its units, never a second writer,
//! since a fence makes the target itself refuse the old owner's writes.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use replicator_model::NodeId;

/// Failures in a row that show a peer gone.
pub(crate) const GONE_AFTER_FAILURES: u32 = 2;

/// Per peer, the calls in a row whose connection was refused, or closed or reset before any
/// answer, since its last answer.
#[derive(Debug, Default)]
pub(crate) struct GonePeers {
    /// Per peer: such failures in a row.
    failures: HashMap<NodeId, Failures>,
}

#[derive(Debug)]
struct Failures {
    count: u32,
    first: Instant,
}

/// A peer shown gone (see [`GonePeers::gone`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Gone {
    /// The first failure of the run: the process died before it.
    pub(crate) since: Instant,
}

impl GonePeers {
    /// A call to `peer` failed at `at` in a way that shows no process listening there.
    /// Whether that showed it gone just now (the failure that completes the proof).
    pub(crate) fn failed(&mut self, peer: NodeId, at: Instant) -> bool {
        let entry = self.failures.entry(peer).or_insert(Failures {
            count: 0,
            first: at,
        });
        entry.count = entry.count.saturating_add(1);
        entry.first = entry.first.min(at);
        entry.count == GONE_AFTER_FAILURES
    }

    /// `peer` answered (any answer, even a refusal of the request: its process is there).
    pub(crate) fn answered(&mut self, peer: NodeId) {
        self.failures.remove(&peer);
    }

    /// The peers shown gone, until they answer again (see `LeaderView::peers_gone`).
    pub(crate) fn gone(&self) -> BTreeMap<NodeId, Gone> {
        self.failures
            .iter()
            .filter(|(_, f)| f.count >= GONE_AFTER_FAILURES)
            .map(|(peer, f)| (*peer, Gone { since: f.first }))
            .collect()
    }
}

/// Whether `e`, the error of a call, shows that no process listens at the peer's address any
/// more: the connection was refused, or closed or reset before the answer was complete. A
/// timeout never does (a frozen peer, a cut or a slow link).
pub(crate) fn shows_peer_gone(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind;
    let mut cause = Some(e);
    while let Some(err) = cause {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            match io.kind() {
                ErrorKind::TimedOut | ErrorKind::WouldBlock => return false,
                ErrorKind::ConnectionRefused
                | ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof => return true,
                // An error wrapped into an `io::Error` (its `source` skips the wrapped one).
                _ => {
                    if let Some(inner) = io.get_ref() {
                        cause = Some(inner);
                        continue;
                    }
                }
            }
        }
        if let Some(http) = err.downcast_ref::<hyper::Error>() {
            if http.is_timeout() {
                return false;
            }
            if http.is_incomplete_message() {
                return true;
            }
        }
        cause = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use assert2::check;

    use super::*;

    #[test]
    fn a_peer_is_gone_after_two_failures_in_a_row_and_back_at_its_first_answer() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut peers = GonePeers::default();
        check!(!peers.failed(2, t0));
        check!(peers.gone().is_empty(), "one failure is no proof");
        check!(peers.failed(2, t0 + ms(100)), "shown gone now");
        peers.failed(3, t0 + ms(100));
        let gone = Gone { since: t0 };
        check!(peers.gone() == BTreeMap::from([(2, gone)]));
        // Later failures keep the first one as the start.
        check!(!peers.failed(2, t0 + ms(300)), "gone already");
        check!(peers.gone() == BTreeMap::from([(2, gone)]));
        // An answer, whatever it says, clears the evidence; counting starts again.
        peers.answered(2);
        peers.failed(2, t0 + ms(400));
        check!(peers.gone().is_empty());
    }

    #[test]
    fn refused_and_closed_connections_show_a_peer_gone_and_timeouts_do_not() {
        use std::io::{Error, ErrorKind};
        for kind in [
            ErrorKind::ConnectionRefused,
            ErrorKind::ConnectionReset,
            ErrorKind::UnexpectedEof,
        ] {
            check!(shows_peer_gone(&Error::from(kind)), "{kind:?}");
        }
        for kind in [ErrorKind::TimedOut, ErrorKind::PermissionDenied] {
            check!(!shows_peer_gone(&Error::from(kind)), "{kind:?}");
        }
        // Found as the cause of a wrapping error, as reqwest reports it.
        let wrapped = Error::other(Error::from(ErrorKind::ConnectionRefused));
        check!(shows_peer_gone(&wrapped));
    }

    /// The errors the HTTP client really gives: a port nobody listens on, and a listener that
    /// closes every connection without answering (a dead peer behind a proxy looks so).
    #[tokio::test]
    async fn the_http_clients_errors_for_a_dead_peer_show_it_gone() {
        let client = reqwest::Client::new();
        // A port that was just free: connecting is refused.
        let free = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = free.local_addr().expect("addr");
        drop(free);
        let refused = client
            .post(format!("http://{addr}/x"))
            .send()
            .await
            .expect_err("nothing listens");
        check!(shows_peer_gone(&refused), "{refused:?}");

        let closer = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = closer.local_addr().expect("addr");
        let accept = tokio::spawn(async move {
            while let Ok((socket, _)) = closer.accept().await {
                drop(socket);
            }
        });
        let closed = client
            .post(format!("http://{addr}/x"))
            .body("hello")
            .send()
            .await
            .expect_err("closed without an answer");
        check!(shows_peer_gone(&closed), "{closed:?}");
        accept.abort();

        // A listener that accepts and never answers: a timeout, not gone.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = silent.local_addr().expect("addr");
        let timed_out = client
            .post(format!("http://{addr}/x"))
            .timeout(Duration::from_millis(100))
            .send()
            .await
            .expect_err("no answer");
        check!(!shows_peer_gone(&timed_out), "{timed_out:?}");
        drop(silent);
    }
}
