//! `deploy/grafana/`: the dashboard queries exactly the metric families the binary exports. The
//! list comes from the binary itself (`iggy-replicator metric-names`, rendered by the registry
//! that serves `/metrics`), and the queries are parsed as PromQL (`promql-parser`), so neither
//! side is a hand-kept copy.

use std::collections::BTreeSet;
use std::process::Command;

use promql_parser::label::{MatchOp, METRIC_NAME};
use promql_parser::parser::{Expr, VectorSelector};
use promql_parser::util::{walk_expr, ExprVisitor};
use serde_json::Value;

use crate::{assert_no_problems, deploy, read, TestResult, BINARY};

/// One metric family the binary exports.
#[derive(Debug)]
pub(crate) struct Family {
    /// The OpenMetrics family name, e.g. `iggy_replicator_messages_copied`.
    pub(crate) name: String,
    /// `counter`, `gauge` or `histogram`.
    kind: String,
}

impl Family {
    /// The series names a query can select for this family.
    fn series(&self) -> Result<Vec<String>, String> {
        let suffixes: &[&str] = match self.kind.as_str() {
            "counter" => &["_total"],
            "gauge" => &[""],
            "histogram" => &["_bucket", "_sum", "_count"],
            other => {
                return Err(format!(
                    "family {} has type {other}: tell grafana.rs which series it has",
                    self.name
                ))
            }
        };
        Ok(suffixes
            .iter()
            .map(|suffix| format!("{}{suffix}", self.name))
            .collect())
    }
}

/// The families `iggy-replicator metric-names` prints, one `<family> <type>` a line.
pub(crate) fn exported_families() -> TestResult<Vec<Family>> {
    let output = Command::new(BINARY).arg("metric-names").output()?;
    let stdout = String::from_utf8(output.stdout)?;
    if !output.status.success() {
        return Err(format!(
            "`iggy-replicator metric-names` failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    let families: Vec<Family> = stdout
        .lines()
        .map(|line| match line.split_once(' ') {
            Some((name, kind)) => Ok(Family {
                name: name.to_owned(),
                kind: kind.to_owned(),
            }),
            None => Err(format!(
                "`iggy-replicator metric-names` printed {line:?}, not `<family> <type>`"
            )),
        })
        .collect::<Result<_, _>>()?;
    if families.is_empty() {
        return Err("`iggy-replicator metric-names` printed no family".into());
    }
    Ok(families)
}

/// The exported family a series name belongs to, if any.
pub(crate) fn family_of<'a>(
    families: &'a [Family],
    series: &str,
) -> Result<Option<&'a str>, String> {
    for family in families {
        if family.series()?.iter().any(|s| s == series) {
            return Ok(Some(&family.name));
        }
    }
    Ok(None)
}

/// Collects the metric name of every selector in an expression (`None` for a selector that
/// names no single metric, e.g. `{__name__=~"…"}`).
struct Selectors(Vec<Option<String>>);

impl ExprVisitor for Selectors {
    type Error = std::convert::Infallible;

    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, Self::Error> {
        let selector: Option<&VectorSelector> = match expr {
            Expr::VectorSelector(selector) => Some(selector),
            Expr::MatrixSelector(matrix) => Some(&matrix.vs),
            _ => None,
        };
        if let Some(selector) = selector {
            let by_matcher = selector
                .matchers
                .matchers
                .iter()
                .find(|m| m.name == METRIC_NAME && matches!(m.op, MatchOp::Equal))
                .map(|m| m.value.clone());
            self.0.push(selector.name.clone().or(by_matcher));
        }
        Ok(true)
    }
}

/// The metric names a dashboard query selects. Grafana's interval variables are replaced by a
/// duration first; any other variable must be inside a label value, or the query fails to parse.
pub(crate) fn metric_names(expression: &str) -> Result<Vec<String>, String> {
    let promql = ["$__rate_interval", "$__interval", "$__range"]
        .iter()
        .fold(expression.to_owned(), |text, variable| {
            text.replace(variable, "5m")
        });
    let expr = promql_parser::parser::parse(&promql)
        .map_err(|e| format!("{expression:?} is not PromQL: {e}"))?;
    let mut selectors = Selectors(Vec::new());
    let Ok(_) = walk_expr(&mut selectors, &expr);
    selectors
        .0
        .into_iter()
        .map(|name| name.ok_or_else(|| format!("{expression:?} selects no single metric")))
        .collect()
}

/// The PromQL inside a Grafana Prometheus variable query: the series selector of
/// `label_values(selector, label)`, the query of `query_result(query)`; `None` for the forms
/// that select no series (`label_values(label)`, `label_names()`, `metrics(regex)`).
fn variable_promql(query: &str) -> Result<Option<&str>, String> {
    let call = |name: &str| {
        query
            .trim()
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('('))
            .and_then(|rest| rest.strip_suffix(')'))
    };
    if let Some(args) = call("label_values") {
        return Ok(args
            .rsplit_once(',')
            .map(|(selector, _label)| selector.trim()));
    }
    if let Some(promql) = call("query_result") {
        return Ok(Some(promql));
    }
    if call("label_names").is_some() || call("metrics").is_some() {
        return Ok(None);
    }
    Err(format!("unsupported variable query {query:?}"))
}

/// Every `expr` string anywhere in the dashboard (panels, rows, annotations).
fn expressions(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                match (key.as_str(), item) {
                    ("expr", Value::String(text)) => out.push(text.clone()),
                    _ => expressions(item, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| expressions(item, out)),
        _ => {}
    }
}

/// The queries of the dashboard's query variables (`query`, as a string or `{query}`, and
/// `definition`).
fn variable_queries(dashboard: &Value) -> Vec<String> {
    let variables = dashboard["templating"]["list"].as_array();
    let mut queries = Vec::new();
    for variable in variables.into_iter().flatten() {
        if variable["type"] != "query" {
            continue;
        }
        let query = &variable["query"];
        for text in [&query["query"], query, &variable["definition"]] {
            queries.extend(text.as_str().map(str::to_owned));
        }
    }
    queries
}

#[test]
fn grafana_dashboard_queries_exactly_the_exported_metrics() -> TestResult {
    let families = exported_families()?;
    let path = deploy().join("grafana/iggy-replicator-dashboard.json");
    let dashboard: Value = serde_json::from_str(&read(&path)?)?;
    let mut problems = Vec::new();
    let mut promql = Vec::new();
    expressions(&dashboard, &mut promql);
    if promql.is_empty() {
        problems.push("the dashboard has no `expr` query".to_owned());
    }
    for query in variable_queries(&dashboard) {
        match variable_promql(&query) {
            Ok(selector) => promql.extend(selector.map(str::to_owned)),
            Err(error) => problems.push(error),
        }
    }
    let mut used = BTreeSet::new();
    for expression in &promql {
        let names = match metric_names(expression) {
            Ok(names) => names,
            Err(error) => {
                problems.push(error);
                continue;
            }
        };
        for name in names {
            match family_of(&families, &name)? {
                Some(family) => {
                    used.insert(family);
                }
                None => problems.push(format!("unknown metric {name} in {expression:?}")),
            }
        }
    }
    for family in &families {
        if !used.contains(family.name.as_str()) {
            problems.push(format!("no panel shows {}", family.name));
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
    assert_no_problems(&problems);
    Ok(())
}

#[test]
fn metric_name_check_rejects_unknown_and_accepts_histogram_series() -> TestResult {
    let families = exported_families()?;
    let names = metric_names(
        "rate(iggy_replicator_messages_copied_total[$__rate_interval]) / my_iggy_replicator_x + iggy_replicator_typo",
    )?;
    assert_eq!(
        names,
        [
            "iggy_replicator_messages_copied_total",
            "my_iggy_replicator_x",
            "iggy_replicator_typo"
        ]
    );
    assert_eq!(
        family_of(&families, "iggy_replicator_messages_copied_total")?,
        Some("iggy_replicator_messages_copied")
    );
    assert_eq!(family_of(&families, "my_iggy_replicator_x")?, None);
    assert_eq!(family_of(&families, "iggy_replicator_typo")?, None);
    assert_eq!(
        family_of(&families, "iggy_replicator_send_latency_seconds_bucket")?,
        Some("iggy_replicator_send_latency_seconds")
    );
    assert_eq!(
        family_of(&families, "iggy_replicator_units_owned_bucket")?,
        None
    );
    // A counter is queried by its `_total` series, never by the bare family name.
    assert_eq!(
        family_of(&families, "iggy_replicator_messages_copied")?,
        None
    );
    assert_eq!(
        metric_names(r#"{__name__="iggy_replicator_raft_term", instance=~"$instance"}"#)?,
        ["iggy_replicator_raft_term"]
    );
    assert!(metric_names(r#"{__name__=~"iggy_replicator_.*"}"#).is_err());
    assert!(metric_names("sum(rate(iggy_replicator_errors_total[$flow]))").is_err());
    Ok(())
}

#[test]
fn variable_queries_yield_their_series_selector() {
    assert_eq!(
        variable_promql("label_values(iggy_replicator_raft_term{a=\"b\",c=\"d\"}, instance)"),
        Ok(Some("iggy_replicator_raft_term{a=\"b\",c=\"d\"}"))
    );
    assert_eq!(variable_promql("label_values(instance)"), Ok(None));
    assert_eq!(variable_promql("query_result(up)"), Ok(Some("up")));
    assert!(variable_promql("prometheus").is_err());
}
