//! Which upstream topics a flow copies and what they are called downstream.

use globset::{GlobSet, GlobSetBuilder};
use replicator_model::Naming;

/// A flow's include/exclude globs, matched against `stream/topic`.
#[derive(Debug, Clone)]
pub struct Selector {
    /// Compiled include globs; a topic must match one of them.
    include: GlobSet,
    /// Compiled exclude globs; a topic matching one of them is skipped.
    exclude: GlobSet,
}

impl Selector {
    /// Compiles the globs. `*` does not cross `/`, so `orders/*` selects every topic of the
    /// stream `orders` and `*/*` selects everything. On error returns the field (`include[2]`) and
    /// the reason.
    pub fn new(include: &[String], exclude: &[String]) -> Result<Self, (String, String)> {
        Ok(Self {
            include: build("include", include)?,
            exclude: build("exclude", exclude)?,
        })
    }

    /// Whether `stream/topic` is selected.
    pub fn matches(&self, stream: &str, topic: &str) -> bool {
        let path = format!("{stream}/{topic}");
        self.include.is_match(&path) && !self.exclude.is_match(&path)
    }
}

/// Compiles one list of globs.
fn build(field: &str, globs: &[String]) -> Result<GlobSet, (String, String)> {
    let mut set = GlobSetBuilder::new();
    for (i, pattern) in globs.iter().enumerate() {
        let glob = globset::GlobBuilder::new(pattern)
            .literal_separator(true)
            .build()
            .map_err(|e| (format!("{field}[{i}]"), e.kind().to_string()))?;
        set.add(glob);
    }
    set.build()
        .map_err(|e| (field.to_owned(), e.kind().to_string()))
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
    fn prefix_naming_prepends_source_alias() {
        check!(downstream_stream(Naming::Prefix, "us", "orders") == "us.orders");
        check!(downstream_stream(Naming::Identity, "us", "orders") == "orders");
    }
}
