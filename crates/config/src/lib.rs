//! replicator-config (being built).
