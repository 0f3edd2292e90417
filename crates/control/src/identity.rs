//! The passwords of the writer identities (see [`WriterLogin`]): derived from the cluster
//! secret and the identity, never chosen at random and never stored.
//!
//! Why derived: a leader that provisions an identity and loses the answer of its commit (a
//! timeout, then an election) used to retry with another random password, so one incarnation
//! could end up with a user on a target whose password differed from the committed one, a
//! member that could never log in. A password that is a function of (secret, node,
//! incarnation) is the same whatever retries happen and whichever leader provisions it, and
//! it never travels in Raft entries or snapshots: every member computes it from the secret it
//! already holds.

use replicator_model::{NodeId, WriterLogin};
use ring::hmac;

use crate::params::ClusterSecret;

/// Derives writer passwords with HMAC-SHA256 keyed by the cluster secret (a pseudo-random
/// function: knowing some passwords tells nothing of the others, nor of the secret).
#[derive(Clone)]
pub(crate) struct WriterPasswords {
    key: hmac::Key,
}

impl std::fmt::Debug for WriterPasswords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WriterPasswords(****)")
    }
}

/// Separates these MACs from every other use of the secret (the RPC signatures sign messages
/// that start with a path).
const LABEL: &str = "iggy-replicator writer password v1";

impl WriterPasswords {
    pub(crate) fn new(secret: &ClusterSecret) -> Self {
        Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret.expose().as_bytes()),
        }
    }

    /// The password of `node`'s identity `incarnation`: 32 hex digits (128 bits; Iggy takes 3
    /// to 100 characters).
    pub(crate) fn password(&self, node: NodeId, incarnation: u64) -> String {
        let tag = hmac::sign(
            &self.key,
            format!("{LABEL}\n{node}\n{incarnation}").as_bytes(),
        );
        tag.as_ref()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The login of `node`'s identity `incarnation`; `stored` is the password an identity of
    /// an older leader was committed with (empty for a derived one).
    pub(crate) fn login(&self, node: NodeId, incarnation: u64, stored: &str) -> WriterLogin {
        let password = if stored.is_empty() {
            self.password(node, incarnation)
        } else {
            stored.to_owned()
        };
        WriterLogin {
            node,
            incarnation,
            password,
        }
    }
}

/// Passwords under a fixed secret, for tests and benches that need no real one.
#[cfg(any(test, feature = "bench"))]
pub(crate) fn test_passwords() -> WriterPasswords {
    WriterPasswords::new(&ClusterSecret::new("test-cluster-secret"))
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    #[test]
    fn one_identity_has_one_password_and_every_other_differs() {
        let a = WriterPasswords::new(&ClusterSecret::new("cluster-secret-0001"));
        let again = WriterPasswords::new(&ClusterSecret::new("cluster-secret-0001"));
        check!(a.password(2, 7) == again.password(2, 7));
        check!(a.password(2, 7).len() == 32);
        check!(a.password(2, 7) != a.password(2, 8));
        check!(a.password(2, 7) != a.password(3, 7));
        // "1\n23" and "12\n3" must not collide: the separator is in the message.
        check!(a.password(1, 23) != a.password(12, 3));
        let other = WriterPasswords::new(&ClusterSecret::new("cluster-secret-0002"));
        check!(a.password(2, 7) != other.password(2, 7));
        check!(!a.password(2, 7).contains("cluster-secret"));
    }

    #[test]
    fn a_stored_password_of_an_older_leader_is_kept() {
        let p = WriterPasswords::new(&ClusterSecret::new("cluster-secret-0001"));
        check!(p.login(2, 7, "legacy-random").password == "legacy-random");
        check!(p.login(2, 7, "").password == p.password(2, 7));
        check!(format!("{p:?}") == "WriterPasswords(****)");
    }
}

/// Which writer identity this process may write as.
///
/// A process must never write as an identity an earlier process of the same node may have
/// written with: that process's last sends can still be on their way (in the kernel's socket
/// buffer after a kill -9, delayed in the network, queued at a busy target), and a fence is
/// what makes Iggy refuse them. Found by the simulator (seeds 10 and 238): a node killed and
/// restarted within `fence_after` kept its identity and its grants, its new writers resumed
/// from the downstream tail, and the dead process's late batch landed after them, a duplicate.
///
/// So a starting process waits until it applied every entry an earlier process can have
/// applied, takes the identity it finds then as inherited, gives it up (`FenceMember`, as a
/// refused login does: its units move once each fenced target acknowledged the revoke, and
/// the leader provisions the next incarnation at once), and writes only as a later
/// incarnation. A node that had no identity inherits none.
///
/// Which entries an earlier process can have applied is bounded by the first entry this
/// process itself got committed (`wrote`): it was committed after this process started, so
/// everything an earlier process applied comes before it. The local log at start is not such
/// a bound on its own: a node restarted with an empty (wiped, or lost) data dir starts at 0,
/// and the leader may then replay the log from index 1, its predecessor's `SetWriterIdentity`
/// among the entries, which would otherwise count as an identity provisioned for this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inheritance {
    /// The last log index at process start.
    start_index: u64,
    /// The index of the first entry this process wrote that was committed.
    wrote: Option<u64>,
    /// Until decided: the node's incarnation after each applied entry that changed it, as
    /// (index, incarnation), oldest first (identities change rarely: a few at most).
    changes: Vec<(u64, Option<u64>)>,
    /// The last index observed applied.
    applied: u64,
    /// Decided once the log up to both bounds is applied: the incarnation as of the bound.
    inherited: Option<Option<u64>>,
}

impl Inheritance {
    /// A process whose log ended at `start_index` when it started.
    pub(crate) fn new(start_index: u64) -> Self {
        Self {
            start_index,
            wrote: None,
            changes: Vec::new(),
            applied: 0,
            inherited: None,
        }
    }

    /// An entry this process wrote was committed at `index` (only the first one counts).
    pub(crate) fn wrote(&mut self, index: u64) {
        self.wrote.get_or_insert(index);
        self.decide();
    }

    /// After applying up to `applied`, with the node's current identity `current`
    /// (incarnation, fenced). Called after every entry (and after a snapshot is installed,
    /// with its last index), so that the index at which each identity appeared is known: an
    /// identity that appeared after the bound was provisioned for this process, even when the
    /// bound and that identity were applied in one batch.
    pub(crate) fn observe(&mut self, applied: u64, current: Option<(u64, bool)>) {
        if self.inherited.is_some() {
            return;
        }
        let incarnation = current.map(|(incarnation, _)| incarnation);
        if self.changes.last().map(|(_, i)| *i) != Some(incarnation) {
            self.changes.push((applied, incarnation));
        }
        self.applied = self.applied.max(applied);
        self.decide();
    }

    /// Decides what was inherited once the log up to both bounds is applied: the identity
    /// the node had as of the bound.
    fn decide(&mut self) {
        let Some(wrote) = self.wrote else {
            return;
        };
        let bound = wrote.max(self.start_index);
        if self.inherited.is_some() || self.applied < bound {
            return;
        }
        let as_of_bound = self
            .changes
            .iter()
            .take_while(|(index, _)| *index <= bound)
            .last()
            .and_then(|(_, incarnation)| *incarnation);
        self.inherited = Some(as_of_bound);
        self.changes = Vec::new();
    }

    /// The incarnation this process may write as: the current one, unfenced, provisioned for
    /// this process (above any inherited one); `None` until the inheritance is decided.
    pub(crate) fn usable(&self, current: Option<(u64, bool)>) -> Option<u64> {
        let inherited = self.inherited?;
        current
            .filter(|(incarnation, fenced)| !fenced && Some(*incarnation) > inherited)
            .map(|(incarnation, _)| incarnation)
    }

    /// The inherited identity to give up: still current and not fenced.
    pub(crate) fn to_abandon(&self, current: Option<(u64, bool)>) -> Option<u64> {
        let inherited = self.inherited??;
        current
            .filter(|(incarnation, fenced)| !fenced && *incarnation == inherited)
            .map(|(incarnation, _)| incarnation)
    }
}

#[cfg(test)]
mod inheritance_tests {
    use super::Inheritance;

    #[test]
    fn a_first_start_writes_as_the_first_identity_it_gets() {
        let mut i = Inheritance::new(0);
        i.observe(0, None);
        // Its registration committed at 3, applied.
        i.wrote(3);
        i.observe(3, None);
        assert_eq!(i.usable(None), None);
        assert_eq!(i.to_abandon(Some((1, false))), None);
        assert_eq!(i.usable(Some((1, false))), Some(1));
    }

    #[test]
    fn a_restart_gives_up_the_identity_it_finds_and_waits_for_the_next() {
        let mut i = Inheritance::new(40);
        // Nothing is usable before the log the previous process had is applied.
        i.wrote(44);
        i.observe(12, Some((3, false)));
        assert_eq!(i.usable(Some((3, false))), None);
        assert_eq!(i.to_abandon(Some((3, false))), None);
        i.observe(44, Some((3, false)));
        assert_eq!(i.usable(Some((3, false))), None);
        assert_eq!(i.to_abandon(Some((3, false))), Some(3));
        // Fenced: nothing to give up, nothing usable; the next incarnation is.
        assert_eq!(i.to_abandon(Some((3, true))), None);
        assert_eq!(i.usable(Some((3, true))), None);
        assert_eq!(i.usable(Some((4, false))), Some(4));
        // Later observations change nothing.
        i.observe(90, Some((4, false)));
        assert_eq!(i.usable(Some((4, false))), Some(4));
    }

    #[test]
    fn an_identity_fenced_while_the_node_was_down_is_not_given_up_again() {
        let mut i = Inheritance::new(5);
        i.wrote(7);
        i.observe(7, Some((2, true)));
        assert_eq!(i.to_abandon(Some((2, true))), None);
        assert_eq!(i.usable(Some((3, false))), Some(3));
    }

    /// The first write of the process and the identity provisioned for it after that write
    /// are applied in one batch: the identity came after the bound, so it is this process's.
    #[test]
    fn an_identity_provisioned_after_the_first_write_is_usable_whatever_the_batches() {
        let mut i = Inheritance::new(10);
        i.observe(10, Some((1, true)));
        // Applied 11 (its renewal) and 12 (its next identity) before the renewal's answer.
        i.observe(11, Some((1, true)));
        i.observe(12, Some((2, false)));
        i.wrote(11);
        assert_eq!(i.to_abandon(Some((2, false))), None);
        assert_eq!(i.usable(Some((2, false))), Some(2));
    }

    /// A node restarted with an empty data dir in a young cluster: its log starts at 0, and
    /// the leader replays the whole log to it from index 1, its predecessor's identity 2
    /// (set at index 9) among the entries. That identity was never this process's.
    #[test]
    fn a_wiped_data_dir_does_not_inherit_an_identity_from_the_replayed_log() {
        let mut i = Inheritance::new(0);
        i.observe(0, None);
        // The replay reaches the predecessor's identity before this process wrote anything.
        i.observe(9, Some((2, false)));
        assert_eq!(i.usable(Some((2, false))), None);
        // This process's first renewal is committed at 31; the log up to it is applied.
        i.wrote(31);
        i.observe(31, Some((2, false)));
        assert_eq!(i.usable(Some((2, false))), None);
        assert_eq!(i.to_abandon(Some((2, false))), Some(2));
        // A later write moves no bound.
        i.wrote(40);
        assert_eq!(i.usable(Some((3, false))), Some(3));
    }
}
