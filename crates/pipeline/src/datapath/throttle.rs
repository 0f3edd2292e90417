//! Throttling of a flow (`flows[].max_messages_per_second`, `max_bytes_per_second`): a budget
//! for the whole replicator cluster, split among the instances by their share of the flow's
//! partitions (an instance that owns 4 of 16 partitions may copy a quarter), and rebalanced
//! whenever the assignment changes. Each instance keeps one rate limiter (the `governor`
//! crate's GCRA) per flow and limit, shared by the flow's writers there; a writer waits for its
//! batch's messages and bytes before it sends. One second of the share is the burst.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use replicator_model::Assignment;
use tokio::sync::watch;

/// This instance's part of a cluster-wide `limit` per second when it owns `owned` of the
/// flow's `total` partitions: proportional, at least 1 (a rate of zero would stop it for good;
/// a partition that just moved here must be able to go on).
pub(crate) fn instance_share(limit: u64, owned: usize, total: usize) -> u64 {
    if total == 0 || owned >= total {
        return limit.max(1);
    }
    let share = u128::from(limit) * owned as u128 / total as u128;
    u64::try_from(share).unwrap_or(u64::MAX).max(1)
}

/// Units of `flow` in `assignments` that are not on their way back.
fn owned_units(assignments: &[Assignment], flow: &str) -> usize {
    assignments
        .iter()
        .filter(|a| a.unit.flow == flow && !a.release_requested)
        .count()
}

/// One limit (messages or bytes per second) of one flow on this instance.
struct Limit {
    /// The cluster-wide limit.
    cluster: u64,
    /// The limiter for this instance's share, and the share it was built for.
    current: Mutex<(u64, Arc<DefaultDirectRateLimiter>)>,
}

impl Limit {
    fn new(cluster: u64) -> Self {
        Self {
            cluster,
            current: Mutex::new((cluster, limiter(cluster))),
        }
    }

    /// The limiter for `share` (rebuilt when the share changed).
    fn for_share(&self, share: u64) -> Arc<DefaultDirectRateLimiter> {
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.0 != share {
            *current = (share, limiter(share));
        }
        current.1.clone()
    }
}

/// A limiter of `per_second` cells per second with one second of burst.
fn limiter(per_second: u64) -> Arc<DefaultDirectRateLimiter> {
    let rate =
        NonZeroU32::new(u32::try_from(per_second).unwrap_or(u32::MAX)).unwrap_or(NonZeroU32::MIN);
    Arc::new(RateLimiter::direct(Quota::per_second(rate)))
}

/// Waits until `n` cells of `limiter` are available, taking them in bursts at most.
async fn take(limiter: &DefaultDirectRateLimiter, burst: u64, mut n: u64) {
    while n > 0 {
        let chunk = n.min(burst).min(u64::from(u32::MAX));
        let cells =
            NonZeroU32::new(u32::try_from(chunk).unwrap_or(u32::MAX)).unwrap_or(NonZeroU32::MIN);
        // `chunk` never exceeds the burst, so this cannot fail for lack of capacity.
        let _ = limiter.until_n_ready(cells).await;
        n -= chunk;
    }
}

/// A flow's limits on this instance (see the module docs); cheap to share among its writers.
pub(crate) struct FlowThrottle {
    flow: String,
    messages: Option<Limit>,
    bytes: Option<Limit>,
    /// The flow's assignments on this instance (see `FlowAssignments`), and how many units
    /// they held when last counted (recounted only when they changed: a wait costs no walk
    /// over the units).
    assignments: Mutex<(watch::Receiver<Arc<Vec<Assignment>>>, usize)>,
    /// The flow's partitions, as this instance's discovery last counted them.
    total: Arc<AtomicUsize>,
}

impl FlowThrottle {
    /// Limits of `flow` (`None`: unlimited); `None` when neither is set.
    pub(crate) fn new(
        flow: &str,
        max_messages_per_second: Option<u64>,
        max_bytes_per_second: Option<u64>,
        assignments: watch::Receiver<Arc<Vec<Assignment>>>,
        total: Arc<AtomicUsize>,
    ) -> Option<Arc<Self>> {
        if max_messages_per_second.is_none() && max_bytes_per_second.is_none() {
            return None;
        }
        let owned = owned_units(&assignments.borrow(), flow);
        Some(Arc::new(Self {
            flow: flow.to_owned(),
            messages: max_messages_per_second.map(Limit::new),
            bytes: max_bytes_per_second.map(Limit::new),
            assignments: Mutex::new((assignments, owned)),
            total,
        }))
    }

    /// Units of the flow this instance owns now.
    fn owned(&self) -> usize {
        let mut guard = self
            .assignments
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (assignments, owned) = &mut *guard;
        if assignments.has_changed().unwrap_or(false) {
            *owned = owned_units(&assignments.borrow_and_update(), &self.flow);
        }
        *owned
    }

    /// This instance's share of `limit` now.
    fn share(&self, limit: &Limit) -> u64 {
        let owned = self.owned();
        let total = self.total.load(Ordering::Relaxed).max(owned);
        instance_share(limit.cluster, owned, total)
    }

    /// Waits until a batch of `messages` messages and `bytes` bytes may be sent.
    pub(crate) async fn admit(&self, messages: u64, bytes: u64) {
        for (limit, n) in [(&self.messages, messages), (&self.bytes, bytes)] {
            if let Some(limit) = limit {
                let share = self.share(limit);
                take(&limit.for_share(share), share, n).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    #[test]
    fn the_budget_is_split_by_share_of_partitions() {
        check!(instance_share(1000, 4, 16) == 250);
        check!(instance_share(1000, 16, 16) == 1000);
        check!(instance_share(1000, 0, 16) == 1, "never zero");
        check!(instance_share(10, 1, 3) == 3);
        check!(
            instance_share(1000, 5, 0) == 1000,
            "nothing counted yet: all of it"
        );
        check!(instance_share(u64::MAX, 1, 2) == u64::MAX / 2);
    }

    #[test]
    fn the_share_follows_the_assignment() {
        use replicator_model::{Epoch, WorkUnit};
        let assigned = |n: u32| -> Arc<Vec<Assignment>> {
            Arc::new(
                (0..n)
                    .map(|p| Assignment {
                        unit: WorkUnit::new("f", "s", "t", p),
                        epoch: Epoch(1),
                        release_requested: false,
                    })
                    .collect(),
            )
        };
        let (tx, rx) = watch::channel(assigned(1));
        let total = Arc::new(AtomicUsize::new(4));
        let throttle = FlowThrottle::new("f", Some(1000), None, rx, total).expect("limited");
        let limit = throttle.messages.as_ref().expect("a message limit");
        check!(throttle.share(limit) == 250);
        tx.send_replace(assigned(4));
        check!(throttle.share(limit) == 1000);
        check!(FlowThrottle::new("f", None, None, tx.subscribe(), Arc::default()).is_none());
    }

    #[tokio::test]
    async fn a_limiter_admits_about_its_rate() {
        let limit = Limit::new(1000);
        let limiter = limit.for_share(1000);
        let started = std::time::Instant::now();
        // One second of burst, then 1000 more at 1000/s: about one second.
        take(&limiter, 1000, 2000).await;
        let took = started.elapsed();
        check!(took >= std::time::Duration::from_millis(900), "{took:?}");
    }
}
