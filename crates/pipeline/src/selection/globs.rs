//! The glob compilers of the flows' selections: topics by `stream/topic` (the flows' include
//! and exclude globs, the residency policies' selections) and plain names (consumer groups,
//! users). Pure; on error they return the field and the reason (`PipelineParams::validate`).

use globset::{GlobSet, GlobSetBuilder};

/// Compiles one list of globs on `stream/topic` (`*` and `?` do not cross `/`); on error
/// returns the field (`include[2]`) and the reason.
pub(crate) fn build_globs(field: &str, globs: &[String]) -> Result<GlobSet, (String, String)> {
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

/// Compiles globs on plain names, such as group or user names (`*` matches any run of
/// characters); on error returns the field (`users[2]`) and the reason.
pub(crate) fn name_globs(field: &str, globs: &[String]) -> Result<GlobSet, (String, String)> {
    let mut set = GlobSetBuilder::new();
    for (i, pattern) in globs.iter().enumerate() {
        let glob = globset::Glob::new(pattern)
            .map_err(|e| (format!("{field}[{i}]"), e.kind().to_string()))?;
        set.add(glob);
    }
    set.build()
        .map_err(|e| (field.to_owned(), e.kind().to_string()))
}
