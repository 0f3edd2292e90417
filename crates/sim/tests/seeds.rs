//! The simulation in CI: a few hundred seeds, and the regression seeds of the bugs it found.

use replicator_sim::{run, run_with, Fault, FaultKind, Schedule, World};

/// Seeds per CI run (`SIM_SEEDS` overrides; `replicator-sim --seeds N` runs more by hand).
const CI_SEEDS: u64 = 300;

#[test]
fn a_few_hundred_random_fault_schedules_break_no_invariant() {
    let seeds = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CI_SEEDS);
    // Two threads: the machine CI runs on has two cores, and seeds are independent.
    let failures: Vec<String> = std::thread::scope(|scope| {
        let halves: Vec<_> = (0..2u64)
            .map(|half| {
                scope.spawn(move || {
                    (0..seeds)
                        .filter(|s| s % 2 == half)
                        .filter_map(|seed| run(seed).err())
                        .map(|f| replicator_sim::minimise(f).to_string())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        halves
            .into_iter()
            .flat_map(|h| h.join().expect("a simulation thread panicked"))
            .collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {seeds} seeds broke an invariant:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Seed 10, shrunk: member 2 is killed while its sends to a slow target are on their way and
/// restarts 114 ms later, before anyone fenced it. Writing again as its old identity, its new
/// writers resumed from the tail and the dead process's late batch landed after them.
fn restart_within_fence_after() -> (u64, Schedule) {
    let schedule = Schedule {
        faults: vec![
            Fault {
                at: 18_194,
                for_ms: 851,
                kind: FaultKind::SlowTarget {
                    target: 0,
                    max_ms: 2_775,
                },
            },
            Fault {
                at: 19_204,
                for_ms: 114,
                kind: FaultKind::Crash { member: 2 },
            },
        ],
    };
    (10, schedule)
}

#[test]
fn a_restarted_member_never_writes_as_its_previous_process() {
    let (seed, schedule) = restart_within_fence_after();
    if let Err(f) = run_with(seed, schedule.clone()) {
        panic!("{f}");
    }
    // The same schedule with members that keep their identity across a restart (the
    // behaviour before the fix) breaks "never two writers": the simulator tells them apart.
    let mut world = World::new(seed, schedule).writing_as_predecessor();
    let violation = world.run().expect_err("the old behaviour duplicates");
    assert!(
        violation.what.contains("after another session had written")
            || violation.what.contains("where"),
        "{}",
        violation.what
    );
}

/// Seed 194, shrunk: a target restarts without its unflushed tail between a writer's resume
/// and its first send. The writer's tail re-read found less than the resume had found, and it
/// sent on after the copies it believed were there, leaving a hole. (The writer now counts the
/// resume's tail as its last copy; the pipeline's e2e test
/// `copies_the_target_lost_after_a_resume_and_before_the_first_send_are_copied_again` shows
/// the same on the real writer.)
#[test]
fn copies_a_target_lost_before_a_writers_first_send_are_copied_again() {
    let schedule = Schedule {
        faults: vec![
            Fault {
                at: 10_402,
                for_ms: 2_663,
                kind: FaultKind::LoseControlAnswers { percent: 28 },
            },
            Fault {
                at: 13_731,
                for_ms: 4_342,
                kind: FaultKind::TargetDown {
                    target: 0,
                    lose_tail: true,
                },
            },
        ],
    };
    let stats = run_with(194, schedule).unwrap_or_else(|f| panic!("{f}"));
    assert!(stats.downstream_losses > 0, "{stats:?}");
}

#[test]
fn a_seed_replays_exactly() {
    let a = run(42).expect("seed 42 passes");
    let b = run(42).expect("seed 42 passes");
    assert_eq!(a.entries, b.entries);
    assert_eq!(a.translations, b.translations);
    assert_eq!(a.settled_after, b.settled_after);
}
