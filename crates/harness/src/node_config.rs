//! The config file of a node, as an operator writes it: `[node]` and `[cluster]`, then the
//! replication sections (`[clusters.*]`, `[[flows]]`, `[pipeline]`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use crate::NodeId;

/// The `[node]` and `[cluster]` sections of one node's config.
#[derive(Debug, Clone)]
pub struct NodeConfig<'a> {
    /// `node.id`, e.g. 1.
    pub id: NodeId,
    /// `node.data_dir`, the node's own directory.
    pub data_dir: &'a Path,
    /// `node.raft_addr`.
    pub raft_addr: SocketAddr,
    /// `node.api_addr`: what the admin API binds.
    pub api_bind: SocketAddr,
    /// `node.advertised_api_addr`, where it differs from `api_bind`.
    pub advertised_api_addr: Option<SocketAddr>,
    /// `cluster.secret`, e.g. a random `test-secret-…`.
    pub secret: &'a str,
    /// `cluster.admin_token`, the bearer token of mutating admin calls (none: refused).
    pub admin_token: Option<&'a str>,
    /// `[cluster.tls]` and `[node.api_tls]` (the same certificate), when the cluster runs TLS.
    pub tls: Option<&'a crate::NodeTls>,
    /// `cluster.initial_members`: the bootstrap members' Raft addresses by node id.
    pub initial_members: &'a BTreeMap<NodeId, SocketAddr>,
    /// More `[cluster]` keys, one per line (may be empty).
    pub cluster_extra: &'a str,
}

impl NodeConfig<'_> {
    /// The whole config file: these sections followed by `replication`.
    #[must_use]
    pub fn toml(&self, replication: &str) -> String {
        let advertised = self
            .advertised_api_addr
            .map(|addr| format!("advertised_api_addr = \"{addr}\"\n"))
            .unwrap_or_default();
        let admin_token = self
            .admin_token
            .map(|token| format!("admin_token = \"{token}\"\n"))
            .unwrap_or_default();
        let (api_tls, tls) = match self.tls {
            Some(t) => (
                format!(
                    "api_tls = {{ cert_file = {cert:?}, key_file = {key:?} }}\n",
                    cert = t.cert_file.display().to_string(),
                    key = t.key_file.display().to_string(),
                ),
                format!(
                    "tls = {{ cert_file = {cert:?}, key_file = {key:?}, ca_file = {ca:?} }}\n",
                    cert = t.cert_file.display().to_string(),
                    key = t.key_file.display().to_string(),
                    ca = t.ca_file.display().to_string(),
                ),
            ),
            None => (String::new(), String::new()),
        };
        let members = self
            .initial_members
            .iter()
            .map(|(id, addr)| format!("{id} = \"{addr}\""))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            r#"[node]
id = {id}
data_dir = {data_dir:?}
raft_addr = "{raft_addr}"
api_addr = "{api_bind}"
{advertised}{api_tls}
[cluster]
secret = "{secret}"
{admin_token}{tls}initial_members = {{ {members} }}
{cluster_extra}

{replication}"#,
            id = self.id,
            data_dir = self.data_dir.display().to_string(),
            raft_addr = self.raft_addr,
            api_bind = self.api_bind,
            secret = self.secret,
            cluster_extra = self.cluster_extra,
        )
    }
}

/// The replication sections of one flow from one server to another with identity naming,
/// polling caught-up partitions every 2 ms and discovering topics every second (so that tests
/// and the demo react fast); product defaults for everything else. [`Replication`] writes any
/// number of clusters and flows the same way.
#[derive(Debug, Clone)]
pub struct FlowConfig<'a> {
    /// `[[flows]] name`, e.g. `"up-to-down"`.
    pub name: &'a str,
    /// Alias of the source cluster, e.g. `"up"`.
    pub source_alias: &'a str,
    /// Connection string of the source cluster.
    pub source_url: &'a str,
    /// Alias of the target cluster, e.g. `"down"`.
    pub target_alias: &'a str,
    /// Connection string of the target cluster.
    pub target_url: &'a str,
    /// The one `include` pattern, e.g. `"ha/*"`.
    pub include: &'a str,
    /// The target cluster's `fencing` (`"users"` or `"off"`); `None` keeps the product default.
    pub target_fencing: Option<&'a str>,
    /// The target cluster's `iggy_version` (`"0.8"` or `"0.9"`); `None` keeps the default.
    pub target_iggy_version: Option<&'a str>,
    /// The target cluster's `writer_user_prefix`; `None` keeps the default.
    pub target_writer_user_prefix: Option<&'a str>,
    /// More lines of the `[[flows]]` table, e.g. `consumer_groups = ["billing"]`; may be empty.
    pub flow_extra: &'a str,
}

impl FlowConfig<'_> {
    /// `[clusters.*]`, `[[flows]]` and `[pipeline]` TOML.
    #[must_use]
    pub fn toml(&self) -> String {
        let mut target = ClusterEntry::new(self.target_alias, self.target_url);
        target.fencing = self.target_fencing.map(str::to_owned);
        target.iggy_version = self.target_iggy_version.map(str::to_owned);
        target.writer_user_prefix = self.target_writer_user_prefix.map(str::to_owned);
        Replication::default()
            .cluster(ClusterEntry::new(self.source_alias, self.source_url))
            .cluster(target)
            .flow(
                FlowEntry::new(
                    self.name,
                    self.source_alias,
                    self.target_alias,
                    self.include,
                )
                .extra(self.flow_extra),
            )
            .toml()
    }
}

/// One `[clusters.<alias>]` table of [`Replication`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterEntry {
    /// The alias, e.g. `"eu"`.
    pub alias: String,
    /// Its connection string.
    pub url: String,
    /// `fencing` (`"users"` or `"off"`); `None` keeps the product default (`"users"`).
    pub fencing: Option<String>,
    /// `iggy_version` (`"0.8"` or `"0.9"`); `None` keeps the default.
    pub iggy_version: Option<String>,
    /// `writer_user_prefix`; `None` keeps the product default.
    pub writer_user_prefix: Option<String>,
}

impl ClusterEntry {
    /// The cluster `alias` at `url`, product defaults otherwise.
    pub fn new(alias: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            alias: alias.into(),
            url: url.into(),
            fencing: None,
            iggy_version: None,
            writer_user_prefix: None,
        }
    }

    /// With `fencing` set (`"users"`, `"off"`), or the product default for `None`.
    #[must_use]
    pub fn fencing(mut self, fencing: Option<&str>) -> Self {
        self.fencing = fencing.map(str::to_owned);
        self
    }
}

/// One `[[flows]]` table of [`Replication`], polling caught-up partitions every 2 ms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowEntry {
    /// `name`, e.g. `"up-to-down"`.
    pub name: String,
    /// Alias of the source cluster.
    pub source: String,
    /// Alias of the target cluster.
    pub target: String,
    /// The one `include` pattern, e.g. `"ha/*"`.
    pub include: String,
    /// More lines of the table, e.g. `consumer_groups = ["billing"]`; may be empty.
    pub extra: String,
}

impl FlowEntry {
    /// The flow `name` from `source` to `target` copying what `include` selects.
    pub fn new(
        name: impl Into<String>,
        source: impl Into<String>,
        target: impl Into<String>,
        include: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            source: source.into(),
            target: target.into(),
            include: include.into(),
            extra: String::new(),
        }
    }

    /// With `extra` lines in the table.
    #[must_use]
    pub fn extra(mut self, extra: impl Into<String>) -> Self {
        self.extra = extra.into();
        self
    }
}

/// The replication sections of a node's config, as [`FlowConfig`] writes them, with any
/// number of clusters and flows (a fan-out to several targets, flows both ways): discovery
/// every second, product defaults for everything not set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replication {
    /// `[clusters.*]`, in this order.
    pub clusters: Vec<ClusterEntry>,
    /// `[[flows]]`, in this order.
    pub flows: Vec<FlowEntry>,
}

impl Replication {
    /// With one more cluster.
    #[must_use]
    pub fn cluster(mut self, cluster: ClusterEntry) -> Self {
        self.clusters.push(cluster);
        self
    }

    /// With one more flow.
    #[must_use]
    pub fn flow(mut self, flow: FlowEntry) -> Self {
        self.flows.push(flow);
        self
    }

    /// `[clusters.*]`, `[[flows]]` and `[pipeline]` TOML.
    #[must_use]
    pub fn toml(&self) -> String {
        let line = |key: &str, value: &Option<String>| {
            value
                .as_ref()
                .map(|v| format!("{key} = \"{v}\"\n"))
                .unwrap_or_default()
        };
        let mut out = String::new();
        for c in &self.clusters {
            out.push_str(&format!(
                "[clusters.{alias}]\nurl = \"{url}\"\n{fencing}{iggy_version}{writers}\n",
                alias = c.alias,
                url = c.url,
                fencing = line("fencing", &c.fencing),
                iggy_version = line("iggy_version", &c.iggy_version),
                writers = line("writer_user_prefix", &c.writer_user_prefix),
            ));
        }
        for f in &self.flows {
            let extra = if f.extra.is_empty() {
                String::new()
            } else {
                format!("{}\n", f.extra.trim_end())
            };
            out.push_str(&format!(
                "[[flows]]\nname = \"{name}\"\nsource = \"{source}\"\ntarget = \"{target}\"\ninclude = [\"{include}\"]\npoll_interval = \"2ms\"\n{extra}\n",
                name = f.name,
                source = f.source,
                target = f.target,
                include = f.include,
            ));
        }
        out.push_str("[pipeline]\ndiscovery_interval = \"1s\"\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_flow_is_written_as_an_operator_would() {
        let toml = FlowConfig {
            name: "up-to-down",
            source_alias: "up",
            source_url: "iggy://iggy:iggy@127.0.0.1:1",
            target_alias: "down",
            target_url: "iggy://iggy:iggy@127.0.0.1:2",
            include: "ha/*",
            target_fencing: Some("off"),
            target_writer_user_prefix: None,
            target_iggy_version: None,
            flow_extra: "batch_size = 50\n",
        }
        .toml();
        assert_eq!(
            toml,
            r#"[clusters.up]
url = "iggy://iggy:iggy@127.0.0.1:1"

[clusters.down]
url = "iggy://iggy:iggy@127.0.0.1:2"
fencing = "off"

[[flows]]
name = "up-to-down"
source = "up"
target = "down"
include = ["ha/*"]
poll_interval = "2ms"
batch_size = 50

[pipeline]
discovery_interval = "1s"
"#
        );
    }

    #[test]
    fn several_clusters_and_flows_each_get_their_table() {
        let toml = Replication::default()
            .cluster(ClusterEntry::new("src", "iggy://a"))
            .cluster(ClusterEntry::new("eu", "iggy://b"))
            .cluster(ClusterEntry::new("ap", "iggy://c").fencing(Some("off")))
            .flow(FlowEntry::new("a", "src", "eu", "a/*"))
            .flow(FlowEntry::new("b", "src", "ap", "b/*").extra("batch_size = 10"))
            .toml();
        for table in [
            "[clusters.src]\nurl = \"iggy://a\"\n\n",
            "[clusters.eu]\nurl = \"iggy://b\"\n\n",
            "[clusters.ap]\nurl = \"iggy://c\"\nfencing = \"off\"\n\n",
            "name = \"a\"\nsource = \"src\"\ntarget = \"eu\"\ninclude = [\"a/*\"]\npoll_interval = \"2ms\"\n\n",
            "target = \"ap\"\ninclude = [\"b/*\"]\npoll_interval = \"2ms\"\nbatch_size = 10\n\n",
        ] {
            assert!(toml.contains(table), "{table:?} in {toml}");
        }
        assert_eq!(toml.matches("[[flows]]").count(), 2);
        assert!(toml.ends_with("[pipeline]\ndiscovery_interval = \"1s\"\n"));
    }
}
