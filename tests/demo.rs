//! `demo --migrate`, as an OS process of the binary: an Iggy 0.8 source, an Iggy 0.9 target,
//! three nodes, a failover, the cutover with the consumer group, and an exact verify.

use std::process::{Command, Output, Stdio};

use replicator_harness::{DevServer, ReplicatorBinary, TestResult};
use replicator_model::IggyVersion;

const BINARY: &str = env!("CARGO_BIN_EXE_iggy-replicator");

/// Runs `iggy-replicator demo --migrate` with a small workload and `extra` arguments.
fn demo_migrate(extra: &[&str]) -> Output {
    Command::new(BINARY)
        .args(["demo", "--migrate", "--messages", "6000", "--rate", "4000"])
        .args(extra)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run the demo")
}

#[test]
fn demo_migrate_copies_08_to_09_exactly_and_prints_the_steps() {
    assert_migrated(&demo_migrate(&[]));
}

/// Starts dev-server processes speaking `source` and `target`, and runs `demo --migrate`
/// against them by URL.
async fn demo_migrate_between(source: IggyVersion, target: IggyVersion) -> TestResult<Output> {
    let binary = ReplicatorBinary::new(BINARY)?;
    let source = DevServer::start_in(&binary, source).await?;
    let target = DevServer::start_in(&binary, target).await?;
    let urls = [
        "--source-url".to_owned(),
        source.url().to_owned(),
        "--target-url".to_owned(),
        target.url().to_owned(),
    ];
    let output = tokio::task::spawn_blocking(move || {
        demo_migrate(&urls.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await?;
    Ok(output)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_migrate_runs_between_servers_given_by_url() -> TestResult {
    let output = demo_migrate_between(IggyVersion::V0_8, IggyVersion::V0_9).await?;
    assert_migrated(&output);
    Ok(())
}

/// The demo ended well: a 0.9 target, the group continued there, an exact verify, the steps.
fn assert_migrated(output: &Output) {
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
    // The application's user was synced, activated by promote, and logged in on the target.
    assert!(stdout.contains("activated on the target"), "{stdout}");
    assert!(
        stdout.contains("the application logged in on eu as"),
        "{stdout}"
    );
    assert!(stdout.contains("→ exact"), "{stdout}");
    assert!(
        stdout.contains("Migrating from Iggy 0.8 to 0.9"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_migrate_names_the_flag_of_a_target_of_the_wrong_generation() -> TestResult {
    let output = demo_migrate_between(IggyVersion::V0_8, IggyVersion::V0_8).await?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.code() == Some(2), "{output:?}");
    assert!(
        stderr.contains("--target-url")
            && stderr.contains("answers in the Iggy 0.8 protocol")
            && stderr.contains("must be Iggy 0.9"),
        "{stderr}"
    );
    Ok(())
}
