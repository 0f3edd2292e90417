//! Config text for tests, not part of the config API: one builder of a minimal valid file, so
//! that the tests of this crate, of the binary's wiring and of the binary itself start from the
//! same file and set only what they are about.

use std::collections::BTreeMap;
use std::fmt;

/// A minimal valid config file: node 1, the cluster secret, two Iggy clusters `us` and `eu`,
/// and one flow `us-to-eu` between them. Each field holds the value of one key (written as a
/// TOML string) or extra lines of one section; [`fmt::Display`] writes the file.
#[derive(Debug, Clone)]
pub struct MinimalConfig {
    /// `node.data_dir`. Default: `"/tmp/r1"`.
    pub data_dir: String,
    /// `node.raft_addr`. Default: `"127.0.0.1:7101"`.
    pub raft_addr: String,
    /// `node.api_addr`. Default: `"127.0.0.1:7181"`.
    pub api_addr: String,
    /// `cluster.secret`, which may name a variable (`"${SECRET}"`). Default:
    /// `"0123456789abcdef"`.
    pub secret: String,
    /// `cluster.initial_members`: Raft addresses by node id. Default: empty, and then the key is
    /// left out.
    pub initial_members: BTreeMap<u64, String>,
    /// Extra lines of `[cluster]`, e.g. `"member_round_trip = \"80ms\""`. Default: none.
    pub cluster_extra: String,
    /// `clusters.us.url`. Default: `"iggy://iggy:iggy@127.0.0.1:8090"`.
    pub us_url: String,
    /// Extra lines of `[clusters.us]`, e.g. `"connections = 7"`. Default: none.
    pub us_extra: String,
    /// `clusters.eu.url`. Default: `"iggy://iggy:iggy@127.0.0.1:8091"`.
    pub eu_url: String,
    /// Extra lines of `[clusters.eu]`. Default: none.
    pub eu_extra: String,
    /// `flows[0].include`, e.g. `["orders/*"]`. Default: empty, and then the key is left out.
    pub include: Vec<String>,
    /// Extra lines of the flow, e.g. `"max_in_flight_batches = 5"`. Default: none.
    pub flow_extra: String,
}

impl Default for MinimalConfig {
    fn default() -> Self {
        Self {
            data_dir: "/tmp/r1".to_owned(),
            raft_addr: "127.0.0.1:7101".to_owned(),
            api_addr: "127.0.0.1:7181".to_owned(),
            secret: "0123456789abcdef".to_owned(),
            initial_members: BTreeMap::new(),
            cluster_extra: String::new(),
            us_url: "iggy://iggy:iggy@127.0.0.1:8090".to_owned(),
            us_extra: String::new(),
            eu_url: "iggy://iggy:iggy@127.0.0.1:8091".to_owned(),
            eu_extra: String::new(),
            include: Vec::new(),
            flow_extra: String::new(),
        }
    }
}

impl MinimalConfig {
    /// Parses and validates the file, with no environment variables set.
    pub fn parse(&self) -> crate::Result<crate::Config> {
        crate::parse_str(&self.to_string(), "test", |_| None)
    }
}

impl fmt::Display for MinimalConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "[node]")?;
        writeln!(f, "id = 1")?;
        writeln!(f, "data_dir = {:?}", self.data_dir)?;
        writeln!(f, "raft_addr = {:?}", self.raft_addr)?;
        writeln!(f, "api_addr = {:?}", self.api_addr)?;
        writeln!(f, "\n[cluster]")?;
        writeln!(f, "secret = {:?}", self.secret)?;
        if !self.initial_members.is_empty() {
            let members: Vec<String> = self
                .initial_members
                .iter()
                .map(|(id, addr)| format!("{id} = {addr:?}"))
                .collect();
            writeln!(f, "initial_members = {{ {} }}", members.join(", "))?;
        }
        lines(f, &self.cluster_extra)?;
        for (alias, url, extra) in [
            ("us", &self.us_url, &self.us_extra),
            ("eu", &self.eu_url, &self.eu_extra),
        ] {
            writeln!(f, "\n[clusters.{alias}]")?;
            writeln!(f, "url = {url:?}")?;
            lines(f, extra)?;
        }
        writeln!(f, "\n[[flows]]")?;
        writeln!(f, "name = \"us-to-eu\"")?;
        writeln!(f, "source = \"us\"")?;
        writeln!(f, "target = \"eu\"")?;
        if !self.include.is_empty() {
            let patterns: Vec<String> = self.include.iter().map(|p| format!("{p:?}")).collect();
            writeln!(f, "include = [{}]", patterns.join(", "))?;
        }
        lines(f, &self.flow_extra)
    }
}

/// Writes `extra` as lines of the current section (nothing when empty).
fn lines(f: &mut fmt::Formatter<'_>, extra: &str) -> fmt::Result {
    if extra.is_empty() {
        Ok(())
    } else {
        writeln!(f, "{}", extra.trim_end_matches('\n'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_minimal_config_is_valid() {
        let config = MinimalConfig::default().parse().expect("valid config");
        assert_eq!(config.flows.len(), 1);
        assert_eq!(config.clusters.len(), 2);
    }
}
