//! A digest of each flow's configuration, for config agreement between the nodes of a
//! replicator cluster: each node publishes its digests to the control plane, and units of a
//! flow are granted only to the nodes whose digest of it equals the leader's.
//!
//! A flow's digest covers everything that decides what the flow copies and how: its own
//! `[[flows]]` entry, its source and target `[clusters.*]` sections (credentials included: a
//! node with another password reaches the cluster as another user) and the residency
//! policies. Node-local settings (`[node]`, `[cluster]`, `[pipeline]`) are not part of it: they
//! may differ between nodes without changing what is copied.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::{Config, FlowConfig, IggyClusterConfig};

/// Hex characters kept of the SHA-256 (64 bits: collisions between two configs an operator
/// wrote are out of reach, and status lines stay short).
const DIGEST_HEX_CHARS: usize = 16;

/// The digest of every flow of `config`, by flow name.
#[must_use]
pub fn flow_digests(config: &Config) -> BTreeMap<String, String> {
    config
        .flows
        .iter()
        .map(|flow| (flow.name.clone(), flow_digest(config, flow)))
        .collect()
}

fn flow_digest(config: &Config, flow: &FlowConfig) -> String {
    // `Debug` writes every field (secrets redacted), so a field added later is covered
    // without touching this; the credentials are added in clear, since `Debug` hides them.
    let mut text = format!("{flow:?}\n");
    for alias in [&flow.source, &flow.target] {
        cluster_text(&mut text, alias, config.clusters.get(alias));
    }
    // All of them: which ones bear on the flow depends on topics discovered at run time.
    let _ = writeln!(text, "{:?}", config.policies);
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest
        .as_ref()
        .iter()
        .fold(String::new(), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        })
        .chars()
        .take(DIGEST_HEX_CHARS)
        .collect()
}

fn cluster_text(text: &mut String, alias: &str, cluster: Option<&IggyClusterConfig>) {
    let settings = cluster.map(IggyClusterConfig::settings_text);
    let _ = writeln!(text, "{alias}: {settings:?}");
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;
    use crate::testing::MinimalConfig;

    fn digests(config: &MinimalConfig) -> BTreeMap<String, String> {
        flow_digests(&config.parse().expect("valid"))
    }

    #[test]
    fn same_flows_same_digest_whatever_the_node() {
        let base = MinimalConfig::default();
        let other_node = MinimalConfig {
            data_dir: "/tmp/other".into(),
            api_addr: "127.0.0.1:9999".into(),
            ..MinimalConfig::default()
        };
        check!(digests(&base) == digests(&other_node));
        check!(digests(&base)["us-to-eu"].len() == DIGEST_HEX_CHARS);
    }

    #[test]
    fn the_flow_its_clusters_and_their_credentials_count() {
        let base = digests(&MinimalConfig::default());
        let changes = [
            MinimalConfig {
                include: vec!["orders/*".into()],
                ..MinimalConfig::default()
            },
            MinimalConfig {
                flow_extra: "batch_size = 7".into(),
                ..MinimalConfig::default()
            },
            MinimalConfig {
                eu_url: "iggy://iggy:other@127.0.0.1:8091".into(),
                ..MinimalConfig::default()
            },
            MinimalConfig {
                us_extra: "connections = 7".into(),
                ..MinimalConfig::default()
            },
            MinimalConfig {
                eu_extra: "zones = [\"eu\"]".into(),
                ..MinimalConfig::default()
            },
            MinimalConfig {
                eu_extra: "zones = [\"eu\"]".into(),
                flow_extra: "\n[[policies]]\nname = \"pii\"\nselect = [\"pii-*/*\"]\nallowed_zones = [\"eu\"]".into(),
                ..MinimalConfig::default()
            },
        ];
        let mut seen = vec![base];
        for changed in changes {
            let d = digests(&changed);
            check!(!seen.contains(&d), "{changed}");
            seen.push(d);
        }
    }
}
