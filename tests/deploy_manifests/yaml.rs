//! Reading the YAML manifests (compose file, kustomize base) with `serde_norway`, path accessors
//! that turn a missing key into `Null` so checks can report it, and the shape every YAML file
//! under `deploy/` must have.

use std::path::Path;

use serde::Deserialize;
use serde_norway::Value;

use crate::{assert_no_problems, deploy, files_under, read, relative, TestResult};

/// The non-empty documents of a YAML file, merge keys (`<<`) applied.
pub(crate) fn yaml_documents(path: &Path) -> Result<Vec<Value>, String> {
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

/// The first document of a YAML file that must have one.
pub(crate) fn first_document(path: &Path) -> Result<Value, String> {
    yaml_documents(path)?
        .into_iter()
        .next()
        .ok_or_else(|| format!("{}: no YAML document", relative(path)))
}

/// The value at `path`, or `Null` when any key on the way is missing.
pub(crate) fn at<'a>(value: &'a Value, path: &[&str]) -> &'a Value {
    static NULL: Value = Value::Null;
    path.iter()
        .try_fold(value, |value, key| value.get(*key))
        .unwrap_or(&NULL)
}

pub(crate) fn str_of<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    at(value, path).as_str()
}

/// The items of a sequence; none when `value` is not one.
pub(crate) fn seq(value: &Value) -> &[Value] {
    value.as_sequence().map(Vec::as_slice).unwrap_or(&[])
}

/// The string items of a sequence (a command, a healthcheck test, volume specs).
pub(crate) fn strings(value: &Value) -> Vec<&str> {
    seq(value).iter().filter_map(Value::as_str).collect()
}

#[test]
fn every_yaml_file_in_deploy_parses_with_the_expected_shape() -> TestResult {
    let files = files_under(&deploy(), &[".yaml", ".yml"]);
    assert!(
        files.len() >= 6,
        "expected the compose file and the kustomize base, found {files:?}"
    );
    let mut problems = Vec::new();
    for path in &files {
        let origin = relative(path);
        if origin.starts_with("deploy/helm/") {
            continue; // Helm templates are not YAML until rendered; checked in `helm`
        }
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
                continue; // a compose file, checked in `compose`
            }
            if document.get("groups").is_some() {
                continue; // a Prometheus rule file, checked in `alerts`
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
    assert_no_problems(&problems);
    Ok(())
}
