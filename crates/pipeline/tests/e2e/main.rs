//! End-to-end scenarios of the pipeline against in-process Iggy-compatible servers
//! (`replicator-testkit`) and the in-memory control plane. One test binary, one module per
//! scenario group.

mod copy;
mod edges;
mod fencing;
mod groups;
mod harness;
mod heartbeats;
mod idle;
mod integrity;
mod release;
mod reload;
mod residency;
mod throttle;
mod topics;
