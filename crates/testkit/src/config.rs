//! Configuration of a [`crate::TestServer`].

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

pub use replicator_model::IggyVersion;

/// Segment size of a real server with the default config (`system.segment.size`, 1 GiB). It
/// decides which `max_topic_size` values are accepted (smaller ones are rejected with 1019) and
/// when the retention cleaner may drop a segment.
pub const DEFAULT_SEGMENT_SIZE: u64 = 1024 * 1024 * 1024;

/// How a [`crate::TestServer`] behaves. `Default` is the root user `iggy`/`iggy` on
/// `127.0.0.1:0`, kept in memory, with retention enforcement off (like a real server's default
/// `data_maintenance.messages.cleaner_enabled = false`).
#[derive(Debug, Clone)]
pub struct TestServerConfig {
    /// Root user name accepted by LOGIN_USER. Default `iggy`.
    pub root_username: String,
    /// Root password accepted by LOGIN_USER. Default `iggy`.
    pub root_password: String,
    /// A personal access token accepted by LOGIN_WITH_PERSONAL_ACCESS_TOKEN, logging in as root.
    /// Default none (every token is rejected with 20 `ResourceNotFound`, like an unknown token).
    pub personal_access_token: Option<String>,
    /// Listen address. Default `127.0.0.1:0` (a free port; read it back with `addr()`).
    pub bind: SocketAddr,
    /// Logical segment size in bytes (see [`DEFAULT_SEGMENT_SIZE`]). Tests of size/expiry
    /// retention lower it, e.g. to 1024, so segments seal after a few messages.
    pub segment_size: u64,
    /// Period of the retention cleaner that enforces each topic's `message_expiry` and
    /// `max_topic_size` by dropping whole sealed segments. `None` (default) disables it.
    pub cleaner_interval: Option<Duration>,
    /// The protocol generation the server speaks: `V0_8` (default, SDK 0.10) or `V0_9` (SDK
    /// 0.11). Both serve the same state with the same command semantics.
    pub iggy_version: IggyVersion,
    /// Directory for persistence across process restarts. `None` (default) keeps everything in
    /// memory only; the data still survives `TestServer::restart`.
    pub data_dir: Option<PathBuf>,
}

impl Default for TestServerConfig {
    fn default() -> Self {
        Self {
            root_username: "iggy".to_owned(),
            root_password: "iggy".to_owned(),
            personal_access_token: None,
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            segment_size: DEFAULT_SEGMENT_SIZE,
            cleaner_interval: None,
            data_dir: None,
            iggy_version: IggyVersion::default(),
        }
    }
}
