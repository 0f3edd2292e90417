//! The binary rejects bad config files at start-up with exit code 2 and names the key.

use std::path::Path;
use std::process::{Command, Output};

use replicator_config::testing::MinimalConfig;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A valid config file whose data dir is `DATA` (see [`run_with`]).
fn valid() -> String {
    MinimalConfig {
        data_dir: "DATA".to_owned(),
        include: vec!["orders/*".to_owned()],
        ..MinimalConfig::default()
    }
    .to_string()
}

fn replicator(args: &[&str], config: &Path) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_iggy-replicator"))
        .args(args)
        .arg("--config")
        .arg(config)
        .env_remove("RUST_LOG")
        .output()
}

/// Writes `text` as a config file and runs `command` on it.
fn run_with(
    command: &str,
    text: &str,
) -> Result<(i32, String), Box<dyn std::error::Error + Send + Sync>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("replicator.toml");
    std::fs::write(
        &path,
        text.replace("DATA", &dir.path().join("data").display().to_string()),
    )?;
    let output = replicator(&[command], &path)?;
    let code = output.status.code().ok_or("killed by a signal")?;
    Ok((code, String::from_utf8_lossy(&output.stderr).into_owned()))
}

fn assert_rejected(text: &str, key: &str) -> TestResult {
    for command in ["run", "check-config"] {
        let (code, stderr) = run_with(command, text)?;
        assert_eq!(code, 2, "{command}: exit code for {key}; stderr:\n{stderr}");
        assert!(
            stderr.contains(key),
            "{command}: {key} not named in:\n{stderr}"
        );
        assert!(stderr.contains("hint:"), "{command}: no hint in:\n{stderr}");
    }
    Ok(())
}

/// [`assert_rejected`] on the valid file with `from` replaced by `to`.
fn assert_edit_rejected(from: &str, to: &str, key: &str) -> TestResult {
    assert_rejected(&valid().replace(from, to), key)
}

#[test]
fn valid_config_passes_check() -> TestResult {
    let (code, stderr) = run_with("check-config", &valid())?;
    assert_eq!(code, 0, "{stderr}");
    Ok(())
}

#[test]
fn unknown_key_exits_2_naming_it() -> TestResult {
    assert_edit_rejected("include =", "includes =", "includes")
}

#[test]
fn missing_cluster_alias_exits_2_naming_it() -> TestResult {
    assert_edit_rejected("target = \"eu\"", "target = \"asia\"", "flows[0].target")
}

#[test]
fn bad_url_exits_2_naming_it() -> TestResult {
    let url = "iggy://iggy:iggy@127.0.0.1:8091";
    assert_edit_rejected(url, "iggy://nopassword@127.0.0.1", "clusters.eu.url")
}

#[test]
fn bad_glob_exits_2_naming_it() -> TestResult {
    assert_edit_rejected("orders/*", "orders/[x", "flows[0].include[0]")
}

#[test]
fn a_flow_a_residency_policy_leaves_nothing_to_copy_exits_2_naming_flow_and_policy() -> TestResult {
    let text = format!(
        "{}\n[[policies]]\nname = \"orders-stay-in-us\"\nselect = [\"orders/*\"]\n\
         allowed_zones = [\"us\"]\n",
        valid()
    );
    assert_rejected(&text, "flows[0].include")?;
    assert_rejected(&text, "\"us-to-eu\"")?;
    assert_rejected(&text, "\"orders-stay-in-us\"")
}

#[test]
fn unset_environment_variable_exits_2_naming_key_and_variable() -> TestResult {
    let text = valid().replace("0123456789abcdef", "${IGGY_REPLICATOR_TEST_UNSET_VAR}");
    assert_rejected(&text, "cluster.secret")?;
    assert_rejected(&text, "IGGY_REPLICATOR_TEST_UNSET_VAR")
}

#[test]
fn missing_file_exits_2() -> TestResult {
    let output = replicator(&["run"], Path::new("/nonexistent/replicator.toml"))?;
    assert_eq!(output.status.code(), Some(2));
    Ok(())
}

#[test]
fn credentials_never_reach_the_error_output() -> TestResult {
    let text = valid()
        .replace(
            "iggy://iggy:iggy@127.0.0.1:8090",
            "iggy://admin:SuperSecretPw@127.0.0.1:8090",
        )
        .replace("target = \"eu\"", "target = \"asia\"");
    let (code, stderr) = run_with("run", &text)?;
    assert_eq!(code, 2);
    assert!(!stderr.contains("SuperSecretPw"), "{stderr}");
    assert!(!stderr.contains("0123456789abcdef"), "{stderr}");
    Ok(())
}
