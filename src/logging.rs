//! Installs the one tracing subscriber of the process: human-readable by default,
//! JSON lines with `--log-format json`, filtered by `--log-level` or `RUST_LOG`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The filter when neither `--log-level` nor `RUST_LOG` is given: our own events at `info`,
/// openraft and the Iggy SDK at `warn`. Their `info` lines (openraft dumps whole Raft states,
/// the SDK logs every reconnect) are for debugging, with `--log-level info`.
pub(crate) const DEFAULT_FILTER: &str =
    "info,openraft=warn,iggy=warn,iggy_common=warn,iggy_binary_protocol=warn";

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Readable lines with the span fields (flow, stream, topic, partition, epoch).
    #[default]
    Human,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Installs the global subscriber; `level` wins over `RUST_LOG`, which wins over `default`.
pub(crate) fn install(format: LogFormat, level: Option<&str>, default: &str) -> Result<(), String> {
    let filter = match level {
        Some(level) => EnvFilter::try_new(level).map_err(|e| e.to_string())?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)),
    };
    // Colour codes only for a person at a terminal, never into files or journald.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().with_current_span(true).try_init(),
    };
    result.map_err(|e| e.to_string())
}
