//! Checks every file under `deploy/` and the `Dockerfile`: each TOML config loads
//! with the real loader (templates rendered the way their entrypoint renders them),
//! each YAML document has the shape its tool expects, the manifests agree with each
//! other (ports, paths, variable names, credentials), and the Grafana dashboard
//! queries only the metrics the replicator exports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use replicator_config::{parse_str, Config};
use serde::Deserialize;
use serde_norway::Value;

type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The metric families the replicator exports (fixed names; see deploy/README.md).
const COUNTERS: &[&str] = &[
    "iggy_replicator_messages_copied_total",
    "iggy_replicator_bytes_copied_total",
    "iggy_replicator_errors_total",
    "iggy_replicator_gap_events_total",
    "iggy_replicator_actor_restarts_total",
    "iggy_replicator_lease_renewals_total",
    "iggy_replicator_fenced_commits_total",
];
const GAUGES: &[&str] = &[
    "iggy_replicator_lag_messages",
    "iggy_replicator_units_owned",
    "iggy_replicator_raft_term",
    "iggy_replicator_raft_leader",
    "iggy_replicator_raft_commit_index",
    "iggy_replicator_raft_applied_index",
];
const HISTOGRAMS: &[&str] = &[
    "iggy_replicator_replication_latency_seconds",
    "iggy_replicator_poll_latency_seconds",
    "iggy_replicator_send_latency_seconds",
];

/// Where the images and units put the config and the Raft log.
const CONFIG_PATH: &str = "/etc/iggy-replicator/replicator.toml";
const DATA_DIR: &str = "/var/lib/iggy-replicator";
const RAFT_PORT: u16 = 7100;
const API_PORT: u16 = 7180;
/// The shortest stop grace that lets a drain finish.
const MIN_GRACE: Duration = Duration::from_secs(30);

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

/// The `${NAME}` references of a TOML config text outside comment lines, as the loader
/// resolves them (`$${` is a literal).
fn referenced_vars(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let code: Vec<&str> = text
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .collect();
    let code = code.join("\n");
    let mut rest = code.as_str();
    while let Some(start) = rest.find('$') {
        let tail = &rest[start..];
        if let Some(after) = tail.strip_prefix("$${") {
            rest = after;
        } else if let Some(after) = tail.strip_prefix("${") {
            let end = after.find('}').unwrap_or(after.len());
            names.insert(after[..end].to_owned());
            rest = &after[end..];
        } else {
            rest = &tail[1..];
        }
    }
    names
}

fn load(text: &str, origin: &str, env: &BTreeMap<String, String>) -> Result<Config, String> {
    parse_str(text, origin, |name| env.get(name).cloned()).map_err(|e| e.to_string())
}

/// A fake environment that defines every variable `text` references.
fn fake_env(text: &str) -> BTreeMap<String, String> {
    referenced_vars(text)
        .into_iter()
        .map(|name| {
            let value = match name.as_str() {
                "POD_NAME" => "iggy-replicator-0".to_owned(),
                "POD_NAMESPACE" => "replication".to_owned(),
                _ => format!("test-value-of-{}", name.to_lowercase().replace('_', "-")),
            };
            (name, value)
        })
        .collect()
}

/// The template placeholder that `deploy/kubernetes/entrypoint.sh` replaces with the node id.
const NODE_ID_PLACEHOLDER: &str = "@NODE_ID@";

/// `(host, port)` of a `host:port` string.
fn host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host, port.parse().ok()?))
}

/// `(user, password, host, port)` of an `iggy://user:password@host:port?options` URL.
fn url_parts(url: &str) -> Option<(&str, &str, &str, u16)> {
    let (_, rest) = url.split_once("://")?;
    let (credentials, address) = rest.rsplit_once('@')?;
    let (user, password) = credentials.split_once(':')?;
    let address = address.split('?').next()?;
    let (host, port) = host_port(address)?;
    Some((user, password, host, port))
}

/// Checks what every member config of one cluster must satisfy; returns the problems.
fn check_member(config: &Config, origin: &str, expected_id: u64) -> Vec<String> {
    let mut problems = Vec::new();
    if config.node.id != expected_id {
        problems.push(format!(
            "{origin}: node.id is {}, expected {expected_id}",
            config.node.id
        ));
    }
    if config.node.data_dir != Path::new(DATA_DIR) {
        problems.push(format!(
            "{origin}: node.data_dir is {}, expected {DATA_DIR}",
            config.node.data_dir.display()
        ));
    }
    let members = config.initial_members();
    if members.len() != 3 {
        problems.push(format!(
            "{origin}: {} initial members, expected 3",
            members.len()
        ));
    }
    if members.get(&config.node.id) != Some(&config.node.raft_addr) {
        problems.push(format!(
            "{origin}: node.raft_addr {} is not initial_members.{}",
            config.node.raft_addr, config.node.id
        ));
    }
    for addr in members.values() {
        if host_port(addr).map(|(_, port)| port) != Some(RAFT_PORT) {
            problems.push(format!(
                "{origin}: member {addr} is not on port {RAFT_PORT}"
            ));
        }
    }
    if host_port(&config.node.api_addr).map(|(_, port)| port) != Some(API_PORT) {
        problems.push(format!(
            "{origin}: node.api_addr {} is not on port {API_PORT}",
            config.node.api_addr
        ));
    }
    problems
}

fn yaml_documents(path: &Path) -> Result<Vec<Value>, String> {
    let text = read(path)?;
    let mut documents = Vec::new();
    for document in serde_norway::Deserializer::from_str(&text) {
        let mut value =
            Value::deserialize(document).map_err(|e| format!("{}: {e}", relative(path)))?;
        value
            .apply_merge()
            .map_err(|e| format!("{}: merge keys: {e}", relative(path)))?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    Ok(documents)
}

fn str_of<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(value, |value, key| value.get(*key))?
        .as_str()
}

fn at<'a>(value: &'a Value, path: &[&str]) -> &'a Value {
    static NULL: Value = Value::Null;
    path.iter()
        .try_fold(value, |value, key| value.get(*key))
        .unwrap_or(&NULL)
}

fn seq(value: &Value) -> &[Value] {
    value.as_sequence().map(Vec::as_slice).unwrap_or(&[])
}

/// Parses a stop timeout as systemd and compose write it: `45`, `45s`, `1m30s`, `2min`.
fn parse_seconds(text: &str) -> Option<Duration> {
    let text = text.trim();
    if let Ok(seconds) = text.parse() {
        return Some(Duration::from_secs(seconds));
    }
    let mut total = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let number: u64 = rest[..digits].parse().ok()?;
        let unit_end = rest[digits..]
            .find(|c: char| c.is_ascii_digit())
            .map_or(rest.len(), |i| digits + i);
        let scale = match &rest[digits..unit_end] {
            "s" | "sec" => 1,
            "m" | "min" => 60,
            "h" => 3600,
            _ => return None,
        };
        total += number * scale;
        rest = &rest[unit_end..];
    }
    Some(Duration::from_secs(total))
}

fn parse_grace(value: &Value) -> Option<Duration> {
    match value.as_u64() {
        Some(seconds) => Some(Duration::from_secs(seconds)),
        None => parse_seconds(value.as_str()?),
    }
}

/// Resolves docker compose interpolation: `${NAME:-default}`, `${NAME-default}`, `$$`.
/// Variables without a default are an error: the file must run without a `.env`.
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
        for item in seq(environment) {
            let line = item.as_str().ok_or("non-string environment entry")?;
            let (key, value) = line.split_once('=').ok_or("environment entry without =")?;
            env.insert(key.to_owned(), compose_interpolate(value)?);
        }
    }
    Ok(env)
}

#[test]
fn every_toml_file_in_deploy_loads_with_the_real_loader() -> TestResult {
    let files = files_under(&deploy(), &[".toml"]);
    let mut problems = Vec::new();
    let mut loaded = BTreeSet::new();
    for path in &files {
        let origin = relative(path);
        let text = read(path)?;
        let env = fake_env(&text);
        if text.contains(NODE_ID_PLACEHOLDER) {
            for id in 1..=3u64 {
                let rendered = text.replace(NODE_ID_PLACEHOLDER, &id.to_string());
                let mut env = env.clone();
                if env.contains_key("POD_NAME") {
                    env.insert("POD_NAME".into(), format!("iggy-replicator-{}", id - 1));
                }
                match load(&rendered, &origin, &env) {
                    Ok(config) => problems.extend(check_member(&config, &origin, id)),
                    Err(error) => problems.push(format!("{origin} (node {id}): {error}")),
                }
            }
        } else {
            match load(&text, &origin, &env) {
                Ok(config) => {
                    if config.flows.is_empty() {
                        problems.push(format!("{origin}: no [[flows]]"));
                    }
                }
                Err(error) => problems.push(format!("{origin}: {error}")),
            }
        }
        loaded.insert(origin);
    }
    for expected in [
        "deploy/systemd/replicator.toml",
        "deploy/docker-compose/node1.toml",
        "deploy/docker-compose/node2.toml",
        "deploy/docker-compose/node3.toml",
        "deploy/kubernetes/replicator.toml",
        "deploy/examples/one-way.toml",
        "deploy/examples/two-way.toml",
        "deploy/examples/fan-out.toml",
    ] {
        if !loaded.contains(expected) {
            problems.push(format!("{expected} is missing"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

#[test]
fn a_broken_config_is_rejected_by_the_same_check() -> TestResult {
    // The loader path above must be able to fail: an unknown alias in a deploy file.
    let path = deploy().join("examples/one-way.toml");
    let text = read(&path)?.replace("target = \"eu\"", "target = \"mars\"");
    let error = load(&text, "broken", &fake_env(&text)).expect_err("unknown alias");
    assert!(error.contains("flows[0].target"), "{error}");
    Ok(())
}

#[test]
fn every_yaml_file_in_deploy_parses_with_the_expected_shape() -> TestResult {
    let files = files_under(&deploy(), &[".yaml", ".yml"]);
    assert!(
        files.len() >= 6,
        "expected the compose file and the kustomize base"
    );
    let mut problems = Vec::new();
    for path in &files {
        let origin = relative(path);
        let documents = match yaml_documents(path) {
            Ok(documents) => documents,
            Err(error) => {
                problems.push(error);
                continue;
            }
        };
        if documents.is_empty() {
            problems.push(format!("{origin}: no YAML document"));
        }
        for (index, document) in documents.iter().enumerate() {
            if document.get("services").is_some() {
                continue; // a compose file, checked below
            }
            let kind = str_of(document, &["kind"]);
            if str_of(document, &["apiVersion"]).is_none() || kind.is_none() {
                problems.push(format!("{origin}[{index}]: apiVersion or kind missing"));
            }
            if kind != Some("Kustomization") && str_of(document, &["metadata", "name"]).is_none() {
                problems.push(format!("{origin}[{index}]: metadata.name missing"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

#[test]
fn systemd_unit_env_file_and_config_fit_together() -> TestResult {
    let dir = deploy().join("systemd");
    let unit_text = read(&dir.join("iggy-replicator.service"))?;
    let mut unit: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut section = String::new();
    for line in unit_text.lines().map(str::trim) {
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
            panic!("unit line without '=': {line}");
        }
    }
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
    let grace = one("Service.TimeoutStopSec").and_then(parse_seconds);
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
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

#[test]
fn compose_runs_two_iggy_servers_and_three_replicators_that_agree() -> TestResult {
    let dir = deploy().join("docker-compose");
    let compose = yaml_documents(&dir.join("docker-compose.yml"))?
        .into_iter()
        .next()
        .ok_or("empty compose file")?;
    let services = at(&compose, &["services"])
        .as_mapping()
        .ok_or("no services")?;
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
        let command: Vec<&str> = seq(at(service, &["command"]))
            .iter()
            .filter_map(Value::as_str)
            .collect();
        if command.first() != Some(&"run") || !command.contains(&CONFIG_PATH) {
            problems.push(format!(
                "{name}: command {command:?} does not run {CONFIG_PATH}"
            ));
        }
        let health: Vec<&str> = seq(at(service, &["healthcheck", "test"]))
            .iter()
            .filter_map(Value::as_str)
            .collect();
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
        for volume in seq(at(service, &["volumes"]))
            .iter()
            .filter_map(Value::as_str)
        {
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
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// The kustomize base: every resource the kustomization lists, by kind.
struct KubeBase {
    kustomization: Value,
    resources: Vec<Value>,
}

impl KubeBase {
    fn load() -> Result<Self, String> {
        let dir = deploy().join("kubernetes");
        let kustomization = yaml_documents(&dir.join("kustomization.yaml"))?
            .into_iter()
            .next()
            .ok_or("empty kustomization.yaml")?;
        let mut resources = Vec::new();
        for file in seq(at(&kustomization, &["resources"])) {
            let file = file.as_str().ok_or("non-string resource")?;
            resources.extend(yaml_documents(&dir.join(file))?);
        }
        Ok(Self {
            kustomization,
            resources,
        })
    }

    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.resources
            .iter()
            .filter(|r| str_of(r, &["kind"]) == Some(kind))
            .collect()
    }

    fn one(&self, kind: &str) -> &Value {
        let found = self.of_kind(kind);
        assert!(
            found.len() == 1,
            "expected one {kind}, found {}",
            found.len()
        );
        found[0]
    }
}

fn probe_path<'a>(container: &'a Value, probe: &str) -> Option<&'a str> {
    str_of(container, &[probe, "httpGet", "path"])
}

fn named_port(container: &Value, name: &str) -> Option<u64> {
    seq(at(container, &["ports"]))
        .iter()
        .find(|port| str_of(port, &["name"]) == Some(name))
        .and_then(|port| at(port, &["containerPort"]).as_u64())
}

#[test]
fn kubernetes_base_has_statefulset_services_and_budget() -> TestResult {
    let base = KubeBase::load()?;
    let mut problems = Vec::new();
    let set = base.one("StatefulSet");
    let spec = at(set, &["spec"]);
    if at(spec, &["replicas"]).as_u64() != Some(3) {
        problems.push("StatefulSet replicas must be 3".to_owned());
    }
    if str_of(spec, &["podManagementPolicy"]) != Some("Parallel") {
        problems.push("podManagementPolicy must be Parallel".to_owned());
    }
    let pod = at(spec, &["template", "spec"]);
    let grace = at(pod, &["terminationGracePeriodSeconds"]).as_u64();
    if grace.is_none_or(|g| Duration::from_secs(g) < MIN_GRACE) {
        problems.push(format!(
            "terminationGracePeriodSeconds {grace:?} under {MIN_GRACE:?}"
        ));
    }
    let selector = at(spec, &["selector", "matchLabels"]);
    if selector.as_mapping().is_none_or(|m| m.is_empty()) {
        problems.push("StatefulSet selector is empty".to_owned());
    }
    for (key, value) in selector.as_mapping().into_iter().flatten() {
        if at(spec, &["template", "metadata", "labels"]).get(key) != Some(value) {
            problems.push(format!("pod template lacks selector label {key:?}"));
        }
    }
    let containers = seq(at(pod, &["containers"]));
    assert!(containers.len() == 1, "expected one container");
    let container = &containers[0];
    if probe_path(container, "readinessProbe") != Some("/ready") {
        problems.push("readinessProbe must GET /ready".to_owned());
    }
    if probe_path(container, "livenessProbe") != Some("/health") {
        problems.push("livenessProbe must GET /health".to_owned());
    }
    if named_port(container, "raft") != Some(RAFT_PORT.into())
        || named_port(container, "http") != Some(API_PORT.into())
    {
        problems.push("container ports must be raft 7100 and http 7180".to_owned());
    }

    // The data dir is a PVC from the claim template.
    let claims: Vec<&str> = seq(at(spec, &["volumeClaimTemplates"]))
        .iter()
        .filter_map(|claim| str_of(claim, &["metadata", "name"]))
        .collect();
    let data_mount = seq(at(container, &["volumeMounts"]))
        .iter()
        .find(|mount| str_of(mount, &["mountPath"]) == Some(DATA_DIR))
        .and_then(|mount| str_of(mount, &["name"]));
    if !data_mount.is_some_and(|name| claims.contains(&name)) {
        problems.push(format!(
            "{DATA_DIR} is not mounted from a volumeClaimTemplate"
        ));
    }

    // Headless Service named by serviceName; a client Service on the admin API.
    let service_name = str_of(spec, &["serviceName"]).unwrap_or_default();
    let services = base.of_kind("Service");
    let headless = services
        .iter()
        .find(|s| str_of(s, &["metadata", "name"]) == Some(service_name));
    match headless {
        Some(service) => {
            if str_of(service, &["spec", "clusterIP"]) != Some("None") {
                problems.push(format!("Service {service_name} must be headless"));
            }
            if at(service, &["spec", "publishNotReadyAddresses"]).as_bool() != Some(true) {
                problems.push(format!(
                    "Service {service_name} must publish not-ready pods"
                ));
            }
        }
        None => problems.push(format!("no Service {service_name:?} (serviceName)")),
    }
    let client = services.iter().any(|s| {
        str_of(s, &["spec", "clusterIP"]) != Some("None")
            && seq(at(s, &["spec", "ports"]))
                .iter()
                .any(|p| at(p, &["port"]).as_u64() == Some(API_PORT.into()))
    });
    if !client {
        problems.push("no client Service for the admin API".to_owned());
    }
    for service in &services {
        if at(service, &["spec", "selector"]) != selector {
            problems.push("a Service does not select the replicator pods".to_owned());
        }
    }

    let budget = base.one("PodDisruptionBudget");
    if at(budget, &["spec", "maxUnavailable"]).as_u64() != Some(1) {
        problems.push("PodDisruptionBudget maxUnavailable must be 1".to_owned());
    }
    if at(budget, &["spec", "selector", "matchLabels"]) != selector {
        problems.push("PodDisruptionBudget does not select the replicator pods".to_owned());
    }

    // Every secretKeyRef names a key of a Secret in the base.
    for variable in seq(at(container, &["env"])) {
        let Some(reference) = at(variable, &["valueFrom", "secretKeyRef"]).as_mapping() else {
            continue;
        };
        let secret = reference.get("name").and_then(Value::as_str);
        let key = reference
            .get("key")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let defined = base.of_kind("Secret").iter().any(|s| {
            str_of(s, &["metadata", "name"]) == secret
                && (at(s, &["stringData"]).get(key).is_some()
                    || at(s, &["data"]).get(key).is_some())
        });
        if !defined {
            problems.push(format!("secretKeyRef {secret:?}/{key} is not in the base"));
        }
    }

    // The config ConfigMap is generated from files that exist and is mounted.
    let generators = seq(at(&base.kustomization, &["configMapGenerator"]));
    let generated: Vec<&str> = generators
        .iter()
        .filter_map(|g| str_of(g, &["name"]))
        .collect();
    for file in generators
        .iter()
        .flat_map(|g| seq(at(g, &["files"])))
        .filter_map(Value::as_str)
    {
        if !deploy().join("kubernetes").join(file).is_file() {
            problems.push(format!("configMapGenerator file {file} is missing"));
        }
    }
    let mounted = seq(at(pod, &["volumes"]))
        .iter()
        .filter_map(|v| str_of(v, &["configMap", "name"]))
        .any(|name| generated.contains(&name));
    if !mounted {
        problems.push("the generated ConfigMap is not mounted".to_owned());
    }
    if base.of_kind("PodDisruptionBudget").is_empty() {
        problems.push("no PodDisruptionBudget".to_owned());
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// What one run of the Kubernetes entrypoint did.
struct EntrypointRun {
    /// The script exited 0.
    ok: bool,
    /// The arguments the replicator was started with, if it was started.
    args: Option<String>,
    /// The rendered config, if one was written.
    rendered: Option<String>,
}

/// Runs `deploy/kubernetes/entrypoint.sh` as the container would, with `getent` and
/// `iggy-replicator` replaced by stand-ins.
fn run_entrypoint(dir: &Path, pod_name: &str) -> TestResult<EntrypointRun> {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    let args_file = dir.join("args");
    let stand_ins = [
        ("getent", "#!/bin/sh\nexit 0\n".to_owned()),
        (
            "iggy-replicator",
            format!("#!/bin/sh\necho \"$@\" > '{}'\n", args_file.display()),
        ),
    ];
    for (name, script) in stand_ins {
        let path = bin.join(name);
        std::fs::write(&path, script)?;
        let status = Command::new("chmod").arg("+x").arg(&path).status()?;
        assert!(status.success(), "chmod");
    }
    let config = dir.join("replicator.toml");
    let status = Command::new("sh")
        .arg(deploy().join("kubernetes/entrypoint.sh"))
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("POD_NAME", pod_name)
        .env("POD_NAMESPACE", "replication")
        .env(
            "REPLICATOR_CONFIG_TEMPLATE",
            deploy().join("kubernetes/replicator.toml"),
        )
        .env("REPLICATOR_CONFIG", &config)
        .status()?;
    Ok(EntrypointRun {
        ok: status.success(),
        args: std::fs::read_to_string(&args_file).ok(),
        rendered: std::fs::read_to_string(&config).ok(),
    })
}

#[test]
fn kubernetes_entrypoint_renders_a_loadable_config_for_each_pod() -> TestResult {
    let base = KubeBase::load()?;
    let set = base.one("StatefulSet");
    let service_name = str_of(set, &["spec", "serviceName"]).unwrap_or_default();
    let container = &seq(at(set, &["spec", "template", "spec", "containers"]))[0];
    let secret = base.one("Secret");
    let mut problems = Vec::new();

    // The container's environment, as Kubernetes would fill it for pod `pod_name`.
    let container_env = |pod_name: &str| -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        for variable in seq(at(container, &["env"])) {
            let name = str_of(variable, &["name"]).unwrap_or_default().to_owned();
            let value = if let Some(value) = str_of(variable, &["value"]) {
                Some(value.to_owned())
            } else if let Some(field) = str_of(variable, &["valueFrom", "fieldRef", "fieldPath"]) {
                match field {
                    "metadata.name" => Some(pod_name.to_owned()),
                    "metadata.namespace" => Some("replication".to_owned()),
                    _ => None,
                }
            } else {
                str_of(variable, &["valueFrom", "secretKeyRef", "key"])
                    .and_then(|key| str_of(secret, &["stringData", key]))
                    .map(str::to_owned)
            };
            env.extend(value.map(|value| (name, value)));
        }
        env
    };

    // The template path the pod passes to the entrypoint is where the ConfigMap is mounted.
    let template_path = container_env("x")
        .get("REPLICATOR_CONFIG_TEMPLATE")
        .cloned()
        .unwrap_or_default();
    let template_mounted = seq(at(container, &["volumeMounts"])).iter().any(|mount| {
        str_of(mount, &["mountPath"])
            .is_some_and(|dir| template_path == format!("{dir}/replicator.toml"))
    });
    if !template_mounted {
        problems.push(format!(
            "template {template_path:?} is not in a mounted volume"
        ));
    }
    let command: Vec<&str> = seq(at(container, &["command"]))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    if command
        .last()
        .is_none_or(|script| !script.ends_with("/entrypoint.sh"))
    {
        problems.push(format!(
            "container command {command:?} does not run entrypoint.sh"
        ));
    }

    for ordinal in 0..3u64 {
        let pod_name = format!("iggy-replicator-{ordinal}");
        let dir = tempfile::tempdir()?;
        let EntrypointRun { ok, args, rendered } = run_entrypoint(dir.path(), &pod_name)?;
        let config_path = dir.path().join("replicator.toml");
        let expected_args = format!("run --config {} --log-format json", config_path.display());
        if !ok || args.as_deref().map(str::trim) != Some(expected_args.as_str()) {
            problems.push(format!(
                "{pod_name}: entrypoint ok={ok}, started with {args:?}"
            ));
        }
        let Some(rendered) = rendered else {
            problems.push(format!("{pod_name}: no config rendered"));
            continue;
        };
        let env = container_env(&pod_name);
        let origin = format!("kubernetes/replicator.toml for {pod_name}");
        for variable in referenced_vars(&rendered) {
            if !env.contains_key(&variable) {
                problems.push(format!("{origin}: container env lacks {variable}"));
            }
        }
        match load(&rendered, &origin, &env) {
            Ok(config) => {
                problems.extend(check_member(&config, &origin, ordinal + 1));
                let expected = format!("{pod_name}.{service_name}.replication.svc:{RAFT_PORT}");
                if config.node.raft_addr != expected {
                    problems.push(format!(
                        "{origin}: raft_addr {} != {expected}",
                        config.node.raft_addr
                    ));
                }
            }
            Err(error) => problems.push(error),
        }
    }

    // A pod name without an ordinal stops the entrypoint before the replicator starts.
    let dir = tempfile::tempdir()?;
    let EntrypointRun { ok, args, .. } = run_entrypoint(dir.path(), "replicator")?;
    if ok || args.is_some() {
        problems.push("entrypoint accepted a pod name without an ordinal".to_owned());
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

/// Metric names referenced in a PromQL expression (maximal `iggy_replicator_…` words).
fn metric_names(expression: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expression;
    while let Some(start) = rest.find("iggy_replicator_") {
        let preceded_by_word = rest[..start]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if !preceded_by_word {
            names.push(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// The exported family a series name belongs to, if any.
fn family_of(series: &str) -> Option<&'static str> {
    if let Some(family) = COUNTERS.iter().chain(GAUGES).find(|f| **f == series) {
        return Some(family);
    }
    HISTOGRAMS.iter().copied().find(|family| {
        ["_bucket", "_sum", "_count"]
            .iter()
            .any(|suffix| series.strip_suffix(suffix) == Some(family))
    })
}

/// Every string under a `expr` or `query` key, anywhere in the dashboard.
fn queries(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, item) in map {
                match (key.as_str(), item) {
                    ("expr" | "query" | "definition", serde_json::Value::String(text)) => {
                        out.push(text.clone());
                    }
                    _ => queries(item, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| queries(item, out)),
        _ => {}
    }
}

#[test]
fn grafana_dashboard_queries_exactly_the_exported_metrics() -> TestResult {
    let path = deploy().join("grafana/iggy-replicator-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&read(&path)?)?;
    let mut problems = Vec::new();
    let mut expressions = Vec::new();
    queries(&dashboard, &mut expressions);
    let mut used = BTreeSet::new();
    for expression in &expressions {
        for name in metric_names(expression) {
            match family_of(&name) {
                Some(family) => {
                    used.insert(family);
                }
                None => problems.push(format!("unknown metric {name} in {expression:?}")),
            }
        }
    }
    for family in COUNTERS.iter().chain(GAUGES).chain(HISTOGRAMS) {
        if !used.contains(family) {
            problems.push(format!("no panel shows {family}"));
        }
    }
    let panels = dashboard["panels"].as_array().ok_or("no panels")?;
    let mut ids = BTreeSet::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default();
        if !panel["id"].as_u64().is_some_and(|id| ids.insert(id)) {
            problems.push(format!("panel {title:?} has a missing or duplicate id"));
        }
        let width = panel["gridPos"]["w"].as_u64().unwrap_or(0);
        let x = panel["gridPos"]["x"].as_u64().unwrap_or(u64::MAX);
        if width == 0 || x.saturating_add(width) > 24 {
            problems.push(format!("panel {title:?} is outside the 24-column grid"));
        }
        if panel["type"] != "row" {
            let targets = panel["targets"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            if targets.is_empty() {
                problems.push(format!("panel {title:?} has no query"));
            }
            for target in targets {
                let legend = target["legendFormat"].as_str().unwrap_or_default();
                let expr = target["expr"].as_str().unwrap_or_default();
                if expr.contains("by (instance") && !legend.contains("{{instance}}") {
                    problems.push(format!(
                        "panel {title:?}: per-instance legend lacks instance"
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}

#[test]
fn stop_timeouts_parse_as_systemd_and_compose_write_them() {
    assert_eq!(parse_seconds("45"), Some(Duration::from_secs(45)));
    assert_eq!(parse_seconds("45s"), Some(Duration::from_secs(45)));
    assert_eq!(parse_seconds("1m30s"), Some(Duration::from_secs(90)));
    assert_eq!(parse_seconds("2min"), Some(Duration::from_secs(120)));
    assert_eq!(parse_seconds("soon"), None);
    assert_eq!(parse_seconds("10x"), None);
}

#[test]
fn metric_name_check_rejects_unknown_and_accepts_histogram_series() {
    let names = metric_names(
        "rate(iggy_replicator_messages_copied_total[5m]) / my_iggy_replicator_x + iggy_replicator_typo",
    );
    assert_eq!(
        names,
        [
            "iggy_replicator_messages_copied_total",
            "iggy_replicator_typo"
        ]
    );
    assert_eq!(family_of("iggy_replicator_typo"), None);
    assert_eq!(
        family_of("iggy_replicator_send_latency_seconds_bucket"),
        Some("iggy_replicator_send_latency_seconds")
    );
    assert_eq!(family_of("iggy_replicator_units_owned_bucket"), None);
}

fn example(name: &str) -> Result<Config, String> {
    let path = deploy().join("examples").join(name);
    let text = read(&path)?;
    load(&text, &relative(&path), &fake_env(&text))
}

#[test]
fn example_configs_describe_their_topologies() -> TestResult {
    let route = |config: &Config| -> Vec<(String, String)> {
        config
            .flows
            .iter()
            .map(|f| (f.source.clone(), f.target.clone()))
            .collect()
    };
    let one_way = example("one-way.toml")?;
    assert_eq!(route(&one_way), [("us".to_owned(), "eu".to_owned())]);

    let two_way = example("two-way.toml")?;
    assert_eq!(
        route(&two_way),
        [
            ("us".to_owned(), "eu".to_owned()),
            ("eu".to_owned(), "us".to_owned())
        ]
    );
    for flow in &two_way.flows {
        assert_eq!(
            flow.naming,
            replicator_model::Naming::Identity,
            "{}",
            flow.name
        );
        assert!(flow.provenance, "{}: two-way needs provenance", flow.name);
    }

    let fan_out = example("fan-out.toml")?;
    assert_eq!(
        route(&fan_out),
        [
            ("us".to_owned(), "eu".to_owned()),
            ("us".to_owned(), "ap".to_owned())
        ]
    );
    Ok(())
}

#[test]
fn dockerfile_builds_a_non_root_image_that_runs_the_replicator() -> TestResult {
    let text = read(&repo().join("Dockerfile"))?;
    let instructions: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .collect();
    let last = |keyword: &str| {
        instructions
            .iter()
            .rev()
            .find_map(|line| line.strip_prefix(keyword))
            .map(str::trim)
    };
    let from_count = instructions
        .iter()
        .filter(|l| l.starts_with("FROM "))
        .count();
    assert!(from_count >= 2, "expected a multi-stage build");
    assert_eq!(last("ENTRYPOINT "), Some(r#"["iggy-replicator"]"#));
    let cmd: Vec<String> = serde_json::from_str(last("CMD ").ok_or("no CMD")?)?;
    assert_eq!(cmd[..3], ["run", "--config", CONFIG_PATH]);
    let user = last("USER ").ok_or("no USER")?;
    assert!(
        !user.starts_with("root") && !user.starts_with("0"),
        "USER {user}"
    );
    let exposed: BTreeSet<&str> = last("EXPOSE ")
        .ok_or("no EXPOSE")?
        .split_whitespace()
        .collect();
    assert_eq!(exposed, BTreeSet::from(["7100", "7180"]));
    assert!(text.contains(DATA_DIR), "the image prepares {DATA_DIR}");
    let ignore = read(&repo().join(".dockerignore"))?;
    assert!(
        ignore.lines().any(|line| line.trim() == "target"),
        ".dockerignore keeps target/ out of the build context"
    );
    Ok(())
}

/// Every way the manifests start the binary, as argument lists.
fn start_commands() -> TestResult<Vec<(String, Vec<String>)>> {
    let mut commands = Vec::new();
    let unit = read(&deploy().join("systemd/iggy-replicator.service"))?;
    for line in unit.lines() {
        if let Some(exec) = line.trim().strip_prefix("ExecStart=") {
            let args = exec.split_whitespace().skip(1).map(str::to_owned).collect();
            commands.push(("systemd ExecStart".to_owned(), args));
        }
    }
    let compose = yaml_documents(&deploy().join("docker-compose/docker-compose.yml"))?;
    for (name, service) in at(&compose[0], &["services"])
        .as_mapping()
        .into_iter()
        .flatten()
    {
        let args: Vec<String> = seq(at(service, &["command"]))
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect();
        if args.first().map(String::as_str) == Some("run") {
            commands.push((format!("compose {}", name.as_str().unwrap_or("?")), args));
        }
    }
    let dockerfile = read(&repo().join("Dockerfile"))?;
    if let Some(cmd) = dockerfile
        .lines()
        .find_map(|l| l.trim().strip_prefix("CMD "))
    {
        commands.push((
            "Dockerfile CMD".to_owned(),
            serde_json::from_str::<Vec<String>>(cmd)?,
        ));
    }
    let dir = tempfile::tempdir()?;
    let args = run_entrypoint(dir.path(), "iggy-replicator-0")?.args;
    let args = args.ok_or("the entrypoint did not start the replicator")?;
    commands.push((
        "kubernetes entrypoint".to_owned(),
        args.split_whitespace().map(str::to_owned).collect(),
    ));
    Ok(commands)
}

#[test]
fn manifests_start_the_binary_with_arguments_it_accepts() -> TestResult {
    let binary = env!("CARGO_BIN_EXE_iggy-replicator");
    let commands = start_commands()?;
    assert!(commands.len() >= 4, "{commands:?}");
    let mut problems = Vec::new();
    for (origin, args) in commands {
        // clap validates the arguments before it, then prints the help of `run`.
        let output = Command::new(binary).args(&args).arg("--help").output()?;
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
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    Ok(())
}
