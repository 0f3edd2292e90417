//! Errors of loading a config file; each names the file and, where it can, the key.

use std::fmt;
use std::path::PathBuf;

/// One thing wrong with a config, tied to the key it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted path of the key, e.g. `flows[1].include`.
    pub key: String,
    /// What is wrong with it, e.g. `must not be empty`.
    pub message: String,
}

impl Problem {
    /// Builds a problem for `key`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file that was asked for.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The text is not valid TOML, or does not fit the schema (unknown key, wrong type).
    #[error("{origin}: {message}")]
    Syntax {
        /// The file, or `<string>` for text given directly.
        origin: String,
        /// The parser's message, which names the key and shows the line.
        message: String,
    },
    /// The config parsed but some values are invalid; every problem is listed.
    #[error("{origin}: invalid config:\n{}", list(problems))]
    Invalid {
        /// The file, or `<string>` for text given directly.
        origin: String,
        /// Every problem found, in file order.
        problems: Vec<Problem>,
    },
}

fn list(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
