//! The `iggy-replicator` executable that node processes, `cluster`, `verify` and `dev-server`
//! run.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The `iggy-replicator` executable.
///
/// The caller passes its path: Cargo names it in `CARGO_BIN_EXE_iggy-replicator` only while it
/// compiles the root package's integration tests and benches, so a library crate cannot ask for
/// it itself, and guessing it from the test executable's directory breaks with another target
/// dir or profile. Tests and benches write
/// `ReplicatorBinary::new(env!("CARGO_BIN_EXE_iggy-replicator"))?`; Cargo builds the binary
/// before them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicatorBinary {
    /// Absolute path of the executable.
    path: PathBuf,
}

impl ReplicatorBinary {
    /// The executable at `path`; an error when there is no file there.
    pub fn new(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        if path.is_file() {
            Ok(Self { path })
        } else {
            Err(Error::MissingBinary(path))
        }
    }

    /// Where it is.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A command running it, with `RUST_LOG` removed (log levels come from `--log-level`), for
    /// long-lived processes the caller kills by pid.
    pub(crate) fn process(&self) -> std::process::Command {
        let mut command = std::process::Command::new(&self.path);
        command.env_remove("RUST_LOG");
        command
    }

    /// A command running it to completion (`cluster`, `verify`), killed if the caller stops
    /// waiting for it.
    pub(crate) fn one_shot(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.path);
        command.env_remove("RUST_LOG").kill_on_drop(true);
        command
    }
}
