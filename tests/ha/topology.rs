//! The fence in topologies beyond one flow into one fenced target (issue 26): a fan-out to two
//! fenced targets with one of them down and an instance killed; a reverse flow added by a
//! reload with both clusters fenced; a target added by a config change and a full restart;
//! fenced and unfenced targets mixed under freezes; a leader whose Raft commits stall. Three
//! `run` processes over in-process servers, fencing the product default ("users") unless a
//! scenario says otherwise; every flow ends checked by `verify` (every message once, in order,
//! per partition) within a stated bound.
//!
//! A target that is "down" stops answering with every connection left open (the in-process
//! equivalent of its process frozen by SIGSTOP): requests are read and wait, and run when it
//! answers again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use replicator_harness::IggyCluster as _;
use replicator_harness::{
    connect, ensure_topic, serial, wait_resumed, wait_until, FlowEntry, NodeId, PacedProducer,
    Placement, Replication, ReplicatorCluster, Stalled, Status, TestResult, Topic,
};

use crate::fixture::{self, exact_within, produced_more, Regions};

/// How long a flow may take to become exact once its last message was produced (or its
/// target answers again): generous for a busy two-core machine; a working failover takes a
/// few seconds.
const EXACT_WITHIN: Duration = Duration::from_secs(60);
/// How long every unit may take to be owned again after a start, a restart or a fault.
const OWNED_WITHIN: Duration = Duration::from_secs(60);
/// The three nodes.
const NODES: [NodeId; 3] = [1, 2, 3];

/// Starts the three nodes on `replication`, whose flows have `units` partitions in all, and
/// waits until every unit is owned.
async fn launch(replication: &Replication, units: usize) -> TestResult<ReplicatorCluster> {
    let placements = NODES
        .iter()
        .map(|id| Ok((*id, Placement::loopback()?)))
        .collect::<TestResult<_>>()?;
    Ok(ReplicatorCluster::launch(fixture::spec_of(replication, units, false)?, placements).await?)
}

/// One flow of [`fan_out`]: `flow` copies `stream`/`events` (8 partitions) from the source
/// `src` to the target `target`, whose `fencing` is set (or the product default for `None`).
struct Branch {
    flow: &'static str,
    stream: &'static str,
    target: &'static str,
    fencing: Option<&'static str>,
}

impl Branch {
    fn new(
        flow: &'static str,
        stream: &'static str,
        target: &'static str,
        fencing: Option<&'static str>,
    ) -> Self {
        Self {
            flow,
            stream,
            target,
            fencing,
        }
    }
}

/// A source and a target per branch, the three nodes running a flow per branch, and a
/// producer into each branch's topic; returns once every branch copies. The topics and their
/// producers come in the branches' order.
async fn fan_out<const N: usize>(
    branches: [Branch; N],
) -> TestResult<(Regions, ReplicatorCluster, [(Topic, PacedProducer); N])> {
    let topics = branches
        .each_ref()
        .map(|b| Topic::new(b.stream, "events", 8));
    let mut aliases = vec!["src"];
    aliases.extend(branches.iter().map(|b| b.target));
    let regions = Regions::start(&aliases, &topics.each_ref()).await?;
    let mut replication = Replication::default().cluster(regions.entry("src", None));
    for b in &branches {
        replication = replication
            .cluster(regions.entry(b.target, b.fencing))
            .flow(FlowEntry::new(
                b.flow,
                "src",
                b.target,
                format!("{}/*", b.stream),
            ));
    }
    let cluster = launch(&replication, units_of(&topics.each_ref())).await?;
    let producers = topics.each_ref().map(|t| regions.produce(t));
    for (b, topic) in branches.iter().zip(&topics) {
        regions.wait_copy_started(b.target, topic).await?;
    }
    let mut producers = producers.into_iter();
    let flows = topics.map(|t| (t, producers.next().expect("one producer per topic")));
    Ok((regions, cluster, flows))
}

/// Stops `producer` (at once, or after its total) and requires `flow` to be exact within
/// [`EXACT_WITHIN`] from then on, which is `when` (for the error).
async fn stopped_then_exact(
    cluster: &ReplicatorCluster,
    producer: PacedProducer,
    flow: &str,
    when: &str,
) -> TestResult {
    let report = producer.stop().await?;
    println!(
        "produced {} messages for flow {flow} ({} failed sends)",
        report.produced, report.failed_sends
    );
    exact_within(cluster, flow, EXACT_WITHIN, when).await
}

/// Units of `topics` (one per partition).
fn units_of(topics: &[&Topic]) -> usize {
    topics.iter().map(|t| t.partitions as usize).sum()
}

/// Flow `a` copies `fan-a` to `eu`, flow `b` copies `fan-b` to `ap`, both targets fenced, a
/// producer per stream. `ap` stops answering; then, while the producer of `fan-a` writes, a
/// follower that writes units of flow `a` is killed (-9) and stays dead. Flow `a` must be
/// exact on `eu` within [`EXACT_WITHIN`] of the producer's end while `ap` is still down:
/// `ap`'s outage may hold back flow `b`, not the flow of a target that answers. Once `ap`
/// answers again and `fan-b` gets more messages, flow `b` must be exact within
/// [`EXACT_WITHIN`] of its producer's end too.
///
/// The killed node then restarts, `ap` still down: it must own units of `a` again within
/// [`OWNED_WITHIN`] (a target's outage does not keep a restarted node from the others).
///
/// `fan-b` gets no message while `ap` is down, and everything before was copied: a send to
/// `ap` that outlives the writer's call timeout would be resent after the thaw, a duplicate
/// the README documents for Iggy 0.8 ("A send whose outcome is unknown"), not this fault.
#[test]
fn one_target_down_holds_back_only_its_own_flow() -> TestResult {
    serial(|| async {
        let (regions, mut cluster, [(a, into_a), (b, into_b)]) = fan_out([
            Branch::new("a", "fan-a", "eu", None),
            Branch::new("b", "fan-b", "ap", None),
        ])
        .await?;

        let every: Vec<u32> = (0..b.partitions).collect();
        regions.quiesce(&into_b, "ap", &b, &every).await?;
        let ap = regions.server("ap").faults();
        ap.stall();
        let (victim, owned) = fixture::owning_follower(&cluster, &a).await?;
        cluster.kill(victim)?;
        println!(
            "ap stopped answering; node {victim} killed, owning partitions {owned:?} of flow a"
        );
        // Five more seconds of traffic into flow a after the kill.
        produced_more(&into_a, 8000).await?;
        let when = "after the producer stopped, ap still down";
        stopped_then_exact(&cluster, into_a, "a", when).await?;

        // Restarted while ap is still down, the node gets its next identity and takes work
        // on eu again; its old identity's units of b stay held until ap acknowledges.
        cluster.restart(victim)?;
        wait_until(
            "the restarted node owns units of flow a, ap still down",
            OWNED_WITHIN,
            || async {
                cluster
                    .leader_status()
                    .await
                    .is_some_and(|s| !s.owned_by(&a, victim).is_empty())
            },
        )
        .await?;

        ap.end_stall();
        into_b.resume();
        produced_more(&into_b, 4000).await?;
        let when = "after the producer stopped, ap up again";
        stopped_then_exact(&cluster, into_b, "b", when).await?;
        regions.finish(cluster).await
    })
}

/// Flow `up-to-down` runs with both clusters fenced (the default). Every node's file gains
/// the flow `down-to-up` (the stream `back` on `down` into `up`) and gets SIGHUP; once every
/// node runs it and its units are owned, 4000 messages are produced into `back`. The new flow
/// must be exact on `up` within [`EXACT_WITHIN`] of the last one, and the first flow stays
/// exact.
#[test]
fn a_reload_adds_the_reverse_flow_with_both_clusters_fenced() -> TestResult {
    serial(|| async {
        let (servers, mut cluster, producer) = fixture::start(3).await?;
        let back = Topic::new("back", "events", 4);
        let down_url = servers.downstream.connection_string();
        let down = connect(&down_url).await?;
        ensure_topic(&down, &back.stream, &back.name, back.partitions).await?;
        let _ = down.shutdown().await;

        let both = fixture::replication(&servers, None, "")
            .flow(FlowEntry::new("down-to-up", "down", "up", "back/*"))
            .toml();
        for node in NODES {
            cluster.rewrite_replication(node, &both)?;
            cluster.hangup(node)?;
        }
        cluster.set_units(units_of(&[&servers.topic, &back]));
        let reloaded = Instant::now();
        wait_until(
            "every node runs both flows and owns units of them",
            OWNED_WITHIN,
            || async {
                cluster.leader_status().await.is_some_and(|s| {
                    s.members.iter().all(|m| m.config_disagrees.is_empty())
                        && s.owned_units_of("down-to-up") == back.partitions as usize
                        && s.owned_units_of("up-to-down") == servers.topic.partitions as usize
                })
            },
        )
        .await?;
        println!(
            "every node reloaded; the reverse flow's units owned after {:.2} s",
            reloaded.elapsed().as_secs_f64()
        );

        let mut params = fixture::producer_params(&down_url, &[&back]);
        params.total = Some(4000);
        let reverse = PacedProducer::start(params);
        wait_until("4000 messages produced into back", OWNED_WITHIN, || {
            std::future::ready(reverse.is_finished())
        })
        .await?;
        let when = "after the last message was produced";
        stopped_then_exact(&cluster, reverse, "down-to-up", when).await?;
        fixture::finish_with_exact_copy(producer, servers, cluster).await
    })
}

/// One flow into `first` runs; every node stops (SIGTERM, a clean drain), every node's file
/// gains the cluster `second` and a flow of the same stream into it, and every node starts
/// again. With the producer writing throughout, the new flow must be exact on `second` within
/// [`EXACT_WITHIN`] of the producer's end, and the flow into `first` stays exact.
#[test]
fn a_config_change_and_full_restart_adds_a_target() -> TestResult {
    serial(|| async {
        let topic = fixture::topic();
        let regions = Regions::start(&["src", "first", "second"], &[&topic]).await?;
        let include = format!("{}/*", topic.stream);
        let one = Replication::default()
            .cluster(regions.entry("src", None))
            .cluster(regions.entry("first", None))
            .flow(FlowEntry::new("to-first", "src", "first", &include));
        let mut cluster = launch(&one, units_of(&[&topic])).await?;
        let producer = regions.produce(&topic);
        regions.wait_copy_started("first", &topic).await?;

        let codes = cluster.terminate(&NODES, Duration::from_secs(90)).await?;
        for (id, code) in &codes {
            assert_eq!(*code, Some(0), "node {id} did not drain cleanly");
        }
        let two = one
            .cluster(regions.entry("second", None))
            .flow(FlowEntry::new("to-second", "src", "second", &include))
            .toml();
        for node in NODES {
            cluster.rewrite_replication(node, &two)?;
            cluster.restart(node)?;
        }
        cluster.set_units(units_of(&[&topic, &topic]));
        let restarted = Instant::now();
        cluster.wait_all_owned(&NODES, OWNED_WITHIN).await?;
        println!(
            "restarted with the second target: every unit owned after {:.2} s",
            restarted.elapsed().as_secs_f64()
        );
        produced_more(&producer, 4000).await?;
        let when = "after the producer stopped";
        stopped_then_exact(&cluster, producer, "to-second", when).await?;
        regions.finish(cluster).await
    })
}

/// Seed of the freeze schedule of the mixed-fencing scenario (`TOPOLOGY_SEED` replays another).
const MIXED_SEED: u64 = 0x70b0_0026;
/// Rounds of that schedule.
const MIXED_ROUNDS: usize = 5;

/// What one round of the mixed-fencing schedule did.
struct Round {
    /// The frozen member.
    member: NodeId,
    /// How long it was frozen.
    frozen: Duration,
    /// Whether the leader had decided to fence it by the end of the freeze.
    fence_decided: bool,
    /// What happened while one of its sends to `open` was held (`None`: it owned no
    /// partition of the unfenced flow after the thaw).
    held: Option<Held>,
}

/// A send of the frozen member to one partition of `open`, held while the fence completes.
struct Held {
    /// The partition.
    partition: u32,
    /// Whether the member sent to it within [`HOLD_AT_MOST`] (the send was held).
    captured: bool,
    /// How long after the fenced target answered again the partition was granted anew (to
    /// another member, or to the member under a new epoch) while the send was held.
    regranted_after: Option<Duration>,
    /// How long after the fenced target answered again another member wrote the partition
    /// while the send was held.
    written_after: Option<Duration>,
}

impl Held {
    /// Why the hold shows a second writer, if it does: the partition moved away from a member
    /// whose lease was valid (it renewed all along, and its send was on its way).
    fn second_writer(&self) -> Option<String> {
        let secs =
            |d: Option<Duration>| d.map_or("-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()));
        (self.captured && (self.regranted_after.is_some() || self.written_after.is_some())).then(|| {
            format!(
                "partition {} of open granted anew after {}, written by another member after {} (after fenced answered), while its owner renewed its lease and had a send on its way to it",
                self.partition,
                secs(self.regranted_after),
                secs(self.written_after)
            )
        })
    }
}

/// Two targets of one source: `fenced` (`fencing = "users"`) gets `mix-f`, `open`
/// (`fencing = "off"`) gets `mix-u`, a producer per stream. A seeded schedule freezes
/// followers that write to `open` (for 1.8 to 3 s, past their lease) while the producers
/// write; at the end both flows must be exact (0 duplicates) within [`EXACT_WITHIN`] of the
/// producers' end.
///
/// Each round aims at a fence acknowledged by `fenced` alone: `fenced` stops answering; the
/// member is frozen past its lease (the leader decides to fence it, and the revoke waits for
/// `fenced`); it thaws, renews its lease and writes to `open` again; one of its sends to
/// `open` is held on its way (a slow network, for at most [`HOLD_AT_MOST`], while the member
/// keeps renewing); `fenced` answers (the revoke is acknowledged); once another member wrote
/// the held partition, or after [`HOLD_AT_MOST`], the held send arrives. With the fence per
/// target, the member's `open` units stay its own while it renews (they move only once its
/// lease expired, renewal-guarded): nobody else writes the held partition, and the held send
/// lands in order. If a fence acknowledged on `fenced` frees them, another member writes the
/// partition while the member's lease is valid (the test names the round: two writers), and
/// the held send lands behind its copies (duplicates, unless the partition moved on again
/// before the new owner wrote).
///
/// No duplicate can come from the limits the README documents: before the freeze the
/// producer of `mix-u` pauses until `open` holds every message of the member's partitions,
/// and resumes once it is frozen, so the member has no send to `open` under way when it
/// freezes (a process frozen inside a send, `fence.rs`); and no send is held, or waits in a
/// target that does not answer, for as long as a call timeout (10 s), so none is resent
/// behind itself (a send whose outcome is unknown): `mix-f` gets no message while `fenced`
/// does not answer.
#[test]
fn fenced_and_unfenced_targets_mixed_under_freezes_duplicate_nothing() -> TestResult {
    let seed = std::env::var("TOPOLOGY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(MIXED_SEED);
    println!(
        "mixed fencing: seed {seed} ({MIXED_ROUNDS} rounds); replay with TOPOLOGY_SEED={seed}"
    );
    serial(|| async move {
        let (regions, mut cluster, [(f, into_fenced), (u, into_open)]) = fan_out([
            Branch::new("to-fenced", "mix-f", "fenced", Some("users")),
            Branch::new("to-open", "mix-u", "open", Some("off")),
        ])
        .await?;
        let mixed = Mixed {
            regions: &regions,
            fenced: &f,
            open: &u,
            into_fenced,
            into_open,
        };

        let mut rng = StdRng::seed_from_u64(seed);
        let started = Instant::now();
        let mut first_excess = None;
        let mut second_writers = Vec::new();
        for index in 1..=MIXED_ROUNDS {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1500))).await;
            let at = started.elapsed();
            let round = mixed.round(&mut cluster, &mut rng).await?;
            let over = excess(&u, &regions, "open");
            let second_writer = round.held.as_ref().and_then(Held::second_writer);
            println!(
                "round {index} at {:>5.1} s: node {} frozen {:.1} s, fence decided: {}; held send: {}; second writer: {}; excess on open {over:?}",
                at.as_secs_f64(),
                round.member,
                round.frozen.as_secs_f64(),
                round.fence_decided,
                round.held.as_ref().map_or("none (no partition of open)".to_owned(), |h| format!(
                    "partition {}{}",
                    h.partition,
                    if h.captured { "" } else { " (nothing sent)" }
                )),
                second_writer.as_deref().unwrap_or("none"),
            );
            if !over.is_empty() && first_excess.is_none() {
                first_excess = Some(index);
            }
            if let Some(why) = second_writer {
                second_writers.push(format!("round {index}, node {}: {why}", round.member));
            }
            cluster.wait_all_owned(&NODES, OWNED_WITHIN).await?;
        }
        for producer in [mixed.into_fenced, mixed.into_open] {
            let report = producer.stop().await?;
            println!(
                "produced {} messages ({} failed sends)",
                report.produced, report.failed_sends
            );
        }
        println!(
            "{MIXED_ROUNDS} rounds in {:.1} s; first round after which open held more than upstream: {first_excess:?} (seed {seed})",
            started.elapsed().as_secs_f64()
        );
        let stopped = "after the producers stopped";
        let open_exact = exact_within(&cluster, "to-open", EXACT_WITHIN, stopped).await;
        let fenced_exact = exact_within(&cluster, "to-fenced", EXACT_WITHIN, stopped).await;
        assert!(
            second_writers.is_empty(),
            "units of the unfenced target moved away from a member whose lease was valid (seed {seed}):\n{}",
            second_writers.join("\n")
        );
        open_exact?;
        fenced_exact?;
        regions.finish(cluster).await
    })
}

/// The longest a send of the member to `open` is held: well below the call timeout (10 s),
/// after which the writer would resend it.
const HOLD_AT_MOST: Duration = Duration::from_secs(3);

/// The servers, topics and producers of the mixed-fencing scenario.
struct Mixed<'a> {
    regions: &'a Regions,
    /// The topic copied to `fenced`.
    fenced: &'a Topic,
    /// The topic copied to `open`.
    open: &'a Topic,
    into_fenced: PacedProducer,
    into_open: PacedProducer,
}

impl Mixed<'_> {
    /// One round of the schedule (see the scenario).
    async fn round(&self, cluster: &mut ReplicatorCluster, rng: &mut StdRng) -> TestResult<Round> {
        let followers = fixture::owning_followers(cluster, self.open).await?;
        let (member, owned) = followers.choose(rng).ok_or("no follower")?.clone();
        let frozen = Duration::from_millis(rng.gen_range(1800..3000));
        let every: Vec<u32> = (0..self.fenced.partitions).collect();
        self.regions
            .quiesce(&self.into_fenced, "fenced", self.fenced, &every)
            .await?;
        // The fenced target stops answering: a fence decided now waits for it.
        let fenced = self.regions.server("fenced").faults();
        fenced.stall();
        let owned: Vec<u32> = owned.into_iter().collect();
        self.regions
            .quiesce(&self.into_open, "open", self.open, &owned)
            .await?;
        cluster.pause(member)?;
        self.into_open.resume();
        tokio::time::sleep(frozen).await;
        let fence_decided = cluster
            .leader_status()
            .await
            .and_then(|s| s.member(member).map(|m| m.fenced))
            .unwrap_or(false);
        cluster.resume(member)?;
        wait_until(
            &format!("node {member} to renew its lease after the thaw"),
            OWNED_WITHIN,
            || async {
                cluster.leader_status().await.is_some_and(|s| {
                    s.member(member)
                        .is_some_and(|m| m.lease_alive == Some(true))
                })
            },
        )
        .await?;

        // One of its sends to `open` on its way while the fence completes.
        let status = cluster.leader_status().await.ok_or("no leader")?;
        let owned: Vec<u32> = status.owned_by(self.open, member).into_iter().collect();
        let held = match owned.choose(rng) {
            Some(&partition) => Some(self.hold_while_fenced_answers(cluster, partition).await?),
            None => {
                fenced.end_stall();
                None
            }
        };
        self.into_fenced.resume();
        Ok(Round {
            member,
            frozen,
            fence_decided,
            held,
        })
    }

    /// Holds the next send to `partition` of the `open` topic (its owner's), lets the fenced
    /// target answer again, watches the partition's grant and copies until another member
    /// wrote it or [`HOLD_AT_MOST`] passed, and lets the held send in.
    async fn hold_while_fenced_answers(
        &self,
        cluster: &ReplicatorCluster,
        partition: u32,
    ) -> TestResult<Held> {
        let open = self.regions.server("open");
        let grant = |status: &Status| {
            status
                .grants_of("to-open")
                .into_iter()
                .find_map(|(unit, grant)| (unit.partition == partition).then_some(grant))
        };
        let hold = open
            .faults()
            .hold_sends_to(&self.open.stream, &self.open.name, partition);
        let captured = tokio::time::timeout(HOLD_AT_MOST, hold.until_held(1))
            .await
            .is_ok();
        let copies = self.open.counts_on(open)[partition as usize];
        let granted = cluster.leader_status().await.as_ref().and_then(grant);
        self.regions.server("fenced").faults().end_stall();
        let answered = Instant::now();
        let mut held = Held {
            partition,
            captured,
            regranted_after: None,
            written_after: None,
        };
        while captured && held.written_after.is_none() && answered.elapsed() < HOLD_AT_MOST {
            let now = cluster.leader_status().await.as_ref().and_then(grant);
            let moved = matches!((&granted, &now), (Some(before), Some(now)) if now != before);
            if moved && held.regranted_after.is_none() {
                held.regranted_after = Some(answered.elapsed());
            }
            if self.open.counts_on(open)[partition as usize] > copies {
                held.written_after = Some(answered.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::timeout(Duration::from_secs(30), hold.release_and_wait())
            .await
            .map_err(|_| "the held send was not answered in 30 s")?;
        Ok(held)
    }
}

/// Partitions of `topic` holding more messages on the server of `alias` than upstream, with
/// how many more (copies can only outnumber their originals by duplicates).
fn excess(topic: &Topic, regions: &Regions, alias: &str) -> BTreeMap<u32, u64> {
    let up = topic.counts_on(regions.source());
    let down = topic.counts_on(regions.server(alias));
    (0..topic.partitions)
        .filter_map(|p| {
            let (u, d) = (up[p as usize], down[p as usize]);
            (d > u).then(|| (p, d - u))
        })
        .collect()
}

/// How long the leader's Raft commits stall.
const COMMIT_STALL: Duration = Duration::from_secs(2);

/// The commit stall of a leader: with the assignment balanced, both followers are frozen for
/// [`COMMIT_STALL`] (the leader cannot reach a quorum and nothing commits), then thawed. The
/// copy is exact within [`EXACT_WITHIN`] of the producer's end (all read after that, seconds
/// after the stall ended), and no member is fenced for the stall itself: every member other
/// than the stalled leader keeps its writer identity (the same incarnation, never marked
/// fenced) and its units (same owner, same epoch).
///
/// The stalled leader keeps all that too when it is still the leader after the thaw. When a
/// thawed follower's election came first (likelier the busier the machine: its election timer
/// ran out while it was frozen), the new leader gives the previous one no grace by design
/// (`LeaderView::carry_on`: a dead leader's units move at once) and may fence it, since none
/// of its renewals committed during the stall: then at most that one fence is counted, and
/// only its identity and units may have changed.
#[test]
fn a_leader_whose_commits_stall_fences_no_one() -> TestResult {
    serial(|| async {
        let (servers, mut cluster, producer) = fixture::start(3).await?;
        let before = cluster.wait_balanced(&NODES, OWNED_WITHIN).await?;
        let leader = before.leader.ok_or("no leader")?;
        let fences_before = fences(&cluster).await?;
        let followers: Vec<NodeId> = NODES.into_iter().filter(|n| *n != leader).collect();

        for node in &followers {
            cluster.pause(*node)?;
        }
        tokio::time::sleep(COMMIT_STALL).await;
        let during = cluster.status_of(leader).await?;
        for node in &followers {
            cluster.resume(*node)?;
        }
        println!(
            "followers {followers:?} frozen for {:.1} s; node {leader} then reported leader {:?} at term {} (term {} before)",
            COMMIT_STALL.as_secs_f64(),
            during.leader,
            during.term,
            before.term
        );
        let thawed = servers.downstream_counts();
        wait_resumed(&servers, &Stalled::every_partition(thawed), OWNED_WITHIN).await?;
        let report = producer.stop().await?;
        servers.wait_caught_up(EXACT_WITHIN).await?;
        println!(
            "produced {} messages ({} failed sends); the copy caught up",
            report.produced, report.failed_sends
        );

        let after = cluster.leader_status().await.ok_or("no leader")?;
        let kept_leading = after.leader == Some(leader) && after.term == before.term;
        println!(
            "leader {:?} at term {} after the stall (node {leader} at term {} before)",
            after.leader, after.term, before.term
        );
        // What must not change: everything while the stalled leader kept leading, and what
        // is not the previous leader's once another node took over.
        let spared = |n: NodeId| kept_leading || n != leader;
        let identities = |s: &Status| -> BTreeMap<NodeId, (Option<u64>, bool)> {
            s.members
                .iter()
                .filter(|m| spared(m.id))
                .map(|m| (m.id, (m.writer_incarnation, m.fenced)))
                .collect()
        };
        let grants = |s: &Status| {
            let mut grants = s.grants_of("up-to-down");
            grants.retain(|_, (owner, _)| owner.is_some_and(spared));
            grants
        };
        let counted = |f: &BTreeMap<NodeId, Option<f64>>| -> f64 {
            f.values().map(|c| c.unwrap_or(0.0)).sum()
        };
        let fences_after = fences(&cluster).await?;
        let new_fences = counted(&fences_after) - counted(&fences_before);
        assert!(
            new_fences <= if kept_leading { 0.0 } else { 1.0 },
            "{new_fences} writer fences counted over a commit stall (iggy_replicator_writer_fences_total by node: {fences_before:?} before, {fences_after:?} after; leader kept: {kept_leading})"
        );
        assert_eq!(
            identities(&after),
            identities(&before),
            "writer identities (incarnation, fenced) changed over the commit stall (leader kept: {kept_leading})"
        );
        let (granted_before, granted_after) = (grants(&before), grants(&after));
        let moved: Vec<_> = granted_before
            .iter()
            .filter(|(unit, grant)| granted_after.get(*unit) != Some(*grant))
            .map(|(unit, _)| unit)
            .collect();
        assert!(
            moved.is_empty(),
            "units changed owner or were granted again over the commit stall (leader kept: {kept_leading}): {moved:?}"
        );
        fixture::finish_exact(servers, cluster).await
    })
}

async fn fences(cluster: &ReplicatorCluster) -> TestResult<BTreeMap<NodeId, Option<f64>>> {
    let mut fences = BTreeMap::new();
    for node in NODES {
        let count = cluster
            .metric_of(node, "iggy_replicator_writer_fences_total")
            .await?;
        fences.insert(node, count);
    }
    Ok(fences)
}
