//! Whether two flows could write the same downstream topic.
//!
//! A flow copies the upstream topics its globs select (`stream/topic`, include minus exclude)
//! to downstream topics named by its naming (`<stream>/<topic>`, or `<source>.<stream>/<topic>`
//! with the `prefix` naming). Two flows between the same clusters that can write the same
//! downstream topic corrupt each other's resume: the provenance headers name the source
//! cluster and the upstream topic, not the flow, so each flow takes the other's copies for its
//! own. This module decides it exactly, on the same regular expressions `globset` matches
//! names with (what the pipeline's `Selector` uses): it searches the product of the flows'
//! automata for a downstream name both could write, and reports the shortest one found. A
//! search too large to finish counts as an overlap.

use std::collections::{HashMap, VecDeque};

use regex_automata::hybrid::dfa::{Cache, DFA};
use regex_automata::hybrid::LazyStateID;
use regex_automata::util::{start, syntax};
use regex_automata::{Anchored, MatchKind};

/// Most product states searched before the answer counts as "may overlap".
const MAX_STATES: usize = 100_000;
/// Lazy DFA cache per automaton; a search that would clear it counts as "may overlap".
const CACHE_BYTES: usize = 4 << 20;

/// What one flow writes downstream, as far as names go.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Selection<'a> {
    /// Prepended to every upstream `stream/topic` (`"<source>."` with the `prefix` naming).
    pub(crate) prefix: &'a str,
    /// Include globs on `stream/topic`.
    pub(crate) include: &'a [String],
    /// Exclude globs on `stream/topic`.
    pub(crate) exclude: &'a [String],
}

/// The answer for two selections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Overlap {
    /// No downstream name is written by both.
    Disjoint,
    /// Both write this downstream `stream/topic` (the shortest such name).
    Shared(String),
    /// The search was too large to finish: they may overlap.
    Undecided,
    /// A glob does not compile (reported on its own key).
    Invalid,
}

/// Whether `a` and `b` can write the same downstream name.
pub(crate) fn overlap(a: &Selection<'_>, b: &Selection<'_>) -> Overlap {
    // No include selects nothing.
    if a.include.is_empty() || b.include.is_empty() {
        return Overlap::Disjoint;
    }
    let (Some(mut a), Some(mut b), Some(names)) = (Side::new(a), Side::new(b), names()) else {
        return Overlap::Invalid;
    };
    let mut names = Machine::new(names);
    search(&mut a, &mut b, &mut names)
}

/// A lazy DFA and its cache.
struct Machine {
    dfa: DFA,
    cache: Cache,
}

impl Machine {
    fn new(dfa: DFA) -> Self {
        let cache = dfa.create_cache();
        Self { dfa, cache }
    }

    fn start(&mut self) -> Option<LazyStateID> {
        let config = start::Config::new().anchored(Anchored::Yes);
        self.dfa.start_state(&mut self.cache, &config).ok()
    }

    fn next(&mut self, state: LazyStateID, byte: u8) -> Option<LazyStateID> {
        self.dfa.next_state(&mut self.cache, state, byte).ok()
    }

    /// Whether the input that led to `state` matches as a whole.
    fn accepts(&mut self, state: LazyStateID) -> Option<bool> {
        let end = self.dfa.next_eoi_state(&mut self.cache, state).ok()?;
        Some(end.is_match())
    }

    fn cleared(&self) -> bool {
        self.cache.clear_count() > 0
    }
}

/// Builds one automaton matching any of `patterns` (regular expressions) as a whole.
fn dfa(patterns: &[String], utf8: bool) -> Option<DFA> {
    DFA::builder()
        .configure(
            DFA::config()
                .match_kind(MatchKind::All)
                .cache_capacity(CACHE_BYTES),
        )
        .syntax(syntax::Config::new().utf8(utf8).dot_matches_new_line(true))
        .build_many(patterns)
        .ok()
}

/// What can be a name at all: UTF-8, a stream and a topic that are not empty.
fn names() -> Option<DFA> {
    dfa(&["(?s)^.+/.+$".to_owned()], true)
}

/// The regular expression `globset` matches `pattern` with (as the pipeline compiles it:
/// `*` and `?` do not match `/`).
fn glob_regex(pattern: &str) -> Option<String> {
    let glob = globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .ok()?;
    Some(glob.regex().to_owned())
}

/// One flow's automata: its prefix, then its includes minus its excludes.
struct Side {
    prefix: Vec<u8>,
    include: Machine,
    /// `None` without excludes.
    exclude: Option<Machine>,
}

impl Side {
    fn new(selection: &Selection<'_>) -> Option<Self> {
        let regexes = |globs: &[String]| -> Option<Vec<String>> {
            globs.iter().map(|g| glob_regex(g)).collect()
        };
        let include = regexes(selection.include)?;
        let exclude = regexes(selection.exclude)?;
        Some(Self {
            prefix: selection.prefix.as_bytes().to_vec(),
            include: Machine::new(dfa(&include, false)?),
            exclude: if exclude.is_empty() {
                None
            } else {
                Some(Machine::new(dfa(&exclude, false)?))
            },
        })
    }

    /// The state before any input.
    fn start(&mut self) -> Option<SideState> {
        if self.prefix.is_empty() {
            self.body_start()
        } else {
            Some(SideState::Prefix(0))
        }
    }

    fn body_start(&mut self) -> Option<SideState> {
        let include = self.include.start()?;
        let exclude = match &mut self.exclude {
            Some(m) => Some(m.start()?),
            None => None,
        };
        Some(SideState::Body { include, exclude })
    }

    /// The state after `byte`; `Some(None)` when no name of this side continues so.
    fn next(&mut self, state: SideState, byte: u8) -> Option<Option<SideState>> {
        match state {
            SideState::Prefix(at) if self.prefix[at] != byte => Some(None),
            SideState::Prefix(at) if at + 1 == self.prefix.len() => self.body_start().map(Some),
            SideState::Prefix(at) => Some(Some(SideState::Prefix(at + 1))),
            SideState::Body { include, exclude } => {
                let include = self.include.next(include, byte)?;
                if include.is_dead() {
                    return Some(None);
                }
                let exclude = match (&mut self.exclude, exclude) {
                    (Some(m), Some(e)) => Some(m.next(e, byte)?),
                    _ => None,
                };
                Some(Some(SideState::Body { include, exclude }))
            }
        }
    }

    /// Whether the input that led to `state` is a name this side writes.
    fn accepts(&mut self, state: SideState) -> Option<bool> {
        let SideState::Body { include, exclude } = state else {
            return Some(false);
        };
        if !self.include.accepts(include)? {
            return Some(false);
        }
        match (&mut self.exclude, exclude) {
            (Some(m), Some(e)) => Some(!m.accepts(e)?),
            _ => Some(true),
        }
    }

    fn cleared(&self) -> bool {
        self.include.cleared() || self.exclude.as_ref().is_some_and(Machine::cleared)
    }
}

/// Where one side stands after some input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum SideState {
    /// Inside the prefix, this many bytes matched.
    Prefix(usize),
    /// Past the prefix.
    Body {
        include: LazyStateID,
        exclude: Option<LazyStateID>,
    },
}

/// A product state of the search.
type State = (SideState, SideState, LazyStateID);

/// Breadth-first search of the product automaton for a name both sides accept (the shortest,
/// with letters and digits tried first, so that the example reads well).
fn search(a: &mut Side, b: &mut Side, names: &mut Machine) -> Overlap {
    let bytes: Vec<u8> = (b'a'..=b'z')
        .chain(b'0'..=b'9')
        .chain(b'A'..=b'Z')
        .chain(b"/.-_".iter().copied())
        .chain((0..=255).filter(|c: &u8| !c.is_ascii_alphanumeric() && !b"/.-_".contains(c)))
        .collect();
    let Some(first) = (|| Some((a.start()?, b.start()?, names.start()?)))() else {
        return Overlap::Undecided;
    };
    // Every state seen, with how it was reached (parent index and byte).
    let mut seen: HashMap<State, usize> = HashMap::from([(first, 0)]);
    let mut trail: Vec<(Option<usize>, u8)> = vec![(None, 0)];
    let mut queue: VecDeque<(State, usize)> = VecDeque::from([(first, 0)]);
    while let Some(((sa, sb, su), index)) = queue.pop_front() {
        let accepted = (|| Some(a.accepts(sa)? && b.accepts(sb)? && names.accepts(su)?))();
        match accepted {
            None => return Overlap::Undecided,
            Some(true) => return Overlap::Shared(witness(&trail, index)),
            Some(false) => {}
        }
        for &byte in &bytes {
            let next = (|| {
                let (Some(na), Some(nb)) = (a.next(sa, byte)?, b.next(sb, byte)?) else {
                    return Some(None);
                };
                let nu = names.next(su, byte)?;
                Some((!nu.is_dead()).then_some((na, nb, nu)))
            })();
            let next = match next {
                None => return Overlap::Undecided,
                Some(None) => continue,
                Some(Some(next)) => next,
            };
            if seen.contains_key(&next) {
                continue;
            }
            if seen.len() >= MAX_STATES {
                return Overlap::Undecided;
            }
            seen.insert(next, trail.len());
            queue.push_back((next, trail.len()));
            trail.push((Some(index), byte));
        }
    }
    if a.cleared() || b.cleared() || names.cleared() {
        return Overlap::Undecided;
    }
    Overlap::Disjoint
}

/// The input that led to state `index`.
fn witness(trail: &[(Option<usize>, u8)], mut index: usize) -> String {
    let mut bytes = Vec::new();
    while let (Some(parent), byte) = trail[index] {
        bytes.push(byte);
        index = parent;
    }
    bytes.reverse();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The host:port addresses of an Iggy connection string (lower case), to tell whether two
/// aliases name the same cluster.
pub(crate) fn addresses(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.split(['?', '/']).next().unwrap_or_default();
    let hosts = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    let mut list: Vec<String> = hosts
        .split(',')
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .collect();
    list.sort();
    list.dedup();
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    fn globs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    /// The overlap of two identity-named selections.
    fn check(a: (&[&str], &[&str]), b: (&[&str], &[&str])) -> Overlap {
        check_prefixed(("", a.0, a.1), ("", b.0, b.1))
    }

    fn check_prefixed(a: (&str, &[&str], &[&str]), b: (&str, &[&str], &[&str])) -> Overlap {
        let (ai, ae, bi, be) = (globs(a.1), globs(a.2), globs(b.1), globs(b.2));
        let sa = Selection {
            prefix: a.0,
            include: &ai,
            exclude: &ae,
        };
        let sb = Selection {
            prefix: b.0,
            include: &bi,
            exclude: &be,
        };
        let forward = overlap(&sa, &sb);
        // Symmetric, up to the example found.
        let backward = overlap(&sb, &sa);
        assert_eq!(
            matches!(forward, Overlap::Shared(_)),
            matches!(backward, Overlap::Shared(_)),
            "{forward:?} vs {backward:?}"
        );
        forward
    }

    fn shared(name: &str) -> Overlap {
        Overlap::Shared(name.to_owned())
    }

    #[test]
    fn different_streams_are_disjoint() {
        assert_eq!(
            check((&["orders/*"], &[]), (&["billing/*"], &[])),
            Overlap::Disjoint
        );
        assert_eq!(
            check((&["orders/created"], &[]), (&["orders/paid"], &[])),
            Overlap::Disjoint
        );
        // `*` does not cross `/`.
        assert_eq!(
            check((&["orders/*"], &[]), (&["orders.eu/*"], &[])),
            Overlap::Disjoint
        );
        assert_eq!(check((&["a/*"], &[]), (&["*/b/c"], &[])), Overlap::Disjoint);
    }

    #[test]
    fn globs_that_can_match_the_same_name_overlap_with_an_example() {
        assert_eq!(
            check((&["*/*"], &[]), (&["orders/*"], &[])),
            shared("orders/a")
        );
        assert_eq!(
            check((&["orders/*"], &[]), (&["orders/*"], &[])),
            shared("orders/a")
        );
        assert_eq!(check((&["o*/x"], &[]), (&["*s/x"], &[])), shared("os/x"));
        assert_eq!(
            check((&["{a,b}/t?"], &[]), (&["[b-c]/t[0-9]"], &[])),
            shared("b/t0")
        );
        // Only one pattern of each needs to meet.
        assert_eq!(
            check(
                (&["x/*", "orders/created"], &[]),
                (&["y/*", "orders/c*"], &[])
            ),
            shared("orders/created")
        );
    }

    #[test]
    fn excludes_that_carve_the_other_selection_out_make_them_disjoint() {
        // The usual split of one cluster over two flows.
        assert_eq!(
            check((&["*/*"], &["orders/*"]), (&["orders/*"], &[])),
            Overlap::Disjoint
        );
        assert_eq!(
            check(
                (&["*/*"], &["orders/*", "billing/*"]),
                (&["orders/*", "billing/x"], &[])
            ),
            Overlap::Disjoint
        );
        // The second flow excluding what the first selects works as well.
        assert_eq!(
            check(
                (&["orders/created"], &[]),
                (&["orders/*"], &["orders/created"])
            ),
            Overlap::Disjoint
        );
        // A partial exclude leaves an overlap, and the example is outside it.
        assert_eq!(
            check((&["*/*"], &["orders/a*"]), (&["orders/*"], &[])),
            shared("orders/b")
        );
    }

    #[test]
    fn recursive_and_unusual_globs_are_decided_too() {
        assert!(matches!(
            check((&["**"], &[]), (&["a/b"], &[])),
            Overlap::Shared(_)
        ));
        assert_eq!(check((&["a/**"], &[]), (&["b/**"], &[])), Overlap::Disjoint);
        assert!(matches!(
            check((&["**/x"], &[]), (&["a/*"], &[])),
            Overlap::Shared(_)
        ));
        // No include selects nothing.
        assert_eq!(check((&[], &[]), (&["*/*"], &[])), Overlap::Disjoint);
        assert!(matches!(
            check((&["é*/*"], &[]), (&["?*/*"], &[])),
            Overlap::Shared(_)
        ));
    }

    #[test]
    fn downstream_names_are_compared_after_the_naming_prefix() {
        // `prefix` naming of `us` and identity naming of `us.orders` write the same topics.
        assert_eq!(
            check_prefixed(("us.", &["orders/*"], &[]), ("", &["us.orders/*"], &[])),
            shared("us.orders/a")
        );
        // The same selection under different prefixes writes different topics.
        assert_eq!(
            check_prefixed(("us.", &["*/*"], &[]), ("", &["orders/*"], &[])),
            Overlap::Disjoint
        );
        assert_eq!(
            check_prefixed(("us.", &["*/*"], &[]), ("us.", &["orders/*"], &[])),
            shared("us.orders/a")
        );
    }

    #[test]
    fn invalid_globs_are_left_to_their_own_problem() {
        assert_eq!(check((&["bad/[x"], &[]), (&["*/*"], &[])), Overlap::Invalid);
    }

    #[test]
    fn addresses_ignore_credentials_options_and_order() {
        assert_eq!(
            addresses("iggy://user:p@ss@Host-B:8090,host-a:8090?nodelay=true"),
            vec!["host-a:8090".to_owned(), "host-b:8090".to_owned()]
        );
        assert_eq!(
            addresses("iggy+tcp://host-a:8090"),
            vec!["host-a:8090".to_owned()]
        );
    }
}
