//! A digest of each flow's configuration, for config agreement between the nodes of a
//! replicator cluster: each node publishes its digests to the control plane, and units of a
//! flow are granted only to the nodes whose digest of it equals the leader's.
//!
//! A flow's digest covers everything that decides what the flow copies and how: its own
//! `[[flows]]` entry, its source and target `[clusters.*]` sections (credentials included: a
//! node with another password reaches the cluster as another user) and the residency
//! policies. Node-local settings (`[node]`, `[cluster]`, `[pipeline]`) are not part of it: they
//! may differ between nodes without changing what is copied.
//!
//! Members of different releases run side by side during a rolling upgrade, so the digest
//! must not change with the release: it is taken over a canonical text of the settings (sorted
//! `key = value` lines of their serialized form) that leaves out every setting at its default.
//! A setting a later release adds is at its default in every config written before it, so it
//! changes no digest; and a default written out explicitly digests like one left out.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::de::DeserializeOwned;
use serde::Serialize;

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
    let mut text = String::new();
    let flow_defaults: FlowConfig = defaults("name = \"\"\nsource = \"\"\ntarget = \"\"");
    section(&mut text, "flow", flow, &flow_defaults);
    let cluster_defaults: IggyClusterConfig = defaults("url = \"\"");
    for (role, alias) in [("source", &flow.source), ("target", &flow.target)] {
        match config.clusters.get(alias) {
            Some(cluster) => {
                section(
                    &mut text,
                    &format!("{role} {alias}"),
                    cluster,
                    &cluster_defaults,
                );
                // In clear: `url` is not serialized, and two passwords are two users.
                let _ = writeln!(text, "{role} {alias}.url = {:?}", cluster.url.expose());
            }
            None => {
                let _ = writeln!(text, "{role} {alias} missing");
            }
        }
    }
    // All of them: which ones bear on the flow depends on topics discovered at run time.
    for policy in &config.policies {
        let no_defaults = BTreeMap::<String, String>::new();
        section(
            &mut text,
            &format!("policy {}", policy.name),
            policy,
            &no_defaults,
        );
    }
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

/// A section with only its required keys set (`required`, TOML): every other setting at its
/// default.
fn defaults<T: DeserializeOwned>(required: &str) -> T {
    toml::from_str(required).expect("a section with only its required keys parses")
}

/// Appends one sorted `name.key = value` line per setting of `value` that differs from
/// `defaults` (an empty map: every setting counts).
fn section<T: Serialize, D: Serialize>(text: &mut String, name: &str, value: &T, defaults: &D) {
    let defaults = table(defaults);
    for (key, value) in table(value) {
        if defaults.get(&key) != Some(&value) {
            let _ = writeln!(text, "{name}.{key} = {value}");
        }
    }
}

/// The serialized settings of a section, sorted by key (whatever order the serializer keeps).
fn table<T: Serialize>(value: &T) -> BTreeMap<String, toml::Value> {
    match toml::Value::try_from(value) {
        Ok(toml::Value::Table(t)) => t.into_iter().collect(),
        _ => BTreeMap::new(),
    }
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
    fn a_setting_written_at_its_default_digests_like_one_left_out() {
        // What a later release's new setting looks like to the digest: at its default.
        let base = digests(&MinimalConfig::default());
        let explicit = MinimalConfig {
            flow_extra: "batch_size = 1000\nidle_poll_interval = \"100ms\"\nprovenance = true"
                .into(),
            eu_extra: "connections = 4\nfencing = \"users\"".into(),
            ..MinimalConfig::default()
        };
        check!(digests(&explicit) == base);
    }

    #[test]
    fn the_digest_is_pinned_across_releases() {
        // Members of two releases compare their digests during a rolling upgrade: a change
        // here makes every member of the new release disagree with the others, and lose its
        // partitions until the last member is upgraded.
        check!(digests(&MinimalConfig::default())["us-to-eu"] == "0b7c98c241ef5ca6");
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
