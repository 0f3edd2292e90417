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

{replication}"#,
            id = self.id,
            data_dir = self.data_dir.display().to_string(),
            raft_addr = self.raft_addr,
            api_bind = self.api_bind,
            secret = self.secret,
        )
    }
}

/// The replication sections of one flow from one server to another with identity naming,
/// polling caught-up partitions every 2 ms and discovering topics every second (so that tests
/// and the demo react fast); product defaults for everything else.
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
    /// More lines of the `[[flows]]` table, e.g. `consumer_groups = ["billing"]`; may be empty.
    pub flow_extra: &'a str,
}

impl FlowConfig<'_> {
    /// `[clusters.*]`, `[[flows]]` and `[pipeline]` TOML.
    #[must_use]
    pub fn toml(&self) -> String {
        format!(
            r#"[clusters.{source_alias}]
url = "{source_url}"

[clusters.{target_alias}]
url = "{target_url}"
{fencing}{iggy_version}
[[flows]]
name = "{name}"
source = "{source_alias}"
target = "{target_alias}"
include = ["{include}"]
poll_interval = "2ms"
{flow_extra}
[pipeline]
discovery_interval = "1s"
"#,
            name = self.name,
            source_alias = self.source_alias,
            source_url = self.source_url,
            target_alias = self.target_alias,
            target_url = self.target_url,
            fencing = self
                .target_fencing
                .map(|f| format!("fencing = \"{f}\"\n"))
                .unwrap_or_default(),
            iggy_version = self
                .target_iggy_version
                .map(|v| format!("iggy_version = \"{v}\"\n"))
                .unwrap_or_default(),
            include = self.include,
            flow_extra = if self.flow_extra.is_empty() {
                String::new()
            } else {
                format!("{}\n", self.flow_extra.trim_end())
            },
        )
    }
}
