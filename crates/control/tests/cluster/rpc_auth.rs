//! The signature of member RPCs through the real server: a request captured on its way to one
//! node is refused by another node and by the same node once it restarted, while the members'
//! own client learns every peer's boot id by itself.
//!
//! The requests here are signed by a test-side signer written from the wire format that the
//! docs of `network::auth` describe (the crate keeps its own signer private), so this test
//! also pins that format.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use assert2::check;
use ring::hmac;

use crate::util::*;

const AUTH_HEADER: &str = "x-replicator-auth";
const RECEIVER_HEADER: &str = "x-replicator-receiver";
const PING: &str = "/control/ping";

/// The `v2` header of a request to `path` with `body` for node `node` in run `boot`.
fn sign(path: &str, body: &[u8], node: u64, boot: u64, nonce: u64) -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut message =
        format!("iggy-replicator rpc v2\n{path}\n{node}\n{boot:016x}\n{millis}\n{nonce:016x}\n")
            .into_bytes();
    message.extend_from_slice(body);
    let key = hmac::Key::new(hmac::HMAC_SHA256, SECRET.as_bytes());
    let mac: String = hmac::sign(&key, &message)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("v2 {node} {boot:016x} {millis} {nonce:016x} {mac}")
}

/// POSTs a ping (an empty body) with `header` to `addr`; the status and the receiver the
/// server named, if it did.
async fn ping(
    http: &reqwest::Client,
    addr: std::net::SocketAddr,
    header: &str,
) -> Result<(u16, Option<String>), reqwest::Error> {
    let resp = http
        .post(format!("http://{addr}{PING}"))
        .header(AUTH_HEADER, header)
        .body(Vec::new())
        .send()
        .await?;
    let receiver = resp
        .headers()
        .get(RECEIVER_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Ok((resp.status().as_u16(), receiver))
}

/// The boot id in a receiver header `<node> <boot id>` of node `node`.
fn boot_of(node: u64, receiver: Option<&str>) -> Option<u64> {
    let (id, boot) = receiver?.split_once(' ')?;
    (id.parse() == Ok(node))
        .then(|| u64::from_str_radix(boot, 16).ok())
        .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_request_is_refused_by_another_node_and_after_a_restart() -> TestResult {
    let (mut cluster, _) = TestCluster::start_led(3).await?;
    let http = reqwest::Client::new();
    let node2 = cluster.addrs[&2];

    // First contact: signed for the unknown run (0), answered with node 2's boot id.
    let (status, receiver) = ping(&http, node2, &sign(PING, b"", 2, 0, 1)).await?;
    check!(status == 409);
    let boot = boot_of(2, receiver.as_deref()).ok_or("no boot id of node 2 in the answer")?;
    check!(boot != 0);

    // Signed for that run it is accepted: this is the request an eavesdropper captures.
    let captured = sign(PING, b"", 2, boot, 2);
    check!(ping(&http, node2, &captured).await?.0 == 200);
    // Replayed to node 2: refused. Replayed to node 3: refused, naming node 3.
    check!(ping(&http, node2, &captured).await?.0 == 401);
    let (status, receiver) = ping(&http, cluster.addrs[&3], &captured).await?;
    check!(status == 409);
    check!(boot_of(3, receiver.as_deref()).is_some());

    // Node 2 restarts with an empty nonce record, yet refuses the captured request: it was
    // signed for the earlier run.
    cluster.crash(2).await;
    cluster.restart(2).await?;
    let (status, receiver) = ping(&http, node2, &captured).await?;
    check!(status == 409);
    let rebooted = boot_of(2, receiver.as_deref()).ok_or("no boot id in the answer")?;
    check!(rebooted != boot);

    // The members' own client learns the new run by itself: the cluster agrees on a leader
    // again (its appends reach node 2), and a write through node 2, forwarded to the leader
    // unless node 2 leads, commits.
    let leader = cluster.wait_leader(Duration::from_secs(10)).await?;
    cluster.report_units(2, 3).await?;
    cluster
        .wait_owners("3 units assigned", leader, |owners| {
            owners.len() == 3 && owners.values().all(Option::is_some)
        })
        .await?;
    cluster.shutdown().await;
    Ok(())
}
