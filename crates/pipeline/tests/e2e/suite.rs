//! The end-to-end suite's modules, one per scenario group: the one list every test binary of
//! the suite (`e2e` and the pair binaries `e2e_<us>_to_<eu>`) loads, so that a scenario added
//! here runs on every pair of Iggy generations.

mod copy;
mod distance;
mod edges;
mod fencing;
mod formats;
mod groups;
pub(crate) mod harness;
mod heartbeats;
mod idle;
mod integrity;
mod metadata;
mod release;
mod reload;
mod residency;
mod supervision;
mod tasks;
mod throttle;
mod topics;
mod two_way;
mod vsr;
