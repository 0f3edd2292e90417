//! What names a flow's globs can select, decided exactly on their automata.
//!
//! A flow copies the upstream topics its globs select (`stream/topic`, include minus exclude)
//! to downstream topics named by its naming (`<stream>/<topic>`, or `<source>.<stream>/<topic>`
//! with the `prefix` naming). Two questions about those names are config errors when answered
//! wrongly, and both are decided here on the same regular expressions `globset` matches names
//! with (what the pipeline's `Selector` uses), by a breadth-first search of the product of lazy
//! DFAs for the shortest name that fits:
//!
//! * [`overlap`]: can two flows between the same clusters write the same downstream topic?
//!   They would corrupt each other's resume: the provenance headers name the source cluster
//!   and the upstream topic, not the flow, so each flow takes the other's copies for its own.
//! * [`any_name`]: does a selection hold any name at all? A flow's selection minus the
//!   `select` globs of the residency policies that forbid its target is what it may copy; when
//!   that is empty, the flow can copy nothing.
//!
//! A search too large to finish is [`Found::Undecided`]; each caller says what that means.

use std::collections::{HashMap, VecDeque};

use regex_automata::hybrid::dfa::{Cache, DFA};
use regex_automata::hybrid::LazyStateID;
use regex_automata::util::{start, syntax};
use regex_automata::{Anchored, MatchKind};

/// Most product states searched before the answer counts as undecided.
const MAX_STATES: usize = 100_000;
/// Lazy DFA cache per automaton; a search that would clear it counts as undecided.
const CACHE_BYTES: usize = 4 << 20;

/// Names selected by globs, as far as names go: what one flow writes downstream, or what it
/// may copy.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Selection<'a> {
    /// Prepended to every upstream `stream/topic` (`"<source>."` with the `prefix` naming).
    pub(crate) prefix: &'a str,
    /// Include globs on `stream/topic`.
    pub(crate) include: &'a [String],
    /// Exclude globs on `stream/topic`.
    pub(crate) exclude: &'a [String],
}

/// What a search for a name found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// This name fits (the shortest such name, letters and digits first).
    Name(String),
    /// No name fits.
    Nothing,
    /// The search was too large to finish: a name may fit.
    Undecided,
    /// A glob does not compile (reported on its own key).
    Invalid,
}

/// A downstream name both `a` and `b` can write, if any.
pub(crate) fn overlap(a: &Selection<'_>, b: &Selection<'_>) -> Found {
    find(&[a, b])
}

/// A name `selection` selects, if any.
pub(crate) fn any_name(selection: &Selection<'_>) -> Found {
    find(&[selection])
}

/// A name every one of `selections` selects.
fn find(selections: &[&Selection<'_>]) -> Found {
    // No include selects nothing.
    if selections.iter().any(|s| s.include.is_empty()) {
        return Found::Nothing;
    }
    let sides: Option<Vec<Side>> = selections.iter().map(|s| Side::new(s)).collect();
    let (Some(mut sides), Some(names)) = (sides, names()) else {
        return Found::Invalid;
    };
    search(&mut sides, &mut Machine::new(names))
}

/// Whether one of `patterns` (globs on `stream/topic`, compiled as the pipeline compiles them)
/// matches `name`; `None` when a pattern does not compile.
pub(crate) fn glob_matches(patterns: &[String], name: &str) -> Option<bool> {
    let mut set = globset::GlobSetBuilder::new();
    for pattern in patterns {
        set.add(glob(pattern)?);
    }
    Some(set.build().ok()?.is_match(name))
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

/// `pattern` compiled as the pipeline compiles it: `*` and `?` do not match `/`.
fn glob(pattern: &str) -> Option<globset::Glob> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .ok()
}

/// The regular expression `globset` matches `pattern` with.
fn glob_regex(pattern: &str) -> Option<String> {
    Some(glob(pattern)?.regex().to_owned())
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

/// A product state of the search: where each side stands, and the names automaton.
type State = (Vec<SideState>, LazyStateID);

/// Breadth-first search of the product automaton for a name every side accepts (the shortest,
/// with letters and digits tried first, so that the example reads well).
fn search(sides: &mut [Side], names: &mut Machine) -> Found {
    let bytes: Vec<u8> = (b'a'..=b'z')
        .chain(b'0'..=b'9')
        .chain(b'A'..=b'Z')
        .chain(b"/.-_".iter().copied())
        .chain((0..=255).filter(|c: &u8| !c.is_ascii_alphanumeric() && !b"/.-_".contains(c)))
        .collect();
    let first = (|| {
        let starts: Option<Vec<SideState>> = sides.iter_mut().map(Side::start).collect();
        Some((starts?, names.start()?))
    })();
    let Some(first) = first else {
        return Found::Undecided;
    };
    // Every state seen, with how it was reached (parent index and byte).
    let mut seen: HashMap<State, usize> = HashMap::from([(first.clone(), 0)]);
    let mut trail: Vec<(Option<usize>, u8)> = vec![(None, 0)];
    let mut queue: VecDeque<(State, usize)> = VecDeque::from([(first, 0)]);
    while let Some(((states, su), index)) = queue.pop_front() {
        let accepted = (|| {
            for (side, &state) in sides.iter_mut().zip(&states) {
                if !side.accepts(state)? {
                    return Some(false);
                }
            }
            names.accepts(su)
        })();
        match accepted {
            None => return Found::Undecided,
            Some(true) => return Found::Name(witness(&trail, index)),
            Some(false) => {}
        }
        for &byte in &bytes {
            let next = (|| {
                let mut next = Vec::with_capacity(states.len());
                for (side, &state) in sides.iter_mut().zip(&states) {
                    let Some(state) = side.next(state, byte)? else {
                        return Some(None);
                    };
                    next.push(state);
                }
                let nu = names.next(su, byte)?;
                Some((!nu.is_dead()).then_some((next, nu)))
            })();
            let next = match next {
                None => return Found::Undecided,
                Some(None) => continue,
                Some(Some(next)) => next,
            };
            if seen.contains_key(&next) {
                continue;
            }
            if seen.len() >= MAX_STATES {
                return Found::Undecided;
            }
            seen.insert(next.clone(), trail.len());
            queue.push_back((next, trail.len()));
            trail.push((Some(index), byte));
        }
    }
    if sides.iter().any(Side::cleared) || names.cleared() {
        return Found::Undecided;
    }
    Found::Nothing
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
    let mut list: Vec<String> = replicator_model::seed_addresses(url)
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    list.sort();
    list.dedup();
    list
}

#[cfg(test)]
mod tests {
    use assert2::check;

    use super::*;

    fn globs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    /// The overlap of two identity-named selections.
    fn check(a: (&[&str], &[&str]), b: (&[&str], &[&str])) -> Found {
        check_prefixed(("", a.0, a.1), ("", b.0, b.1))
    }

    fn check_prefixed(a: (&str, &[&str], &[&str]), b: (&str, &[&str], &[&str])) -> Found {
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
            matches!(forward, Found::Name(_)),
            matches!(backward, Found::Name(_)),
            "{forward:?} vs {backward:?}"
        );
        forward
    }

    fn shared(name: &str) -> Found {
        Found::Name(name.to_owned())
    }

    #[test]
    fn different_streams_are_disjoint() {
        assert_eq!(
            check((&["orders/*"], &[]), (&["billing/*"], &[])),
            Found::Nothing
        );
        assert_eq!(
            check((&["orders/created"], &[]), (&["orders/paid"], &[])),
            Found::Nothing
        );
        // `*` does not cross `/`.
        assert_eq!(
            check((&["orders/*"], &[]), (&["orders.eu/*"], &[])),
            Found::Nothing
        );
        assert_eq!(check((&["a/*"], &[]), (&["*/b/c"], &[])), Found::Nothing);
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
            Found::Nothing
        );
        assert_eq!(
            check(
                (&["*/*"], &["orders/*", "billing/*"]),
                (&["orders/*", "billing/x"], &[])
            ),
            Found::Nothing
        );
        // The second flow excluding what the first selects works as well.
        assert_eq!(
            check(
                (&["orders/created"], &[]),
                (&["orders/*"], &["orders/created"])
            ),
            Found::Nothing
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
            Found::Name(_)
        ));
        assert_eq!(check((&["a/**"], &[]), (&["b/**"], &[])), Found::Nothing);
        assert!(matches!(
            check((&["**/x"], &[]), (&["a/*"], &[])),
            Found::Name(_)
        ));
        // No include selects nothing.
        assert_eq!(check((&[], &[]), (&["*/*"], &[])), Found::Nothing);
        assert!(matches!(
            check((&["é*/*"], &[]), (&["?*/*"], &[])),
            Found::Name(_)
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
            Found::Nothing
        );
        assert_eq!(
            check_prefixed(("us.", &["*/*"], &[]), ("us.", &["orders/*"], &[])),
            shared("us.orders/a")
        );
    }

    #[test]
    fn invalid_globs_are_left_to_their_own_problem() {
        assert_eq!(check((&["bad/[x"], &[]), (&["*/*"], &[])), Found::Invalid);
    }

    /// A name `include` minus `exclude` selects.
    fn any(include: &[&str], exclude: &[&str]) -> Found {
        let (include, exclude) = (globs(include), globs(exclude));
        any_name(&Selection {
            prefix: "",
            include: &include,
            exclude: &exclude,
        })
    }

    #[test]
    fn a_selection_that_excludes_everything_it_includes_selects_no_name() {
        // How a flow meets the policies that forbid its target: their globs join its excludes.
        check!(any(&["pii-*/*"], &["pii-*/*"]) == Found::Nothing);
        check!(any(&["pii-users/*", "pii-cards/*"], &["pii-*/*"]) == Found::Nothing);
        check!(any(&["*/*"], &["*/*"]) == Found::Nothing);
        // `**` crosses `/` and so covers every `stream/topic`.
        check!(any(&["orders/*"], &["**"]) == Found::Nothing);
        check!(any(&[], &[]) == Found::Nothing);
    }

    #[test]
    fn a_selection_with_a_name_left_returns_the_shortest_one() {
        check!(any(&["*/*"], &["pii-*/*"]) == Found::Name("a/a".to_owned()));
        // The witness lies outside every exclude, even one that covers nearly everything.
        check!(any(&["*/*"], &["[!p]*/*", "p[!i]*/*"]) == Found::Name("p/a".to_owned()));
        check!(
            any(&["pii-users/*", "orders/*"], &["pii-*/*"]) == Found::Name("orders/a".to_owned())
        );
        check!(any(&["pii-users/a"], &["pii-*/b"]) == Found::Name("pii-users/a".to_owned()));
        check!(any(&["bad/[x"], &[]) == Found::Invalid);
    }

    #[test]
    fn glob_matches_compiles_like_the_pipeline() {
        check!(glob_matches(&globs(&["replicator/*"]), "replicator/heartbeats") == Some(true));
        // `*` does not cross `/`.
        check!(glob_matches(&globs(&["*"]), "replicator/heartbeats") == Some(false));
        check!(glob_matches(&globs(&["ops/*", "*/heart*"]), "replicator/heartbeats") == Some(true));
        check!(glob_matches(&[], "replicator/heartbeats") == Some(false));
        check!(glob_matches(&globs(&["bad/[x"]), "bad/x") == None);
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
