//! `deploy/helm/iggy-replicator/`: the Helm chart. Helm is not installed where these tests
//! run, so the chart is checked through two hand-kept renderings, `rendered/default.yaml`
//! (`helm template` with the default values) and `rendered/tls-scaled.yaml` (with
//! `ci/tls-scaled-values.yaml`), and through the templates' own text:
//!
//! * the renderings come from the current templates, as far as that is cheap to see: every
//!   template yields a document of the kind it declares, every line of a template without
//!   template code shows in a rendering, the ConfigMap carries the chart's files and config,
//!   the checksum annotations are the SHA-256 of the rendered ConfigMap and Secret, and
//!   labels, Secret, image and replicas follow the values;
//! * every `.Values.` path a template uses is in `values.yaml`, and every value is used;
//! * the rendered cluster passes the kustomize base's checks (`kubernetes`), keeps its
//!   hardening and probes, and each member's config (rendered by the entrypoint from the
//!   ConfigMap) loads with the real loader;
//! * the `join` container adds exactly the members beyond the founding ones, with arguments
//!   the binary accepts;
//! * the PrometheusRule carries `deploy/prometheus/alerts.yaml`, and the ServiceMonitor scrapes
//!   every member once;
//! * members are kept apart: required anti-affinity by default, preferred and zone spread on
//!   request.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_norway::Value;

use crate::configs::{check_member, load};
use crate::kubernetes::{
    check_cluster_resources, check_entrypoint_wiring, container, container_env, containers,
    of_kind, one, probe_path, run_entrypoint_script,
};
use crate::yaml::{at, first_document, seq, str_of, strings, yaml_documents};
use crate::{
    assert_no_problems, deploy, files_under, read, relative, TestResult, API_PORT, BINARY,
    DATA_DIR, RAFT_PORT,
};

const CHART_NAME: &str = "iggy-replicator";
/// Where the templates mount the TLS Secret; the renderings' configs point here.
const TLS_DIR: &str = "/etc/iggy-replicator/tls";

/// The values file that sets every optional value, for `rendered/tls-scaled.yaml`.
const SCALED_VALUES: &str = "ci/tls-scaled-values.yaml";

fn chart() -> PathBuf {
    deploy().join("helm").join(CHART_NAME)
}

/// The chart's default values (`values.yaml`).
fn default_values() -> Result<Value, String> {
    first_document(&chart().join("values.yaml"))
}

/// One document of a rendering: the template it came from (`# Source:`), its text as rendered
/// and its value.
struct Document {
    template: String,
    text: String,
    value: Value,
}

/// One hand-kept rendering of the chart, with the values it was rendered with.
struct Rendering {
    /// `rendered/<name>.yaml`.
    name: &'static str,
    /// The chart's values with the rendering's overrides merged in.
    values: Value,
    /// The release namespace the rendering was made for.
    namespace: &'static str,
    documents: Vec<Document>,
    /// The documents' values, for the shared `kubernetes` checks.
    resources: Vec<Value>,
}

impl Rendering {
    fn load_all() -> Result<Vec<Rendering>, String> {
        Ok(vec![
            Self::load("default", None, "default")?,
            Self::load("tls-scaled", Some(SCALED_VALUES), "replication")?,
        ])
    }

    fn load(
        name: &'static str,
        overrides: Option<&str>,
        namespace: &'static str,
    ) -> Result<Rendering, String> {
        let mut values = default_values()?;
        if let Some(file) = overrides {
            merge(&mut values, &first_document(&chart().join(file))?);
        }
        let path = chart().join("rendered").join(format!("{name}.yaml"));
        let documents = split_rendering(&read(&path)?, &relative(&path))?;
        let resources = documents.iter().map(|d| d.value.clone()).collect();
        Ok(Rendering {
            name,
            values,
            namespace,
            documents,
            resources,
        })
    }

    fn origin(&self) -> String {
        format!("rendered/{}.yaml", self.name)
    }

    fn value(&self, path: &[&str]) -> &Value {
        at(&self.values, path)
    }

    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        of_kind(&self.resources, kind)
    }

    fn one(&self, kind: &str) -> Result<&Value, String> {
        one(&self.resources, kind).map_err(|e| format!("{}: {e}", self.origin()))
    }

    /// The rendered document of one kind.
    fn document(&self, kind: &str) -> Result<&Document, String> {
        self.documents
            .iter()
            .find(|d| str_of(&d.value, &["kind"]) == Some(kind))
            .ok_or_else(|| format!("{}: no {kind}", self.origin()))
    }

    fn replicas(&self) -> u64 {
        self.value(&["replicaCount"]).as_u64().unwrap_or_default()
    }

    fn initial_members(&self) -> u64 {
        self.value(&["cluster", "initialMembers"])
            .as_u64()
            .unwrap_or_default()
    }

    fn tls(&self) -> bool {
        self.value(&["tls", "enabled"]).as_bool() == Some(true)
    }

    fn api_tls(&self) -> bool {
        self.tls() && self.value(&["tls", "api"]).as_bool() == Some(true)
    }

    /// How the pods of the StatefulSet are named.
    fn pods(&self) -> Result<Pods<'_>, String> {
        let set = self.one("StatefulSet")?;
        Ok(Pods {
            set: str_of(set, &["metadata", "name"]).unwrap_or_default(),
            service: str_of(set, &["spec", "serviceName"]).unwrap_or_default(),
            namespace: self.namespace,
        })
    }

    /// A data entry of the ConfigMap.
    fn config_file(&self, key: &str) -> Result<&str, String> {
        str_of(self.one("ConfigMap")?, &["data", key])
            .ok_or_else(|| format!("{}: ConfigMap has no {key}", self.origin()))
    }

    /// Writes every data entry of the ConfigMap into `dir/template`, a file per key, as the
    /// pods mount it (a script sources `pod.sh` from beside it); returns that directory.
    fn mount_config_map(&self, dir: &Path) -> TestResult<PathBuf> {
        let mounted = dir.join("template");
        std::fs::create_dir_all(&mounted)?;
        let data = at(self.one("ConfigMap")?, &["data"]);
        for (key, value) in data.as_mapping().into_iter().flatten() {
            let (Some(key), Some(value)) = (key.as_str(), value.as_str()) else {
                let origin = self.origin();
                return Err(format!("{origin}: ConfigMap data {key:?} is not text").into());
            };
            std::fs::write(mounted.join(key), value)?;
        }
        Ok(mounted)
    }
}

/// The names of a rendering's pods, as the StatefulSet and its headless Service give them.
struct Pods<'a> {
    /// The StatefulSet's name.
    set: &'a str,
    /// Its headless Service (`serviceName`).
    service: &'a str,
    /// The release namespace.
    namespace: &'a str,
}

impl Pods<'_> {
    /// The pod with `ordinal`: `<set>-<ordinal>`.
    fn name(&self, ordinal: u64) -> String {
        format!("{}-{ordinal}", self.set)
    }

    /// Its stable DNS name (its Raft and admin API host): `<pod>.<service>.<namespace>.svc`.
    fn fqdn(&self, ordinal: u64) -> String {
        format!(
            "{}.{}.{}.svc",
            self.name(ordinal),
            self.service,
            self.namespace
        )
    }
}

/// Merges `overrides` into `values` as Helm merges a values file into the chart's values.
fn merge(values: &mut Value, overrides: &Value) {
    match (values.as_mapping_mut(), overrides.as_mapping()) {
        (Some(values), Some(overrides)) => {
            for (key, value) in overrides {
                match values.get_mut(key) {
                    Some(existing) if existing.is_mapping() && value.is_mapping() => {
                        merge(existing, value)
                    }
                    _ => {
                        values.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        _ => *values = overrides.clone(),
    }
}

/// Splits `helm template` output into its documents: each starts with a `---` line and a
/// `# Source: <chart>/templates/<file>` line. Lines before the first `---` are a comment.
fn split_rendering(text: &str, origin: &str) -> Result<Vec<Document>, String> {
    let mut chunks: Vec<Vec<&str>> = Vec::new();
    let mut before_first = true;
    for line in text.lines() {
        if line == "---" {
            chunks.push(Vec::new());
            before_first = false;
        } else if let Some(chunk) = chunks.last_mut() {
            chunk.push(line);
        } else if before_first && !line.starts_with('#') && !line.trim().is_empty() {
            return Err(format!("{origin}: content before the first ---: {line}"));
        }
    }
    let prefix = format!("# Source: {CHART_NAME}/templates/");
    let mut documents = Vec::new();
    for (index, chunk) in chunks.iter().enumerate() {
        let Some(template) = chunk.first().and_then(|line| line.strip_prefix(&prefix)) else {
            return Err(format!("{origin}[{index}]: no `{prefix}…` line"));
        };
        let text = chunk[1..].join("\n");
        // The newline that ends the document ends its last block scalar too.
        let value: Value = serde_norway::from_str(&format!("{text}\n"))
            .map_err(|e| format!("{origin}[{index}] ({template}): {e}"))?;
        if !value.is_mapping() {
            return Err(format!("{origin}[{index}] ({template}): not a mapping"));
        }
        documents.push(Document {
            template: template.to_owned(),
            text,
            value,
        });
    }
    if documents.is_empty() {
        return Err(format!("{origin}: no document"));
    }
    Ok(documents)
}

/// The SHA-256 of `text` in hex, as Helm's `sha256sum` prints it.
fn sha256_hex(text: &str) -> Result<String, String> {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running sha256sum: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("sha256sum: no stdin")?
        .write_all(text.as_bytes())
        .map_err(|e| format!("writing to sha256sum: {e}"))?;
    let output = child
        .wait_with_output()
        .map_err(|e| format!("sha256sum: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .split_whitespace()
        .next()
        .map(str::to_owned)
        .ok_or_else(|| format!("sha256sum printed {stdout:?}"))
}

/// The template files: `(file name, text)`, sorted.
fn templates() -> Result<Vec<(String, String)>, String> {
    let mut found = Vec::new();
    for path in files_under(&chart().join("templates"), &[""]) {
        let name = path
            .strip_prefix(chart().join("templates"))
            .map_err(|e| e.to_string())?
            .display()
            .to_string();
        found.push((name, read(&path)?));
    }
    Ok(found)
}

/// The `.Values.a.b` paths a template uses, as `["a", "b"]`.
fn values_paths(template: &str) -> Vec<Vec<String>> {
    const MARK: &str = ".Values.";
    let mut paths = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find(MARK) {
        rest = &rest[start + MARK.len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .unwrap_or(rest.len());
        let path: Vec<String> = rest[..end]
            .split('.')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if !path.is_empty() {
            paths.push(path);
        }
        rest = &rest[end..];
    }
    paths
}

/// The paths of the leaves of a values tree: values that are not a non-empty mapping.
fn leaf_paths(value: &Value, prefix: &mut Vec<String>, leaves: &mut Vec<Vec<String>>) {
    match value.as_mapping() {
        Some(mapping) if !mapping.is_empty() => {
            for (key, child) in mapping {
                prefix.push(key.as_str().unwrap_or("?").to_owned());
                leaf_paths(child, prefix, leaves);
                prefix.pop();
            }
        }
        _ => leaves.push(prefix.clone()),
    }
}

fn has_path(value: &Value, path: &[String]) -> bool {
    path.iter()
        .try_fold(value, |value, key| value.get(key.as_str()))
        .is_some()
}

/// Whether values.yaml takes an override at `path`: the key exists, or the path leads into
/// a mapping values.yaml leaves empty for the user to fill (labels, annotations, settings).
fn takes_override(values: &Value, path: &[String]) -> bool {
    let mut current = values;
    for key in path {
        if current.as_mapping().is_some_and(|m| m.is_empty()) {
            return true;
        }
        match current.get(key.as_str()) {
            Some(next) => current = next,
            None => return false,
        }
    }
    true
}

/// `text` without its template comments (`{{/* … */}}`, also with `-` trim markers).
fn without_template_comments(text: &str) -> String {
    let mut kept = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let inside = rest[start + 2..].trim_start_matches('-').trim_start();
        if !inside.starts_with("/*") {
            kept.push_str(&rest[..start + 2]);
            rest = &rest[start + 2..];
            continue;
        }
        kept.push_str(&rest[..start]);
        let comment = &rest[start..];
        let end = comment
            .find("*/")
            .and_then(|close| comment[close..].find("}}").map(|i| close + i + 2))
            .unwrap_or(comment.len());
        rest = &comment[end..];
    }
    kept.push_str(rest);
    kept
}

#[test]
fn helm_chart_metadata_matches_the_workspace() -> TestResult {
    let mut problems = Vec::new();
    let meta = first_document(&chart().join("Chart.yaml"))?;
    if str_of(&meta, &["apiVersion"]) != Some("v2") {
        problems.push("Chart.yaml: apiVersion must be v2".to_owned());
    }
    if str_of(&meta, &["name"]) != Some(CHART_NAME) {
        problems.push(format!("Chart.yaml: name must be {CHART_NAME}"));
    }
    let workspace = env!("CARGO_PKG_VERSION");
    if str_of(&meta, &["appVersion"]) != Some(workspace) {
        problems.push(format!(
            "Chart.yaml: appVersion {:?} is not the workspace version {workspace}",
            str_of(&meta, &["appVersion"])
        ));
    }
    let version = str_of(&meta, &["version"]).unwrap_or_default();
    if version.split('.').count() != 3 || version.split('.').any(|n| n.parse::<u64>().is_err()) {
        problems.push(format!("Chart.yaml: version {version:?} is not x.y.z"));
    }

    // The chart's files are links to the single copies elsewhere in deploy/.
    for (link, target) in [
        ("files/alerts.yaml", "prometheus/alerts.yaml"),
        ("files/entrypoint.sh", "kubernetes/entrypoint.sh"),
        ("files/pod.sh", "kubernetes/pod.sh"),
    ] {
        let path = chart().join(link);
        let is_link = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink());
        let resolved = std::fs::canonicalize(&path).ok();
        let expected = std::fs::canonicalize(deploy().join(target)).ok();
        if !is_link || resolved.is_none() || resolved != expected {
            problems.push(format!(
                "{link} must be a symlink to deploy/{target} (resolves to {resolved:?})"
            ));
        }
    }
    let ignore = read(&chart().join(".helmignore"))?;
    if !ignore.lines().any(|line| line.trim() == "rendered/") {
        problems.push(".helmignore must leave rendered/ out of the package".to_owned());
    }
    assert_no_problems(&problems);
    Ok(())
}

#[test]
fn helm_templates_use_only_values_that_values_yaml_defines() -> TestResult {
    let values = default_values()?;
    let mut problems = Vec::new();
    let mut used = Vec::new();
    let templates = templates()?;
    if templates.len() < 8 {
        problems.push(format!(
            "expected the chart's templates, found {}",
            templates.len()
        ));
    }
    for (name, text) in &templates {
        for path in values_paths(text) {
            if !has_path(&values, &path) {
                problems.push(format!(
                    "templates/{name}: .Values.{} is not in values.yaml",
                    path.join(".")
                ));
            }
            used.push(path);
        }
    }
    // Every value is used: some template reads it or a mapping around it.
    let mut leaves = Vec::new();
    leaf_paths(&values, &mut Vec::new(), &mut leaves);
    for leaf in &leaves {
        if !used.iter().any(|path| leaf.starts_with(path)) {
            problems.push(format!(
                "values.yaml: {} is used by no template",
                leaf.join(".")
            ));
        }
    }
    // An override of a key the chart does not have would be ignored silently.
    let overrides = first_document(&chart().join(SCALED_VALUES))?;
    let mut override_leaves = Vec::new();
    leaf_paths(&overrides, &mut Vec::new(), &mut override_leaves);
    for leaf in override_leaves {
        if !takes_override(&values, &leaf) {
            problems.push(format!(
                "{SCALED_VALUES}: {} is not in values.yaml",
                leaf.join(".")
            ));
        }
    }
    assert_no_problems(&problems);
    Ok(())
}

#[test]
fn values_paths_are_found_in_template_text() {
    let text = "{{- if and .Values.tls.enabled $.Values.tls.api }}{{ toYaml .Values }}\
                {{ .Values.resources | nindent 4 }}{{ .Values.a_b.c2}}";
    let paths: Vec<String> = values_paths(text).iter().map(|p| p.join(".")).collect();
    assert_eq!(paths, ["tls.enabled", "tls.api", "resources", "a_b.c2"]);
}

#[test]
fn helm_renderings_come_from_the_current_templates() -> TestResult {
    let renderings = Rendering::load_all()?;
    let templates = templates()?;
    let meta = first_document(&chart().join("Chart.yaml"))?;
    let chart_label = format!(
        "{CHART_NAME}-{}",
        str_of(&meta, &["version"]).unwrap_or_default()
    );
    let app_version = str_of(&meta, &["appVersion"]).unwrap_or_default();
    let mut problems = Vec::new();
    let mut rendered_templates = BTreeSet::new();
    for rendering in &renderings {
        let origin = rendering.origin();
        for document in &rendering.documents {
            let value = &document.value;
            let name = str_of(value, &["metadata", "name"]).unwrap_or_default();
            let kind = str_of(value, &["kind"]).unwrap_or_default();
            let at_doc = format!("{origin}: {kind} {name} ({})", document.template);
            rendered_templates.insert(document.template.clone());
            // The document is of the kind its template declares.
            match templates
                .iter()
                .find(|(file, _)| *file == document.template)
            {
                Some((_, text)) => {
                    let declared: Vec<&str> = text
                        .lines()
                        .filter_map(|line| line.strip_prefix("kind: "))
                        .collect();
                    if declared != [kind] {
                        problems.push(format!("{at_doc}: its template declares {declared:?}"));
                    }
                }
                None => problems.push(format!("{at_doc}: no such template")),
            }
            if str_of(value, &["apiVersion"]).is_none() || name.is_empty() {
                problems.push(format!("{at_doc}: apiVersion or metadata.name missing"));
            }
            if str_of(value, &["metadata", "namespace"]) != Some(rendering.namespace) {
                problems.push(format!(
                    "{at_doc}: namespace is not {}",
                    rendering.namespace
                ));
            }
            let labels = at(value, &["metadata", "labels"]);
            if str_of(labels, &["helm.sh/chart"]) != Some(chart_label.as_str())
                || str_of(labels, &["app.kubernetes.io/version"]) != Some(app_version)
            {
                problems.push(format!(
                    "{at_doc}: labels do not name chart {chart_label} and version {app_version}"
                ));
            }
        }

        // The ConfigMap carries the chart's files and the config of the values.
        for file in ["entrypoint.sh", "pod.sh", "join.sh"] {
            let expected = read(&chart().join("files").join(file))?;
            if rendering.config_file(file)? != expected {
                problems.push(format!("{origin}: ConfigMap {file} is not files/{file}"));
            }
        }
        let replication = str_of(&rendering.values, &["config", "replication"]).unwrap_or("?");
        if !rendering
            .config_file("replicator.toml")?
            .ends_with(&format!("\n\n{}\n", replication.trim()))
        {
            problems.push(format!(
                "{origin}: replicator.toml does not end with config.replication"
            ));
        }

        // The Secret holds the credentials of the values.
        let secret = rendering.one("Secret")?;
        let mut expected = BTreeMap::from([
            (
                "REPLICATOR_SECRET".to_owned(),
                rendering.value(&["secrets", "clusterSecret"]).clone(),
            ),
            (
                "REPLICATOR_ADMIN_TOKEN".to_owned(),
                rendering.value(&["secrets", "adminToken"]).clone(),
            ),
        ]);
        for (key, value) in rendering
            .value(&["secrets", "env"])
            .as_mapping()
            .into_iter()
            .flatten()
        {
            expected.insert(key.as_str().unwrap_or("?").to_owned(), value.clone());
        }
        let actual: BTreeMap<String, Value> = at(secret, &["stringData"])
            .as_mapping()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.as_str().unwrap_or("?").to_owned(), v.clone()))
            .collect();
        if actual != expected {
            problems.push(format!(
                "{origin}: Secret stringData {actual:?} is not the values' {expected:?}"
            ));
        }

        // The checksum annotations are Helm's sha256sum of the raw template output: the
        // rendered document and its final newline.
        let set = rendering.one("StatefulSet")?;
        let annotations = at(set, &["spec", "template", "metadata", "annotations"]);
        for (annotation, kind) in [
            ("checksum/config", "ConfigMap"),
            ("checksum/secret", "Secret"),
        ] {
            let expected = sha256_hex(&format!("{}\n", rendering.document(kind)?.text))?;
            let actual = str_of(annotations, &[annotation]);
            if actual != Some(expected.as_str()) {
                problems.push(format!(
                    "{origin}: {annotation} is {actual:?}, the rendered {kind} hashes to {expected}"
                ));
            }
        }

        let image = format!(
            "{}:{app_version}",
            str_of(&rendering.values, &["image", "repository"]).unwrap_or("?")
        );
        for container in containers(set) {
            if str_of(container, &["image"]) != Some(image.as_str()) {
                problems.push(format!(
                    "{origin}: container {:?} image is not {image}",
                    str_of(container, &["name"])
                ));
            }
        }
    }

    // Every template renders in one of the renderings; the optional ones only when enabled.
    for (file, _) in &templates {
        if file.starts_with('_') || !file.ends_with(".yaml") {
            continue;
        }
        if !rendered_templates.contains(file) {
            problems.push(format!("templates/{file} yields no document in rendered/"));
        }
    }
    let default = &renderings[0];
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        if !default.of_kind(kind).is_empty() {
            problems.push(format!("{}: a {kind} by default", default.origin()));
        }
    }
    assert_no_problems(&problems);
    Ok(())
}

#[test]
fn template_comments_are_left_out() {
    let text = "a\n{{/* one\nline */}}\nb {{ .x }}\n{{- /* two */ -}}\nc";
    assert_eq!(without_template_comments(text), "a\n\nb {{ .x }}\n\nc");
}

/// Every line of a template without template code shows in a rendering: in a document of
/// that template, with its indentation, or for `_helpers.tpl` (whose text is included at
/// other indentations) anywhere. A literal change to a template therefore needs the
/// renderings changed too; `ci/tls-scaled-values.yaml` sets every optional value so that
/// each conditional line shows in one of the two renderings.
#[test]
fn helm_renderings_show_every_literal_line_of_the_templates() -> TestResult {
    let renderings = Rendering::load_all()?;
    let mut problems = Vec::new();
    for (file, text) in templates()? {
        if file == "NOTES.txt" {
            continue; // printed by install and upgrade, not by `helm template`
        }
        let helpers = file.starts_with('_');
        let rendered: Vec<&str> = renderings
            .iter()
            .flat_map(|r| &r.documents)
            .filter(|d| helpers || d.template == file)
            .flat_map(|d| d.text.lines())
            .collect();
        for line in without_template_comments(&text).lines() {
            if line.trim().is_empty() || line.contains("{{") {
                continue;
            }
            let found = rendered.iter().any(|r| {
                if helpers {
                    r.trim() == line.trim()
                } else {
                    r.trim_end() == line.trim_end()
                }
            });
            if !found {
                problems.push(format!("templates/{file}: {line:?} is in no rendering"));
            }
        }
    }
    assert_no_problems(&problems);
    Ok(())
}

#[test]
fn helm_renderings_have_the_shape_of_the_kustomize_base() -> TestResult {
    let base_set = yaml_documents(&deploy().join("kubernetes/statefulset.yaml"))?
        .into_iter()
        .next()
        .ok_or("deploy/kubernetes/statefulset.yaml: no document")?;
    let base_pod = at(&base_set, &["spec", "template", "spec"]);
    let base_container = container(&base_set)?;
    let mut problems = Vec::new();
    for rendering in Rendering::load_all()? {
        let origin = rendering.origin();
        let shape = check_cluster_resources(&rendering.resources, rendering.replicas())?;
        problems.extend(shape.into_iter().map(|p| format!("{origin}: {p}")));

        let set = rendering.one("StatefulSet")?;
        let pod = at(set, &["spec", "template", "spec"]);
        // The same hardening as the kustomize base, on every container.
        for key in [
            "securityContext",
            "automountServiceAccountToken",
            "enableServiceLinks",
        ] {
            if at(pod, &[key]) != at(base_pod, &[key]) {
                problems.push(format!(
                    "{origin}: pod {key} differs from the kustomize base"
                ));
            }
        }
        for container in containers(set) {
            if at(container, &["securityContext"]) != at(base_container, &["securityContext"]) {
                problems.push(format!(
                    "{origin}: container {:?} securityContext differs from the kustomize base",
                    str_of(container, &["name"])
                ));
            }
        }
        // The base's probes, over HTTPS when the admin API serves it.
        let replicator = container(set)?;
        for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
            let mut expected = at(base_container, &[probe]).clone();
            if rendering.api_tls() {
                if let Some(get) = expected.get_mut("httpGet").and_then(Value::as_mapping_mut) {
                    get.insert("scheme".into(), "HTTPS".into());
                }
            }
            if at(replicator, &[probe]) != &expected || probe_path(replicator, probe).is_none() {
                problems.push(format!(
                    "{origin}: {probe} is not the kustomize base's{}",
                    if rendering.api_tls() {
                        " over HTTPS"
                    } else {
                        ""
                    }
                ));
            }
        }
        if at(replicator, &["resources"]) != rendering.value(&["resources"]) {
            problems.push(format!("{origin}: resources are not the values'"));
        }
        let claims = seq(at(set, &["spec", "volumeClaimTemplates"]));
        let size = claims
            .first()
            .map(|claim| at(claim, &["spec", "resources", "requests", "storage"]));
        if size != Some(rendering.value(&["persistence", "size"])) {
            problems.push(format!("{origin}: the claim size is not persistence.size"));
        }
        // The ConfigMap is the one the pods mount.
        let config_map = str_of(rendering.one("ConfigMap")?, &["metadata", "name"]);
        let mounted = seq(at(pod, &["volumes"]))
            .iter()
            .any(|v| str_of(v, &["configMap", "name"]) == config_map);
        if !mounted {
            problems.push(format!("{origin}: ConfigMap {config_map:?} is not mounted"));
        }
    }
    assert_no_problems(&problems);
    Ok(())
}

/// Writes empty stand-ins for the certificate files the config names: the loader only checks
/// that they can be opened.
fn stand_in_tls_dir(dir: &Path) -> TestResult<PathBuf> {
    let tls = dir.join("tls");
    std::fs::create_dir_all(&tls)?;
    for file in ["tls.crt", "tls.key", "ca.crt"] {
        std::fs::write(tls.join(file), "stand-in")?;
    }
    Ok(tls)
}

/// Checks that `container` mounts the TLS Secret of the values at [`TLS_DIR`].
fn check_tls_mount(rendering: &Rendering, set: &Value, container: &Value) -> Vec<String> {
    let origin = rendering.origin();
    let name = str_of(container, &["name"]).unwrap_or("?");
    let secret_name = str_of(&rendering.values, &["tls", "secretName"]);
    let volume = seq(at(set, &["spec", "template", "spec", "volumes"]))
        .iter()
        .find(|v| secret_name.is_some() && str_of(v, &["secret", "secretName"]) == secret_name)
        .and_then(|v| str_of(v, &["name"]));
    let mounted = seq(at(container, &["volumeMounts"])).iter().any(|mount| {
        volume.is_some()
            && str_of(mount, &["name"]) == volume
            && str_of(mount, &["mountPath"]) == Some(TLS_DIR)
    });
    if rendering.tls() && !mounted {
        vec![format!(
            "{origin}: container {name} does not mount Secret {secret_name:?} at {TLS_DIR}"
        )]
    } else if !rendering.tls() && volume.is_some() {
        vec![format!("{origin}: a TLS volume without tls.enabled")]
    } else {
        Vec::new()
    }
}

#[test]
fn helm_rendered_configs_load_for_every_member() -> TestResult {
    let mut problems = Vec::new();
    for rendering in Rendering::load_all()? {
        let origin = rendering.origin();
        let set = rendering.one("StatefulSet")?;
        let pods = rendering.pods()?;
        let namespace = rendering.namespace;
        let replicator = container(set)?;
        let secrets = rendering.of_kind("Secret");
        problems.extend(check_entrypoint_wiring(
            replicator,
            &container_env(replicator, &secrets, "x-0", namespace),
        ));
        problems.extend(check_tls_mount(&rendering, set, replicator));

        let dir = tempfile::tempdir()?;
        let tls_dir = stand_in_tls_dir(dir.path())?;
        let mounted = rendering.mount_config_map(dir.path())?;
        let script = mounted.join("entrypoint.sh");
        let template = mounted.join("replicator.toml");

        let initial = rendering.initial_members();
        let founders: BTreeMap<u64, String> = (0..initial)
            .map(|o| (o + 1, format!("{}:{RAFT_PORT}", pods.fqdn(o))))
            .collect();
        for ordinal in 0..rendering.replicas() {
            let pod_name = pods.name(ordinal);
            let at_pod = format!("{origin} for {pod_name}");
            let run_dir = tempfile::tempdir()?;
            let env = container_env(replicator, &secrets, &pod_name, namespace);
            let run = run_entrypoint_script(run_dir.path(), &script, &template, &pod_name)?;
            let Some(rendered) = run.checked_config(&env, &at_pod, &mut problems) else {
                continue;
            };
            // The certificate files are where the TLS Secret is mounted; the stand-ins there.
            let local = rendered.replace(
                &format!("\"{TLS_DIR}/"),
                &format!("\"{}/", tls_dir.display()),
            );
            let config = match load(&local, &at_pod, &env) {
                Ok(config) => config,
                Err(error) => {
                    problems.push(error);
                    continue;
                }
            };
            let node_id = ordinal + 1;
            let fqdn = pods.fqdn(ordinal);
            if ordinal < initial {
                problems.extend(check_member(&config, &at_pod, node_id));
            } else {
                if config.node.id != node_id || config.node.data_dir != Path::new(DATA_DIR) {
                    problems.push(format!(
                        "{at_pod}: node {} with data dir {}, expected {node_id} and {DATA_DIR}",
                        config.node.id,
                        config.node.data_dir.display()
                    ));
                }
                if config.initial_members().contains_key(&node_id) {
                    problems.push(format!("{at_pod}: a joining node in initial_members"));
                }
            }
            if config.initial_members() != founders {
                problems.push(format!(
                    "{at_pod}: initial_members {:?}, expected the founding pods {founders:?}",
                    config.initial_members()
                ));
            }
            if config.node.raft_addr != format!("{fqdn}:{RAFT_PORT}")
                || config.advertised_api_addr() != format!("{fqdn}:{API_PORT}")
            {
                problems.push(format!(
                    "{at_pod}: raft {} / api {} are not {fqdn}",
                    config.node.raft_addr,
                    config.advertised_api_addr()
                ));
            }
            let token = config.cluster.admin_token.as_ref().map(|t| t.expose());
            if token.is_none() || token != env.get("REPLICATOR_ADMIN_TOKEN").map(String::as_str) {
                problems.push(format!("{at_pod}: cluster.admin_token is not the Secret's"));
            }
            let local_tls = |file: &str| tls_dir.join(file);
            let member_tls = config
                .cluster
                .tls
                .as_ref()
                .map(|t| (t.cert_file.clone(), t.key_file.clone(), t.ca_file.clone()));
            let expected_tls = rendering.tls().then(|| {
                (
                    local_tls("tls.crt"),
                    local_tls("tls.key"),
                    local_tls("ca.crt"),
                )
            });
            if member_tls != expected_tls {
                problems.push(format!(
                    "{at_pod}: [cluster.tls] {member_tls:?}, expected {expected_tls:?}"
                ));
            }
            let api_tls = config.node.api_tls.as_ref().map(|t| {
                (
                    t.cert_file.clone(),
                    t.key_file.clone(),
                    t.client_ca_file.clone(),
                )
            });
            let expected_api_tls = rendering
                .api_tls()
                .then(|| (local_tls("tls.crt"), local_tls("tls.key"), None));
            if api_tls != expected_api_tls {
                problems.push(format!(
                    "{at_pod}: [node.api_tls] {api_tls:?}, expected {expected_api_tls:?}"
                ));
            }
        }
    }
    assert_no_problems(&problems);
    Ok(())
}

/// What one run of `join.sh` did before it was stopped.
struct JoinRun {
    /// The stand-in binary's invocations, one argument list a line.
    calls: Vec<String>,
    /// What the script logged.
    stderr: String,
    /// It exited 0 on SIGTERM.
    stopped_cleanly: bool,
}

/// Runs the rendered `join.sh` for pod `pod_name` with the join container's environment, an
/// `iggy-replicator` stand-in whose first `cluster add` fails, until its log contains
/// `until`; then stops it with SIGTERM as Kubernetes would.
fn run_join(
    rendering: &Rendering,
    join: &Value,
    pod_name: &str,
    until: &str,
) -> TestResult<JoinRun> {
    let dir = tempfile::tempdir()?;
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin)?;
    let calls = dir.path().join("calls");
    let failed_once = dir.path().join("failed-once");
    let stand_in = format!(
        "#!/bin/sh\necho \"$@\" >> '{calls}'\n\
         if [ \"$1 $2\" = 'cluster add' ] && [ ! -e '{failed}' ]; then\n\
         touch '{failed}'; echo 'add failed (503): no leader' >&2; exit 1\nfi\nexit 0\n",
        calls = calls.display(),
        failed = failed_once.display(),
    );
    let path = bin.join("iggy-replicator");
    std::fs::write(&path, stand_in)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    let script = rendering.mount_config_map(dir.path())?.join("join.sh");
    let stderr_path = dir.path().join("stderr");

    let secrets = rendering.of_kind("Secret");
    let env = container_env(join, &secrets, pod_name, rendering.namespace);
    let mut child = Command::new("sh")
        .arg(&script)
        .env_clear()
        .envs(&env)
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("JOIN_RETRY_INTERVAL", "0")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path)?)
        .process_group(0)
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&stderr_path)?.contains(until) {
        if Instant::now() > deadline || child.try_wait()?.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SIGTERM to the whole group (the script and its idle `sleep`), as to the container.
    Command::new("kill")
        .args(["-TERM", "--", &format!("-{}", child.id())])
        .status()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() > deadline {
            child.kill()?;
            child.wait()?;
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // A `sleep` forked just as SIGTERM arrived outlives the script (in a container the
    // runtime ends it with the container): end whatever is left of the group.
    Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .stderr(Stdio::null())
        .status()?;
    Ok(JoinRun {
        calls: std::fs::read_to_string(&calls)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect(),
        stderr: std::fs::read_to_string(&stderr_path)?,
        stopped_cleanly: status.is_some_and(|s| s.success()),
    })
}

#[test]
fn helm_join_container_adds_only_the_members_beyond_the_founders() -> TestResult {
    let mut problems = Vec::new();
    for rendering in Rendering::load_all()? {
        let origin = rendering.origin();
        let set = rendering.one("StatefulSet")?;
        let pods = rendering.pods()?;
        let Some(join) = containers(set)
            .iter()
            .find(|c| str_of(c, &["name"]) == Some("join"))
        else {
            problems.push(format!("{origin}: no join container"));
            continue;
        };
        problems.extend(check_tls_mount(&rendering, set, join));
        let command = strings(at(join, &["command"]));
        let template_dir = seq(at(join, &["volumeMounts"]))
            .iter()
            .find(|m| str_of(m, &["name"]) == Some("config-template"))
            .and_then(|m| str_of(m, &["mountPath"]));
        let runs_join_sh = command.last().is_some_and(|script| {
            template_dir.is_some_and(|dir| *script == format!("{dir}/join.sh"))
        });
        if !runs_join_sh {
            problems.push(format!(
                "{origin}: join command {command:?} does not run the mounted join.sh"
            ));
        }
        let env = container_env(
            join,
            &rendering.of_kind("Secret"),
            "x-0",
            rendering.namespace,
        );
        let expected_initial = rendering.initial_members().to_string();
        if env.get("INITIAL_MEMBERS") != Some(&expected_initial) {
            problems.push(format!(
                "{origin}: join INITIAL_MEMBERS is not {expected_initial}"
            ));
        }
        let token = rendering.value(&["secrets", "adminToken"]).as_str();
        if env.get("REPLICATOR_TOKEN").map(String::as_str) != token {
            problems.push(format!(
                "{origin}: join REPLICATOR_TOKEN is not the admin token"
            ));
        }
        let ca_file = env.get("REPLICATOR_CA_FILE").cloned();
        let expected_ca = rendering.api_tls().then(|| format!("{TLS_DIR}/ca.crt"));
        if ca_file != expected_ca {
            problems.push(format!(
                "{origin}: join REPLICATOR_CA_FILE {ca_file:?}, expected {expected_ca:?}"
            ));
        }

        // A founding member adds nothing and idles until SIGTERM.
        let founder = pods.name(0);
        let run = run_join(&rendering, join, &founder, "nothing to join")?;
        if run.calls.iter().any(|c| c.starts_with("cluster add")) || !run.stopped_cleanly {
            problems.push(format!(
                "{origin}: join on {founder}: calls {:?}, clean stop {}, log {}",
                run.calls, run.stopped_cleanly, run.stderr
            ));
        }

        // A pod beyond the founders waits for its own API, then is added through the
        // founding members in turn until an add succeeds.
        let ordinal = rendering.initial_members();
        let pod = pods.name(ordinal);
        let run = run_join(&rendering, join, &pod, "is a voter")?;
        let fqdn = pods.fqdn(ordinal);
        let add = |member: u64| {
            format!(
                "cluster add --api {}:{API_PORT} --id {} --raft-addr {fqdn}:{RAFT_PORT} \
                 --api-addr {fqdn}:{API_PORT}",
                pods.fqdn(member),
                ordinal + 1
            )
        };
        let expected = [
            format!("cluster status --api {fqdn}:{API_PORT}"),
            add(0),
            add(1),
        ];
        if run.calls != expected || !run.stopped_cleanly {
            problems.push(format!(
                "{origin}: join on {pod}: calls {:?}, expected {expected:?}, clean stop {}, \
                 log {}",
                run.calls, run.stopped_cleanly, run.stderr
            ));
        }
        // The binary accepts those arguments (clap checks them before it prints the help).
        for call in &run.calls {
            let output = Command::new(BINARY)
                .args(call.split_whitespace())
                .arg("--help")
                .output()?;
            if !output.status.success() {
                problems.push(format!(
                    "{origin}: `iggy-replicator {call}` is not accepted: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                ));
            }
        }
    }
    assert_no_problems(&problems);
    Ok(())
}

#[test]
fn helm_prometheus_resources_carry_the_alerts_and_scrape_every_member() -> TestResult {
    let renderings = Rendering::load_all()?;
    let alerts = first_document(&deploy().join("prometheus/alerts.yaml"))?;
    let mut problems = Vec::new();
    let mut checked = 0;
    for rendering in &renderings {
        let origin = rendering.origin();
        if rendering
            .value(&["metrics", "prometheusRule", "enabled"])
            .as_bool()
            == Some(true)
        {
            let rule = rendering.one("PrometheusRule")?;
            let spec = at(rule, &["spec"]);
            let keys: Vec<&str> = spec
                .as_mapping()
                .into_iter()
                .flatten()
                .filter_map(|(k, _)| k.as_str())
                .collect();
            if keys != ["groups"] || at(spec, &["groups"]) != at(&alerts, &["groups"]) {
                problems.push(format!(
                    "{origin}: PrometheusRule spec is not the groups of deploy/prometheus/alerts.yaml"
                ));
            }
            checked += 1;
        }
        if rendering
            .value(&["metrics", "serviceMonitor", "enabled"])
            .as_bool()
            == Some(true)
        {
            let monitor = rendering.one("ServiceMonitor")?;
            let set = rendering.one("StatefulSet")?;
            let headless = str_of(set, &["spec", "serviceName"]);
            let selector = at(monitor, &["spec", "selector", "matchLabels"]);
            let selected: Vec<&str> = rendering
                .of_kind("Service")
                .into_iter()
                .filter(|service| {
                    let labels = at(service, &["metadata", "labels"]);
                    selector.as_mapping().is_some_and(|m| {
                        !m.is_empty() && m.iter().all(|(k, v)| labels.get(k) == Some(v))
                    })
                })
                .filter_map(|service| str_of(service, &["metadata", "name"]))
                .collect();
            // Only the headless Service: it lists every member, ready or not, once.
            if selected != [headless.unwrap_or("?")] {
                problems.push(format!(
                    "{origin}: ServiceMonitor selects {selected:?}, expected only {headless:?}"
                ));
            }
            match seq(at(monitor, &["spec", "endpoints"])) {
                [endpoint] => {
                    if str_of(endpoint, &["port"]) != Some("http")
                        || str_of(endpoint, &["path"]) != Some("/metrics")
                    {
                        problems.push(format!(
                            "{origin}: ServiceMonitor must scrape http /metrics"
                        ));
                    }
                    let https = str_of(endpoint, &["scheme"]) == Some("https");
                    if https != rendering.api_tls() {
                        problems.push(format!("{origin}: ServiceMonitor scheme https={https}"));
                    }
                    if rendering.api_tls() {
                        let ca = at(endpoint, &["tlsConfig", "ca", "secret"]);
                        let client = rendering
                            .of_kind("Service")
                            .into_iter()
                            .find(|s| str_of(s, &["spec", "clusterIP"]) != Some("None"))
                            .and_then(|s| str_of(s, &["metadata", "name"]));
                        let server_name =
                            client.map(|c| format!("{c}.{}.svc", rendering.namespace));
                        if str_of(ca, &["name"]) != rendering.value(&["tls", "secretName"]).as_str()
                            || str_of(ca, &["key"]) != Some("ca.crt")
                            || str_of(endpoint, &["tlsConfig", "serverName"])
                                != server_name.as_deref()
                        {
                            problems.push(format!(
                                "{origin}: ServiceMonitor tlsConfig must trust ca.crt of the TLS \
                                 Secret and expect {server_name:?}"
                            ));
                        }
                    }
                }
                found => problems.push(format!(
                    "{origin}: ServiceMonitor has {} endpoints, expected 1",
                    found.len()
                )),
            }
            checked += 1;
        }
    }
    if checked < 2 {
        problems.push("no rendering has the PrometheusRule and the ServiceMonitor".to_owned());
    }
    assert_no_problems(&problems);
    Ok(())
}

#[test]
fn helm_members_are_kept_apart_by_required_anti_affinity_by_default() -> TestResult {
    let mut problems = Vec::new();
    if str_of(&default_values()?, &["antiAffinity", "mode"]) != Some("required") {
        problems.push("values.yaml: antiAffinity.mode must default to required".to_owned());
    }
    for rendering in Rendering::load_all()? {
        let origin = rendering.origin();
        let set = rendering.one("StatefulSet")?;
        let selector = at(set, &["spec", "selector", "matchLabels"]);
        let pod = at(set, &["spec", "template", "spec"]);
        let anti = at(pod, &["affinity", "podAntiAffinity"]);
        let required = seq(at(
            anti,
            &["requiredDuringSchedulingIgnoredDuringExecution"],
        ));
        let preferred = seq(at(
            anti,
            &["preferredDuringSchedulingIgnoredDuringExecution"],
        ));
        let host_term = |term: &Value| {
            str_of(term, &["topologyKey"]) == Some("kubernetes.io/hostname")
                && at(term, &["labelSelector", "matchLabels"]) == selector
        };
        let mode = rendering.value(&["antiAffinity", "mode"]).as_str();
        let (has_required, has_preferred) = (
            required.iter().any(host_term),
            preferred.iter().any(|p| {
                at(p, &["weight"]).as_u64().is_some() && host_term(at(p, &["podAffinityTerm"]))
            }),
        );
        let expected = match mode {
            Some("required") => (true, false),
            Some("preferred") => (false, true),
            _ => (false, false),
        };
        if (has_required, has_preferred) != expected {
            problems.push(format!(
                "{origin}: antiAffinity.mode {mode:?} gives required={has_required} \
                 preferred={has_preferred} on kubernetes.io/hostname"
            ));
        }
        let zone_spread = seq(at(pod, &["topologySpreadConstraints"]))
            .iter()
            .any(|c| {
                str_of(c, &["topologyKey"]) == Some("topology.kubernetes.io/zone")
                    && at(c, &["labelSelector", "matchLabels"]) == selector
            });
        let wanted = rendering.value(&["zoneSpread", "enabled"]).as_bool() == Some(true);
        if zone_spread != wanted {
            problems.push(format!(
                "{origin}: zone spread {zone_spread}, zoneSpread.enabled {wanted}"
            ));
        }
    }
    let renderings = Rendering::load_all()?;
    if renderings[0].value(&["antiAffinity", "mode"]).as_str() != Some("required") {
        problems
            .push("rendered/default.yaml is not rendered with required anti-affinity".to_owned());
    }
    if !renderings
        .iter()
        .any(|r| r.value(&["antiAffinity", "mode"]).as_str() == Some("preferred"))
    {
        problems.push("no rendering shows preferred anti-affinity".to_owned());
    }
    assert_no_problems(&problems);
    Ok(())
}
