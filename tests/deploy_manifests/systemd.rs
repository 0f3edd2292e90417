//! `deploy/systemd/`: the unit, its environment file and the config fit together.

use std::collections::BTreeMap;

use crate::configs::{check_member, load, referenced_vars};
use crate::{
    assert_no_problems, deploy, parse_stop_timeout, read, StartCommand, TestResult, CONFIG_PATH,
    MIN_GRACE,
};

const UNIT: &str = "systemd/iggy-replicator.service";

/// A unit file as `Section.Key` → its values in order (a key may repeat). Only the syntax the
/// unit uses: `[Section]` headers, `Key=value` lines, `#` comments.
fn unit_entries(text: &str) -> Result<BTreeMap<String, Vec<String>>, String> {
    let mut unit: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
        } else if let Some((key, value)) = line.split_once('=') {
            unit.entry(format!("{section}.{key}"))
                .or_default()
                .push(value.to_owned());
        } else {
            return Err(format!("{UNIT}: line without '=': {line}"));
        }
    }
    Ok(unit)
}

fn unit() -> Result<BTreeMap<String, Vec<String>>, String> {
    unit_entries(&read(&deploy().join(UNIT))?)
}

/// The `ExecStart=` lines, as argument lists after the binary.
pub(crate) fn start_commands() -> TestResult<Vec<StartCommand>> {
    let unit = unit()?;
    Ok(unit
        .get("Service.ExecStart")
        .into_iter()
        .flatten()
        .map(|exec| {
            let args = exec.split_whitespace().skip(1).map(str::to_owned).collect();
            ("systemd ExecStart".to_owned(), args)
        })
        .collect())
}

#[test]
fn systemd_unit_env_file_and_config_fit_together() -> TestResult {
    let dir = deploy().join("systemd");
    let unit = unit()?;
    let one = |key: &str| unit.get(key).and_then(|v| v.last()).map(String::as_str);
    let mut problems = Vec::new();
    for (key, expected) in [
        ("Service.Restart", "on-failure"),
        ("Service.KillSignal", "SIGTERM"),
        ("Service.ProtectSystem", "strict"),
        ("Service.NoNewPrivileges", "yes"),
        ("Service.PrivateTmp", "yes"),
        ("Service.DynamicUser", "yes"),
        ("Service.StateDirectory", "iggy-replicator"),
        (
            "Service.RestrictAddressFamilies",
            "AF_INET AF_INET6 AF_UNIX",
        ),
        ("Install.WantedBy", "multi-user.target"),
    ] {
        if one(key) != Some(expected) {
            problems.push(format!("{key} is {:?}, expected {expected}", one(key)));
        }
    }
    let grace = one("Service.TimeoutStopSec").and_then(parse_stop_timeout);
    if grace.is_none_or(|grace| grace < MIN_GRACE) {
        problems.push(format!("TimeoutStopSec {grace:?} is under {MIN_GRACE:?}"));
    }
    let exec = one("Service.ExecStart").unwrap_or_default();
    if !exec.contains(&format!("run --config {CONFIG_PATH}")) {
        problems.push(format!("ExecStart {exec:?} does not run {CONFIG_PATH}"));
    }

    // The environment file must define every variable the config refers to.
    let env_file = one("Service.EnvironmentFile").unwrap_or_default();
    if env_file != "/etc/iggy-replicator/iggy-replicator.env" {
        problems.push(format!("EnvironmentFile is {env_file:?}"));
    }
    let env: BTreeMap<String, String> = read(&dir.join("iggy-replicator.env"))?
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
    let config_text = read(&dir.join("replicator.toml"))?;
    for name in referenced_vars(&config_text) {
        if !env.contains_key(&name) {
            problems.push(format!("iggy-replicator.env does not define {name}"));
        }
    }
    match load(&config_text, "systemd/replicator.toml", &env) {
        Ok(config) => problems.extend(check_member(&config, "systemd/replicator.toml", 1)),
        Err(error) => problems.push(error),
    }
    assert_no_problems(&problems);
    Ok(())
}
