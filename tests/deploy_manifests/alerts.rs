//! `deploy/prometheus/alerts.yaml`: a Prometheus rule file whose every rule can fire. Each
//! `expr` parses as PromQL and selects only metric families the binary exports (the list comes
//! from `iggy-replicator metric-names`, through the helpers `grafana` uses) or series Prometheus
//! itself writes (`up`); each alert has a `for`, a severity, a summary, a description and a
//! runbook link to an entry of the "Alerts" section of `deploy/README.md`, and every alert
//! entry there belongs to a rule.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use crate::grafana::{exported_families, family_of, metric_names, Family};
use crate::{assert_no_problems, deploy, read, TestResult};

/// Series that Prometheus writes for every target, which rules may use besides the binary's.
const PROMETHEUS_SERIES: &[&str] = &["up"];

/// The severities the rules use (what an Alertmanager routes on).
const SEVERITIES: &[&str] = &["critical", "warning", "info"];

/// The README section whose `### <alert name>` entries are the runbook.
const RUNBOOK_SECTION: &str = "## Alerts";

/// A Prometheus rule file (`rule_files:`), as strict as Prometheus: unknown keys are errors.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    groups: Vec<Group>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Group {
    name: String,
    #[serde(default)]
    interval: Option<String>,
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    #[serde(default)]
    alert: Option<String>,
    #[serde(default)]
    record: Option<String>,
    expr: String,
    #[serde(default, rename = "for")]
    for_: Option<String>,
    #[serde(default)]
    keep_firing_for: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of every heading in a Markdown text (outside fenced code blocks).
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut found = BTreeSet::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            found.insert(anchor(line.trim_start_matches('#')));
        }
    }
    found
}

/// The `### ` headings of the runbook section (up to the next `## `).
fn runbook_entries(markdown: &str) -> Vec<String> {
    markdown
        .lines()
        .skip_while(|line| line.trim_end() != RUNBOOK_SECTION)
        .skip(1)
        .take_while(|line| !line.starts_with("## "))
        .filter_map(|line| line.strip_prefix("### "))
        .map(|heading| heading.trim().to_owned())
        .collect()
}

/// Every problem of a rule file's text, checked against the exported families and the README.
fn problems(rules: &str, families: &[Family], readme: &str) -> Vec<String> {
    let file: RuleFile = match serde_norway::from_str(rules) {
        Ok(file) => file,
        Err(error) => return vec![format!("not a Prometheus rule file: {error}")],
    };
    let mut problems = Vec::new();
    let anchors = anchors(readme);
    let mut groups = BTreeSet::new();
    let mut alerts = BTreeSet::new();
    if file.groups.is_empty() {
        problems.push("no rule group".to_owned());
    }
    for group in &file.groups {
        if group.name.is_empty() || !groups.insert(group.name.as_str()) {
            problems.push(format!("group {:?}: empty or duplicate name", group.name));
        }
        if let Some(duration) = &group.interval {
            if let Err(error) = promql_parser::util::parse_duration(duration) {
                problems.push(format!(
                    "group {}: interval {duration:?}: {error}",
                    group.name
                ));
            }
        }
        if group.rules.is_empty() {
            problems.push(format!("group {}: no rule", group.name));
        }
        for rule in &group.rules {
            problems.extend(rule_problems(rule, families, &anchors, &mut alerts));
        }
    }
    for entry in runbook_entries(readme) {
        if !alerts.contains(entry.as_str()) {
            problems.push(format!(
                "deploy/README.md: runbook entry {entry:?} belongs to no alert"
            ));
        }
    }
    problems
}

/// The problems of one rule; `alerts` collects the alert names seen so far.
fn rule_problems<'a>(
    rule: &'a Rule,
    families: &[Family],
    anchors: &BTreeSet<String>,
    alerts: &mut BTreeSet<&'a str>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let name = match (&rule.alert, &rule.record) {
        (Some(alert), None) => alert.as_str(),
        (None, Some(record)) => {
            // A recording rule only needs a valid expression over exported metrics.
            problems.extend(expr_problems(record, &rule.expr, families));
            return problems;
        }
        _ => {
            return vec![format!(
                "rule with expr {:?}: needs exactly one of alert and record",
                rule.expr
            )]
        }
    };
    if !alerts.insert(name) {
        problems.push(format!("{name}: duplicate alert name"));
    }
    if !name.starts_with("IggyReplicator") || name.contains(|c: char| !c.is_ascii_alphanumeric()) {
        problems.push(format!("{name}: alert names are IggyReplicatorCamelCase"));
    }
    problems.extend(expr_problems(name, &rule.expr, families));
    match rule.for_.as_deref() {
        None => problems.push(format!("{name}: no `for` (a single bad scrape would page)")),
        Some(duration) => {
            if let Err(error) = promql_parser::util::parse_duration(duration) {
                problems.push(format!("{name}: for {duration:?}: {error}"));
            }
        }
    }
    if let Some(duration) = &rule.keep_firing_for {
        if let Err(error) = promql_parser::util::parse_duration(duration) {
            problems.push(format!("{name}: keep_firing_for {duration:?}: {error}"));
        }
    }
    match rule.labels.get("severity") {
        Some(severity) if SEVERITIES.contains(&severity.as_str()) => {}
        other => problems.push(format!(
            "{name}: labels.severity is {other:?}, not one of {SEVERITIES:?}"
        )),
    }
    for key in ["summary", "description"] {
        if rule
            .annotations
            .get(key)
            .is_none_or(|text| text.trim().is_empty())
        {
            problems.push(format!("{name}: no annotations.{key}"));
        }
    }
    match rule.annotations.get("runbook_url") {
        None => problems.push(format!("{name}: no annotations.runbook_url")),
        Some(url) => match url.split_once("deploy/README.md#") {
            Some((_, fragment)) if anchors.contains(fragment) => {
                if fragment != anchor(name) {
                    problems.push(format!(
                        "{name}: runbook_url points at #{fragment}, not at the alert's own entry #{}",
                        anchor(name)
                    ));
                }
            }
            Some((_, fragment)) => problems.push(format!(
                "{name}: runbook_url {url:?}: deploy/README.md has no heading #{fragment}"
            )),
            None => problems.push(format!(
                "{name}: runbook_url {url:?} does not point into deploy/README.md"
            )),
        },
    }
    problems
}

/// The problems of one expression: PromQL that parses and selects only known series.
fn expr_problems(rule: &str, expr: &str, families: &[Family]) -> Vec<String> {
    let names = match metric_names(expr) {
        Ok(names) => names,
        Err(error) => return vec![format!("{rule}: {error}")],
    };
    let mut problems = Vec::new();
    if names.is_empty() {
        problems.push(format!("{rule}: {expr:?} selects no series"));
    }
    for name in names {
        match family_of(families, &name) {
            Ok(Some(_)) => {}
            Ok(None) if PROMETHEUS_SERIES.contains(&name.as_str()) => {}
            Ok(None) => problems.push(format!(
                "{rule}: {name} is not exported by iggy-replicator (see `iggy-replicator metric-names`)"
            )),
            Err(error) => problems.push(format!("{rule}: {error}")),
        }
    }
    problems
}

fn alerts_yaml() -> Result<String, String> {
    read(&deploy().join("prometheus/alerts.yaml"))
}

fn readme() -> Result<String, String> {
    read(&deploy().join("README.md"))
}

#[test]
fn alert_rules_use_exported_metrics_and_have_runbook_entries() -> TestResult {
    let families = exported_families()?;
    let rules = alerts_yaml()?;
    let readme = readme()?;
    let file: RuleFile = serde_norway::from_str(&rules)?;
    let alerts: usize = file.groups.iter().map(|g| g.rules.len()).sum();
    assert!(
        alerts >= 10,
        "expected the documented alerts, found {alerts}"
    );
    assert!(
        !runbook_entries(&readme).is_empty(),
        "deploy/README.md has no `### ` entry under {RUNBOOK_SECTION:?}"
    );
    assert_no_problems(&problems(&rules, &families, &readme));
    Ok(())
}

#[test]
fn alert_check_rejects_unknown_metrics_and_missing_fields() -> TestResult {
    let families = exported_families()?;
    let readme = readme()?;
    let rules = alerts_yaml()?;
    assert!(rules.contains("iggy_replicator_ready == 0"));
    let typo = rules.replace(
        "iggy_replicator_ready == 0",
        "iggy_replicator_readyness == 0",
    );
    let found = problems(&typo, &families, &readme);
    assert!(
        found
            .iter()
            .any(|p| p.contains("iggy_replicator_readyness is not exported")),
        "{found:?}"
    );
    // A counter is selected by its `_total` series, never by the bare family name.
    let bare = rules.replace(
        "iggy_replicator_gap_events_total",
        "iggy_replicator_gap_events",
    );
    assert!(!problems(&bare, &families, &readme).is_empty());
    let broken = rules.replace("iggy_replicator_ready == 0", "iggy_replicator_ready ==");
    assert!(problems(&broken, &families, &readme)
        .iter()
        .any(|p| p.contains("is not PromQL")));
    let no_for = rules.replace("        for: 5m\n", "");
    assert!(problems(&no_for, &families, &readme)
        .iter()
        .any(|p| p.contains("no `for`")));
    let no_entry = rules.replace("#iggyreplicatornodedown", "#iggyreplicatornodedownn");
    assert!(problems(&no_entry, &families, &readme)
        .iter()
        .any(|p| p.contains("has no heading")));
    let orphan = readme.replace("### IggyReplicatorNodeDown", "### IggyReplicatorNodeGone");
    assert!(problems(&rules, &families, &orphan)
        .iter()
        .any(|p| p.contains("\"IggyReplicatorNodeGone\" belongs to no alert")));
    let typo_key = rules.replace("annotations:", "anotations:");
    assert!(problems(&typo_key, &families, &readme)
        .iter()
        .any(|p| p.contains("not a Prometheus rule file")));
    Ok(())
}

#[test]
fn anchors_are_the_ones_github_renders() {
    assert_eq!(anchor(" IggyReplicatorNodeDown"), "iggyreplicatornodedown");
    assert_eq!(anchor("Helm chart"), "helm-chart");
    assert_eq!(anchor("`deploy/` (files)"), "deploy-files");
    let text = "# a\n```sh\n# not a heading\n```\n## Alerts\n### IggyReplicatorX\ntext\n## Next\n### Other\n";
    assert_eq!(
        anchors(text),
        BTreeSet::from([
            "a".into(),
            "alerts".into(),
            "iggyreplicatorx".into(),
            "next".into(),
            "other".into()
        ])
    );
    assert_eq!(runbook_entries(text), ["IggyReplicatorX"]);
}
