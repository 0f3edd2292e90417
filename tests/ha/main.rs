//! High-availability scenarios with real OS processes: three (or four) `iggy-replicator run`
//! nodes over in-process Iggy servers (two; three in `topology`; a three-replica 0.9 cluster
//! as the target in `vsr`), with `kill -9`,
//! SIGSTOP/SIGCONT, SIGTERM, membership changes and server faults, driven by
//! `replicator-harness`. One test binary; the scenarios run one at a time (see
//! `replicator_harness::serial`).

mod chaos;
mod churn;
mod dr;
mod failover;
mod fence;
mod fence_edges;
mod fixture;
mod groups;
mod partition;
mod pause;
mod reload;
mod reset;
mod restart;
mod rolling_fence;
mod scale;
mod start;
mod tls;
mod topology;
mod two_way_metadata;
mod upgrade;
mod users;
mod vsr;
mod wan;
mod zombie;
