//! The `Dockerfile`: a multi-stage build of a non-root image that runs the replicator with the
//! conventional config path and ports.

use std::collections::BTreeSet;

use crate::{read, repo, StartCommand, TestResult, API_PORT, CONFIG_PATH, DATA_DIR, RAFT_PORT};

/// The Dockerfile's instruction lines (comments dropped).
fn instructions(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .collect()
}

/// The argument of the last `keyword` instruction: the one that takes effect.
fn last<'a>(instructions: &[&'a str], keyword: &str) -> Option<&'a str> {
    instructions
        .iter()
        .rev()
        .find_map(|line| line.strip_prefix(keyword))
        .map(str::trim)
}

/// The image's `CMD` (exec form).
fn cmd(instructions: &[&str]) -> TestResult<Vec<String>> {
    let cmd = last(instructions, "CMD ").ok_or("Dockerfile: no CMD")?;
    Ok(serde_json::from_str(cmd).map_err(|e| format!("Dockerfile: CMD {cmd}: {e}"))?)
}

/// The image's `CMD`, which the `ENTRYPOINT` binary runs.
pub(crate) fn start_commands() -> TestResult<Vec<StartCommand>> {
    let text = read(&repo().join("Dockerfile"))?;
    Ok(vec![(
        "Dockerfile CMD".to_owned(),
        cmd(&instructions(&text))?,
    )])
}

#[test]
fn dockerfile_builds_a_non_root_image_that_runs_the_replicator() -> TestResult {
    let text = read(&repo().join("Dockerfile"))?;
    let instructions = instructions(&text);
    let from_count = instructions
        .iter()
        .filter(|l| l.starts_with("FROM "))
        .count();
    assert!(from_count >= 2, "expected a multi-stage build");
    assert_eq!(
        last(&instructions, "ENTRYPOINT "),
        Some(r#"["iggy-replicator"]"#)
    );
    let cmd = cmd(&instructions)?;
    assert_eq!(
        cmd.get(..3),
        Some(
            ["run", "--config", CONFIG_PATH]
                .map(str::to_owned)
                .as_slice()
        ),
        "CMD {cmd:?}"
    );
    let user = last(&instructions, "USER ").ok_or("Dockerfile: no USER")?;
    assert!(
        !user.starts_with("root") && !user.starts_with("0"),
        "USER {user}"
    );
    let exposed: BTreeSet<String> = last(&instructions, "EXPOSE ")
        .ok_or("Dockerfile: no EXPOSE")?
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        exposed,
        BTreeSet::from([RAFT_PORT.to_string(), API_PORT.to_string()])
    );
    assert!(text.contains(DATA_DIR), "the image prepares {DATA_DIR}");
    let ignore = read(&repo().join(".dockerignore"))?;
    assert!(
        ignore.lines().any(|line| line.trim() == "target"),
        ".dockerignore keeps target/ out of the build context"
    );
    Ok(())
}
