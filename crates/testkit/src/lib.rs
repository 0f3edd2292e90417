//! replicator-testkit (being built).
