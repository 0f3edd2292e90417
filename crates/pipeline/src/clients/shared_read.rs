//! One read for many callers: units that start at the same time (an instance starting, or
//! taking over a dead member's units) each need their topic's metadata, and a topic of 1,000
//! partitions would otherwise be asked for 1,000 times at once, each answer listing every
//! partition (about 100 KiB decoded). [`SharedReads`] lets the callers of one key share a
//! request.
//!
//! The rule that keeps it as fresh as a read of one's own: a caller takes only an answer to a
//! request that *started after it arrived*. A request already in flight when it arrives may
//! have been answered before whatever the caller is reacting to (a grant after a fence, say),
//! so it waits for that one to end and shares the next. At most one request per key is in
//! flight; everyone who arrived while it ran shares the one after it.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::watch;

/// Requests per key shared by the callers that arrive while one runs (see the module docs).
pub(crate) struct SharedReads<K, V> {
    keys: Mutex<HashMap<K, KeyState<V>>>,
}

struct KeyState<V> {
    /// Requests started so far for this key; a request's number is the count when it started.
    started: u64,
    /// Whether request `started` is running.
    in_flight: bool,
    /// The newest request that ended, and its answer (`None`: it failed).
    last: Option<(u64, Option<V>)>,
    /// Callers inside [`SharedReads::get`] for this key; the key is forgotten (with its
    /// answer) when the last one leaves.
    callers: usize,
    /// Bumped when a request ends (answered, failed or abandoned).
    ended: watch::Sender<u64>,
}

/// What a caller does next.
enum Step<V> {
    Answer(V),
    /// Run request `n` for everyone.
    Lead(u64),
    /// Wait for the running request to end.
    Wait(watch::Receiver<u64>),
    /// The request it would share failed: make one of its own (for its own error).
    Alone,
}

impl<K: Eq + Hash + Clone, V: Clone> Default for SharedReads<K, V> {
    fn default() -> Self {
        Self {
            keys: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone, V: Clone> SharedReads<K, V> {
    /// The answer of a `read` of `key` that started after this call: this caller's own, or
    /// one it shares with the callers of `key` that arrived while another was in flight.
    /// When the shared request fails, each caller reads alone and gets its own error.
    pub(crate) async fn get<E, F, Fut>(&self, key: &K, read: F) -> Result<V, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, E>>,
    {
        let floor = {
            let mut keys = self.lock();
            let state = keys.entry(key.clone()).or_insert_with(|| KeyState {
                started: 0,
                in_flight: false,
                last: None,
                callers: 0,
                ended: watch::channel(0).0,
            });
            state.callers += 1;
            // Every request numbered up to here started before this caller arrived.
            state.started
        };
        let _leave = Leave { reads: self, key };
        loop {
            match self.step(key, floor) {
                Step::Answer(value) => return Ok(value),
                Step::Alone => return read().await,
                Step::Wait(mut ended) => {
                    // The sender lives as long as the key, which this caller keeps.
                    let _ = ended.changed().await;
                }
                Step::Lead(n) => {
                    let mut lead = Lead {
                        reads: self,
                        key,
                        n,
                        answer: None,
                    };
                    let result = read().await;
                    lead.answer = Some(result.as_ref().ok().cloned());
                    return result;
                }
            }
        }
    }

    fn step(&self, key: &K, floor: u64) -> Step<V> {
        let mut keys = self.lock();
        let Some(state) = keys.get_mut(key) else {
            unreachable!("a key stays while it has callers");
        };
        match &state.last {
            Some((n, Some(value))) if *n > floor => return Step::Answer(value.clone()),
            Some((n, None)) if *n > floor => return Step::Alone,
            _ => {}
        }
        if state.in_flight {
            Step::Wait(state.ended.subscribe())
        } else {
            state.started += 1;
            state.in_flight = true;
            Step::Lead(state.started)
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, KeyState<V>>> {
        // A panic under this lock leaves the map consistent (every update is one assignment).
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keys with callers now (for tests).
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.lock().len()
    }
}

/// Ends request `n` when the leading caller is done with it, also when that caller is dropped
/// mid-request (its unit stopped): then nobody got an answer, and a waiter leads the next.
struct Lead<'a, K: Eq + Hash + Clone, V: Clone> {
    reads: &'a SharedReads<K, V>,
    key: &'a K,
    n: u64,
    /// `Some` once the request ended: its answer, `None` inside when it failed.
    answer: Option<Option<V>>,
}

impl<K: Eq + Hash + Clone, V: Clone> Drop for Lead<'_, K, V> {
    fn drop(&mut self) {
        let mut keys = self.reads.lock();
        if let Some(state) = keys.get_mut(self.key) {
            state.in_flight = false;
            if let Some(answer) = self.answer.take() {
                state.last = Some((self.n, answer));
            }
            state.ended.send_modify(|count| *count += 1);
        }
    }
}

/// Counts a caller out of its key, forgetting the key after the last one.
struct Leave<'a, K: Eq + Hash + Clone, V: Clone> {
    reads: &'a SharedReads<K, V>,
    key: &'a K,
}

impl<K: Eq + Hash + Clone, V: Clone> Drop for Leave<'_, K, V> {
    fn drop(&mut self) {
        let mut keys = self.reads.lock();
        if let Some(state) = keys.get_mut(self.key) {
            state.callers -= 1;
            if state.callers == 0 {
                keys.remove(self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use assert2::check;
    use tokio::sync::Semaphore;

    use super::*;

    /// A read whose answer is the number of reads started before it (1, 2, ...), held until
    /// `gate` lets it finish.
    async fn counted(reads: &AtomicU64, gate: &Semaphore) -> Result<u64, String> {
        let n = reads.fetch_add(1, Ordering::SeqCst) + 1;
        gate.acquire().await.map_err(|e| e.to_string())?.forget();
        Ok(n)
    }

    /// A caller of key "t" making a `counted` read when it leads, in a task of its own.
    fn spawn_counted(
        shared: &Arc<SharedReads<&'static str, u64>>,
        reads: &Arc<AtomicU64>,
        gate: &Arc<Semaphore>,
    ) -> tokio::task::JoinHandle<Result<u64, String>> {
        let (shared, reads, gate) = (shared.clone(), reads.clone(), gate.clone());
        tokio::spawn(async move { shared.get(&"t", || counted(&reads, &gate)).await })
    }

    /// Waits (bounded) until `cond` holds, yielding to the runtime in between.
    async fn until(cond: impl Fn() -> bool) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while !cond() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("condition never held");
    }

    #[tokio::test]
    async fn callers_arriving_during_a_read_share_the_next_one_not_the_running_one() {
        let shared = Arc::new(SharedReads::<&str, u64>::default());
        let reads = Arc::new(AtomicU64::new(0));
        let gate = Arc::new(Semaphore::new(0));
        // The first caller leads read 1.
        let first = spawn_counted(&shared, &reads, &gate);
        until(|| reads.load(Ordering::SeqCst) == 1).await;
        // Ten arrive while it runs: none may take read 1's answer.
        let late: Vec<_> = (0..10)
            .map(|_| spawn_counted(&shared, &reads, &gate))
            .collect();
        tokio::task::yield_now().await;
        gate.add_permits(1);
        check!(first.await.unwrap() == Ok(1));
        // One of them leads read 2 for all ten.
        until(|| reads.load(Ordering::SeqCst) == 2).await;
        gate.add_permits(1);
        for caller in late {
            check!(caller.await.unwrap() == Ok(2));
        }
        check!(reads.load(Ordering::SeqCst) == 2);
        check!(shared.keys() == 0);
    }

    #[tokio::test]
    async fn a_failed_read_makes_each_of_its_callers_read_alone() {
        let shared = Arc::new(SharedReads::<&str, u64>::default());
        let gate = Arc::new(Semaphore::new(0));
        let reads = Arc::new(AtomicU64::new(0));
        let fail = {
            let (shared, gate, reads) = (shared.clone(), gate.clone(), reads.clone());
            tokio::spawn(async move {
                shared
                    .get(&"t", || async {
                        reads.fetch_add(1, Ordering::SeqCst);
                        let _ = gate.acquire().await;
                        Err::<u64, _>("refused".to_owned())
                    })
                    .await
            })
        };
        until(|| reads.load(Ordering::SeqCst) == 1).await;
        let waiters: Vec<_> = (0..3)
            .map(|i| {
                let (shared, reads) = (shared.clone(), reads.clone());
                tokio::spawn(async move {
                    shared
                        .get(&"t", || async move {
                            reads.fetch_add(1, Ordering::SeqCst);
                            Err::<u64, _>(format!("own error {i}"))
                        })
                        .await
                })
            })
            .collect();
        // The waiters queue behind the failing read, then lead the next one (a success would
        // be shared; this one fails too, so each of its callers reads alone).
        tokio::task::yield_now().await;
        gate.add_permits(1);
        check!(fail.await.unwrap() == Err("refused".to_owned()));
        let mut errors = Vec::new();
        for w in waiters {
            errors.push(w.await.unwrap().unwrap_err());
        }
        errors.sort();
        check!(errors == vec!["own error 0", "own error 1", "own error 2"]);
        check!(shared.keys() == 0);
    }

    #[tokio::test]
    async fn a_leader_dropped_mid_read_hands_the_read_to_a_waiter() {
        let shared = Arc::new(SharedReads::<&str, u64>::default());
        let reads = Arc::new(AtomicU64::new(0));
        let gate = Arc::new(Semaphore::new(0));
        let leader = spawn_counted(&shared, &reads, &gate);
        until(|| reads.load(Ordering::SeqCst) == 1).await;
        let waiter = spawn_counted(&shared, &reads, &gate);
        tokio::task::yield_now().await;
        leader.abort();
        check!(leader.await.unwrap_err().is_cancelled());
        until(|| reads.load(Ordering::SeqCst) == 2).await;
        gate.add_permits(1);
        check!(waiter.await.unwrap() == Ok(2));
        check!(shared.keys() == 0);
    }

    #[tokio::test]
    async fn keys_do_not_share() {
        let shared = SharedReads::<&str, u64>::default();
        check!(shared.get(&"a", || async { Ok::<_, ()>(1) }).await == Ok(1));
        check!(shared.get(&"b", || async { Ok::<_, ()>(2) }).await == Ok(2));
        // Nothing is cached: a caller after the last one reads anew.
        check!(shared.get(&"a", || async { Ok::<_, ()>(3) }).await == Ok(3));
    }
}
