//! replicator-control (being built).
