//! Exit codes and the one-line error report every command ends with.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success (for `verify`: the copy is exact) |
//! | 1 | runtime failure (cannot connect, cluster unavailable, …) |
//! | 2 | invalid config file or command line |
//! | 3 | `verify` found differences between upstream and downstream; `flow promote` ended with messages not copied |

use std::process::ExitCode;

/// Runtime failure.
pub(crate) const RUNTIME: u8 = 1;
/// Invalid configuration or usage.
pub(crate) const CONFIG: u8 = 2;
/// `verify` found the copy not exact (or `flow promote` could not complete it).
pub(crate) const NOT_EXACT: u8 = 3;

/// Why a command failed, with what to tell the operator.
#[derive(Debug)]
pub(crate) struct Failure {
    /// Exit code, one of the constants above.
    code: u8,
    /// The error, printed as one line (or a list for config problems).
    message: String,
    /// What to try next.
    hint: Option<String>,
}

impl Failure {
    /// A runtime failure with a hint.
    pub(crate) fn runtime(message: impl std::fmt::Display, hint: impl Into<String>) -> Self {
        Self {
            code: RUNTIME,
            message: message.to_string(),
            hint: Some(hint.into()),
        }
    }

    /// An invalid config or command line.
    pub(crate) fn config(message: impl std::fmt::Display) -> Self {
        Self {
            code: CONFIG,
            message: message.to_string(),
            hint: Some("fix the named keys; `iggy-replicator check-config --config FILE` re-checks without starting".into()),
        }
    }

    /// The same failure with another hint.
    pub(crate) fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// `verify` found differences.
    pub(crate) fn not_exact(message: impl std::fmt::Display) -> Self {
        Self {
            code: NOT_EXACT,
            message: message.to_string(),
            hint: None,
        }
    }

    /// Prints the failure to stderr and returns its exit code.
    pub(crate) fn report(self) -> ExitCode {
        eprintln!("error: {}", self.message);
        if let Some(hint) = self.hint {
            eprintln!("hint: {hint}");
        }
        ExitCode::from(self.code)
    }
}

impl From<replicator_config::Error> for Failure {
    fn from(error: replicator_config::Error) -> Self {
        match error {
            replicator_config::Error::Read { .. } => Failure {
                code: CONFIG,
                message: error.to_string(),
                hint: Some("pass the path of an existing file with --config".into()),
            },
            other => Failure::config(other),
        }
    }
}

/// The failure for clusters that answer in another Iggy protocol generation than configured,
/// if any: every one named, with the key to change.
pub(crate) fn generation_failure(
    mismatches: &[replicator_pipeline::GenerationMismatch],
) -> Option<Failure> {
    if mismatches.is_empty() {
        return None;
    }
    let text = mismatches
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    Some(Failure::config(text).with_hint(
        "Iggy 0.8 and 0.9 servers speak incompatible protocols: set each cluster's iggy_version \
         to the generation its servers run (README, \"Iggy 0.8 and 0.9\")",
    ))
}
