//! Writer identities: the Iggy user a node writes to a fenced target cluster as.

use std::fmt;

use crate::NodeId;

/// One incarnation of a node's writer identity, as the control plane hands it to the node.
///
/// On a target cluster with fencing on, every node writes as a user of its own, one per
/// *incarnation*: fencing a node takes the rights of its current incarnation away for good
/// (the leader revokes them on the target before it grants the node's units to others), and
/// the node writes again only as a new incarnation, created after the leader committed its
/// rejoin. A stale incarnation's user is never given rights back, so a request of the old
/// incarnation that is still in flight somewhere can never be appended.
#[derive(Clone, PartialEq, Eq)]
pub struct WriterLogin {
    /// The node this identity belongs to.
    pub node: NodeId,
    /// Increases with every identity the node is given; never reused.
    pub incarnation: u64,
    /// The user's password on every fenced target cluster (random, chosen by the leader).
    pub password: String,
}

impl WriterLogin {
    /// The user name on a target cluster whose writer users are named with `prefix`, e.g.
    /// `iggy-replicator-n2-i7`.
    #[must_use]
    pub fn username(&self, prefix: &str) -> String {
        writer_username(prefix, self.node, self.incarnation)
    }
}

/// The user name of `node`'s writer identity `incarnation` under `prefix`.
#[must_use]
pub fn writer_username(prefix: &str, node: NodeId, incarnation: u64) -> String {
    format!("{prefix}-n{node}-i{incarnation}")
}

/// Whether `name` is a writer identity's user name under `prefix` (as [`writer_username`]
/// makes them: `<prefix>-n<node>-i<incarnation>`).
#[must_use]
pub fn is_writer_username(prefix: &str, name: &str) -> bool {
    let Some(rest) = name.strip_prefix(prefix).and_then(|r| r.strip_prefix("-n")) else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    rest.split_once("-i")
        .is_some_and(|(node, incarnation)| digits(node) && digits(incarnation))
}

impl fmt::Debug for WriterLogin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriterLogin")
            .field("node", &self.node)
            .field("incarnation", &self.incarnation)
            .field("password", &"****")
            .finish()
    }
}

#[cfg(test)]
mod writer_name_tests {
    use super::*;

    #[test]
    fn writer_user_names_are_told_from_other_users_of_the_prefix() {
        assert!(is_writer_username(
            "demo-1",
            &writer_username("demo-1", 3, 12)
        ));
        assert!(!is_writer_username("demo-1", "demo-1-app"));
        assert!(!is_writer_username("demo-1", "demo-1-n3"));
        assert!(!is_writer_username("demo-1", "demo-1-nx-i2"));
        assert!(!is_writer_username("demo", "demo-1-n3-i2"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_node_and_incarnation_and_the_password_never_prints() {
        let login = WriterLogin {
            node: 2,
            incarnation: 7,
            password: "hunter2".into(),
        };
        assert_eq!(login.username("iggy-replicator"), "iggy-replicator-n2-i7");
        assert!(!format!("{login:?}").contains("hunter2"));
    }
}
