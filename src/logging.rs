//! Installs the one tracing subscriber of the process: human-readable by default,
//! JSON lines with `--log-format json`, filtered by `--log-level` or `RUST_LOG`.

use tracing_subscriber::EnvFilter;

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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().with_current_span(true).try_init(),
    };
    result.map_err(|e| e.to_string())
}
