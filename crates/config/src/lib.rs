//! The operator's TOML file: its schema ([`Config`] and its sections), the
//! documented defaults, `${VAR}` substitution for secrets, and a single
//! validation pass ([`Config::problems`]) that reports every problem with the
//! key it concerns, including what the flows' globs can select (`selection`: flows
//! that overlap, flows the residency policies leave nothing to copy).
//!
//! This crate owns parsing and checking only. It starts nothing and connects to
//! nothing; the binary turns a validated [`Config`] into the resolved parameters
//! that the control plane and the pipeline take.
#![warn(missing_docs)]

mod digest;
mod error;
mod load;
mod schema;
mod secret;
mod selection;
#[doc(hidden)]
pub mod testing;

pub use digest::flow_digests;
pub use error::{Error, Problem, Result};
pub use load::{load_file, parse_str};
pub use schema::{
    ApiTlsConfig, ClusterConfig, Config, FencingMode, FlowConfig, IggyClusterConfig,
    InitialOffsetSetting, NodeConfig, PipelineConfig, PolicyConfig, TlsFilesConfig,
    BATCH_SIZE_LIMITS, DEFAULT_CONNECTIONS, DEFAULT_FAR_CONNECTIONS, MAX_BATCH_BYTES_LIMITS,
};
pub use secret::{ClusterUrl, Secret};
