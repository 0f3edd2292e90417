//! Leader kills: three instances carrying `BENCH_KILL_TOPICS` × `BENCH_KILL_PARTITIONS`
//! (default 1,000) units at low traffic (`BENCH_SCALE_RATE`), and `BENCH_LEADER_KILLS` times
//! (default 50) a `kill -9` of the Raft leader: (a) the time until both survivors name the same
//! new leader, (b) the time until the new leader's `/status` has every unit owned by a survivor.
//! The killed node is restarted and rejoins before the next kill. A wait past its deadline
//! fails the bench at that kill (a stall is what this scenario hunts); at the end the copy
//! must be exact.

use std::time::{Duration, Instant};

use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, partition_counts, Deadline, NodeId, ReplicatorCluster, Status, TestResult,
};

use crate::env::{cleaned_up, run_name, start_three_nodes, wait_balanced, Endpoints};
use crate::load::{paced, targets};
use crate::metrics::{raft_view, RaftView};
use crate::report::{percentile_of_sorted, secs};
use crate::settings::Settings;

/// Bound of every wait of a kill round: far above the failover budget of the defaults (an
/// election, one `ControlTiming::lease_expiry`, one assignment round), so that only a stall
/// runs into it.
const DEADLINE: Duration = Duration::from_secs(60);
/// Pause between two polls while a kill is measured; each poll reads the survivors' `/metrics`
/// and, once one follows a new leader, the leader's `/status` of every unit.
const POLL: Duration = Duration::from_millis(50);
/// Steady state between a rejoin and the next kill: lease renewals and commits flow under the
/// current leader for a while, as they would between two real failures.
const STEADY: Duration = Duration::from_secs(3);

/// What one kill measured.
#[derive(Debug, Clone)]
struct Kill {
    /// Which kill, from 1.
    number: u32,
    /// The killed leader.
    victim: NodeId,
    /// Its term when it was killed.
    old_term: u64,
    /// Units it owned when it was killed.
    moved: usize,
    /// The leader both survivors agreed on.
    new_leader: NodeId,
    /// The term they agreed at.
    new_term: u64,
    /// (a) From the kill until both survivors name `new_leader` at `new_term`.
    elected: Duration,
    /// (b) From the kill until the leader's `/status` has every unit owned by a survivor.
    owned: Duration,
    /// From the restart until all three agree on the leader and the units are spread evenly
    /// again; `None` when that wait failed.
    rejoined: Option<Duration>,
}

pub(crate) async fn run(endpoints: &Endpoints, settings: &Settings) -> TestResult {
    let stream = run_name("leader-kills");
    println!(
        "## Leader kills: {} × kill -9 of the Raft leader of three instances, {} topics × {} partitions, {} msg/s produced, defaults\n",
        settings.leader_kills, settings.kill_topics, settings.kill_partitions, settings.scale_rate
    );
    cleaned_up(endpoints, &stream, measure(endpoints, settings, &stream)).await
}

async fn measure(endpoints: &Endpoints, settings: &Settings, stream: &str) -> TestResult {
    let names: Vec<String> = (0..settings.kill_topics)
        .map(|t| format!("t{t:03}"))
        .collect();
    let partitions = settings.kill_partitions;
    let units = names.len() * partitions as usize;
    let (mut cluster, assigned, _wan) =
        start_three_nodes(endpoints, settings, stream, &names, partitions).await?;
    println!(
        "{units} units owned {} s after start, spread evenly\n",
        secs(assigned)
    );
    let producer = paced(
        &endpoints.upstream,
        targets(stream, &names, partitions),
        settings.scale_rate,
    );
    println!("| kill | killed leader (term) | its units | new leader (term) | (a) survivors agree on it (s) | (b) every unit owned again (s) | restarted node rejoined, units spread (s) |");
    println!("|---|---|---|---|---|---|---|");
    let mut kills = Vec::new();
    let mut failure = None;
    for number in 1..=settings.leader_kills {
        let mut kill = match measure_kill(&mut cluster, number, units).await {
            Ok(kill) => kill,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        let rejoined = rejoin(&mut cluster, kill.victim, number).await;
        kill.rejoined = rejoined.as_ref().ok().copied();
        println!(
            "| {number} | node {} ({}) | {} | node {} ({}) | {} | {} | {} |",
            kill.victim,
            kill.old_term,
            kill.moved,
            kill.new_leader,
            kill.new_term,
            secs(kill.elected),
            secs(kill.owned),
            kill.rejoined.map_or_else(|| "—".to_owned(), secs)
        );
        kills.push(kill);
        if let Err(e) = rejoined {
            failure = Some(e);
            break;
        }
        if number < settings.leader_kills {
            tokio::time::sleep(STEADY).await;
        }
    }
    println!();
    summary(&kills);
    if let Some(e) = failure {
        // The stall is the finding; the producer's own outcome does not matter any more.
        let _ = producer.stop().await;
        return Err(format!(
            "{e} (the table above holds the {} kills before; HA_KEEP_DIR=1 keeps the node logs)",
            kills.len()
        )
        .into());
    }

    let produced = producer.stop().await?.produced;
    let caught_up = wait_copied(endpoints, stream, &names, Duration::from_secs(120)).await?;
    let exact = verify_briefly(&cluster, Duration::from_secs(60)).await?;
    println!(
        "{produced} messages produced; downstream caught up {} s after the producer stopped; verify: {}\n",
        secs(caught_up),
        if exact {
            "exact (no loss, no duplicates)"
        } else {
            "NOT EXACT"
        }
    );
    if !exact {
        return Err("verify found the copy not exact after the leader kills".into());
    }
    cluster.passed();
    Ok(())
}

/// Kills the leader all running nodes agree on and measures (a) and (b).
async fn measure_kill(
    cluster: &mut ReplicatorCluster,
    number: u32,
    units: usize,
) -> TestResult<Kill> {
    let running = cluster.running();
    let (victim, old_term) = wait_agreed(cluster, &running)
        .await
        .map_err(|e| format!("kill {number}: before the kill: {e}"))?;
    let moved = cluster
        .leader_status()
        .await
        .map_or(0, |s| s.units_owned(victim));
    cluster.kill(victim)?;
    let killed_at = Instant::now();
    let survivors = cluster.running();
    let mut elected = None;
    let mut owned = None;
    let mut last_status = None;
    loop {
        let views = read_views(cluster, &survivors).await;
        if elected.is_none() {
            elected = agreement(&views, &survivors)
                .filter(|(_, term)| *term > old_term)
                .map(|(leader, term)| (leader, term, killed_at.elapsed()));
        }
        // Only a new leader can move the dead one's units: ask for the leader's status once a
        // survivor follows someone else.
        let new_leader_known = views
            .iter()
            .any(|(_, v)| matches!(v, Ok(RaftView { leader: Some(l), .. }) if *l != victim));
        if owned.is_none() && new_leader_known {
            if let Some(status) = cluster.leader_status().await {
                if status.leader != Some(victim)
                    && status.all_units_owned_by_any_of(&survivors, units)
                {
                    owned = Some(killed_at.elapsed());
                }
                last_status = Some(status);
            }
        }
        if let (Some((new_leader, new_term, elected)), Some(owned)) = (elected, owned) {
            return Ok(Kill {
                number,
                victim,
                old_term,
                moved,
                new_leader,
                new_term,
                elected,
                owned,
                rejoined: None,
            });
        }
        if killed_at.elapsed() > DEADLINE {
            let stalled = match elected {
                None => "the survivors agreed on no new leader".to_owned(),
                Some((leader, term, at)) => format!(
                    "the survivors agreed on node {leader} (term {term}) after {} s, but the units were not all owned by {survivors:?}",
                    secs(at)
                ),
            };
            return Err(format!(
                "kill {number} (node {victim}, leader at term {old_term}): {stalled} within {DEADLINE:?}; survivors' views: {}; leader's units: {}",
                describe(&views),
                ownership(last_status.as_ref(), victim)
            )
            .into());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Restarts `victim` and waits until it follows the leader and the units are spread evenly
/// over all three nodes; returns how long that took from the restart.
async fn rejoin(
    cluster: &mut ReplicatorCluster,
    victim: NodeId,
    number: u32,
) -> TestResult<Duration> {
    cluster.restart(victim)?;
    let restarted_at = Instant::now();
    let everyone = cluster.running();
    wait_agreed(cluster, &everyone)
        .await
        .map_err(|e| format!("kill {number}: node {victim} restarted: {e}"))?;
    wait_balanced(cluster, DEADLINE)
        .await
        .map_err(|e| format!("kill {number}: node {victim} restarted and follows: {e}"))?;
    Ok(restarted_at.elapsed())
}

/// Each node's own Raft view, or why it could not be read.
type Views = Vec<(NodeId, Result<RaftView, String>)>;

async fn read_views(cluster: &ReplicatorCluster, nodes: &[NodeId]) -> Views {
    let mut views = Vec::with_capacity(nodes.len());
    for node in nodes {
        let view = raft_view(cluster, *node).await.map_err(|e| e.to_string());
        views.push((*node, view));
    }
    views
}

/// The leader and term every one of `nodes` reports, when they all name the same leader,
/// one of `nodes`, at the same term.
fn agreement(views: &Views, nodes: &[NodeId]) -> Option<(NodeId, u64)> {
    let mut agreed = None;
    for (_, view) in views {
        let RaftView {
            leader: Some(leader),
            term,
        } = view.as_ref().ok()?
        else {
            return None;
        };
        match agreed {
            None => agreed = Some((*leader, *term)),
            Some(first) if first == (*leader, *term) => {}
            Some(_) => return None,
        }
    }
    agreed.filter(|(leader, _)| views.len() == nodes.len() && nodes.contains(leader))
}

/// Waits (up to [`DEADLINE`]) until all of `nodes` agree on a leader among them.
async fn wait_agreed(cluster: &ReplicatorCluster, nodes: &[NodeId]) -> TestResult<(NodeId, u64)> {
    let deadline = Deadline::new(DEADLINE, format!("nodes {nodes:?} to agree on a leader"));
    loop {
        let views = read_views(cluster, nodes).await;
        if let Some(agreed) = agreement(&views, nodes) {
            return Ok(agreed);
        }
        if let Err(e) = deadline.check() {
            return Err(format!("{e}; their views: {}", describe(&views)).into());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `node 1: leader 2, term 7; node 2: …` for an error message.
fn describe(views: &Views) -> String {
    views
        .iter()
        .map(|(node, view)| match view {
            Ok(RaftView { leader, term }) => format!(
                "node {node}: leader {}, term {term}",
                leader.map_or_else(|| "none".to_owned(), |l| l.to_string())
            ),
            Err(e) => format!("node {node}: {e}"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// How the leader's last status spreads the units, for an error message.
fn ownership(status: Option<&Status>, victim: NodeId) -> String {
    let Some(status) = status else {
        return "no leader's status".to_owned();
    };
    let live = status.units.iter().filter(|u| !u.retired);
    let (mut unowned, mut dead) = (0, 0);
    for unit in live {
        match unit.owner {
            None => unowned += 1,
            Some(owner) if owner == victim => dead += 1,
            Some(_) => {}
        }
    }
    format!(
        "leader {:?} at term {}: {dead} still owned by node {victim}, {unowned} unowned",
        status.leader, status.term
    )
}

/// Waits until every partition of every topic holds as many messages downstream as upstream;
/// returns how long that took.
async fn wait_copied(
    endpoints: &Endpoints,
    stream: &str,
    topics: &[String],
    within: Duration,
) -> TestResult<Duration> {
    let started = Instant::now();
    let up = connect(&endpoints.upstream).await?;
    let down = connect(&endpoints.downstream).await?;
    let deadline = Deadline::new(within, format!("{stream} to be copied completely"));
    loop {
        let (mut behind, mut up_total, mut down_total) = (0usize, 0u64, 0u64);
        for topic in topics {
            let source = partition_counts(&up, stream, topic).await?;
            let target = partition_counts(&down, stream, topic).await?;
            up_total += source.iter().sum::<u64>();
            down_total += target.iter().sum::<u64>();
            behind += source
                .iter()
                .enumerate()
                .filter(|(p, count)| target.get(*p) != Some(*count))
                .count();
        }
        if behind == 0 {
            up.shutdown().await?;
            down.shutdown().await?;
            return Ok(started.elapsed());
        }
        if let Err(e) = deadline.check() {
            return Err(format!(
                "{e}: {behind} partitions behind, {down_total} of {up_total} messages downstream"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Runs `iggy-replicator verify` like [`ReplicatorCluster::verify`] but prints only its totals
/// when the copy is exact (its table has a row per partition: 1,000 rows by default); returns
/// whether it was exact.
async fn verify_briefly(cluster: &ReplicatorCluster, wait: Duration) -> TestResult<bool> {
    let run = cluster.run_verify(wait).await?;
    for line in run.stdout.lines() {
        // Partition rows are indented; keep them only when something is wrong.
        if !run.exact || !line.starts_with("  ") || line.trim_start().starts_with("total:") {
            println!("verify: {line}");
        }
    }
    Ok(run.exact)
}

/// The markdown summary: p50 / p99 / max of (a) and (b) and the slowest kill of each.
fn summary(kills: &[Kill]) {
    if kills.is_empty() {
        println!("no kill completed\n");
        return;
    }
    let spread = |pick: fn(&Kill) -> Duration| {
        let mut sorted: Vec<Duration> = kills.iter().map(pick).collect();
        sorted.sort_unstable();
        let slowest = kills.iter().max_by_key(|k| pick(k)).map_or(0, |k| k.number);
        (
            format!(
                "{} / {} / {}",
                secs(percentile_of_sorted(&sorted, 50.0)),
                secs(percentile_of_sorted(&sorted, 99.0)),
                secs(sorted.last().copied().unwrap_or_default())
            ),
            slowest,
        )
    };
    let (elected, slowest_elected) = spread(|k| k.elected);
    let (owned, slowest_owned) = spread(|k| k.owned);
    println!("| kills | (a) survivors agree on a new leader: p50 / p99 / max (s) | (b) every unit owned again: p50 / p99 / max (s) | slowest kill (a) / (b) |");
    println!("|---|---|---|---|");
    println!(
        "| {} | {elected} | {owned} | {slowest_elected} / {slowest_owned} |\n",
        kills.len()
    );
}
