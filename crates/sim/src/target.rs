//! A simulated Iggy target cluster: partitions that append what a permitted user sends, users
//! whose rights are checked on every request (as Iggy checks a live session's permissions) and
//! at login, the cluster's configured credential that nobody revokes, a restart that may lose
//! what was acknowledged but not flushed, and the checks of what it accepted ("never two
//! writers", "exactly once, in order").

use std::collections::{BTreeMap, BTreeSet};

use replicator_model::{NodeId, WorkUnit};

use crate::schedule::Ms;

/// A writer user on the target: the identity (node, incarnation) it belongs to.
pub(crate) type Identity = (NodeId, u64);

/// Who a request is sent as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Credential {
    /// A writer identity's own user (fencing on for the target in the sender's config).
    Writer(Identity),
    /// The cluster's configured credential (fencing off), shared by every member: no revoke
    /// stops it, only the sender's lease does.
    Configured,
}

/// How often the target flushes what it acknowledged (what a restart may lose is newer).
const FLUSH_EVERY: Ms = 200;

/// One writer user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct User {
    /// Send and poll rights on the flows' streams; taken away by a revoke.
    rights: bool,
}

/// One downstream message: the upstream offset it copies and the writer session that sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Copy {
    pub(crate) upstream: u64,
    pub(crate) session: u64,
}

/// One downstream partition.
#[derive(Debug, Default)]
struct Partition {
    messages: Vec<Copy>,
    /// Messages flushed (a restart with loss keeps these).
    flushed: usize,
    /// The most messages it ever held (a confirmed offset never exceeds what was acknowledged).
    high_water: usize,
    /// The sessions that appended, in order of their first append, and the last one.
    sessions: Vec<u64>,
}

/// Why the target refused or failed a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Down (connection refused, or the session was dropped by a restart).
    Down,
    /// The user is missing, inactive or has no rights (Iggy's permission checks).
    Denied,
}

/// A broken invariant at the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Violation {
    /// A session appended again after another session had appended (two writers).
    TwoWriters { unit: WorkUnit, session: u64 },
    /// An append that is not the next upstream offset (a duplicate or a hole).
    NotNext {
        unit: WorkUnit,
        expected: u64,
        got: u64,
    },
}

/// One target cluster.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) up: bool,
    /// Answers a send with where it landed, as an Iggy 0.9 server does (0.8 answers nothing).
    pub(crate) confirms: bool,
    users: BTreeMap<Identity, User>,
    /// Identities whose login this target refused at least once.
    refused_logins: BTreeSet<Identity>,
    partitions: BTreeMap<WorkUnit, Partition>,
    next_flush: Ms,
}

impl Target {
    pub(crate) fn new(
        name: &str,
        confirms: bool,
        units: impl IntoIterator<Item = WorkUnit>,
    ) -> Self {
        Self {
            name: name.to_owned(),
            up: true,
            confirms,
            users: BTreeMap::new(),
            refused_logins: BTreeSet::new(),
            partitions: units
                .into_iter()
                .map(|u| (u, Partition::default()))
                .collect(),
            next_flush: FLUSH_EVERY,
        }
    }

    /// Flushes every partition when due.
    pub(crate) fn tick(&mut self, now: Ms) {
        if now >= self.next_flush && self.up {
            for p in self.partitions.values_mut() {
                p.flushed = p.messages.len();
            }
            self.next_flush = now + FLUSH_EVERY;
        }
    }

    /// Goes down; with `lose_tail`, what was not flushed is gone when it comes back.
    pub(crate) fn go_down(&mut self, lose_tail: bool) {
        self.up = false;
        if lose_tail {
            for p in self.partitions.values_mut() {
                p.messages.truncate(p.flushed);
            }
        }
    }

    fn permitted(&self, who: Credential) -> Result<(), Refusal> {
        if !self.up {
            return Err(Refusal::Down);
        }
        match who {
            Credential::Configured => Ok(()),
            Credential::Writer(identity) => match self.users.get(&identity) {
                Some(u) if u.rights => Ok(()),
                _ => Err(Refusal::Denied),
            },
        }
    }

    /// A new connection logging in as a writer identity: refused when its user is missing or
    /// revoked (inactive), as Iggy refuses the credentials. Refusals are remembered.
    pub(crate) fn login(&mut self, who: Identity) -> Result<(), Refusal> {
        let verdict = self.permitted(Credential::Writer(who));
        if verdict == Err(Refusal::Denied) {
            self.refused_logins.insert(who);
        }
        verdict
    }

    /// Whether this target ever refused a login of `who`.
    pub(crate) fn refused_login(&self, who: Identity) -> bool {
        self.refused_logins.contains(&who)
    }

    /// The leader's `ensure`: creates the user with rights unless a user of that name exists
    /// (never changes an existing one).
    pub(crate) fn ensure(&mut self, who: Identity) -> Result<(), Refusal> {
        if !self.up {
            return Err(Refusal::Down);
        }
        self.users.entry(who).or_insert(User { rights: true });
        Ok(())
    }

    /// The leader's `revoke`: no rights, inactive; created that way if missing.
    pub(crate) fn revoke(&mut self, who: Identity) -> Result<(), Refusal> {
        if !self.up {
            return Err(Refusal::Down);
        }
        self.users.insert(who, User { rights: false });
        Ok(())
    }

    /// A page of the partition for the tail scan, read as `who`: `last` newest messages, or
    /// `count` from `from` on. Each entry: (downstream offset, upstream offset).
    pub(crate) fn read(
        &self,
        who: Credential,
        unit: &WorkUnit,
        from: Option<u64>,
        count: u32,
    ) -> Result<Vec<(u64, u64)>, Refusal> {
        self.permitted(who)?;
        let p = &self.partitions[unit];
        let len = p.messages.len() as u64;
        let start = match from {
            Some(offset) => offset.min(len),
            None => len.saturating_sub(u64::from(count)),
        };
        let end = (start + u64::from(count)).min(len);
        Ok((start..end)
            .map(|o| (o, p.messages[o as usize].upstream))
            .collect())
    }

    /// The partition's next offset, read as `who`.
    pub(crate) fn next_offset(&self, who: Credential, unit: &WorkUnit) -> Result<u64, Refusal> {
        self.permitted(who)?;
        Ok(self.partitions[unit].messages.len() as u64)
    }

    /// A send arriving: appended if `who` may send; the offset its first message got. Checks
    /// the invariants on what it accepts.
    pub(crate) fn append(
        &mut self,
        who: Credential,
        unit: &WorkUnit,
        session: u64,
        upstream: &[u64],
    ) -> Result<Result<u64, Violation>, Refusal> {
        self.permitted(who)?;
        let p = self.partitions.get_mut(unit).expect("known unit");
        let base = p.messages.len() as u64;
        let mut verdict = Ok(());
        if p.sessions.last() != Some(&session) {
            if p.sessions.contains(&session) {
                verdict = Err(Violation::TwoWriters {
                    unit: unit.clone(),
                    session,
                });
            }
            p.sessions.push(session);
        }
        for &up in upstream {
            let expected = p.messages.last().map_or(0, |c| c.upstream + 1);
            if up != expected && verdict.is_ok() {
                verdict = Err(Violation::NotNext {
                    unit: unit.clone(),
                    expected,
                    got: up,
                });
            }
            p.messages.push(Copy {
                upstream: up,
                session,
            });
        }
        p.high_water = p.high_water.max(p.messages.len());
        Ok(verdict.map(|()| base))
    }

    /// What an observer (not a writer) sees: the partition's messages.
    pub(crate) fn copies(&self, unit: &WorkUnit) -> &[Copy] {
        &self.partitions[unit].messages
    }

    /// The most messages the partition ever held.
    pub(crate) fn high_water(&self, unit: &WorkUnit) -> usize {
        self.partitions[unit].high_water
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit() -> WorkUnit {
        WorkUnit::new("f", "s", "t", 0)
    }

    fn writer(node: NodeId, incarnation: u64) -> Credential {
        Credential::Writer((node, incarnation))
    }

    #[test]
    fn a_revoked_user_is_refused_and_a_late_ensure_does_not_give_rights_back() {
        let mut t = Target::new("t", false, [unit()]);
        t.ensure((1, 1)).unwrap();
        assert_eq!(t.append(writer(1, 1), &unit(), 7, &[0]), Ok(Ok(0)));
        t.revoke((1, 1)).unwrap();
        assert_eq!(
            t.append(writer(1, 1), &unit(), 7, &[1]),
            Err(Refusal::Denied)
        );
        t.ensure((1, 1)).unwrap();
        assert_eq!(
            t.read(writer(1, 1), &unit(), None, 10),
            Err(Refusal::Denied)
        );
        // A revoke of a user that never existed leaves it without rights.
        t.revoke((2, 1)).unwrap();
        t.ensure((2, 1)).unwrap();
        assert_eq!(t.next_offset(writer(2, 1), &unit()), Err(Refusal::Denied));
    }

    #[test]
    fn a_revoked_identity_is_refused_at_login_and_the_configured_credential_never_is() {
        let mut t = Target::new("t", false, [unit()]);
        t.ensure((1, 1)).unwrap();
        assert_eq!(t.login((1, 1)), Ok(()));
        assert_eq!(t.login((1, 2)), Err(Refusal::Denied));
        t.revoke((1, 1)).unwrap();
        assert_eq!(t.login((1, 1)), Err(Refusal::Denied));
        assert!(t.refused_login((1, 1)) && t.refused_login((1, 2)));
        assert!(!t.refused_login((2, 1)));
        assert_eq!(
            t.append(Credential::Configured, &unit(), 3, &[0]),
            Ok(Ok(0))
        );
        t.go_down(false);
        assert_eq!(t.login((2, 1)), Err(Refusal::Down));
        assert!(!t.refused_login((2, 1)));
    }

    #[test]
    fn duplicates_holes_and_interleaved_writers_are_caught() {
        let mut t = Target::new("t", false, [unit()]);
        t.ensure((1, 1)).unwrap();
        assert_eq!(t.append(writer(1, 1), &unit(), 1, &[0, 1]), Ok(Ok(0)));
        assert!(matches!(
            t.append(writer(1, 1), &unit(), 2, &[1]),
            Ok(Err(Violation::NotNext {
                expected: 2,
                got: 1,
                ..
            }))
        ));
        assert!(matches!(
            t.append(writer(1, 1), &unit(), 1, &[3]),
            Ok(Err(Violation::TwoWriters { session: 1, .. }))
        ));
    }

    #[test]
    fn a_restart_with_loss_keeps_only_what_was_flushed() {
        let mut t = Target::new("t", false, [unit()]);
        t.ensure((1, 1)).unwrap();
        t.append(writer(1, 1), &unit(), 1, &[0, 1])
            .unwrap()
            .unwrap();
        t.tick(FLUSH_EVERY);
        t.append(writer(1, 1), &unit(), 1, &[2]).unwrap().unwrap();
        t.go_down(true);
        assert_eq!(t.read(writer(1, 1), &unit(), None, 10), Err(Refusal::Down));
        t.up = true;
        assert_eq!(
            t.read(writer(1, 1), &unit(), None, 10),
            Ok(vec![(0, 0), (1, 1)])
        );
        assert_eq!(t.high_water(&unit()), 3);
    }
}
