//! What the node's side of the flow calls (`flow pause|resume|promote` in `flow.rs`, `flow
//! reset` in `reset.rs`) shares: the checks before a call works on a flow, who made it, the
//! flow's units, and the wait until a paused flow's writers handed them back.

use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use replicator_control::Control;
use replicator_model::WorkUnit;
use replicator_pipeline::Cutover;

use crate::admin::AdminState;

/// How often promote and reset re-read the partitions while they wait.
pub(crate) const PROMOTE_POLL: Duration = Duration::from_millis(200);

/// How long promote (past its deadline) and reset wait for a paused flow's writers to hand
/// their units back (a dead owner's units move after its lease or fence).
pub(crate) const HAND_BACK_WAIT: Duration = Duration::from_secs(30);

/// Who made a call, for the record in Raft.
pub(crate) fn requester(action: &str) -> String {
    format!("{action} via the admin API")
}

/// 404 unless this node's config has the flow.
pub(crate) fn known_flow(state: &AdminState, name: &str) -> Result<(), Box<Response>> {
    let flows = state.flows();
    if flows.iter().any(|f| f == name) {
        Ok(())
    } else {
        Err(Box::new(
            (
                StatusCode::NOT_FOUND,
                format!(
                    "no flow {name:?} in this node's config (flows: {})\n",
                    flows.join(", ")
                ),
            )
                .into_response(),
        ))
    }
}

/// What a flow call that works on the pipeline needs: the caller [`authorise`]d for `action`,
/// `name` a flow of this node's config, the control plane and the pipeline's cutover handle
/// (503 until the pipeline started).
///
/// [`authorise`]: AdminState::control_for
pub(crate) fn flow_call(
    state: &AdminState,
    headers: &HeaderMap,
    action: &str,
    name: &str,
) -> Result<(Control, Cutover), Box<Response>> {
    let control = state.control_for(headers, action)?.clone();
    known_flow(state, name)?;
    let cutover = state.cutover().ok_or_else(|| {
        Box::new(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the pipeline has not started yet; retry when /ready answers 200\n",
            )
                .into_response(),
        )
    })?;
    Ok((control, cutover))
}

/// The flow's units as the control plane knows them (retired ones left out).
pub(crate) async fn flow_units(
    control: &Control,
    flow: &str,
) -> Result<Vec<(WorkUnit, Option<u64>)>, String> {
    let status = control.status().await.map_err(|e| e.to_string())?;
    Ok(status
        .units
        .into_iter()
        .filter(|u| u.unit.flow == flow && !u.retired)
        .map(|u| (u.unit, u.progress.confirmed))
        .collect())
}

/// Waits until no unit of the paused `flow` that `selected` picks has an owner (their writers
/// finished the batch in flight, committed and handed them back), or `until`; then answers how
/// many are still owned.
pub(crate) async fn wait_handed_back(
    control: &Control,
    flow: &str,
    until: Instant,
    selected: impl Fn(&WorkUnit) -> bool,
) -> Result<(), usize> {
    loop {
        let owned = control
            .owned_units_of(flow)
            .iter()
            .filter(|u| selected(u))
            .count();
        if owned == 0 {
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(owned);
        }
        tokio::time::sleep(PROMOTE_POLL).await;
    }
}
