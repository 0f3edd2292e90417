//! `demo --migrate`, as an OS process of the binary: an Iggy 0.8 source, an Iggy 0.9 target,
//! three nodes, a failover, the cutover with the consumer group, and an exact verify.

use std::process::{Command, Stdio};

#[test]
fn demo_migrate_copies_08_to_09_exactly_and_prints_the_steps() {
    let output = Command::new(env!("CARGO_BIN_EXE_iggy-replicator"))
        .args(["demo", "--migrate", "--messages", "6000", "--rate", "4000"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("target cluster \"eu\"") && stdout.contains("(Iggy 0.9)"),
        "{stdout}"
    );
    assert!(stdout.contains("the group continues on eu"), "{stdout}");
    assert!(stdout.contains("→ exact"), "{stdout}");
    assert!(
        stdout.contains("Migrating from Iggy 0.8 to 0.9"),
        "{stdout}"
    );
}
