//! Which upstream topics a flow copies and what they are called downstream.

use std::sync::Arc;

use globset::GlobSet;
use replicator_model::Naming;

use super::globs::build_globs;
use super::residency::Residency;

/// A flow's include/exclude globs, matched against `stream/topic`.
#[derive(Debug, Clone)]
pub struct Selector {
    /// Compiled include globs; a topic must match one of them.
    include: GlobSet,
    /// Compiled exclude globs; a topic matching one of them is skipped.
    exclude: GlobSet,
    /// Heartbeat topics (`stream/topic`) skipped although a glob matches them, because no
    /// include names them literally (see [`Selector::reserving`]).
    reserved: Vec<String>,
    /// The include patterns as written, to tell a literal mention of a reserved topic.
    include_literals: Vec<String>,
    /// The policies that keep topics from the flow's target (see [`Selector::under`]).
    residency: Arc<Residency>,
}

/// What a flow does with one upstream topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice<'a> {
    /// Not selected: no glob includes it, one excludes it, or it is a heartbeat topic.
    Skip,
    /// Selected: copied.
    Copy,
    /// Selected, but this residency policy forbids it on the target: never created there nor
    /// copied.
    Blocked(&'a str),
}

impl Selector {
    /// Compiles the globs. `*` does not cross `/`, so `orders/*` selects every topic of the
    /// stream `orders` and `*/*` selects everything. On error returns the field (`include[2]`) and
    /// the reason.
    pub fn new(include: &[String], exclude: &[String]) -> Result<Self, (String, String)> {
        Ok(Self {
            include: build_globs("include", include)?,
            exclude: build_globs("exclude", exclude)?,
            reserved: Vec::new(),
            include_literals: include.to_vec(),
            residency: Arc::default(),
        })
    }

    /// Leaves out the selected topics `residency` forbids on the flow's target (they become
    /// [`Choice::Blocked`]).
    #[must_use]
    pub(crate) fn under(mut self, residency: Arc<Residency>) -> Self {
        self.residency = residency;
        self
    }

    /// Leaves out the heartbeat topics `topics` (`stream/topic`, of every flow in the config)
    /// even where an include glob matches them, except those an include pattern names
    /// literally. Without this a flow with `*/*` would copy the heartbeats its reverse flow
    /// writes into its source, and the reverse flow would copy them back: a loop.
    #[must_use]
    pub fn reserving<I, S>(mut self, topics: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        for topic in topics {
            let topic = topic.into();
            // A heartbeat topic has no glob characters (validated), so a pattern equal to it
            // names it literally.
            let named = self.include_literals.contains(&topic);
            if !named && !self.reserved.contains(&topic) {
                self.reserved.push(topic);
            }
        }
        self
    }

    /// Whether `stream/topic` is copied: selected and not blocked.
    pub fn matches(&self, stream: &str, topic: &str) -> bool {
        self.choose(stream, topic) == Choice::Copy
    }

    /// What the flow does with `stream/topic`.
    pub(crate) fn choose(&self, stream: &str, topic: &str) -> Choice<'_> {
        let path = format!("{stream}/{topic}");
        let selected = self.include.is_match(&path)
            && !self.exclude.is_match(&path)
            && !self.reserved.contains(&path);
        if !selected {
            return Choice::Skip;
        }
        match self.residency.blocked_by(stream, topic) {
            Some(policy) => Choice::Blocked(policy),
            None => Choice::Copy,
        }
    }
}

/// Downstream stream name of an upstream stream under `naming` (topics keep their names).
pub fn downstream_stream(naming: Naming, source_alias: &str, stream: &str) -> String {
    match naming {
        Naming::Identity => stream.to_owned(),
        Naming::Prefix => format!("{source_alias}.{stream}"),
    }
}

#[cfg(test)]
mod tests {
    use assert2::{assert, check};

    use super::*;

    fn globs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn star_selects_within_one_stream_only() {
        let s = Selector::new(&globs(&["orders/*"]), &[]).expect("valid");
        check!(s.matches("orders", "created"));
        check!(!s.matches("payments", "created"));
        check!(!s.matches("orders.eu", "created"));
    }

    #[test]
    fn exclude_wins_over_include() {
        let s = Selector::new(&globs(&["*/*"]), &globs(&["*/tmp-*", "audit/*"])).expect("valid");
        check!(s.matches("orders", "created"));
        check!(!s.matches("orders", "tmp-1"));
        check!(!s.matches("audit", "log"));
    }

    #[test]
    fn empty_include_selects_nothing() {
        let s = Selector::new(&[], &[]).expect("valid");
        check!(!s.matches("a", "b"));
    }

    #[test]
    fn bad_glob_names_its_field() {
        let err = Selector::new(&globs(&["ok/*", "bad/[x"]), &[]).expect_err("invalid");
        assert!(err.0 == "include[1]");
    }

    #[test]
    fn heartbeat_topics_matched_by_a_glob_are_skipped() {
        let s = Selector::new(&globs(&["*/*"]), &[])
            .expect("valid")
            .reserving(["replicator/heartbeats", "ops/hb"]);
        check!(!s.matches("replicator", "heartbeats"));
        check!(!s.matches("ops", "hb"));
        check!(s.matches("replicator", "other"));
        check!(s.matches("orders", "heartbeats"));
        let s = Selector::new(&globs(&["replicator/*"]), &[])
            .expect("valid")
            .reserving(["replicator/heartbeats"]);
        check!(!s.matches("replicator", "heartbeats"));
        check!(s.matches("replicator", "audit"));
    }

    #[test]
    fn heartbeat_topic_named_literally_by_an_include_is_selected() {
        let s = Selector::new(&globs(&["orders/*", "replicator/heartbeats"]), &[])
            .expect("valid")
            .reserving(["replicator/heartbeats", "ops/hb"]);
        check!(s.matches("replicator", "heartbeats"));
        check!(s.matches("orders", "x"));
        check!(!s.matches("ops", "hb"));
        // Exclude still wins over a literal include.
        let s = Selector::new(
            &globs(&["replicator/heartbeats"]),
            &globs(&["replicator/*"]),
        )
        .expect("valid")
        .reserving(["replicator/heartbeats"]);
        check!(!s.matches("replicator", "heartbeats"));
    }

    #[test]
    fn a_near_literal_glob_does_not_name_a_heartbeat_topic() {
        let s = Selector::new(&globs(&["replicator/heartbeat?", "replicator/heart*"]), &[])
            .expect("valid")
            .reserving(["replicator/heartbeats"]);
        check!(!s.matches("replicator", "heartbeats"));
        check!(s.matches("replicator", "heartbeatz"));
    }

    #[test]
    fn a_selected_topic_a_policy_forbids_on_the_target_is_blocked_not_skipped() -> Result<(), String>
    {
        let policy = crate::params::PolicyParams {
            name: "pii-stays-in-eu".to_owned(),
            select: globs(&["pii-*/*"]),
            allowed_zones: globs(&["eu"]),
        };
        let residency = Residency::new(&[policy], &globs(&["us"])).map_err(|e| e.1)?;
        let s = Selector::new(&globs(&["*/*"]), &globs(&["pii-tmp/*"]))
            .map_err(|e| e.1)?
            .reserving(["pii-ops/heartbeats"])
            .under(Arc::new(residency));
        check!(s.choose("pii-users", "events") == Choice::Blocked("pii-stays-in-eu"));
        check!(!s.matches("pii-users", "events"));
        check!(s.choose("orders", "created") == Choice::Copy);
        check!(s.matches("orders", "created"));
        // What the flow does not select is skipped, whatever the policies say of it.
        check!(s.choose("pii-tmp", "x") == Choice::Skip);
        check!(s.choose("pii-ops", "heartbeats") == Choice::Skip);
        check!(s.choose("pii-users", "a/b") == Choice::Skip);
        Ok(())
    }

    #[test]
    fn prefix_naming_prepends_source_alias() {
        check!(downstream_stream(Naming::Prefix, "us", "orders") == "us.orders");
        check!(downstream_stream(Naming::Identity, "us", "orders") == "orders");
    }
}
