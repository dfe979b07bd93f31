//! The agent's folders are its architecture, and its imports point one way:
//!
//! ```text
//! run/ ──▶ dataplane.rs (the seam) ◀── modes/<mode>/ ──▶ ruleset/, conntrack.rs ──▶ kernel/
//! ```
//!
//! This test reads every file of the library (following `mod` declarations from
//! `src/lib.rs`), resolves each `crate::`, `super::` and `self::` path and each `use` of a
//! child module to the file that defines it, and fails on:
//!
//! - `kernel/` importing anything of the agent outside `kernel/`, or naming the plan
//!   types (`proxyplan_crds`): it only talks to the kernel;
//! - `ruleset/` or `conntrack.rs` (what the modes share) importing a mode, `run/` or the
//!   seam;
//! - one mode importing another, or a mode importing `run/` (but for the allowed uses
//!   listed in [`ALLOWED`], each of which must still be in use);
//! - `run/` or the seam importing a mode;
//! - any circle between files.
//!
//! `cargo test -p proxyplan-agent --test layout` runs it; it prints the edges it found
//! with `-- --nocapture`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Imports that break a rule on purpose, with the reason: (importing file's prefix,
/// imported path's prefix).
const ALLOWED: [(&str, &str, &str); 1] = [(
    "modes/ipvs/",
    "run::Cidr",
    "the ipvs settings take CIDRs as the CLI parses them; Cidr lives in run/healthcheck.rs \
     and moves below the modes once run/ is free to change",
)];

/// Circles left alone, with the reason: every file of such a circle starts with the
/// prefix.
const CIRCLES_LEFT: [(&str, &str); 1] = [(
    "run/",
    "run/ is another issue's ground: its files import `run/mod.rs`, which imports them \
     back; breaking that means moving types out of `run/mod.rs`",
)];

/// A module: its path from the crate root and the file that holds it.
#[derive(Debug, Clone)]
struct Module {
    path: Vec<String>,
    file: String,
}

/// File → file imports, each with the paths that make it.
type Edges = BTreeMap<(String, String), Vec<String>>;

/// One import: the file it is in, the path as written (resolved to absolute segments).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Import {
    from: String,
    path: Vec<String>,
}

// ---- reading the sources -----------------------------------------------------------

/// The source without comments, string and char literals (their contents become spaces),
/// so that only code is searched.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (next == Some('#') || next == Some('"')) && !ident_before(&chars, i) {
            // Raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("' '");
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// Identifiers, `::` and single punctuation characters.
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".to_owned());
            i += 2;
        } else if c.is_whitespace() {
            i += 1;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// The `mod NAME;` declarations of a file (not inline modules), with their `#[path]`-free
/// file: `NAME.rs` or `NAME/mod.rs` next to the file's own module folder.
fn declared_modules(tokens: &[String]) -> Vec<String> {
    tokens
        .windows(3)
        .filter(|w| w[0] == "mod" && w[2] == ";")
        .map(|w| w[1].clone())
        .collect()
}

/// Every module of the library, from `src/lib.rs`.
fn modules(src: &Path) -> Vec<Module> {
    let mut out = Vec::new();
    let mut todo = vec![(Vec::<String>::new(), src.join("lib.rs"), src.to_path_buf())];
    while let Some((path, file, dir)) = todo.pop() {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        let rel = file
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        for child in declared_modules(&tokens(&code_only(&text))) {
            let flat = dir.join(format!("{child}.rs"));
            let nested = dir.join(&child).join("mod.rs");
            let (child_file, child_dir) = if flat.exists() {
                (flat, dir.join(&child))
            } else if nested.exists() {
                (nested, dir.join(&child))
            } else {
                panic!("{rel}: no file for mod {child}");
            };
            let mut child_path = path.clone();
            child_path.push(child);
            todo.push((child_path, child_file, child_dir));
        }
        out.push(Module { path, file: rel });
    }
    out
}

// ---- finding the imports -------------------------------------------------------------

/// Reads a path from `tokens[at]` on (`a::b::{c, d::e}`); returns its leaves and where it
/// ends.
fn read_tree(tokens: &[String], mut at: usize, prefix: Vec<String>) -> (Vec<Vec<String>>, usize) {
    let mut path = prefix;
    let mut leaves = Vec::new();
    while let Some(token) = tokens.get(at) {
        if token == "{" {
            at += 1;
            loop {
                match tokens.get(at).map(String::as_str) {
                    Some("}") => {
                        at += 1;
                        break;
                    }
                    Some(",") => at += 1,
                    Some(_) => {
                        let (inner, end) = read_tree(tokens, at, path.clone());
                        leaves.extend(inner);
                        at = end;
                    }
                    None => break,
                }
            }
            return (leaves, at);
        }
        if token == "*" {
            leaves.push(path);
            return (leaves, at + 1);
        }
        if !(token.chars().all(|c| c.is_alphanumeric() || c == '_')) {
            break;
        }
        path.push(token.clone());
        at += 1;
        if tokens.get(at).map(String::as_str) == Some("::") {
            at += 1;
        } else {
            break;
        }
    }
    // `self` at the end of a group (`a::{self, b}`) names `a`.
    if path.last().map(String::as_str) == Some("self") && path.len() > 1 {
        path.pop();
    }
    leaves.push(path);
    (leaves, at)
}

/// The paths one file names, resolved against its module (and its inline modules).
fn imports(module: &Module, text: &str, children: &BTreeSet<Vec<String>>) -> Vec<Import> {
    let tokens = tokens(&code_only(text));
    let mut out = Vec::new();
    // The module path at each brace depth: inline `mod name {` opens one.
    let mut stack: Vec<(usize, Vec<String>)> = vec![(0, module.path.clone())];
    let mut depth = 0usize;
    let mut pending_mod: Option<String> = None;
    let mut i = 0;
    while i < tokens.len() {
        let token = tokens[i].as_str();
        match token {
            "mod" => {
                pending_mod = tokens.get(i + 1).cloned();
            }
            "{" => {
                depth += 1;
                if let Some(name) = pending_mod.take() {
                    let mut path = stack.last().unwrap().1.clone();
                    path.push(name);
                    stack.push((depth, path));
                }
            }
            "}" => {
                if stack.last().is_some_and(|(d, _)| *d == depth) && stack.len() > 1 {
                    stack.pop();
                }
                depth = depth.saturating_sub(1);
            }
            ";" => pending_mod = None,
            _ => {}
        }
        let here = stack.last().unwrap().1.clone();
        let starts_path = matches!(token, "crate" | "super" | "self")
            && tokens.get(i + 1).map(String::as_str) == Some("::")
            && (i == 0 || tokens[i - 1] != "::");
        let is_use = token == "use";
        if starts_path || is_use {
            let start = if is_use { i + 1 } else { i };
            let (leaves, end) = read_tree(&tokens, start, Vec::new());
            for leaf in leaves {
                if let Some(path) = resolve(&here, &leaf, children) {
                    out.push(Import {
                        from: module.file.clone(),
                        path,
                    });
                }
            }
            i = end.max(i + 1);
            continue;
        }
        i += 1;
    }
    out
}

/// `path` as written in module `here`, made absolute; `None` for other crates and std.
fn resolve(
    here: &[String],
    path: &[String],
    children: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let mut base: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("self") => here.to_vec(),
        Some("super") => here.to_vec(),
        Some(first) => {
            // A use of a child module (`pub use decode::...` in a `mod.rs`).
            let mut child = here.to_vec();
            child.push(first.to_owned());
            if !children.contains(&child) {
                return None;
            }
            here.to_vec()
        }
        None => return None,
    };
    let mut rest = path;
    if matches!(rest.first().map(String::as_str), Some("crate" | "self")) {
        rest = &rest[1..];
    }
    while rest.first().map(String::as_str) == Some("super") {
        base.pop();
        rest = &rest[1..];
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The file that defines `path`: the deepest module on it.
fn file_of<'a>(modules: &'a [Module], path: &[String]) -> Option<&'a Module> {
    modules
        .iter()
        .filter(|m| path.starts_with(&m.path))
        .max_by_key(|m| m.path.len())
}

// ---- the rules -----------------------------------------------------------------------

/// The layer of a file.
fn layer(file: &str) -> String {
    if file.starts_with("kernel/") {
        "kernel".into()
    } else if file.starts_with("ruleset/") || file == "conntrack.rs" {
        "shared".into()
    } else if let Some(rest) = file.strip_prefix("modes/") {
        match rest.split_once('/') {
            Some((mode, _)) => format!("mode {mode}"),
            None => "modes".into(),
        }
    } else if file == "dataplane.rs" {
        "seam".into()
    } else if file.starts_with("run/") {
        "run".into()
    } else {
        "root".into()
    }
}

/// Whether a file of layer `from` may import one of layer `to`.
fn allowed(from: &str, to: &str) -> bool {
    if from == to || from == "root" || from == "modes" {
        return true;
    }
    match from {
        "kernel" => false,
        "shared" => to == "kernel",
        "seam" => to == "kernel",
        "run" => matches!(to, "seam" | "kernel"),
        mode if mode.starts_with("mode ") => matches!(to, "kernel" | "shared" | "seam"),
        _ => false,
    }
}

/// Rule breaks among `edges` (file → file, with the path that made the edge).
fn violations(edges: &Edges) -> Vec<String> {
    let mut out = Vec::new();
    for ((from, to), paths) in edges {
        let (lf, lt) = (layer(from), layer(to));
        if allowed(&lf, &lt) {
            continue;
        }
        let excused = paths.iter().all(|p| {
            ALLOWED
                .iter()
                .any(|(file, path, _)| from.starts_with(file) && p.starts_with(path))
        });
        if !excused {
            out.push(format!(
                "{from} ({lf}) imports {to} ({lt}): {}",
                paths.join(", ")
            ));
        }
    }
    out
}

/// Circles between files: the strongly connected components with more than one file.
fn circles(edges: &Edges) -> Vec<Vec<String>> {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        graph.entry(from).or_default().push(to);
        graph.entry(to).or_default();
    }
    // Tarjan.
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(v: &'a str, graph: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in &graph[v] {
            if !s.index.contains_key(w) {
                visit(w, graph, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut state = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for &v in graph.keys() {
        if !state.index.contains_key(v) {
            visit(v, &graph, &mut state);
        }
    }
    state.out
}

/// The file → file edges of the library, each with the paths that make it.
fn edges() -> (Vec<Module>, Edges) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let known: BTreeSet<Vec<String>> = modules.iter().map(|m| m.path.clone()).collect();
    let mut edges: Edges = BTreeMap::new();
    for module in &modules {
        let text = std::fs::read_to_string(src.join(&module.file)).unwrap();
        for import in imports(module, &text, &known) {
            let Some(target) = file_of(&modules, &import.path) else {
                continue;
            };
            if target.file == import.from {
                continue;
            }
            let paths = edges
                .entry((import.from.clone(), target.file.clone()))
                .or_default();
            let text = import.path.join("::");
            if !paths.contains(&text) {
                paths.push(text);
            }
        }
    }
    (modules, edges)
}

fn kernel_files_naming_the_plan(modules: &[Module]) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    modules
        .iter()
        .filter(|m| layer(&m.file) == "kernel")
        .filter(|m| {
            let text = std::fs::read_to_string(src.join(&m.file)).unwrap();
            tokens(&code_only(&text))
                .iter()
                .any(|t| t == "proxyplan_crds")
        })
        .map(|m| m.file.clone())
        .collect()
}

// ---- the tests -----------------------------------------------------------------------

#[test]
fn imports_point_from_the_modes_to_what_they_share_to_the_kernel() {
    let (modules, edges) = edges();
    for ((from, to), paths) in &edges {
        println!("{from} -> {to}: {}", paths.join(", "));
    }
    // It read the library: every layer has files, and files import each other.
    let layers: BTreeSet<String> = modules.iter().map(|m| layer(&m.file)).collect();
    for wanted in [
        "kernel",
        "shared",
        "mode iptables",
        "mode ipvs",
        "seam",
        "run",
    ] {
        assert!(
            layers.contains(wanted),
            "no file of layer {wanted}: {layers:?}"
        );
    }
    assert!(modules.len() > 60, "only {} modules found", modules.len());
    assert!(
        edges.len() > 150,
        "only {} imports between files found",
        edges.len()
    );
    assert!(
        edges.contains_key(&("modes/ipvs/dataplane.rs".into(), "ruleset/tables.rs".into())),
        "a known import (ipvs dataplane -> ruleset tables) was not found"
    );
    let broken = violations(&edges);
    assert!(
        broken.is_empty(),
        "imports against the layering:\n{}",
        broken.join("\n")
    );
    let named = kernel_files_naming_the_plan(&modules);
    assert!(
        named.is_empty(),
        "kernel files that name the plan: {named:?}"
    );
}

/// Whether a circle is one of [`CIRCLES_LEFT`].
fn left_alone(circle: &[String]) -> bool {
    CIRCLES_LEFT
        .iter()
        .any(|(prefix, _)| circle.iter().all(|f| f.starts_with(prefix)))
}

#[test]
fn no_circles_between_files() {
    let (_, edges) = edges();
    let found: Vec<Vec<String>> = circles(&edges)
        .into_iter()
        .filter(|c| !left_alone(c))
        .collect();
    assert!(
        found.is_empty(),
        "files that import each other (directly or around a circle): {found:?}"
    );
}

#[test]
fn every_allowed_exception_is_still_needed() {
    let (_, edges) = edges();
    for (file, path, why) in ALLOWED {
        let used = edges.iter().any(|((from, _), paths)| {
            from.starts_with(file) && paths.iter().any(|p| p.starts_with(path))
        });
        assert!(
            used,
            "{file} no longer imports {path} ({why}): remove it from ALLOWED"
        );
    }
}

#[test]
fn the_checks_catch_what_they_are_for() {
    let edge = |from: &str, to: &str, path: &str| {
        ((from.to_owned(), to.to_owned()), vec![path.to_owned()])
    };
    let bad: BTreeMap<_, _> = [
        edge("kernel/link.rs", "dataplane.rs", "dataplane::SyncReport"),
        edge(
            "modes/ipvs/render.rs",
            "modes/iptables/render.rs",
            "modes::iptables::render",
        ),
        edge(
            "ruleset/save.rs",
            "modes/iptables/cache.rs",
            "modes::iptables::cache",
        ),
        edge("conntrack.rs", "run/mod.rs", "run::Settings"),
        edge(
            "run/sync.rs",
            "modes/ipvs/mod.rs",
            "modes::ipvs::IpvsDataplane",
        ),
        edge("modes/iptables/cache.rs", "run/healthcheck.rs", "run::Cidr"),
    ]
    .into_iter()
    .collect();
    assert_eq!(violations(&bad).len(), 6, "{:?}", violations(&bad));
    let good: BTreeMap<_, _> = [
        edge(
            "modes/ipvs/render.rs",
            "ruleset/rules.rs",
            "ruleset::rules::Ruleset",
        ),
        edge(
            "modes/ipvs/dataplane.rs",
            "kernel/ipvs/node.rs",
            "kernel::ipvs::node",
        ),
        edge(
            "conntrack.rs",
            "kernel/command/runner.rs",
            "kernel::command::Runner",
        ),
        edge("modes/ipvs/settings.rs", "run/healthcheck.rs", "run::Cidr"),
        edge("run/sync.rs", "dataplane.rs", "dataplane::Dataplane"),
    ]
    .into_iter()
    .collect();
    assert!(violations(&good).is_empty(), "{:?}", violations(&good));
    let circle: BTreeMap<_, _> = [
        edge("a.rs", "b.rs", "b"),
        edge("b.rs", "c.rs", "c"),
        edge("c.rs", "a.rs", "a"),
        edge("c.rs", "d.rs", "d"),
    ]
    .into_iter()
    .collect();
    assert_eq!(circles(&circle), vec![vec!["a.rs", "b.rs", "c.rs"]]);
    // Paths are read from `use` trees and from code, not from comments or strings.
    let here = vec!["modes".to_owned(), "ipvs".to_owned(), "render".to_owned()];
    let module = Module {
        path: here,
        file: "modes/ipvs/render.rs".into(),
    };
    let text = "// use crate::run::X;\nuse super::{rules::{self, a}, sets::*};\n\
                fn f() { let s = \"crate::kernel\"; crate::kernel::link::Links::open(); }\n\
                mod tests { use super::*; }";
    let found: Vec<String> = imports(&module, text, &BTreeSet::new())
        .into_iter()
        .map(|i| i.path.join("::"))
        .collect();
    assert_eq!(
        found,
        [
            "modes::ipvs::rules",
            "modes::ipvs::rules::a",
            "modes::ipvs::sets",
            "kernel::link::Links::open",
            "modes::ipvs::render"
        ]
    );
}
