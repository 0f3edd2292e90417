//! No import circles between the files of a crate (ARCHITECTURE.md, "Import circles").
//!
//! Run it alone with `cargo test -p iggy-replicator --test import_circles`; with
//! `IMPORT_ARROWS=<crate> … -- --nocapture` (e.g. `IMPORT_ARROWS=control`) it also prints every
//! arrow of that crate.
//!
//! For every crate of the workspace (`crates/*/src` and the root package's `src/`) this reads
//! the `.rs` files of each crate root (`lib.rs`, `main.rs`) by following their `mod`
//! declarations, and draws an arrow from file A to file B when A's code names an item that B
//! defines:
//! - a `use` of a path inside the crate: `use crate::…`, `use super::…`, `use self::…`, or a
//!   path starting with one of the module's own child modules (`use writer::Batch` beside
//!   `mod writer;`), nested braces included (`use crate::{a::B, c::{D, E}}`, over any number
//!   of lines);
//! - a path in code starting the same way (`crate::a::b::f(…)`, `super::X`, `writer::run`),
//!   or with a module a `use` brought in (`node::start` after `use crate::node;`).
//!
//! A path leads to the file of the deepest module it names (`crate::a::b::f` to `a/b.rs`, or to
//! `a.rs` if `b` is a module written inside `a.rs`). When that module only re-exports the item
//! (`pub use`, `pub(crate) use`, or a private `use` a child module reads through `super::`),
//! the arrow follows the re-export to the file that defines it: a `mod.rs` or `lib.rs` that
//! gathers its children's items is a facade, not a dependency. For the same reason a `pub use`
//! draws no arrow from the facade itself unless the facade's own code uses the name, and a
//! `use` of a module (`use crate::node;`) draws none of its own: the paths through it do.
//! `mod x;` declarations are not arrows, nor are arrows from a file to itself.
//!
//! Not read: comments (doc links are not imports), string literals, and test code: items under
//! `#[cfg(test)]` (the `mod tests { … }` blocks; also `#[cfg(all(test, …))]`, but not
//! `#[cfg(any(test, feature = …))]`, which builds without tests) and files that are test-only
//! modules (`#[cfg(test)] mod tests;`). Tests may import anything.
//!
//! The files of a crate and the arrows between them form a graph; its strongly connected
//! components of more than one file (Tarjan's algorithm) are the circles. The test fails listing
//! each circle: one shortest round trip through it, then every arrow inside it with the
//! `file:line` of the `use` or path that makes it.
//!
//! The parser is a small tokenizer (comments, strings, chars and lifetimes skipped) and a scan
//! over its tokens, not a Rust parser: it knows `use` trees, `mod`, attributes, visibility and
//! paths, and nothing else. Its own tests below run it on tiny crates in memory, with and
//! without a circle, and the workspace test also requires each crate to have arrows, so a
//! parser that finds none fails instead of passing.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};

/// The workspace's crates: a name for the report and the `src` directory.
fn workspace_crates() -> Vec<(String, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut crates = vec![("iggy-replicator (src/)".to_string(), root.join("src"))];
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("crates/ is readable")
        .map(|entry| entry.expect("crates/ entry").path())
        .filter(|path| path.join("src").is_dir())
        .collect();
    dirs.sort();
    for dir in dirs {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        crates.push((name, dir.join("src")));
    }
    crates
}

/// Every `.rs` file under `dir`, as `/`-separated paths relative to it, with its text.
fn read_tree(dir: &Path) -> BTreeMap<String, String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(base, &path, out);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let relative = path.strip_prefix(base).unwrap();
                let key = relative
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                out.insert(key, text);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

#[test]
fn no_import_circles_between_the_files_of_a_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut failures = String::new();
    let mut summary = String::new();
    let (mut total_files, mut total_arrows) = (0, 0);
    for (name, src) in workspace_crates() {
        let files = read_tree(&src);
        let shown = src.strip_prefix(root).unwrap_or(&src).display().to_string();
        for graph in crate_graphs(&files) {
            let label = format!("{name}, {}", graph.root);
            summary.push_str(&format!(
                "{label}: {} files, {} arrows, {} circles\n",
                graph.files.len(),
                graph.arrow_count(),
                graph.circles().len()
            ));
            // A parser that lost its arrows must not pass: every crate of more than two files
            // imports between them (the flat `model` the least, two arrows between seven), and
            // one of ten files or more has at least one arrow per file (two or more when this
            // was written).
            let files_in_graph = graph.files.len();
            assert!(
                files_in_graph <= 2 || graph.arrow_count() > 0,
                "{label}: no arrows between {files_in_graph} files: does the import parser \
                 still work?"
            );
            assert!(
                files_in_graph < 10 || graph.arrow_count() >= files_in_graph,
                "{label}: only {} arrows between {files_in_graph} files: does the import parser \
                 still work?",
                graph.arrow_count()
            );
            if std::env::var("IMPORT_ARROWS").is_ok_and(|wanted| label.starts_with(&wanted)) {
                summary.push_str(&graph.listing(&shown));
            }
            total_files += files_in_graph;
            total_arrows += graph.arrow_count();
            failures.push_str(&graph.report(&format!("{label} ({shown})"), &shown));
        }
        let reached = reached_files(&files);
        let unreached: Vec<&String> = files.keys().filter(|f| !reached.contains(*f)).collect();
        assert!(
            unreached.is_empty(),
            "{name}: files no `mod` declaration reaches from lib.rs or main.rs: {unreached:?}"
        );
    }
    println!("{summary}");
    // The workspace as a whole: more arrows than files (3.6 per file when this was written).
    assert!(
        total_arrows >= total_files,
        "{total_arrows} arrows between {total_files} files: does the import parser still work?"
    );
    assert!(
        failures.is_empty(),
        "import circles between files:\n\n{failures}"
    );
}

// ---------------------------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    /// An identifier or keyword; `$crate` keeps its `$`.
    Ident(String),
    /// `::`
    PathSep,
    /// Any other punctuation character.
    Punct(char),
    /// A string, char or number literal (their contents never matter here).
    Literal,
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    line: usize,
}

/// Splits Rust source into tokens, dropping comments, whitespace and literal contents.
fn tokenize(src: &str) -> Vec<Token> {
    let chars: Vec<char> = src.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let is_ident_start = |c: char| c.is_alphabetic() || c == '_';
    let is_ident_char = |c: char| c.is_alphanumeric() || c == '_';
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let start_line = line;
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut nesting = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    nesting += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    nesting -= 1;
                    i += 2;
                    if nesting == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == '"' {
            i = skip_string(&chars, i + 1, &mut line);
            tokens.push(Token {
                tok: Tok::Literal,
                line: start_line,
            });
        } else if let Some(after_prefix) = raw_string_start(&chars, i) {
            // r"…", r#"…"#, br"…", cr#"…"#: count the hashes, find `"` followed by as many.
            let mut hashes = 0;
            let mut j = after_prefix;
            while at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1; // the opening quote
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '\n' {
                    line += 1;
                }
                if chars[j] == '"' && (1..=hashes).all(|k| at(j + k) == '#') {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
            tokens.push(Token {
                tok: Tok::Literal,
                line: start_line,
            });
        } else if (c == 'b' || c == 'c') && at(i + 1) == '"' {
            i = skip_string(&chars, i + 2, &mut line);
            tokens.push(Token {
                tok: Tok::Literal,
                line: start_line,
            });
        } else if c == 'b' && at(i + 1) == '\'' {
            i = skip_char(&chars, i + 2);
            tokens.push(Token {
                tok: Tok::Literal,
                line: start_line,
            });
        } else if c == '\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a, 'static).
            if at(i + 1) == '\\' || at(i + 2) == '\'' {
                i = skip_char(&chars, i + 1);
                tokens.push(Token {
                    tok: Tok::Literal,
                    line: start_line,
                });
            } else {
                i += 1;
                while is_ident_char(at(i)) {
                    i += 1;
                }
            }
        } else if c == 'r' && at(i + 1) == '#' && is_ident_start(at(i + 2)) {
            let mut j = i + 2;
            while is_ident_char(at(j)) {
                j += 1;
            }
            let name: String = chars[i + 2..j].iter().collect();
            tokens.push(Token {
                tok: Tok::Ident(name),
                line: start_line,
            });
            i = j;
        } else if is_ident_start(c) || (c == '$' && is_ident_start(at(i + 1))) {
            let mut j = i + 1;
            while is_ident_char(at(j)) {
                j += 1;
            }
            let name: String = chars[i..j].iter().collect();
            tokens.push(Token {
                tok: Tok::Ident(name),
                line: start_line,
            });
            i = j;
        } else if c.is_ascii_digit() {
            while is_ident_char(at(i)) {
                i += 1;
            }
            tokens.push(Token {
                tok: Tok::Literal,
                line: start_line,
            });
        } else if c == ':' && at(i + 1) == ':' {
            tokens.push(Token {
                tok: Tok::PathSep,
                line: start_line,
            });
            i += 2;
        } else {
            tokens.push(Token {
                tok: Tok::Punct(c),
                line: start_line,
            });
            i += 1;
        }
    }
    tokens
}

/// Where the raw string starting at `i` has its hashes or quote, if one starts there.
fn raw_string_start(chars: &[char], i: usize) -> Option<usize> {
    let at = |k: usize| chars.get(k).copied().unwrap_or('\0');
    let prefix = match (at(i), at(i + 1)) {
        ('r', _) => 1,
        ('b' | 'c', 'r') => 2,
        _ => return None,
    };
    // Not an identifier that merely starts with r/br/cr: the prefix must be its own token.
    if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return None;
    }
    let mut j = i + prefix;
    while at(j) == '#' {
        j += 1;
    }
    (at(j) == '"').then_some(i + prefix)
}

/// Past the closing quote of a string whose contents start at `i`.
fn skip_string(chars: &[char], mut i: usize, line: &mut usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            '\n' => {
                *line += 1;
                i += 1;
            }
            _ => i += 1,
        }
    }
    i
}

/// Past the closing quote of a char literal whose contents start at `i`.
fn skip_char(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() && chars[i] != '\'' && chars[i] != '\n' {
        i += if chars[i] == '\\' { 2 } else { 1 };
    }
    i + 1
}

// ---------------------------------------------------------------------------------------------
// What one file says
// ---------------------------------------------------------------------------------------------

/// One name a `use` brings into a module.
#[derive(Debug, Clone)]
struct UseLeaf {
    /// The inline modules (inside the file) the `use` is written in.
    scope: Vec<String>,
    /// The path as written (`self` at the end of a brace group already dropped).
    path: Vec<String>,
    /// The name it binds (its last segment or its `as` name); `None` for a glob.
    bound: Option<String>,
    /// Whether it is a re-export (`pub`, `pub(crate)`, …).
    public: bool,
    line: usize,
}

/// A path in code (not in a `use`) whose first segment is followed by `::`.
#[derive(Debug, Clone)]
struct PathRef {
    scope: Vec<String>,
    path: Vec<String>,
    line: usize,
}

/// A `mod name;` or `mod name { … }`.
#[derive(Debug, Clone)]
struct ModDecl {
    scope: Vec<String>,
    name: String,
    inline: bool,
    test_only: bool,
}

#[derive(Debug, Default)]
struct FileFacts {
    uses: Vec<UseLeaf>,
    paths: Vec<PathRef>,
    mods: Vec<ModDecl>,
    /// How often each identifier occurs in the file's non-test code outside `use` items.
    idents: HashMap<String, usize>,
    /// `#![cfg(test)]` at the top of the file.
    test_only: bool,
}

fn ident(token: Option<&Token>) -> Option<&str> {
    match token {
        Some(Token {
            tok: Tok::Ident(name),
            ..
        }) => Some(name),
        _ => None,
    }
}

fn punct(token: Option<&Token>, c: char) -> bool {
    matches!(token, Some(Token { tok: Tok::Punct(p), .. }) if *p == c)
}

fn is_path_sep(token: Option<&Token>) -> bool {
    matches!(
        token,
        Some(Token {
            tok: Tok::PathSep,
            ..
        })
    )
}

/// The index just past the group opened at `open` (`(`, `[` or `{`).
fn skip_group(tokens: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    let mut i = open;
    while i < tokens.len() {
        match tokens[i].tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

/// Whether a `cfg` predicate holds only in test builds: `test`, `all(…, test, …)`, or
/// `any(…)` of such predicates. `any(test, feature = "x")` is not: it compiles without tests.
fn cfg_requires_test(tokens: &[Token]) -> bool {
    fn predicate(tokens: &[Token], i: &mut usize) -> bool {
        let name = ident(tokens.get(*i)).unwrap_or("").to_string();
        *i += 1;
        if punct(tokens.get(*i), '(') {
            let close = skip_group(tokens, *i) - 1;
            *i += 1;
            let mut args = Vec::new();
            while *i < close {
                args.push(predicate(tokens, i));
                if punct(tokens.get(*i), ',') {
                    *i += 1;
                }
            }
            *i = close + 1;
            match name.as_str() {
                "all" => args.iter().any(|a| *a),
                "any" => !args.is_empty() && args.iter().all(|a| *a),
                _ => false,
            }
        } else {
            if punct(tokens.get(*i), '=') {
                *i += 2;
            }
            name == "test"
        }
    }
    let mut i = 0;
    predicate(tokens, &mut i)
}

/// Whether the attribute whose inner tokens (between `[` and `]`) are `inner` is a
/// `cfg` that holds only in test builds.
fn attribute_is_test_only(inner: &[Token]) -> bool {
    ident(inner.first()) == Some("cfg")
        && punct(inner.get(1), '(')
        && cfg_requires_test(&inner[2..skip_group(inner, 1) - 1])
}

const ITEM_KEYWORDS: &[&str] = &[
    "fn",
    "impl",
    "mod",
    "struct",
    "enum",
    "trait",
    "use",
    "const",
    "static",
    "type",
    "let",
    "extern",
    "macro_rules",
    "union",
    "async",
    "unsafe",
    "pub",
];

/// The index past the item or statement starting at `i`, which a `#[cfg(test)]` removes: up to
/// its `;`, or through its `{ … }` body; a field or an argument ends at its `,`.
fn skip_item(tokens: &[Token], mut i: usize) -> usize {
    let item = ident(tokens.get(i)).is_some_and(|word| ITEM_KEYWORDS.contains(&word));
    while i < tokens.len() {
        match tokens[i].tok {
            Tok::Punct('{') if item => return skip_group(tokens, i),
            Tok::Punct('(' | '[' | '{') => i = skip_group(tokens, i),
            Tok::Punct(')' | ']' | '}') => return i,
            Tok::Punct(';') => return i + 1,
            Tok::Punct(',') if !item => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Reads a use tree starting at `i` (after `use`), up to and including its `;`.
fn parse_use_tree(tokens: &[Token], i: &mut usize, prefix: Vec<String>, out: &mut Vec<UseLeaf>) {
    let leaf = |path: Vec<String>, bound: Option<String>, line: usize| UseLeaf {
        scope: Vec::new(),
        path,
        bound,
        public: false,
        line,
    };
    if punct(tokens.get(*i), '{') {
        *i += 1;
        while *i < tokens.len() && !punct(tokens.get(*i), '}') {
            let before = *i;
            parse_use_tree(tokens, i, prefix.clone(), out);
            if punct(tokens.get(*i), ',') {
                *i += 1;
            }
            if *i == before {
                *i += 1; // never stall on something unexpected
            }
        }
        *i += 1;
        return;
    }
    if punct(tokens.get(*i), '*') {
        out.push(leaf(prefix, None, tokens[*i].line));
        *i += 1;
        return;
    }
    let mut path = prefix;
    let mut line = tokens.get(*i).map_or(0, |t| t.line);
    while let Some(segment) = ident(tokens.get(*i)) {
        path.push(segment.to_string());
        line = tokens[*i].line;
        *i += 1;
        if !is_path_sep(tokens.get(*i)) {
            break;
        }
        *i += 1;
        if punct(tokens.get(*i), '{') || punct(tokens.get(*i), '*') {
            parse_use_tree(tokens, i, path, out);
            return;
        }
    }
    let mut bound = path.last().cloned();
    if ident(tokens.get(*i)) == Some("as") {
        bound = ident(tokens.get(*i + 1)).map(str::to_string);
        *i += 2;
    }
    if path.last().is_some_and(|s| s == "self") {
        path.pop();
        if bound.as_deref() == Some("self") {
            bound = path.last().cloned();
        }
    }
    if !path.is_empty() {
        out.push(leaf(path, bound, line));
    }
}

/// Reads one file: its `mod` declarations, `use` items and paths, skipping test code.
fn scan_file(src: &str) -> FileFacts {
    let tokens = tokenize(src);
    let mut facts = FileFacts::default();
    // Inline modules open around the current token: (name, brace depth inside them).
    let mut scope: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut public = false;
    let mut test_item = false;
    let names = |scope: &[(String, usize)]| scope.iter().map(|(n, _)| n.clone()).collect();
    let mut i = 0;
    while i < tokens.len() {
        let token = &tokens[i];
        // Attributes: `#[…]` and `#![…]`. Their paths count (`#[error("{}", crate::X)]`).
        if punct(Some(token), '#') {
            let inner_attr = punct(tokens.get(i + 1), '!');
            let open = if inner_attr { i + 2 } else { i + 1 };
            if punct(tokens.get(open), '[') {
                let close = skip_group(&tokens, open);
                let inner = &tokens[open + 1..close - 1];
                if attribute_is_test_only(inner) {
                    if inner_attr && scope.is_empty() && depth == 0 {
                        facts.test_only = true;
                        return facts;
                    }
                    test_item = true;
                }
                // The attributes of a test-only item go with it; any other's tokens are read
                // like code (the `[` and `]` are harmless).
                i = if test_item { close } else { open + 1 };
                continue;
            }
        }
        if test_item {
            test_item = false;
            // Skip the visibility to see whether the item is a `mod x;` (a test-only file).
            let mut k = i;
            if ident(tokens.get(k)) == Some("pub") {
                k += 1;
                if punct(tokens.get(k), '(') {
                    k = skip_group(&tokens, k);
                }
            }
            if ident(tokens.get(k)) == Some("mod") {
                if let Some(name) = ident(tokens.get(k + 1)) {
                    facts.mods.push(ModDecl {
                        scope: names(&scope),
                        name: name.to_string(),
                        inline: !punct(tokens.get(k + 2), ';'),
                        test_only: true,
                    });
                }
            }
            i = skip_item(&tokens, i);
            continue;
        }
        match &token.tok {
            Tok::Punct('{') => {
                depth += 1;
                public = false;
            }
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if scope.last().is_some_and(|(_, d)| *d == depth + 1) {
                    scope.pop();
                }
                public = false;
            }
            Tok::Ident(word) if word == "pub" => {
                public = true;
                // `pub(crate)`, `pub(super)`, `pub(in crate::a)`: not a path to anything.
                if punct(tokens.get(i + 1), '(') {
                    i = skip_group(&tokens, i + 1);
                    continue;
                }
            }
            Tok::Ident(word) if word == "mod" && ident(tokens.get(i + 1)).is_some() => {
                let name = ident(tokens.get(i + 1)).unwrap().to_string();
                let inline = punct(tokens.get(i + 2), '{');
                facts.mods.push(ModDecl {
                    scope: names(&scope),
                    name: name.clone(),
                    inline,
                    test_only: false,
                });
                if inline {
                    depth += 1;
                    scope.push((name, depth));
                    i += 3;
                } else {
                    i += 2;
                }
                public = false;
                continue;
            }
            // `use` items; `use<'a>` (precise capturing in `impl Trait + use<'a>`) is not one.
            Tok::Ident(word) if word == "use" && !punct(tokens.get(i + 1), '<') => {
                let mut leaves = Vec::new();
                let mut k = i + 1;
                if is_path_sep(tokens.get(k)) {
                    k += 1; // `use ::std::…`: an extern crate, found as such later
                }
                parse_use_tree(&tokens, &mut k, Vec::new(), &mut leaves);
                while k < tokens.len() && !punct(tokens.get(k), ';') {
                    k += 1;
                }
                for mut leaf in leaves {
                    leaf.scope = names(&scope);
                    leaf.public = public;
                    facts.uses.push(leaf);
                }
                public = false;
                i = k + 1;
                continue;
            }
            Tok::Ident(first)
                if is_path_sep(tokens.get(i + 1))
                    && !is_path_sep(tokens.get(i.wrapping_sub(1))) =>
            {
                let line = token.line;
                let mut path = vec![first.clone()];
                let mut k = i + 1;
                while is_path_sep(tokens.get(k)) {
                    match ident(tokens.get(k + 1)) {
                        Some(segment) => path.push(segment.to_string()),
                        None => break, // `::<T>`, `::{`, `::*`
                    }
                    k += 2;
                }
                for segment in &path {
                    *facts.idents.entry(segment.clone()).or_default() += 1;
                }
                facts.paths.push(PathRef {
                    scope: names(&scope),
                    path,
                    line,
                });
                public = false;
                i = k;
                continue;
            }
            Tok::Ident(word) => {
                *facts.idents.entry(word.clone()).or_default() += 1;
                if !matches!(word.as_str(), "crate" | "super" | "self" | "in") {
                    public = false;
                }
            }
            _ => public = false,
        }
        i += 1;
    }
    facts
}

// ---------------------------------------------------------------------------------------------
// The crate's modules and arrows
// ---------------------------------------------------------------------------------------------

/// A module of the crate: the file it is written in, and the names its `use` items bind
/// (`None`: the name comes from another crate).
#[derive(Debug, Default)]
struct Module {
    file: usize,
    imports: HashMap<String, Option<Vec<String>>>,
}

/// Where an arrow comes from in its file: the line and the path as written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Site {
    line: usize,
    text: String,
}

/// The file graph of one crate root (`lib.rs` or `main.rs`) and its modules.
#[derive(Debug)]
struct Graph {
    root: String,
    /// Files, relative to `src/`.
    files: Vec<String>,
    /// `arrows[from][to]`: where `from` names items of `to`.
    arrows: BTreeMap<usize, BTreeMap<usize, BTreeSet<Site>>>,
}

/// The module tree reachable from `root` (a file path), with each file's facts.
struct Crate {
    files: Vec<String>,
    facts: Vec<FileFacts>,
    modules: BTreeMap<Vec<String>, Module>,
}

/// Where the file of module `name`, declared in `file` (inside inline modules `scope`), is.
fn child_file(
    file: &str,
    scope: &[String],
    name: &str,
    files: &BTreeMap<String, String>,
) -> Option<String> {
    let (dir, stem) = match file.rsplit_once('/') {
        Some((dir, name)) => (format!("{dir}/"), name.trim_end_matches(".rs")),
        None => (String::new(), file.trim_end_matches(".rs")),
    };
    // lib.rs, main.rs and mod.rs own their directory; `a.rs` owns `a/`.
    let mut base = if matches!(stem, "lib" | "main" | "mod") {
        dir
    } else {
        format!("{dir}{stem}/")
    };
    for inline in scope {
        base.push_str(inline);
        base.push('/');
    }
    [format!("{base}{name}.rs"), format!("{base}{name}/mod.rs")]
        .into_iter()
        .find(|candidate| files.contains_key(candidate))
}

fn load_crate(root: &str, files: &BTreeMap<String, String>) -> Crate {
    let mut krate = Crate {
        files: Vec::new(),
        facts: Vec::new(),
        modules: BTreeMap::new(),
    };
    let mut queue = VecDeque::from([(root.to_string(), Vec::<String>::new())]);
    while let Some((file, module)) = queue.pop_front() {
        let facts = scan_file(&files[&file]);
        if facts.test_only {
            continue;
        }
        let id = krate.files.len();
        for decl in &facts.mods {
            if decl.test_only {
                continue;
            }
            let mut path = module.clone();
            path.extend(decl.scope.iter().cloned());
            path.push(decl.name.clone());
            if decl.inline {
                krate.modules.insert(
                    path,
                    Module {
                        file: id,
                        ..Module::default()
                    },
                );
            } else if let Some(child) = child_file(&file, &decl.scope, &decl.name, files) {
                queue.push_back((child, path));
            }
        }
        krate.modules.insert(
            module,
            Module {
                file: id,
                ..Module::default()
            },
        );
        krate.files.push(file);
        krate.facts.push(facts);
    }
    krate
}

impl Crate {
    /// The module path of the code at `scope` (inline modules) in file `file`.
    fn module_of(&self, file: usize, scope: &[String]) -> Vec<String> {
        let mut module = self
            .modules
            .iter()
            .filter(|(_, m)| m.file == file)
            .map(|(path, _)| path.clone())
            .min_by_key(Vec::len)
            .expect("every file is a module");
        module.extend(scope.iter().cloned());
        module
    }

    /// `path`, written in `module`, from the crate root; `None` if it leaves the crate or
    /// starts with something else than a module (a local item, a type, another crate).
    /// `via_imports`: a first segment naming a module a `use` of `module` brought in counts too
    /// (paths in code).
    fn absolute(
        &self,
        module: &[String],
        path: &[String],
        via_imports: bool,
    ) -> Option<Vec<String>> {
        let first = path.first()?;
        let mut out: Vec<String>;
        let mut rest = &path[1..];
        match first.as_str() {
            "crate" | "$crate" => out = Vec::new(),
            "self" => out = module.to_vec(),
            "super" => {
                out = module.to_vec();
                out.pop()?;
                while rest.first().is_some_and(|s| s == "super") {
                    out.pop()?;
                    rest = &rest[1..];
                }
            }
            name => {
                let mut child = module.to_vec();
                child.push(name.to_string());
                if self.modules.contains_key(&child) {
                    out = child;
                } else if via_imports {
                    // Only a module brought in by a `use`: a path through an imported item
                    // (`Error::Timeout`) adds nothing to the arrow its `use` drew.
                    match self.modules.get(module)?.imports.get(name) {
                        Some(Some(target)) if self.modules.contains_key(target) => {
                            out = target.clone();
                        }
                        _ => return None,
                    }
                } else {
                    return None;
                }
            }
        }
        out.extend(rest.iter().cloned());
        Some(out)
    }

    /// The file that defines what the crate-absolute `path` names, following re-exports.
    fn resolve(&self, path: &[String], hops: usize) -> Option<usize> {
        let mut k = path.len();
        while !self.modules.contains_key(&path[..k]) {
            k -= 1; // the crate root (k == 0) is always a module
        }
        let module = &self.modules[&path[..k]];
        let Some(name) = path.get(k) else {
            return Some(module.file);
        };
        match module.imports.get(name) {
            Some(Some(target)) if hops < 32 => {
                let mut next = target.clone();
                next.extend(path[k + 1..].iter().cloned());
                self.resolve(&next, hops + 1)
            }
            Some(None) => None, // re-exported from another crate
            _ => Some(module.file),
        }
    }

    fn graph(&mut self, root: &str) -> Graph {
        // Bind every `use` in its module first: resolving follows them across files.
        for file in 0..self.files.len() {
            for leaf in &self.facts[file].uses {
                let module = self.module_of(file, &leaf.scope);
                let target = self.absolute(&module, &leaf.path, false);
                let entry = self.modules.get_mut(&module).expect("module of a use");
                // A glob (`use x::*`, no name) is an arrow to `x` and binds nothing here: a name
                // read through it resolves to the glob's module, not further.
                if let Some(name) = leaf.bound.as_ref().filter(|name| *name != "_") {
                    entry.imports.insert(name.clone(), target);
                }
            }
        }
        let mut arrows: BTreeMap<usize, BTreeMap<usize, BTreeSet<Site>>> = BTreeMap::new();
        let mut add = |from: usize, to: Option<usize>, line: usize, text: String| {
            if let Some(to) = to.filter(|to| *to != from) {
                arrows
                    .entry(from)
                    .or_default()
                    .entry(to)
                    .or_default()
                    .insert(Site { line, text });
            }
        };
        for file in 0..self.files.len() {
            let facts = &self.facts[file];
            for leaf in &facts.uses {
                let module = self.module_of(file, &leaf.scope);
                let Some(target) = self.absolute(&module, &leaf.path, false) else {
                    continue;
                };
                // A module brought into scope is no arrow by itself: the paths through it are.
                if leaf.bound.is_some() && self.modules.contains_key(&target) {
                    continue;
                }
                // A re-export the file's own code does not use only passes the item on.
                let used_here = leaf
                    .bound
                    .as_ref()
                    .is_none_or(|name| facts.idents.get(name).copied().unwrap_or(0) > 0);
                if leaf.public && !used_here {
                    continue;
                }
                let to = self.resolve(&target, 0);
                add(file, to, leaf.line, format!("use {}", leaf.path.join("::")));
            }
            for path in &facts.paths {
                let module = self.module_of(file, &path.scope);
                if let Some(target) = self.absolute(&module, &path.path, true) {
                    let to = self.resolve(&target, 0);
                    add(file, to, path.line, path.path.join("::"));
                }
            }
        }
        Graph {
            root: root.to_string(),
            files: self.files.clone(),
            arrows,
        }
    }
}

/// One graph per crate root among `lib.rs` and `main.rs`.
fn crate_graphs(files: &BTreeMap<String, String>) -> Vec<Graph> {
    ["lib.rs", "main.rs"]
        .into_iter()
        .filter(|root| files.contains_key(*root))
        .map(|root| load_crate(root, files).graph(root))
        .collect()
}

/// The files a crate's roots reach through `mod` declarations, test-only files included.
fn reached_files(files: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut reached = BTreeSet::new();
    let mut queue: VecDeque<String> = ["lib.rs", "main.rs"]
        .into_iter()
        .filter(|r| files.contains_key(*r))
        .map(String::from)
        .collect();
    while let Some(file) = queue.pop_front() {
        if !reached.insert(file.clone()) {
            continue;
        }
        for decl in scan_file(&files[&file]).mods.iter().filter(|d| !d.inline) {
            queue.extend(child_file(&file, &decl.scope, &decl.name, files));
        }
    }
    reached
}

impl Graph {
    fn arrow_count(&self) -> usize {
        self.arrows.values().map(BTreeMap::len).sum()
    }

    fn targets(&self, from: usize) -> impl Iterator<Item = usize> + '_ {
        self.arrows
            .get(&from)
            .into_iter()
            .flat_map(|to| to.keys().copied())
    }

    /// The strongly connected components of more than one file (Tarjan), each sorted.
    fn circles(&self) -> Vec<Vec<usize>> {
        struct Tarjan<'g> {
            graph: &'g Graph,
            index: Vec<Option<usize>>,
            low: Vec<usize>,
            on_stack: Vec<bool>,
            stack: Vec<usize>,
            next: usize,
            out: Vec<Vec<usize>>,
        }
        impl Tarjan<'_> {
            fn visit(&mut self, v: usize) {
                self.index[v] = Some(self.next);
                self.low[v] = self.next;
                self.next += 1;
                self.stack.push(v);
                self.on_stack[v] = true;
                let targets: Vec<usize> = self.graph.targets(v).collect();
                for w in targets {
                    match self.index[w] {
                        None => {
                            self.visit(w);
                            self.low[v] = self.low[v].min(self.low[w]);
                        }
                        Some(index) if self.on_stack[w] => self.low[v] = self.low[v].min(index),
                        Some(_) => {}
                    }
                }
                if Some(self.low[v]) == self.index[v] {
                    let mut component = Vec::new();
                    loop {
                        let w = self.stack.pop().expect("v is on the stack");
                        self.on_stack[w] = false;
                        component.push(w);
                        if w == v {
                            break;
                        }
                    }
                    if component.len() > 1 {
                        component.sort_unstable();
                        self.out.push(component);
                    }
                }
            }
        }
        let n = self.files.len();
        let mut tarjan = Tarjan {
            graph: self,
            index: vec![None; n],
            low: vec![0; n],
            on_stack: vec![false; n],
            stack: Vec::new(),
            next: 0,
            out: Vec::new(),
        };
        for v in 0..n {
            if tarjan.index[v].is_none() {
                tarjan.visit(v);
            }
        }
        let mut out = tarjan.out;
        out.sort();
        out
    }

    /// A shortest round trip from the component's first file back to it, inside `component`.
    fn round_trip(&self, component: &[usize]) -> Vec<usize> {
        let start = component[0];
        let mut parent: HashMap<usize, usize> = HashMap::new();
        let mut queue = VecDeque::from([start]);
        while let Some(v) = queue.pop_front() {
            for w in self.targets(v).filter(|w| component.contains(w)) {
                if w == start {
                    let mut trip = vec![v];
                    let mut at = v;
                    while at != start {
                        at = parent[&at];
                        trip.push(at);
                    }
                    trip.reverse();
                    return trip;
                }
                if let std::collections::hash_map::Entry::Vacant(e) = parent.entry(w) {
                    e.insert(v);
                    queue.push_back(w);
                }
            }
        }
        vec![start]
    }

    /// Every arrow of the graph with its sites (`IMPORT_ARROWS=<crate>` prints it).
    fn listing(&self, shown: &str) -> String {
        let mut out = String::new();
        for (from, targets) in &self.arrows {
            for (to, sites) in targets {
                out.push_str(&format!("  {} -> {}\n", self.files[*from], self.files[*to]));
                for site in sites {
                    let file = &self.files[*from];
                    out.push_str(&format!(
                        "    {shown}/{file}:{}: {}\n",
                        site.line, site.text
                    ));
                }
            }
        }
        out
    }

    /// The report of this graph's circles, empty if it has none. `shown`: the path of `src/`.
    fn report(&self, label: &str, shown: &str) -> String {
        let circles = self.circles();
        if circles.is_empty() {
            return String::new();
        }
        let at = |file: usize, site: &Site| format!("{shown}/{}:{}", self.files[file], site.line);
        let mut out = format!("{label}: {} circle(s)\n", circles.len());
        for (n, component) in circles.iter().enumerate() {
            let names: Vec<&str> = component.iter().map(|f| self.files[*f].as_str()).collect();
            out.push_str(&format!(
                "  circle {} ({} files): {}\n",
                n + 1,
                component.len(),
                names.join(", ")
            ));
            let trip = self.round_trip(component);
            out.push_str("    a shortest round trip:\n");
            for (k, from) in trip.iter().enumerate() {
                let to = trip[(k + 1) % trip.len()];
                let site = self.arrows[from][&to]
                    .iter()
                    .next()
                    .expect("an arrow has a site");
                out.push_str(&format!(
                    "      {} -> {}   ({}: {})\n",
                    self.files[*from],
                    self.files[to],
                    at(*from, site),
                    site.text
                ));
            }
            out.push_str(
                "    every arrow inside it (the file on the left names items of the right):\n",
            );
            for from in component {
                for to in self.targets(*from).filter(|to| component.contains(to)) {
                    out.push_str(&format!(
                        "      {} -> {}\n",
                        self.files[*from], self.files[to]
                    ));
                    for site in &self.arrows[from][&to] {
                        out.push_str(&format!("        {}: {}\n", at(*from, site), site.text));
                    }
                }
            }
        }
        out.push_str(
            "  To break a circle, make one of its arrows point the other way: move what both \
             sides need down into a module that neither imports back, or pass the upper file's \
             data to the lower one instead of letting it reach up.\n\n",
        );
        out
    }
}

// ---------------------------------------------------------------------------------------------
// The checker's own tests
// ---------------------------------------------------------------------------------------------

fn tree(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(path, text)| (path.to_string(), text.to_string()))
        .collect()
}

/// `(from, to)` file pairs of the graph, sorted.
fn pairs(graph: &Graph) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (from, targets) in &graph.arrows {
        for to in targets.keys() {
            out.push((graph.files[*from].clone(), graph.files[*to].clone()));
        }
    }
    out.sort();
    out
}

fn pair(from: &str, to: &str) -> (String, String) {
    (from.to_string(), to.to_string())
}

#[test]
fn checker_finds_a_circle_and_the_lines_that_make_it() {
    let files = tree(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
        (
            "a.rs",
            "//! `crate::c::Z` in a doc is no import.\n\
             use crate::b::{\n    X,\n};\npub struct A;\n",
        ),
        (
            "b.rs",
            "pub struct X;\nfn f() -> crate::c::Y {\n    super::c::Y\n}\n",
        ),
        (
            "c.rs",
            "pub struct Y;\nfn g() {\n    let _ = \"crate::a::A\";\n    let _ = crate::a::A;\n}\n",
        ),
    ]);
    let graphs = crate_graphs(&files);
    assert_eq!(graphs.len(), 1);
    let graph = &graphs[0];
    assert_eq!(
        pairs(graph),
        [
            pair("a.rs", "b.rs"),
            pair("b.rs", "c.rs"),
            pair("c.rs", "a.rs")
        ]
    );
    let circles = graph.circles();
    assert_eq!(circles.len(), 1);
    let names: Vec<&str> = circles[0]
        .iter()
        .map(|f| graph.files[*f].as_str())
        .collect();
    assert_eq!(names, ["a.rs", "b.rs", "c.rs"]);
    let report = graph.report("example", "src");
    assert!(report.contains("src/a.rs:3: use crate::b::X"), "{report}");
    assert!(report.contains("src/b.rs:2: crate::c::Y"), "{report}");
    assert!(report.contains("src/b.rs:3: super::c::Y"), "{report}");
    assert!(report.contains("src/c.rs:4: crate::a::A"), "{report}");
}

#[test]
fn checker_passes_a_layered_crate_with_facades_and_test_code() {
    let files = tree(&[
        // The crate root re-exports without using: no arrows from it.
        (
            "lib.rs",
            "mod low;\nmod high;\n#[cfg(test)]\nmod tests;\npub use high::{Api, \
             Builder as B};\npub(crate) use low::model::Thing;\n",
        ),
        (
            "low/mod.rs",
            "pub(crate) mod model;\npub(crate) use self::model::Thing;\n",
        ),
        (
            "low/model.rs",
            "pub(crate) struct Thing;\n#[cfg(test)]\nmod tests {\n    use crate::high::Api;\n}\n",
        ),
        (
            "high.rs",
            "use crate::{\n    low::{self, Thing},\n};\npub struct Api(Thing);\n\
             pub struct Builder;\nfn make() -> Thing { low::Thing }\n#[cfg(test)]\n\
             fn helper() -> crate::Api { todo!() }\n",
        ),
        // A test-only file may import anything.
        ("tests.rs", "use crate::high::Api;\nuse crate::Thing;\n"),
    ]);
    let graph = &crate_graphs(&files)[0];
    // `crate::Thing` and `low::Thing` pass through the facades to low/model.rs.
    assert_eq!(pairs(graph), [pair("high.rs", "low/model.rs")]);
    assert!(graph.circles().is_empty());
    assert_eq!(graph.report("example", "src"), "");
    assert_eq!(reached_files(&files).len(), 5);
}

#[test]
fn checker_reads_nested_use_trees_and_skips_literals() {
    let src = "use crate::{a::B, c::{D, e::{self as f, G}}, h::*};\n\
               pub(in crate::x) fn k() -> &'static str { let _c = '\\''; r#\"crate::no::Z\"# }\n\
               fn l() { x::<u8>(); self::m::N::new(); }\n";
    let facts = scan_file(src);
    let used: Vec<(String, Option<String>)> = facts
        .uses
        .iter()
        .map(|u| (u.path.join("::"), u.bound.clone()))
        .collect();
    assert_eq!(
        used,
        [
            ("crate::a::B".to_string(), Some("B".to_string())),
            ("crate::c::D".to_string(), Some("D".to_string())),
            ("crate::c::e".to_string(), Some("f".to_string())),
            ("crate::c::e::G".to_string(), Some("G".to_string())),
            ("crate::h".to_string(), None),
        ]
    );
    let paths: Vec<String> = facts.paths.iter().map(|p| p.path.join("::")).collect();
    assert_eq!(paths, ["x", "self::m::N::new"]);
}
