//! What the leader removes from the state, so that it returns to its size after topics come
//! and go: units of flows no member runs any more are retired, and units retired and owned by
//! nobody for `forget_retired_after` are forgotten.
//!
//! The wait is the leader's own observation (no clock in the state): a new leader starts it
//! over, which only delays forgetting. It protects the confirmed offset of a topic that comes
//! back soon (deselected by one reload and selected again by the next, or a discovery that
//! briefly missed it); one that comes back later resumes from what the downstream tail holds
//! (provenance), or from `initial_offset` without it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use replicator_model::WorkUnit;

use crate::command::ControlCommand;
use crate::format;
use crate::state::ControlState;

/// Most units one round forgets, so that one entry stays small whatever the churn.
const MAX_FORGOTTEN_PER_ROUND: usize = 1000;

/// The leader's view of which units became forgettable when.
#[derive(Debug, Clone, Default)]
pub(crate) struct Retention {
    /// Forgettable units, since when this leader has seen them so.
    since: BTreeMap<WorkUnit, Instant>,
}

impl Retention {
    /// Whether no unit is waiting to be forgotten: its rounds then depend on the state alone,
    /// not on the clock.
    pub(crate) fn is_idle(&self) -> bool {
        self.since.is_empty()
    }

    /// This round's commands: flows nobody runs reported empty (retiring their units), and the
    /// units forgettable for at least `after` forgotten (at feature level 2).
    pub(crate) fn round(
        &mut self,
        state: &ControlState,
        now: Instant,
        after: Duration,
    ) -> Vec<ControlCommand> {
        let mut out: Vec<ControlCommand> = state
            .flows_nobody_runs()
            .into_iter()
            .map(|flow| ControlCommand::ReportUnits {
                flow: flow.to_owned(),
                units: Vec::new(),
            })
            .collect();
        let mut since = BTreeMap::new();
        let mut due = Vec::new();
        for unit in state.forgettable_units() {
            let seen = self.since.get(unit).copied().unwrap_or(now);
            if now.saturating_duration_since(seen) >= after && due.len() < MAX_FORGOTTEN_PER_ROUND {
                due.push(unit.clone());
            }
            since.insert(unit.clone(), seen);
        }
        // Units no longer forgettable (reported again, granted) start over next time.
        self.since = since;
        if !due.is_empty() && state.feature_level() >= 2 {
            out.push(ControlCommand::ForgetUnits { units: due });
        }
        debug_assert!(out.iter().all(|c| c.level() <= format::SUPPORTED_LEVEL));
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use assert2::{check, let_assert};

    use super::*;

    fn unit(flow: &str, p: u32) -> WorkUnit {
        WorkUnit::new(flow, "s", "t", p)
    }

    /// Two members running flow `a` (published), units of `a` and of `gone`, at `level`.
    fn state(level: u32) -> ControlState {
        let mut s = ControlState::default();
        for node in [1, 2] {
            s.apply(
                node,
                &ControlCommand::RegisterMember {
                    node,
                    raft_addr: String::new(),
                    api_addr: String::new(),
                },
            );
            s.apply(
                3,
                &ControlCommand::PublishConfig {
                    node,
                    digests: BTreeMap::from([("a".to_owned(), "d".to_owned())]),
                },
            );
            s.apply(4, &ControlCommand::PublishFeatures { node, level });
        }
        s.apply(5, &ControlCommand::RaiseFeatureLevel { level });
        for flow in ["a", "gone"] {
            s.apply(
                6,
                &ControlCommand::ReportUnits {
                    flow: flow.into(),
                    units: vec![unit(flow, 0), unit(flow, 1)],
                },
            );
        }
        s
    }

    #[test]
    fn a_flow_no_member_runs_is_retired_then_forgotten_after_the_wait() {
        let mut s = state(2);
        let mut r = Retention::default();
        let t0 = Instant::now();
        let after = Duration::from_secs(60);
        let cmds = r.round(&s, t0, after);
        let_assert!([ControlCommand::ReportUnits { flow, units }] = cmds.as_slice());
        check!(flow == "gone" && units.is_empty());
        s.apply(7, &cmds[0]);
        check!(r.round(&s, t0, after).is_empty(), "retired just now");
        check!(r.round(&s, t0 + after / 2, after).is_empty());
        let cmds = r.round(&s, t0 + after, after);
        let_assert!([ControlCommand::ForgetUnits { units }] = cmds.as_slice());
        check!(units == &vec![unit("gone", 0), unit("gone", 1)]);
        s.apply(8, &cmds[0]);
        check!(s.units.keys().all(|u| u.flow == "a"));
        check!(r.round(&s, t0 + after * 2, after).is_empty());
    }

    #[test]
    fn a_unit_reported_again_before_the_wait_keeps_its_place() {
        let mut s = state(2);
        let mut r = Retention::default();
        let t0 = Instant::now();
        let after = Duration::from_secs(60);
        let report = |units| ControlCommand::ReportUnits {
            flow: "a".into(),
            units,
        };
        s.apply(7, &report(vec![unit("a", 0)]));
        r.round(&s, t0, after);
        s.apply(8, &report(vec![unit("a", 0), unit("a", 1)]));
        r.round(&s, t0 + after / 2, after);
        s.apply(9, &report(vec![unit("a", 0)]));
        // Retired again: the wait starts over.
        let cmds = r.round(&s, t0 + after, after);
        check!(!cmds
            .iter()
            .any(|c| matches!(c, ControlCommand::ForgetUnits { .. })));
    }

    #[test]
    fn owned_or_held_units_and_level_1_clusters_forget_nothing() {
        let mut s = state(1);
        let mut r = Retention::default();
        let t0 = Instant::now();
        s.apply(
            7,
            &ControlCommand::Grant {
                unit: unit("gone", 0),
                node: 1,
            },
        );
        let cmds = r.round(&s, t0, Duration::ZERO);
        // Retiring is level 1; forgetting is not.
        check!(cmds.len() == 1);
        s.apply(8, &cmds[0]);
        check!(r.round(&s, t0, Duration::ZERO).is_empty());

        let mut s = state(2);
        s.apply(
            7,
            &ControlCommand::Grant {
                unit: unit("gone", 0),
                node: 1,
            },
        );
        s.apply(8, &r.round(&s, t0, Duration::ZERO)[0]);
        let cmds = r.round(&s, t0, Duration::ZERO);
        let_assert!([ControlCommand::ForgetUnits { units }] = cmds.as_slice());
        check!(
            units == &vec![unit("gone", 1)],
            "the owned one stays until released"
        );
    }

    #[test]
    fn nothing_is_retired_while_a_member_has_not_published_its_config() {
        let mut s = state(2);
        s.apply(
            9,
            &ControlCommand::RegisterMember {
                node: 3,
                raft_addr: String::new(),
                api_addr: String::new(),
            },
        );
        check!(Retention::default()
            .round(&s, Instant::now(), Duration::ZERO)
            .is_empty());
    }
}
