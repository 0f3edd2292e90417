//! replicator-pipeline (being built).
