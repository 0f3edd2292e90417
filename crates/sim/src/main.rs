//! Runs seeds of the simulation by hand: `replicator-sim [--pair] [--seeds N] [--from S]
//! [--seed S] [--retry-budget-ms M]`. Prints a summary, and for each failing seed its shrunk
//! schedule (with `--pair`, the seeds of a two-way pair's metadata sync instead, each failure
//! with its last steps); exits 1 if any failed. `--retry-budget-ms` gives the writers a retry
//! budget shorter than the faults, so that they give up mid-outage.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .map(|v| {
                v.parse::<u64>().unwrap_or_else(|_| {
                    eprintln!("{flag} takes a number, got {v:?}");
                    std::process::exit(2)
                })
            })
    };
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "usage: replicator-sim [--pair] [--seeds N (default 1000)] [--from S (default 0)] \
             [--seed S] [--retry-budget-ms M (default: the node's)]"
        );
        return ExitCode::SUCCESS;
    }
    let pair = args.iter().any(|a| a == "--pair");
    let settings = replicator_sim::Settings {
        retry_budget: value("--retry-budget-ms").map(std::time::Duration::from_millis),
    };
    let seeds: Vec<u64> = match value("--seed") {
        Some(seed) => vec![seed],
        None => {
            let from = value("--from").unwrap_or(0);
            (from..from + value("--seeds").unwrap_or(1000)).collect()
        }
    };
    if pair {
        let started = std::time::Instant::now();
        let failed = seeds
            .iter()
            .filter_map(|&seed| replicator_sim::run_pair(seed).err())
            .inspect(|violation| println!("{violation}"))
            .count();
        println!(
            "{} pair seeds, {failed} failed, in {:.1?}",
            seeds.len(),
            started.elapsed()
        );
        return if failed > 0 {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
    }
    let (mut failed, mut faults, mut totals) = (0u64, 0usize, replicator_sim::Stats::default());
    let mut classes: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    let started = std::time::Instant::now();
    for &seed in &seeds {
        let schedule = replicator_sim::Schedule::random(seed);
        faults += schedule.faults.len();
        for fault in &schedule.faults {
            *classes.entry(fault.kind.class()).or_default() += 1;
        }
        match replicator_sim::run_set(seed, schedule, settings) {
            Ok(stats) => totals.add(&stats),
            Err(failure) => {
                failed += 1;
                println!("{}", replicator_sim::minimise(failure));
            }
        }
    }
    println!(
        "{} seeds, {faults} faults, {failed} failed, in {:.1?}; entries {}, elections {}, \
         fences {}, refused stale sends {}, unknown outcomes {}, downstream losses {}, \
         landed mismatches {}, writers given up {}, translations checked {}, slowest settle {} ms",
        seeds.len(),
        started.elapsed(),
        totals.entries,
        totals.elections,
        totals.fences,
        totals.refused_sends,
        totals.unknown_outcomes,
        totals.downstream_losses,
        totals.landed_mismatches,
        totals.writers_given_up,
        totals.translations,
        totals.settled_after
    );
    println!(
        "wiped restarts {}, rolling restarts {}, configured-credential sends {} ({} held back as \
         they departed), refused logins {} ({} late, of a replaced identity), identities given \
         up after a refusal {}",
        totals.wiped_restarts,
        totals.rolling_restarts,
        totals.configured_sends,
        totals.held_at_departure,
        totals.logins_refused,
        totals.late_refusals,
        totals.identities_given_up
    );
    let classes: Vec<String> = classes.iter().map(|(c, n)| format!("{c} {n}")).collect();
    println!("faults by class: {}", classes.join(", "));
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
