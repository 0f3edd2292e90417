//! `deploy/docker-compose/`: two Iggy servers and three replicators whose configs, environment,
//! volumes, health checks and credentials agree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_norway::Value;

use crate::configs::{check_member, host_port, load, referenced_vars, url_parts};
use crate::yaml::{at, first_document, str_of, strings};
use crate::{
    assert_no_problems, deploy, parse_stop_timeout, read, relative, StartCommand, TestResult,
    CONFIG_PATH, DATA_DIR, MIN_GRACE,
};

fn dir() -> PathBuf {
    deploy().join("docker-compose")
}

fn compose_file() -> Result<Value, String> {
    first_document(&dir().join("docker-compose.yml"))
}

/// Resolves docker compose interpolation: `${NAME:-default}`, `${NAME-default}`, `$$`.
/// Variables without a default are an error: the file must run without a `.env`. (No crate
/// implements compose's rules; shell-expansion crates differ on `$$` and `-default`.)
fn compose_interpolate(text: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('$') {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("${") {
            let end = after.find('}').ok_or("unterminated ${")?;
            let expression = &after[..end];
            let default = expression
                .split_once(":-")
                .or_else(|| expression.split_once('-'))
                .map(|(_, default)| default)
                .ok_or_else(|| format!("${{{expression}}} has no default"))?;
            out.push_str(default);
            rest = &after[end + 1..];
        } else {
            return Err(format!("bare $ in {text:?}"));
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// A compose `environment:` (map or `KEY=value` list), interpolated.
fn compose_environment(service: &Value) -> Result<BTreeMap<String, String>, String> {
    let environment = at(service, &["environment"]);
    let mut env = BTreeMap::new();
    if let Some(map) = environment.as_mapping() {
        for (key, value) in map {
            let key = key.as_str().ok_or("non-string environment key")?;
            let value = match value {
                Value::String(text) => text.clone(),
                Value::Bool(flag) => flag.to_string(),
                Value::Number(number) => number.to_string(),
                other => return Err(format!("environment {key}: unexpected {other:?}")),
            };
            env.insert(key.to_owned(), compose_interpolate(&value)?);
        }
    } else {
        for line in strings(environment) {
            let (key, value) = line.split_once('=').ok_or("environment entry without =")?;
            env.insert(key.to_owned(), compose_interpolate(value)?);
        }
    }
    Ok(env)
}

/// A compose `stop_grace_period`: seconds as a number, or a duration string.
fn parse_grace(value: &Value) -> Option<std::time::Duration> {
    match value.as_u64() {
        Some(seconds) => Some(std::time::Duration::from_secs(seconds)),
        None => parse_stop_timeout(value.as_str()?),
    }
}

/// The services whose `command:` runs the replicator.
pub(crate) fn start_commands() -> TestResult<Vec<StartCommand>> {
    let compose = compose_file()?;
    let mut commands = Vec::new();
    for (name, service) in at(&compose, &["services"])
        .as_mapping()
        .into_iter()
        .flatten()
    {
        let args: Vec<String> = strings(at(service, &["command"]))
            .into_iter()
            .map(str::to_owned)
            .collect();
        if args.first().map(String::as_str) == Some("run") {
            commands.push((format!("compose {}", name.as_str().unwrap_or("?")), args));
        }
    }
    Ok(commands)
}

#[test]
fn compose_interpolation_takes_defaults_and_refuses_variables_without_one() {
    assert_eq!(
        compose_interpolate("${A:-x}/${B-y}/$$"),
        Ok("x/y/$".to_owned())
    );
    assert!(compose_interpolate("${A}").is_err());
    assert!(compose_interpolate("$A").is_err());
}

#[test]
fn compose_runs_two_iggy_servers_and_three_replicators_that_agree() -> TestResult {
    let dir = dir();
    let compose = compose_file()?;
    let services = at(&compose, &["services"])
        .as_mapping()
        .ok_or("docker-compose.yml: no services")?;
    let named_volumes: BTreeSet<&str> = at(&compose, &["volumes"])
        .as_mapping()
        .map(|m| m.keys().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut problems = Vec::new();

    // Iggy servers: service name → (root user, root password).
    let mut iggy = BTreeMap::new();
    let mut replicators = Vec::new();
    for (name, service) in services {
        let name = name.as_str().ok_or("non-string service name")?;
        let image = str_of(service, &["image"]).unwrap_or_default();
        if image.starts_with("apache/iggy:") {
            let env = compose_environment(service)?;
            if env.get("IGGY_TCP_ADDRESS").map(String::as_str) != Some("0.0.0.0:8090") {
                problems.push(format!("{name}: IGGY_TCP_ADDRESS must be 0.0.0.0:8090"));
            }
            match (env.get("IGGY_ROOT_USERNAME"), env.get("IGGY_ROOT_PASSWORD")) {
                (Some(user), Some(password)) => {
                    iggy.insert(name.to_owned(), (user.clone(), password.clone()));
                }
                _ => problems.push(format!("{name}: root credentials not set")),
            }
        } else if image.starts_with("iggy-replicator") || service.get("build").is_some() {
            replicators.push((name.to_owned(), service));
        }
    }
    assert!(iggy.len() == 2, "expected 2 Iggy servers, found {iggy:?}");
    assert!(
        replicators.len() == 3,
        "expected 3 replicators, found {}",
        replicators.len()
    );

    let mut ids = BTreeSet::new();
    let mut member_sets = BTreeSet::new();
    for (name, service) in &replicators {
        let command = strings(at(service, &["command"]));
        if command.first() != Some(&"run") || !command.contains(&CONFIG_PATH) {
            problems.push(format!(
                "{name}: command {command:?} does not run {CONFIG_PATH}"
            ));
        }
        let health = strings(at(service, &["healthcheck", "test"]));
        if !health.iter().any(|part| part.ends_with(":7180/health")) {
            problems.push(format!(
                "{name}: healthcheck {health:?} does not probe /health"
            ));
        }
        if parse_grace(at(service, &["stop_grace_period"])).is_none_or(|g| g < MIN_GRACE) {
            problems.push(format!("{name}: stop_grace_period under {MIN_GRACE:?}"));
        }
        // Volumes: the config file and a named volume on the data dir.
        let mut config_file = None;
        let mut data_volume = None;
        for volume in strings(at(service, &["volumes"])) {
            let parts: Vec<&str> = volume.split(':').collect();
            match parts.as_slice() {
                [source, CONFIG_PATH, ..] => {
                    config_file = Some(dir.join(source.trim_start_matches("./")));
                }
                [source, DATA_DIR, ..] => data_volume = Some(*source),
                _ => {}
            }
        }
        if !data_volume.is_some_and(|v| named_volumes.contains(v)) {
            problems.push(format!("{name}: no named volume on {DATA_DIR}"));
        }
        let Some(config_file) = config_file else {
            problems.push(format!("{name}: no config mounted at {CONFIG_PATH}"));
            continue;
        };
        let env = compose_environment(service)?;
        let origin = relative(&config_file);
        let text = read(&config_file)?;
        for variable in referenced_vars(&text) {
            if !env.contains_key(&variable) {
                problems.push(format!("{name}: environment lacks {variable} ({origin})"));
            }
        }
        let config = match load(&text, &origin, &env) {
            Ok(config) => config,
            Err(error) => {
                problems.push(error);
                continue;
            }
        };
        let expected_id: u64 = name
            .trim_start_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .unwrap_or(0);
        problems.extend(check_member(&config, &origin, expected_id));
        ids.insert(config.node.id);
        member_sets.insert(format!("{:?}", config.initial_members()));
        if host_port(&config.node.raft_addr).map(|(host, _)| host) != Some(name.as_str()) {
            problems.push(format!("{origin}: raft_addr does not name service {name}"));
        }
        // Every Iggy cluster the config uses is a service here, with matching credentials.
        for (alias, cluster) in &config.clusters {
            let Some((user, password, host, port)) = url_parts(cluster.url.expose()) else {
                problems.push(format!("{origin}: clusters.{alias}.url does not parse"));
                continue;
            };
            match iggy.get(host) {
                Some((root_user, root_password)) => {
                    if (user, password) != (root_user.as_str(), root_password.as_str()) {
                        problems.push(format!(
                            "{origin}: clusters.{alias} credentials differ from service {host}"
                        ));
                    }
                    if port != 8090 {
                        problems.push(format!("{origin}: clusters.{alias} port {port} != 8090"));
                    }
                }
                None => problems.push(format!(
                    "{origin}: clusters.{alias} host {host} is no Iggy service"
                )),
            }
        }
    }
    if ids != BTreeSet::from([1, 2, 3]) {
        problems.push(format!("node ids {ids:?}, expected 1, 2, 3"));
    }
    if member_sets.len() != 1 {
        problems.push(format!(
            "members disagree on initial_members: {member_sets:?}"
        ));
    }
    assert_no_problems(&problems);
    Ok(())
}
