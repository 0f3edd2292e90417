//! Residency policies at runtime: which topics a flow must not write to its target because a
//! policy keeps them in zones the target is not in, and the record of those topics that status
//! and metrics show.
//!
//! [`Residency`] is the pure decision, compiled once per flow at start from the policies that
//! forbid the flow's target (`replicator_model::zones_allow`). Every place that could write a
//! topic downstream asks it: discovery (through `Selector::choose`: a blocked topic is never
//! created downstream and gets no units), the coordinator (a unit of a blocked topic, left
//! from before the policy, is never started), the consumer-group sync (never joins or stores a
//! group on a blocked topic) and the heartbeat task (never started when its topic is blocked;
//! the config refuses that case, see `replicator-config`). [`BlockedTopics`] keeps what they
//! found per flow and logs each blocked topic once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use globset::GlobSet;
use replicator_model::{zones_allow, WorkUnit};

use super::globs::build_globs;
use crate::params::PolicyParams;

/// The policies that forbid one flow's target, compiled: decides per upstream `stream/topic`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Residency {
    /// Name and compiled `select` of each policy whose allowed zones miss the target's, in
    /// config order.
    forbidding: Vec<(String, GlobSet)>,
}

impl Residency {
    /// The residency of a flow whose target is in `target_zones`. On error returns the field
    /// (`policies[1].select[0]`) and the reason.
    pub(crate) fn new(
        policies: &[PolicyParams],
        target_zones: &[String],
    ) -> Result<Self, (String, String)> {
        let mut forbidding = Vec::new();
        for (index, policy) in policies.iter().enumerate() {
            // Compile every policy, also those that allow the target: a bad glob is an error
            // whichever target this flow has.
            let select = build_globs("select", &policy.select)
                .map_err(|(field, reason)| (format!("policies[{index}].{field}"), reason))?;
            if !zones_allow(&policy.allowed_zones, target_zones) {
                forbidding.push((policy.name.clone(), select));
            }
        }
        Ok(Self { forbidding })
    }

    /// The name of the first policy (in config order) that keeps `stream/topic` from the
    /// target; `None` when the flow may write it there.
    pub(crate) fn blocked_by(&self, stream: &str, topic: &str) -> Option<&str> {
        if self.forbidding.is_empty() {
            return None;
        }
        let path = format!("{stream}/{topic}");
        self.forbidding
            .iter()
            .find(|(_, select)| select.is_match(&path))
            .map(|(name, _)| name.as_str())
    }

    /// Leaves out of `units` those of blocked topics.
    pub(crate) fn retain_allowed(&self, units: &mut Vec<WorkUnit>) {
        units.retain(|u| self.blocked_by(&u.stream, &u.topic).is_none());
    }
}

/// A topic a residency policy keeps from a flow's target.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct BlockedTopic {
    /// Upstream stream (for a heartbeat topic: the stream on the target).
    pub stream: String,
    /// Topic.
    pub topic: String,
    /// The policy that forbids it (the first in config order that does).
    pub policy: String,
    /// Whether it is the flow's heartbeat topic (no heartbeats are written) rather than an
    /// upstream topic (not copied).
    pub heartbeat: bool,
}

/// One flow's blocked topics on this node, for status and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowResidency {
    /// The flow.
    pub flow: String,
    /// The flow's target cluster alias.
    pub target: String,
    /// The topics the policies keep from the target: the upstream topics the latest discovery
    /// round found selected but forbidden, and the heartbeat topic if it is forbidden.
    pub blocked: Vec<BlockedTopic>,
}

/// The blocked topics of every flow of this node (a cheap handle: clone it).
#[derive(Debug, Clone, Default)]
pub(crate) struct BlockedTopics(Arc<Mutex<BTreeMap<String, FlowResidency>>>);

impl BlockedTopics {
    /// A record of `flows` (name, target), none blocked yet.
    pub(crate) fn new<'a>(flows: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let flows = flows
            .into_iter()
            .map(|(flow, target)| {
                let state = FlowResidency {
                    flow: flow.to_owned(),
                    target: target.to_owned(),
                    blocked: Vec::new(),
                };
                (flow.to_owned(), state)
            })
            .collect();
        Self(Arc::new(Mutex::new(flows)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, FlowResidency>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A discovery round of `flow` found exactly `topics` (upstream, sorted) selected but
    /// blocked: they replace the round before's, and each one that was not blocked then is
    /// logged (once per topic while it stays blocked, not once per round).
    pub(crate) fn discovered(&self, flow: &str, topics: Vec<BlockedTopic>) {
        let mut flows = self.lock();
        let Some(state) = flows.get_mut(flow) else {
            return;
        };
        let (heartbeat, before): (Vec<_>, Vec<_>) = std::mem::take(&mut state.blocked)
            .into_iter()
            .partition(|b| b.heartbeat);
        for new in newly_blocked(&before, &topics) {
            log_blocked(state, new);
        }
        state.blocked = heartbeat;
        state.blocked.extend(topics);
    }

    /// The heartbeat topic `stream/topic` of `flow` is blocked by `policy`: logged, and no
    /// heartbeats are written.
    pub(crate) fn heartbeat_blocked(&self, flow: &str, stream: &str, topic: &str, policy: &str) {
        let mut flows = self.lock();
        let Some(state) = flows.get_mut(flow) else {
            return;
        };
        let blocked = BlockedTopic {
            stream: stream.to_owned(),
            topic: topic.to_owned(),
            policy: policy.to_owned(),
            heartbeat: true,
        };
        if !state.blocked.contains(&blocked) {
            log_blocked(state, &blocked);
            state.blocked.insert(0, blocked);
        }
    }

    /// Every flow's blocked topics, by flow name (flows with none included).
    pub(crate) fn snapshot(&self) -> Vec<FlowResidency> {
        self.lock().values().cloned().collect()
    }
}

/// The topics of `now` that `before` did not hold (both sorted).
fn newly_blocked<'a>(before: &[BlockedTopic], now: &'a [BlockedTopic]) -> Vec<&'a BlockedTopic> {
    now.iter()
        .filter(|b| before.binary_search(b).is_err())
        .collect()
}

/// The one event of a blocked topic.
fn log_blocked(state: &FlowResidency, blocked: &BlockedTopic) {
    let what = if blocked.heartbeat {
        "heartbeat topic forbidden on the target by a residency policy: no heartbeats written"
    } else {
        "topic not copied: a residency policy forbids it on the target"
    };
    tracing::info!(
        flow = %state.flow,
        stream = %blocked.stream,
        topic = %blocked.topic,
        policy = %blocked.policy,
        target = %state.target,
        "{what}"
    );
}

#[cfg(test)]
mod tests {
    use assert2::{assert, check};

    use super::*;

    fn policy(name: &str, select: &[&str], allowed_zones: &[&str]) -> PolicyParams {
        PolicyParams {
            name: name.to_owned(),
            select: select.iter().map(|s| (*s).to_owned()).collect(),
            allowed_zones: allowed_zones.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn zones(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn blocked(stream: &str, topic: &str, policy: &str) -> BlockedTopic {
        BlockedTopic {
            stream: stream.to_owned(),
            topic: topic.to_owned(),
            policy: policy.to_owned(),
            heartbeat: false,
        }
    }

    #[test]
    fn a_policy_blocks_its_topics_only_on_targets_outside_its_zones() -> Result<(), String> {
        let policies = [policy("pii-stays-in-eu", &["pii-*/*"], &["eu"])];
        let us = Residency::new(&policies, &zones(&["us"])).map_err(|e| e.1)?;
        check!(us.blocked_by("pii-users", "events") == Some("pii-stays-in-eu"));
        check!(us.blocked_by("orders", "created") == None);
        // `*` does not cross `/`: the policy selects streams `pii-*` only.
        check!(us.blocked_by("pii", "users") == None);
        let eu = Residency::new(&policies, &zones(&["eu", "eu-west-1"])).map_err(|e| e.1)?;
        check!(eu.blocked_by("pii-users", "events") == None);
        // A target in no zone is outside every policy's zones.
        let nowhere = Residency::new(&policies, &[]).map_err(|e| e.1)?;
        check!(nowhere.blocked_by("pii-users", "events") == Some("pii-stays-in-eu"));
        Ok(())
    }

    #[test]
    fn the_first_forbidding_policy_in_config_order_is_named() -> Result<(), String> {
        let policies = [
            policy("allows-us", &["*/*"], &["us"]),
            policy("pii", &["pii-*/*"], &["eu"]),
            policy("all", &["*/*"], &["eu"]),
        ];
        let us = Residency::new(&policies, &zones(&["us"])).map_err(|e| e.1)?;
        check!(us.blocked_by("pii-a", "t") == Some("pii"));
        check!(us.blocked_by("orders", "t") == Some("all"));
        Ok(())
    }

    #[test]
    fn no_policies_block_nothing_and_a_bad_glob_names_its_field() {
        let none = Residency::default();
        check!(none.blocked_by("pii-users", "events") == None);
        let policies = [
            policy("ok", &["a/*"], &["eu"]),
            policy("bad", &["b/*", "b/[x"], &["us"]),
        ];
        // Reported even though `bad` allows this target.
        let error = Residency::new(&policies, &zones(&["us"])).map(|_| ());
        check!(matches!(error, Err((field, _)) if field == "policies[1].select[1]"));
    }

    #[test]
    fn units_of_blocked_topics_are_left_out() -> Result<(), String> {
        let us = Residency::new(&[policy("pii", &["pii-*/*"], &["eu"])], &zones(&["us"]))
            .map_err(|e| e.1)?;
        let mut units = vec![
            WorkUnit::new("f", "pii-users", "events", 0),
            WorkUnit::new("f", "orders", "created", 0),
            WorkUnit::new("f", "pii-users", "events", 1),
        ];
        us.retain_allowed(&mut units);
        check!(units == [WorkUnit::new("f", "orders", "created", 0)]);
        Ok(())
    }

    #[test]
    fn only_topics_not_blocked_before_are_new() {
        let a = blocked("pii-a", "t", "p");
        let b = blocked("pii-b", "t", "p");
        let c = blocked("pii-c", "t", "p");
        check!(newly_blocked(&[], std::slice::from_ref(&a)) == [&a]);
        check!(newly_blocked(&[a.clone(), b.clone()], &[a.clone(), b.clone()]).is_empty());
        check!(newly_blocked(&[a.clone(), c.clone()], &[b.clone(), c.clone()]) == [&b]);
        // Blocked again after it was gone: new again.
        check!(newly_blocked(std::slice::from_ref(&b), &[a.clone(), b.clone()]) == [&a]);
    }

    #[test]
    fn a_discovery_round_replaces_the_upstream_topics_and_keeps_the_heartbeat() {
        let record = BlockedTopics::new([("f", "us"), ("g", "eu")]);
        record.heartbeat_blocked("f", "replicator", "heartbeats", "ops");
        record.heartbeat_blocked("f", "replicator", "heartbeats", "ops");
        record.discovered("f", vec![blocked("pii-a", "t", "p")]);
        record.discovered("f", vec![blocked("pii-b", "t", "p")]);
        // An unknown flow is ignored.
        record.discovered("h", vec![blocked("pii-b", "t", "p")]);
        let snapshot = record.snapshot();
        assert!(snapshot.len() == 2);
        check!(snapshot[0].flow == "f");
        check!(snapshot[0].target == "us");
        let names: Vec<(&str, bool)> = snapshot[0]
            .blocked
            .iter()
            .map(|b| (b.stream.as_str(), b.heartbeat))
            .collect();
        check!(names == [("replicator", true), ("pii-b", false)]);
        check!(snapshot[1].blocked.is_empty());
    }
}
