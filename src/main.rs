//! iggy-replicator binary.
fn main() {}
