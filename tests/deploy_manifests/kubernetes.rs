//! `deploy/kubernetes/`: the kustomize base (StatefulSet, Services, budget, Secret, generated
//! ConfigMap) fits together, and `entrypoint.sh` renders a loadable config for each pod.
//!
//! The checks on the cluster's resources, the container environment and the entrypoint run
//! are shared with the Helm chart's renderings (`helm`).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_norway::Value;

use crate::configs::{check_member, load, referenced_vars};
use crate::yaml::{at, first_document, seq, str_of, strings, yaml_documents};
use crate::{
    assert_no_problems, deploy, StartCommand, TestResult, API_PORT, DATA_DIR, MIN_GRACE, RAFT_PORT,
};

/// The kustomize base: every resource the kustomization lists, by kind.
struct KubeBase {
    kustomization: Value,
    resources: Vec<Value>,
}

impl KubeBase {
    fn load() -> Result<Self, String> {
        let dir = deploy().join("kubernetes");
        let kustomization = first_document(&dir.join("kustomization.yaml"))?;
        let mut resources = Vec::new();
        for file in seq(at(&kustomization, &["resources"])) {
            let file = file
                .as_str()
                .ok_or("kustomization.yaml: non-string resource")?;
            resources.extend(yaml_documents(&dir.join(file))?);
        }
        Ok(Self {
            kustomization,
            resources,
        })
    }

    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        of_kind(&self.resources, kind)
    }

    fn one(&self, kind: &str) -> Result<&Value, String> {
        one(&self.resources, kind)
    }
}

/// The resources of one kind.
pub(crate) fn of_kind<'a>(resources: &'a [Value], kind: &str) -> Vec<&'a Value> {
    resources
        .iter()
        .filter(|r| str_of(r, &["kind"]) == Some(kind))
        .collect()
}

/// The one resource of a kind that must occur once.
pub(crate) fn one<'a>(resources: &'a [Value], kind: &str) -> Result<&'a Value, String> {
    match of_kind(resources, kind).as_slice() {
        [one] => Ok(one),
        found => Err(format!("expected one {kind}, found {}", found.len())),
    }
}

/// The name of the container that runs the replicator.
pub(crate) const REPLICATOR_CONTAINER: &str = "replicator";

/// The containers of the StatefulSet's pod template.
pub(crate) fn containers(set: &Value) -> &[Value] {
    seq(at(set, &["spec", "template", "spec", "containers"]))
}

/// The replicator container of the StatefulSet's pod template (there must be exactly one;
/// other containers, like the Helm chart's `join`, may run beside it).
pub(crate) fn container(set: &Value) -> Result<&Value, String> {
    let found: Vec<&Value> = containers(set)
        .iter()
        .filter(|c| str_of(c, &["name"]) == Some(REPLICATOR_CONTAINER))
        .collect();
    match found.as_slice() {
        [container] => Ok(container),
        found => Err(format!(
            "expected one container named {REPLICATOR_CONTAINER} in the StatefulSet, found {}",
            found.len()
        )),
    }
}

pub(crate) fn probe_path<'a>(container: &'a Value, probe: &str) -> Option<&'a str> {
    str_of(container, &[probe, "httpGet", "path"])
}

pub(crate) fn named_port(container: &Value, name: &str) -> Option<u64> {
    seq(at(container, &["ports"]))
        .iter()
        .find(|port| str_of(port, &["name"]) == Some(name))
        .and_then(|port| at(port, &["containerPort"]).as_u64())
}

#[test]
fn kubernetes_base_has_statefulset_services_and_budget() -> TestResult {
    let base = KubeBase::load()?;
    let mut problems = check_cluster_resources(&base.resources, 3)?;
    let set = base.one("StatefulSet")?;
    let pod = at(set, &["spec", "template", "spec"]);

    // The config ConfigMap is generated from files that exist and is mounted.
    let generators = seq(at(&base.kustomization, &["configMapGenerator"]));
    let generated: Vec<&str> = generators
        .iter()
        .filter_map(|g| str_of(g, &["name"]))
        .collect();
    for file in generators.iter().flat_map(|g| strings(at(g, &["files"]))) {
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
    assert_no_problems(&problems);
    Ok(())
}

/// Checks the resources of a replicator cluster (the kustomize base, or a rendering of the
/// Helm chart): one StatefulSet of `replicas` parallel members with the probes, ports, stop
/// grace and Raft volume every target uses, its headless and client Services, the
/// PodDisruptionBudget, and a Secret key behind every `secretKeyRef` of every container.
pub(crate) fn check_cluster_resources(
    resources: &[Value],
    replicas: u64,
) -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    let set = one(resources, "StatefulSet")?;
    let spec = at(set, &["spec"]);
    if at(spec, &["replicas"]).as_u64() != Some(replicas) {
        problems.push(format!("StatefulSet replicas must be {replicas}"));
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
    let container = container(set)?;
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
    let services = of_kind(resources, "Service");
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

    let budget = one(resources, "PodDisruptionBudget")?;
    if at(budget, &["spec", "maxUnavailable"]).as_u64() != Some(1) {
        problems.push("PodDisruptionBudget maxUnavailable must be 1".to_owned());
    }
    if at(budget, &["spec", "selector", "matchLabels"]) != selector {
        problems.push("PodDisruptionBudget does not select the replicator pods".to_owned());
    }

    // Every secretKeyRef names a key of a Secret among the resources.
    let variables = containers(set)
        .iter()
        .flat_map(|container| seq(at(container, &["env"])));
    for variable in variables {
        let Some(reference) = at(variable, &["valueFrom", "secretKeyRef"]).as_mapping() else {
            continue;
        };
        let secret = reference.get("name").and_then(Value::as_str);
        let key = reference
            .get("key")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let defined = of_kind(resources, "Secret").iter().any(|s| {
            str_of(s, &["metadata", "name"]) == secret
                && (at(s, &["stringData"]).get(key).is_some()
                    || at(s, &["data"]).get(key).is_some())
        });
        if !defined {
            problems.push(format!("secretKeyRef {secret:?}/{key} is not defined"));
        }
    }
    Ok(problems)
}

/// What one run of the Kubernetes entrypoint did.
pub(crate) struct EntrypointRun {
    /// The script exited 0.
    pub(crate) ok: bool,
    /// The arguments the replicator was started with, if it was started.
    pub(crate) args: Option<String>,
    /// Where the entrypoint was told to write the config (`REPLICATOR_CONFIG`).
    pub(crate) config: PathBuf,
    /// The rendered config, if one was written.
    pub(crate) rendered: Option<String>,
}

impl EntrypointRun {
    /// The rendered config of a run that should have started the replicator, after checking
    /// it: the entrypoint started `run` on it with JSON logs, and `env` (the container's
    /// environment) defines every variable it references. Problems name `origin`.
    pub(crate) fn checked_config(
        self,
        env: &BTreeMap<String, String>,
        origin: &str,
        problems: &mut Vec<String>,
    ) -> Option<String> {
        let expected_args = format!("run --config {} --log-format json", self.config.display());
        if !self.ok || self.args.as_deref().map(str::trim) != Some(expected_args.as_str()) {
            problems.push(format!(
                "{origin}: entrypoint ok={}, started with {:?}",
                self.ok, self.args
            ));
        }
        let Some(rendered) = self.rendered else {
            problems.push(format!("{origin}: no config rendered"));
            return None;
        };
        for variable in referenced_vars(&rendered) {
            if !env.contains_key(&variable) {
                problems.push(format!("{origin}: container env lacks {variable}"));
            }
        }
        Some(rendered)
    }
}

/// Runs `deploy/kubernetes/entrypoint.sh` as the container would, with `getent` and
/// `iggy-replicator` replaced by stand-ins.
fn run_entrypoint(dir: &Path, pod_name: &str) -> TestResult<EntrypointRun> {
    run_entrypoint_script(
        dir,
        &deploy().join("kubernetes/entrypoint.sh"),
        &deploy().join("kubernetes/replicator.toml"),
        pod_name,
    )
}

/// Runs the entrypoint `script` on the config `template` as the container of pod `pod_name`
/// would (the config is written to `dir/replicator.toml`), with `getent` and
/// `iggy-replicator` replaced by stand-ins.
pub(crate) fn run_entrypoint_script(
    dir: &Path,
    script: &Path,
    template: &Path,
    pod_name: &str,
) -> TestResult<EntrypointRun> {
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
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    }
    let config = dir.join("replicator.toml");
    let status = Command::new("sh")
        .arg(script)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("POD_NAME", pod_name)
        .env("POD_NAMESPACE", "replication")
        .env("REPLICATOR_CONFIG_TEMPLATE", template)
        .env("REPLICATOR_CONFIG", &config)
        .status()?;
    Ok(EntrypointRun {
        ok: status.success(),
        args: std::fs::read_to_string(&args_file).ok(),
        rendered: std::fs::read_to_string(&config).ok(),
        config,
    })
}

/// The environment of `container` as Kubernetes fills it for pod `pod_name` in `namespace`:
/// literal values, the downward API's pod name and namespace, and `secretKeyRef`s resolved
/// from the `stringData` of `secrets`.
pub(crate) fn container_env(
    container: &Value,
    secrets: &[&Value],
    pod_name: &str,
    namespace: &str,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for variable in seq(at(container, &["env"])) {
        let name = str_of(variable, &["name"]).unwrap_or_default().to_owned();
        let value = if let Some(value) = str_of(variable, &["value"]) {
            Some(value.to_owned())
        } else if let Some(field) = str_of(variable, &["valueFrom", "fieldRef", "fieldPath"]) {
            match field {
                "metadata.name" => Some(pod_name.to_owned()),
                "metadata.namespace" => Some(namespace.to_owned()),
                _ => None,
            }
        } else {
            let reference = at(variable, &["valueFrom", "secretKeyRef"]);
            let (secret, key) = (str_of(reference, &["name"]), str_of(reference, &["key"]));
            secrets
                .iter()
                .find(|s| str_of(s, &["metadata", "name"]) == secret)
                .and_then(|s| str_of(s, &["stringData", key.unwrap_or_default()]))
                .map(str::to_owned)
        };
        env.extend(value.map(|value| (name, value)));
    }
    env
}

/// Checks that the replicator container runs `entrypoint.sh` and that the config template
/// path it passes (`REPLICATOR_CONFIG_TEMPLATE` in `env`) is in a mounted volume.
pub(crate) fn check_entrypoint_wiring(
    container: &Value,
    env: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let template_path = env
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
    let command = strings(at(container, &["command"]));
    if command
        .last()
        .is_none_or(|script| !script.ends_with("/entrypoint.sh"))
    {
        problems.push(format!(
            "container command {command:?} does not run entrypoint.sh"
        ));
    }
    problems
}

#[test]
fn kubernetes_entrypoint_renders_a_loadable_config_for_each_pod() -> TestResult {
    let base = KubeBase::load()?;
    let set = base.one("StatefulSet")?;
    let service_name = str_of(set, &["spec", "serviceName"]).unwrap_or_default();
    let container = container(set)?;
    let secrets = base.of_kind("Secret");
    let container_env =
        |pod_name: &str| container_env(container, &secrets, pod_name, "replication");
    let mut problems = check_entrypoint_wiring(container, &container_env("x"));

    for ordinal in 0..3u64 {
        let pod_name = format!("iggy-replicator-{ordinal}");
        let dir = tempfile::tempdir()?;
        let env = container_env(&pod_name);
        let origin = format!("kubernetes/replicator.toml for {pod_name}");
        let run = run_entrypoint(dir.path(), &pod_name)?;
        let Some(rendered) = run.checked_config(&env, &origin, &mut problems) else {
            continue;
        };
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
    assert_no_problems(&problems);
    Ok(())
}

/// The arguments the entrypoint starts the replicator with, for the first pod.
pub(crate) fn start_commands() -> TestResult<Vec<StartCommand>> {
    let dir = tempfile::tempdir()?;
    let args = run_entrypoint(dir.path(), "iggy-replicator-0")?
        .args
        .ok_or("the kubernetes entrypoint did not start the replicator")?;
    Ok(vec![(
        "kubernetes entrypoint".to_owned(),
        args.split_whitespace().map(str::to_owned).collect(),
    )])
}
