//! Compares a flow's source and target (being built).
