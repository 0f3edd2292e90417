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
#[doc(hidden)]
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
