//! `iggy-replicator verify`: compares every selected topic of every flow (or one flow)
//! upstream against downstream and prints one row per partition.

use std::path::Path;
use std::time::Duration;

use replicator_pipeline::verify::{verify, PartitionReport, VerifyParams, VerifyReport};
use replicator_pipeline::{check_generations, PROBE_TIMEOUT};

use crate::exit::{generation_failure, Failure};
use crate::wiring::pipeline_params;

/// Verifies the flows of the config at `config_path`; `Ok` only for exact copies.
pub(crate) async fn run(
    config_path: &Path,
    flow: Option<&str>,
    wait: Duration,
) -> Result<(), Failure> {
    let config = replicator_config::load_file(config_path)?;
    let params = pipeline_params(&config);
    let flows: Vec<_> = params
        .flows
        .iter()
        .filter(|f| flow.is_none_or(|name| f.name == name))
        .collect();
    if flows.is_empty() {
        return Err(Failure::config(format!(
            "no flow named {:?} in {}",
            flow.unwrap_or_default(),
            config_path.display()
        )));
    }
    let mismatches = check_generations(&params.clusters, PROBE_TIMEOUT).await;
    if let Some(failure) = generation_failure(&mismatches) {
        return Err(failure);
    }
    let mut exact = true;
    for flow in flows {
        let connection = |alias: &str| {
            params
                .clusters
                .get(alias)
                .map(|c| c.connection_string.clone())
                .unwrap_or_default()
        };
        let mut verify_params = VerifyParams::new(
            flow.clone(),
            connection(&flow.source),
            connection(&flow.target),
        );
        verify_params.wait = wait;
        let version = |alias: &str| {
            params
                .clusters
                .get(alias)
                .map(|c| c.iggy_version)
                .unwrap_or_default()
        };
        verify_params.source_version = version(&flow.source);
        verify_params.target_version = version(&flow.target);
        verify_params.heartbeat_topics = params.heartbeat_topics();
        verify_params.policies = params.policies.clone();
        verify_params.target_zones = params
            .clusters
            .get(&flow.target)
            .map(|c| c.zones.clone())
            .unwrap_or_default();
        let report = verify(&verify_params).await.map_err(|e| {
            Failure::runtime(
                format!("flow {}: verification failed: {e}", flow.name),
                "check that both clusters are reachable with the configured credentials",
            )
        })?;
        print_report(&flow.name, &report);
        exact &= report.is_exact();
    }
    if exact {
        println!("result: exact copy");
        Ok(())
    } else {
        Err(Failure::not_exact(
            "the downstream copy is not exact (see the rows above)",
        ))
    }
}

/// Prints the table of one flow.
pub(crate) fn print_report(flow: &str, report: &VerifyReport) {
    println!("flow {flow}");
    println!(
        "  {:<40} {:>12} {:>12} {:>9} {:>10} {:>12} {:>10}",
        "partition", "upstream", "downstream", "missing", "duplicated", "out_of_order", "corrupted"
    );
    for row in &report.partitions {
        println!("  {}", format_row(row));
    }
    println!(
        "  total: upstream {} downstream {} → {}",
        report.upstream_total(),
        report.downstream_total(),
        if report.is_exact() {
            "exact"
        } else {
            "NOT EXACT"
        }
    );
}

fn format_row(row: &PartitionReport) -> String {
    format!(
        "{:<40} {:>12} {:>12} {:>9} {:>10} {:>12} {:>10}",
        format!("{}/{}/{}", row.stream, row.topic, row.partition),
        row.upstream,
        row.downstream,
        row.missing,
        row.duplicated,
        row.out_of_order,
        row.corrupted
    )
}
