//! Runs seeds of the simulation by hand: `replicator-sim [--seeds N] [--from S] [--seed S]`.
//! Prints a summary, and for each failing seed its shrunk schedule; exits 1 if any failed.

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
            "usage: replicator-sim [--seeds N (default 1000)] [--from S (default 0)] [--seed S]"
        );
        return ExitCode::SUCCESS;
    }
    let seeds: Vec<u64> = match value("--seed") {
        Some(seed) => vec![seed],
        None => {
            let from = value("--from").unwrap_or(0);
            (from..from + value("--seeds").unwrap_or(1000)).collect()
        }
    };
    let (mut failed, mut faults, mut totals) = (0u64, 0usize, replicator_sim::Stats::default());
    let started = std::time::Instant::now();
    for &seed in &seeds {
        faults += replicator_sim::Schedule::random(seed).faults.len();
        match replicator_sim::run(seed) {
            Ok(stats) => {
                totals.entries += stats.entries;
                totals.elections += stats.elections;
                totals.fences += stats.fences;
                totals.refused_sends += stats.refused_sends;
                totals.unknown_outcomes += stats.unknown_outcomes;
                totals.downstream_losses += stats.downstream_losses;
                totals.landed_mismatches += stats.landed_mismatches;
                totals.translations += stats.translations;
                totals.settled_after = totals.settled_after.max(stats.settled_after);
            }
            Err(failure) => {
                failed += 1;
                println!("{}", replicator_sim::minimise(failure));
            }
        }
    }
    println!(
        "{} seeds, {faults} faults, {failed} failed, in {:.1?}; entries {}, elections {}, \
         fences {}, refused stale sends {}, unknown outcomes {}, downstream losses {}, \
         landed mismatches {}, translations checked {}, slowest settle {} ms",
        seeds.len(),
        started.elapsed(),
        totals.entries,
        totals.elections,
        totals.fences,
        totals.refused_sends,
        totals.unknown_outcomes,
        totals.downstream_losses,
        totals.landed_mismatches,
        totals.translations,
        totals.settled_after
    );
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
