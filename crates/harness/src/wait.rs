//! Waiting on conditions: deadlines for polling loops, and running one process scenario at a
//! time. Waits poll a condition under a generous deadline; nothing sleeps to synchronise.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{Error, Result, TestResult};

/// A deadline for a polling loop, with a description for the error.
#[derive(Debug, Clone)]
pub struct Deadline {
    /// When the wait gives up.
    until: Instant,
    /// What is awaited, for [`Error::TimedOut`].
    what: String,
}

impl Deadline {
    /// A deadline `within` from now for `what`.
    pub fn new(within: Duration, what: impl Into<String>) -> Self {
        Self {
            until: Instant::now() + within,
            what: what.into(),
        }
    }

    /// [`Error::TimedOut`] once the deadline has passed.
    pub fn check(&self) -> Result<()> {
        if Instant::now() > self.until {
            Err(Error::TimedOut {
                what: self.what.clone(),
                detail: String::new(),
            })
        } else {
            Ok(())
        }
    }

    /// [`Error::TimedOut`] with what was seen last once the deadline has passed.
    pub fn check_seeing(&self, last: impl FnOnce() -> String) -> Result<()> {
        if Instant::now() > self.until {
            Err(Error::timed_out(&self.what, last()))
        } else {
            Ok(())
        }
    }
}

/// Pause between two polls of a process cluster's state (its admin API, server counts).
pub async fn tick() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Polls `condition` every 50 ms until it holds, or fails once `within` has passed.
pub async fn wait_until<F, Fut>(what: &str, within: Duration, mut condition: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Deadline::new(within, what);
    loop {
        if condition().await {
            return Ok(());
        }
        deadline.check()?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs one scenario alone, on its own two-thread runtime: a process-wide lock, because the
/// scenarios start several processes each and share the machine's cores with the rest of the
/// suite.
pub fn serial<F, Fut>(scenario: F) -> TestResult
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = TestResult>,
{
    static LOCK: Mutex<()> = Mutex::new(());
    // A failed scenario poisons the lock; the next one may still run.
    let _guard = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(scenario());
    runtime.shutdown_timeout(Duration::from_secs(5));
    outcome
}
