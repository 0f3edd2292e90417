//! Installs the one tracing subscriber of the process: human-readable by default,
//! JSON lines with `--log-format json`, filtered by `--log-level` or `RUST_LOG`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The filter when neither `--log-level` nor `RUST_LOG` is given: our own events at `info`,
/// openraft and the Iggy SDK at `warn`. Their `info` lines (openraft dumps whole Raft states,
/// the SDK logs every reconnect) are for debugging, with `--log-level info`. A directive's
/// target is a prefix (`iggy` also matches `iggy_replicator`), so this binary's own target is
/// named too: the longer directive wins.
pub(crate) const DEFAULT_FILTER: &str =
    "info,openraft=warn,iggy=warn,iggy_common=warn,iggy_binary_protocol=warn,iggy_replicator=info";

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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Collects what the subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("not poisoned").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_default_filter_keeps_our_info_and_drops_the_sdks() {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new(DEFAULT_FILTER))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "iggy_replicator::node", "ours");
            tracing::info!(target: "replicator_pipeline::writer", "pipeline");
            tracing::info!(target: "iggy::tcp::tcp_client", "sdk");
            tracing::info!(target: "openraft::core", "raft");
        });
        let text = String::from_utf8(out.0.lock().expect("not poisoned").clone()).expect("utf-8");
        assert!(text.contains("ours"), "{text}");
        assert!(text.contains("pipeline"), "{text}");
        assert!(!text.contains("sdk"), "{text}");
        assert!(!text.contains("raft"), "{text}");
    }
}
