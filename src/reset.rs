//! `iggy-replicator flow reset`: move where partitions of a paused flow resume.
//!
//! The node the call reaches waits until the flow's writers handed their partitions back,
//! reads the upstream partitions (their end, and for `earliest` their first message), decides
//! each partition's new start ([`plan`], pure) and writes all of them in one Raft entry
//! (`ResetOffsets`, refused as a whole unless the flow is paused and nothing of it is owned).
//! The next owner of each partition starts there when the flow is resumed.
//!
//! Starting at or below a partition's confirmed offset copies again what the target holds, so
//! it is refused unless `--allow-duplicates`: without it the resume's tail scan would find the
//! copies downstream and start after them anyway.

use std::str::FromStr;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use replicator_control::{Control, ResetRefusal};
use replicator_model::{Offset, WorkUnit};
use replicator_pipeline::Cutover;
use serde::{Deserialize, Serialize};
use tracing::info;

use crate::admin::AdminState;
use crate::api_client::MutationArgs;
use crate::exit::Failure;
use crate::flow_call::{flow_call, flow_units, requester, wait_handed_back, HAND_BACK_WAIT};

/// Where `--to` points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResetTo {
    /// The oldest message upstream still holds.
    Earliest,
    /// The upstream end: messages appended from now on are copied, none before.
    Latest,
    /// This upstream offset.
    Offset(Offset),
}

impl FromStr for ResetTo {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "earliest" => Ok(ResetTo::Earliest),
            "latest" => Ok(ResetTo::Latest),
            n => n.parse().map(ResetTo::Offset).map_err(|_| {
                format!("`{s}` is not earliest, latest or an offset (a non-negative integer)")
            }),
        }
    }
}

impl std::fmt::Display for ResetTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResetTo::Earliest => f.write_str("earliest"),
            ResetTo::Latest => f.write_str("latest"),
            ResetTo::Offset(n) => write!(f, "{n}"),
        }
    }
}

/// Body of `POST /flows/{name}/reset`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ResetRequest {
    /// Upstream stream.
    pub(crate) stream: String,
    /// Upstream topic.
    pub(crate) topic: String,
    /// One partition, or every partition of the topic.
    pub(crate) partition: Option<u32>,
    /// `earliest`, `latest` or an offset.
    pub(crate) to: String,
    /// Allow starting at or below confirmed offsets (copies messages again).
    pub(crate) allow_duplicates: bool,
}

/// The answer of `POST /flows/{name}/reset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ResetReport {
    /// The flow.
    pub(crate) flow: String,
    /// Per partition, in unit order.
    pub(crate) partitions: Vec<PartitionReset>,
}

/// One partition in [`ResetReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PartitionReset {
    pub(crate) stream: String,
    pub(crate) topic: String,
    pub(crate) partition: u32,
    /// The confirmed offset before the reset.
    pub(crate) confirmed_before: Option<Offset>,
    /// The first upstream offset the next owner copies.
    pub(crate) next: Offset,
    /// The upstream end (next offset) when the reset was decided.
    pub(crate) upstream_end: Offset,
    /// Messages after the confirmed offset that will never be copied.
    pub(crate) skipped: u64,
    /// Confirmed messages that will be copied again.
    pub(crate) copied_again: u64,
}

/// What the reset needs to know of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionFacts {
    /// The unit.
    pub(crate) unit: WorkUnit,
    /// Its confirmed offset.
    pub(crate) confirmed: Option<Offset>,
    /// The upstream end (next offset).
    pub(crate) upstream_end: Offset,
    /// The oldest offset upstream holds (`None`: empty; only read for `earliest`).
    pub(crate) first: Option<Offset>,
    /// Creation time (µs) of the upstream topic these facts are about: the reset is for that
    /// topic only (a topic recreated before the next owner starts drops it).
    pub(crate) topic_created_at: u64,
}

/// Each partition's new start, or every reason the reset cannot be done (nothing changes
/// then). A start past the upstream end is refused: the writer would take the end below its
/// confirmed offset for a purged partition.
pub(crate) fn plan(
    facts: &[PartitionFacts],
    to: ResetTo,
    allow_duplicates: bool,
) -> Result<Vec<PartitionReset>, Vec<String>> {
    let mut problems = Vec::new();
    let mut out = Vec::new();
    for f in facts {
        let u = &f.unit;
        let label = format!("{}/{}/{}", u.stream, u.topic, u.partition);
        let next = match to {
            ResetTo::Earliest => f.first.unwrap_or(f.upstream_end),
            ResetTo::Latest => f.upstream_end,
            ResetTo::Offset(n) => n,
        };
        if next > f.upstream_end {
            problems.push(format!(
                "{label}: offset {next} is past the partition's end (its next offset is {})",
                f.upstream_end
            ));
            continue;
        }
        let copied_again = f.confirmed.map_or(0, |c| (c + 1).saturating_sub(next));
        if copied_again > 0 && !allow_duplicates {
            problems.push(format!(
                "{label}: the target already holds the copies up to offset {} (confirmed); \
                 starting at {next} copies {copied_again} message(s) again, which the resume's \
                 tail scan would skip: pass --allow-duplicates to copy them again",
                f.confirmed.unwrap_or_default()
            ));
            continue;
        }
        out.push(PartitionReset {
            stream: u.stream.clone(),
            topic: u.topic.clone(),
            partition: u.partition,
            confirmed_before: f.confirmed,
            next,
            upstream_end: f.upstream_end,
            skipped: f.confirmed.map_or(0, |c| next.saturating_sub(c + 1)),
            copied_again,
        });
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

// ---------------------------------------------------------------------------------------------
// The admin API side.

fn answer(code: StatusCode, text: String) -> Response {
    (code, text).into_response()
}

/// `POST /flows/{name}/reset`.
pub(crate) async fn reset(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Json(body): Json<ResetRequest>,
) -> Response {
    let (control, cutover) = match flow_call(&state, &headers, "reset", &name) {
        Ok(parts) => parts,
        Err(answer) => return *answer,
    };
    let to = match body.to.parse::<ResetTo>() {
        Ok(to) => to,
        Err(e) => return answer(StatusCode::BAD_REQUEST, format!("to: {e}\n")),
    };
    match run_reset(&control, &cutover, &name, &body, to).await {
        Ok(report) => Json(report).into_response(),
        Err((code, text)) => answer(
            code,
            format!("reset of flow {name} refused: {text}\nnothing was changed\n"),
        ),
    }
}

async fn run_reset(
    control: &Control,
    cutover: &Cutover,
    flow: &str,
    body: &ResetRequest,
    to: ResetTo,
) -> Result<ResetReport, (StatusCode, String)> {
    let conflict = |text: String| (StatusCode::CONFLICT, text);
    if !control.is_flow_paused(flow) {
        return Err(conflict(format!(
            "the flow is running: pause it first (iggy-replicator flow pause {flow})"
        )));
    }
    let selected = |u: &WorkUnit| {
        u.stream == body.stream
            && u.topic == body.topic
            && body.partition.is_none_or(|p| p == u.partition)
    };
    let units: Vec<_> = flow_units(control, flow)
        .await
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e))?
        .into_iter()
        .filter(|(u, _)| selected(u))
        .collect();
    if units.is_empty() {
        return Err((
            StatusCode::NOT_FOUND,
            format!(
                "the flow has no partition {}/{}{} (the control plane knows the partitions discovery reported)",
                body.stream,
                body.topic,
                body.partition.map_or(String::new(), |p| format!("/{p}"))
            ),
        ));
    }
    // Wait until the writers of the paused flow handed the partitions back: a reset of an
    // owned partition would be undone by its owner's final commit.
    let until = Instant::now() + HAND_BACK_WAIT;
    if let Err(owned) = wait_handed_back(control, flow, until, selected).await {
        return Err(conflict(format!(
            "{owned} partition(s) are still owned {}s after the pause (a writer that cannot \
             stop keeps its partition until its lease expires); retry later",
            HAND_BACK_WAIT.as_secs()
        )));
    }
    let ids: Vec<WorkUnit> = units.iter().map(|(u, _)| u.clone()).collect();
    let extents = cutover.extents(flow, &ids).await;
    let firsts = if to == ResetTo::Earliest {
        cutover.first_offsets(flow, &ids).await
    } else {
        ids.iter().map(|_| Ok(None)).collect()
    };
    let mut facts = Vec::new();
    let mut unreadable = Vec::new();
    for (((unit, confirmed), e), first) in units.iter().zip(&extents).zip(firsts) {
        match (&e.upstream, &first) {
            (Ok(up), Ok(first)) => facts.push(PartitionFacts {
                unit: unit.clone(),
                confirmed: *confirmed,
                upstream_end: up.next_offset,
                first: *first,
                topic_created_at: up.topic_created_at,
            }),
            (Err(error), _) | (_, Err(error)) => {
                unreadable.push(format!("{unit}: upstream: {error}"));
            }
        }
    }
    if !unreadable.is_empty() {
        return Err((StatusCode::SERVICE_UNAVAILABLE, unreadable.join("\n")));
    }
    let partitions = plan(&facts, to, body.allow_duplicates).map_err(|p| conflict(p.join("\n")))?;
    // The plan answers every partition, in order, or refuses the reset.
    let resets = partitions
        .iter()
        .zip(&facts)
        .map(|(p, f)| (f.unit.clone(), p.next, f.topic_created_at))
        .collect();
    info!(flow, stream = %body.stream, topic = %body.topic, partition = ?body.partition,
        %to, allow_duplicates = body.allow_duplicates, "offset reset requested");
    control
        .reset_offsets(flow, resets, body.allow_duplicates, requester("reset"))
        .await
        .map_err(|refusal| match refusal {
            ResetRefusal::Failed(e) => (StatusCode::SERVICE_UNAVAILABLE, e),
            other => conflict(other.to_string()),
        })?;
    Ok(ResetReport {
        flow: flow.to_owned(),
        partitions,
    })
}

// ---------------------------------------------------------------------------------------------
// The CLI side.

/// Arguments of `flow reset`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ResetArgs {
    /// The flow (`flows[].name`); it must be paused.
    pub(crate) name: String,
    /// Upstream stream.
    #[arg(long)]
    pub(crate) stream: String,
    /// Upstream topic.
    #[arg(long)]
    pub(crate) topic: String,
    /// One partition (default: every partition of the topic).
    #[arg(long)]
    pub(crate) partition: Option<u32>,
    /// Where the next owner starts: `earliest` (the oldest message upstream holds), `latest`
    /// (the upstream end now: skip the backlog) or an upstream offset.
    #[arg(long, value_parser = ResetTo::from_str)]
    pub(crate) to: ResetTo,
    /// Allow starting at or below what is confirmed: those messages are copied again (the
    /// target then holds them twice).
    #[arg(long)]
    pub(crate) allow_duplicates: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) call: MutationArgs,
}

/// Runs `flow reset`.
pub(crate) async fn run(args: ResetArgs) -> Result<(), Failure> {
    let body = ResetRequest {
        stream: args.stream.clone(),
        topic: args.topic.clone(),
        partition: args.partition,
        to: args.to.to_string(),
        allow_duplicates: args.allow_duplicates,
    };
    let name = &args.name;
    let (report, answer): (ResetReport, _) = args
        .call
        .post_for(
            HAND_BACK_WAIT + Duration::from_secs(60),
            "reset",
            &format!("/flows/{name}/reset"),
            &body,
        )
        .await?;
    if args.json {
        println!("{answer}");
    } else {
        print!("{}", render(&report));
    }
    Ok(())
}

/// The report as a table.
pub(crate) fn render(report: &ResetReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "flow {}: offsets reset; each partition starts there when the flow is resumed \
         (iggy-replicator flow resume {})",
        report.flow, report.flow
    );
    let label = |p: &PartitionReset| format!("{}/{}/{}", p.stream, p.topic, p.partition);
    let w = report
        .partitions
        .iter()
        .map(|p| label(p).len())
        .max()
        .unwrap_or(0)
        .max(9);
    let _ = writeln!(
        out,
        "{:<w$} {:>10} {:>10} {:>13} {:>8} {:>13}",
        "PARTITION", "CONFIRMED", "NEXT", "UPSTREAM END", "SKIPPED", "COPIED AGAIN"
    );
    for p in &report.partitions {
        let _ = writeln!(
            out,
            "{:<w$} {:>10} {:>10} {:>13} {:>8} {:>13}",
            label(p),
            p.confirmed_before
                .map_or_else(|| "-".to_owned(), |c| c.to_string()),
            p.next,
            p.upstream_end,
            p.skipped,
            p.copied_again,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(
        partition: u32,
        confirmed: Option<Offset>,
        end: Offset,
        first: Option<Offset>,
    ) -> PartitionFacts {
        PartitionFacts {
            unit: WorkUnit::new("f", "s", "t", partition),
            confirmed,
            upstream_end: end,
            first,
            topic_created_at: 1,
        }
    }

    #[test]
    fn to_parses_earliest_latest_and_offsets_only() {
        assert_eq!("earliest".parse(), Ok(ResetTo::Earliest));
        assert_eq!("latest".parse(), Ok(ResetTo::Latest));
        assert_eq!("42".parse(), Ok(ResetTo::Offset(42)));
        let e = "-1".parse::<ResetTo>().expect_err("refused");
        assert!(e.contains("earliest, latest or an offset"));
        assert!("first".parse::<ResetTo>().is_err());
        assert_eq!(
            ResetTo::Offset(7).to_string().parse(),
            Ok(ResetTo::Offset(7))
        );
    }

    #[test]
    fn latest_skips_the_backlog_and_earliest_starts_at_the_oldest_message_held() {
        let f = [facts(0, Some(9), 100, Some(5)), facts(1, None, 0, None)];
        let latest = plan(&f, ResetTo::Latest, false).expect("plans");
        assert_eq!(latest[0].next, 100);
        assert_eq!(latest[0].skipped, 90);
        assert_eq!(latest[1].next, 0);
        // Earliest is below the confirmed offset of partition 0: copies again.
        let problems = plan(&f, ResetTo::Earliest, false).expect_err("refused");
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("s/t/0:"));
        assert!(problems[0].contains("--allow-duplicates"));
        assert!(problems[0].contains("copies 5 message(s) again"));
        let earliest = plan(&f, ResetTo::Earliest, true).expect("plans");
        assert_eq!(earliest[0].next, 5);
        assert_eq!(earliest[0].copied_again, 5);
        assert!(
            earliest[1].next == 0,
            "an empty partition starts at its end"
        );
    }

    #[test]
    fn an_offset_past_the_end_or_below_the_confirmed_one_is_refused() {
        let f = [facts(0, Some(9), 20, None)];
        let past = plan(&f, ResetTo::Offset(21), true).expect_err("refused");
        assert!(past[0].contains("past the partition's end"));
        assert!(
            plan(&f, ResetTo::Offset(20), false).is_ok(),
            "the end itself is latest"
        );
        assert!(
            plan(&f, ResetTo::Offset(9), false).is_err(),
            "the confirmed offset itself"
        );
        let ok = plan(&f, ResetTo::Offset(10), false).expect("plans");
        assert_eq!(ok[0].skipped, 0);
        assert_eq!(ok[0].copied_again, 0);
        let back = plan(&f, ResetTo::Offset(0), true).expect("plans");
        assert_eq!(back[0].copied_again, 10);
    }
}
