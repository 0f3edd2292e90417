//! Checks every file under `deploy/` and the `Dockerfile`, one module per target: each TOML
//! config loads with the real loader (templates rendered the way their entrypoint renders
//! them), each YAML document has the shape its tool expects, the manifests agree with each
//! other (ports, paths, variable names, credentials), and the Grafana dashboard queries exactly
//! the metric families that the binary's own registry exports.
//!
//! * `configs`: the TOML configs, with what every member config of a cluster must satisfy;
//! * `yaml`: reading YAML, and the shape of every YAML file;
//! * `systemd`, `compose`, `kubernetes`, `docker`: each target's manifests, and how each starts
//!   the binary;
//! * `grafana`: the dashboard against `iggy-replicator metric-names`.
//!
//! This file keeps the conventions every target shares and the check that every way the
//! manifests start the binary passes arguments it accepts.

mod alerts;
mod compose;
mod configs;
mod docker;
mod grafana;
mod helm;
mod kubernetes;
mod systemd;
mod yaml;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Where the images and units put the config and the Raft log.
const CONFIG_PATH: &str = "/etc/iggy-replicator/replicator.toml";
const DATA_DIR: &str = "/var/lib/iggy-replicator";
const RAFT_PORT: u16 = 7100;
const API_PORT: u16 = 7180;
/// The shortest stop grace that lets a drain finish.
const MIN_GRACE: Duration = Duration::from_secs(30);

/// The binary under test.
const BINARY: &str = env!("CARGO_BIN_EXE_iggy-replicator");

/// One way a manifest starts the binary: where (for messages) and the arguments.
type StartCommand = (String, Vec<String>);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deploy() -> PathBuf {
    repo().join("deploy")
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// Every file under `dir` whose name ends with one of `suffixes`, sorted.
fn files_under(dir: &Path, suffixes: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(current) = pending.pop() {
        let entries = std::fs::read_dir(&current).expect("deploy/ is readable");
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if suffixes.iter().any(|s| path.to_string_lossy().ends_with(s)) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn relative(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Fails with every problem found, one a line: a check collects them all before it fails, so
/// one run shows everything to fix.
#[track_caller]
fn assert_no_problems(problems: &[String]) {
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A stop timeout as systemd (`TimeoutStopSec=`) and compose (`stop_grace_period`) write it:
/// bare seconds (`45`) or a duration with units (`45s`, `1m30s`, `2min`).
fn parse_stop_timeout(text: &str) -> Option<Duration> {
    let text = text.trim();
    match text.parse() {
        Ok(seconds) => Some(Duration::from_secs(seconds)),
        Err(_) => humantime::parse_duration(text).ok(),
    }
}

#[test]
fn stop_timeouts_parse_as_systemd_and_compose_write_them() {
    assert_eq!(parse_stop_timeout("45"), Some(Duration::from_secs(45)));
    assert_eq!(parse_stop_timeout("45s"), Some(Duration::from_secs(45)));
    assert_eq!(parse_stop_timeout("1m30s"), Some(Duration::from_secs(90)));
    assert_eq!(parse_stop_timeout("2min"), Some(Duration::from_secs(120)));
    assert_eq!(parse_stop_timeout("soon"), None);
    assert_eq!(parse_stop_timeout("10x"), None);
}

#[test]
fn manifests_start_the_binary_with_arguments_it_accepts() -> TestResult {
    let mut problems = Vec::new();
    let mut commands = Vec::new();
    for (target, found) in [
        ("systemd", systemd::start_commands()?),
        ("compose", compose::start_commands()?),
        ("Dockerfile", docker::start_commands()?),
        ("kubernetes", kubernetes::start_commands()?),
    ] {
        if found.is_empty() {
            problems.push(format!("{target}: found no command that starts the binary"));
        }
        commands.extend(found);
    }
    for (origin, args) in commands {
        // clap validates the arguments before it, then prints the help of `run`.
        let output = Command::new(BINARY).args(&args).arg("--help").output()?;
        let help = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() || !help.contains("--config") {
            problems.push(format!(
                "{origin}: `iggy-replicator {}` is not accepted: {}{}",
                args.join(" "),
                help.trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
    }
    assert_no_problems(&problems);
    Ok(())
}
