//! The workspace's floors, checked on its source (docs/ARCHITECTURE.md).
//!
//! - In each crate no file imports one on a higher floor, and no two files
//!   import each other, however indirectly. A module's own files may use
//!   their parent's items, which is how the server table's files extend
//!   `LockTable`.
//! - The server's `ops` takes nothing from the floors but the table.
//! - docs/ARCHITECTURE.md names every source file of the workspace's crates
//!   in the file map of its crate, and no file that does not exist.
//!
//! The check reads every `crate::` and `super::` path outside comments and
//! test modules, and resolves it to the deepest file it names.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// One crate's floors.
struct Layout {
    /// Its source directory, from the workspace's root.
    src: &'static str,
    /// Top-level modules by floor, the top floor first; a file may use its
    /// own floor and those below. Every module is on a floor, beside them
    /// or exempt.
    floors: &'static [&'static [&'static str]],
    /// A module beside the floors and the only modules it may use.
    beside: Option<(&'static str, &'static [&'static str])>,
    /// The crate's root and binary, and test scaffolding: they sit on top of
    /// everything and may use any of it.
    exempt: &'static [&'static str],
}

/// The server: net → service → engine → table, with ops beside.
const SERVER: Layout = Layout {
    src: "dlock-server/src",
    floors: &[&["net"], &["service"], &["engine"], &["table"]],
    beside: Some(("ops", &["ops", "table"])),
    exempt: &["testing", "fuzzing", "lib", "main"],
};

/// The client library (src/lib.rs lists the same floors).
const LIBRARY: Layout = Layout {
    src: "src",
    floors: &[
        &["election", "enqueue", "guard", "lock"],
        &["client"],
        &["owners"],
        &["link", "liveness"],
        &["dial", "raw", "transport"],
        &[
            "backoff",
            "disconnect",
            "error",
            "event",
            "inspect",
            "keys",
            "options",
            "request",
            "rules",
            "safety",
            "servers",
        ],
    ],
    beside: None,
    exempt: &["lib"],
};

/// The `dlock` command: the subcommands above the helpers they share.
const CLI: Layout = Layout {
    src: "dlock-client/src",
    floors: &[
        &["cluster", "elect", "inspect", "leader", "run", "top"],
        &[
            "child",
            "cli",
            "columns",
            "connect",
            "exit",
            "guardian",
            "guardian_message",
            "hook",
            "keeper",
            "reconnects",
            "say",
            "signals",
            "stdout",
            "subcommand",
        ],
    ],
    beside: None,
    exempt: &["main"],
};

/// The wire contract: one floor, no circles.
const PROTO: Layout = Layout {
    src: "dlock-proto/src",
    floors: &[&["codec", "duration", "limits", "tls", "token_file"]],
    beside: None,
    exempt: &["lib"],
};

const LAYOUTS: [&Layout; 4] = [&SERVER, &LIBRARY, &CLI, &PROTO];

/// Every crate whose files docs/ARCHITECTURE.md maps.
const MAPPED: [&str; 8] = [
    "src",
    "dlock-proto/src",
    "dlock-testkit/src",
    "dlock-model/src",
    "dlock-server/src",
    "dlock-client/src",
    "dlock-bench/src",
    "dlock-torture/src",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

type Module = Vec<String>;

/// Every module of the crate with its file.
fn modules(dir: &Path, prefix: &Module, out: &mut BTreeMap<Module, PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("a source directory is readable")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("file names are UTF-8")
            .to_string();
        let mut module = prefix.clone();
        module.push(name);
        if path.is_dir() {
            modules(&path, &module, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.insert(module, path);
        }
    }
}

/// The source without comments and without its test module, which may use
/// anything of the file it tests.
fn code(path: &Path) -> String {
    let text = fs::read_to_string(path).expect("a source file is readable");
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod tests"))
        {
            break;
        }
        let line = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Splits a `{a, b::{c, d}}` group's inside at its top-level commas.
fn group_items(inner: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(inner[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(inner[start..].trim());
    items.retain(|s| !s.is_empty());
    items
}

/// The paths one path expression names: `a::b::{c, d::e}` is `a::b::c` and
/// `a::b::d::e`. `rest` starts right after `crate::` or `super::`.
fn expand(base: &Module, rest: &str, out: &mut Vec<Module>) {
    let mut path = base.clone();
    let mut rest = rest;
    loop {
        if let Some(inner) = rest.strip_prefix('{') {
            let end = closing_brace(inner);
            for item in group_items(&inner[..end]) {
                expand(&path, item, out);
            }
            return;
        }
        let len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if len == 0 {
            break;
        }
        path.push(rest[..len].to_string());
        match rest[len..].strip_prefix("::") {
            Some(next) => rest = next,
            None => break,
        }
    }
    out.push(path);
}

fn closing_brace(inner: &str) -> usize {
    let mut depth = 0usize;
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return i,
            '}' => depth -= 1,
            _ => {}
        }
    }
    inner.len()
}

/// The deepest module of the crate a path names (`table::Command` is the
/// module `table`).
fn resolve(path: &Module, known: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|m| known.contains_key(m))
}

/// The modules each module uses, found by its `crate::` and `super::` paths.
fn imports(known: &BTreeMap<Module, PathBuf>) -> BTreeMap<Module, BTreeSet<Module>> {
    let reexports = reexports(known);
    let mut graph = BTreeMap::new();
    for (module, path) in known {
        let code = code(path);
        let mut named = Vec::new();
        for (prefix, base) in [
            ("crate::", Vec::new()),
            ("super::", module[..module.len().saturating_sub(1)].to_vec()),
        ] {
            for (at, _) in code.match_indices(prefix) {
                let before = code[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                expand(&base, &code[at + prefix.len()..], &mut named);
            }
        }
        let uses: BTreeSet<Module> = named
            .iter()
            .map(|p| match p.first().and_then(|first| reexports.get(first)) {
                Some(home) => home.iter().chain(&p[1..]).cloned().collect(),
                None => p.clone(),
            })
            .filter_map(|p| resolve(&p, known))
            .filter(|m| m != module)
            .collect();
        graph.insert(module.clone(), uses);
    }
    graph
}

/// The items the crate's root re-exports from its own modules (`pub use
/// client::Client;`), each with the module it comes from: `crate::Client`
/// in a file is an import of `client`.
fn reexports(known: &BTreeMap<Module, PathBuf>) -> BTreeMap<String, Module> {
    let mut out = BTreeMap::new();
    let Some(root) = known.get(&vec!["lib".to_string()]) else {
        return out;
    };
    let code = code(root);
    for (at, _) in code.match_indices("pub use ") {
        let mut paths = Vec::new();
        expand(&Vec::new(), &code[at + "pub use ".len()..], &mut paths);
        for path in paths {
            let Some((item, home)) = path.split_last() else {
                continue;
            };
            if let Some(home) = resolve(&home.to_vec(), known) {
                out.insert(item.clone(), home);
            }
        }
    }
    out
}

/// Whether one module is the other's ancestor (a parent and its files).
fn related(a: &Module, b: &Module) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn name(m: &Module) -> String {
    m.join("::")
}

fn graph(layout: &Layout) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut known = BTreeMap::new();
    modules(&root().join(layout.src), &Vec::new(), &mut known);
    imports(&known)
}

impl Layout {
    /// The floor of a module, counted from the top.
    fn floor(&self, m: &Module) -> Option<usize> {
        let top = m.first()?;
        self.floors.iter().position(|f| f.contains(&top.as_str()))
    }

    /// Imports against the floors, and modules on no floor.
    fn wrong_imports(&self) -> Vec<String> {
        let graph = graph(self);
        let mut wrong = Vec::new();
        for (from, uses) in &graph {
            let top = from[0].as_str();
            if self.exempt.contains(&top) {
                continue;
            }
            let beside = self.beside.filter(|(b, _)| *b == top);
            if beside.is_none() && self.floor(from).is_none() {
                wrong.push(format!("{}: {} is on no floor", self.src, name(from)));
                continue;
            }
            for to in uses {
                let ok = match (beside, self.floor(from), self.floor(to)) {
                    (Some((_, may)), _, _) => may.contains(&to[0].as_str()),
                    (None, Some(a), Some(b)) => b >= a,
                    (None, Some(_), None) => self.beside.is_some_and(|(b, _)| to[0] == b),
                    (None, None, _) => false,
                };
                if !ok {
                    wrong.push(format!("{}: {} uses {}", self.src, name(from), name(to)));
                }
            }
        }
        wrong
    }

    /// Every chain of imports that comes back to where it started.
    fn circles(&self) -> Vec<String> {
        let graph = graph(self);
        let mut circles = Vec::new();
        for start in graph.keys() {
            // Every module reachable from `start` by imports between
            // unrelated modules, with the path that reached it.
            let mut seen: BTreeSet<&Module> = BTreeSet::new();
            let mut todo = vec![(start, vec![start])];
            while let Some((at, trail)) = todo.pop() {
                for next in graph.get(at).into_iter().flatten() {
                    if related(at, next) {
                        continue;
                    }
                    if next == start {
                        let names: Vec<_> = trail.iter().map(|m| name(m)).collect();
                        circles.push(format!(
                            "{}: {} -> {}",
                            self.src,
                            names.join(" -> "),
                            name(start)
                        ));
                        continue;
                    }
                    if !seen.insert(next) {
                        continue;
                    }
                    let mut longer = trail.clone();
                    longer.push(next);
                    todo.push((next, longer));
                }
            }
        }
        circles
    }
}

#[test]
fn no_file_imports_a_higher_floor_and_ops_takes_only_the_table() {
    let wrong: Vec<String> = LAYOUTS.iter().flat_map(|l| l.wrong_imports()).collect();
    assert!(wrong.is_empty(), "imports against the floors: {wrong:#?}");
}

#[test]
fn no_two_files_import_each_other() {
    let circles: Vec<String> = LAYOUTS.iter().flat_map(|l| l.circles()).collect();
    assert!(circles.is_empty(), "import circles: {circles:#?}");
}

#[test]
fn the_check_sees_the_imports_it_judges() {
    // A check that resolved nothing would pass on any layout.
    let uses = |layout: &Layout, from: &[&str], to: &[&str]| {
        let from: Module = from.iter().map(|s| s.to_string()).collect();
        let to: Module = to.iter().map(|s| s.to_string()).collect();
        graph(layout).get(&from).is_some_and(|u| u.contains(&to))
    };
    assert!(uses(&SERVER, &["net", "pipeline"], &["service"]));
    assert!(uses(&SERVER, &["service", "lock"], &["service", "reply"]));
    assert!(uses(&SERVER, &["engine", "local"], &["table"]));
    assert!(uses(&LIBRARY, &["client"], &["owners"]));
    assert!(uses(&LIBRARY, &["link"], &["dial"]));
    assert!(uses(&CLI, &["run"], &["connect"]));
    assert!(
        graph(&SERVER).len() > 60,
        "only {} modules found",
        graph(&SERVER).len()
    );
    assert!(graph(&LIBRARY).len() > 15);
    assert!(graph(&CLI).len() > 15);
}

/// The `.rs` files under `dir`, as paths relative to it.
fn sources(dir: &Path) -> BTreeSet<String> {
    let mut known = BTreeMap::new();
    modules(dir, &Vec::new(), &mut known);
    known
        .values()
        .map(|p| {
            p.strip_prefix(dir)
                .expect("under its directory")
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// The backticked words of `text` that name a Rust file.
fn named_files(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| w.ends_with(".rs") && !w.contains(' '))
        .map(str::to_owned)
        .collect()
}

/// docs/ARCHITECTURE.md's file map of each crate: the section under a
/// heading that names the crate's source directory (`### Files of
/// \`dlock-server/src/\``), which names every file by its path from there.
fn file_maps(doc: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut maps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut section = String::new();
    let mut close = |current: &Option<String>, section: &str| {
        if let Some(src) = current {
            maps.entry(src.clone())
                .or_default()
                .extend(named_files(section));
        }
    };
    for line in doc.lines() {
        if line.starts_with('#') {
            close(&current, &section);
            section.clear();
            current = line
                .strip_prefix("### Files of `")
                .and_then(|rest| rest.split('`').next())
                .map(|src| src.trim_end_matches('/').to_owned());
            continue;
        }
        section.push_str(line);
        section.push('\n');
    }
    close(&current, &section);
    maps
}

#[test]
fn the_architecture_map_names_every_source_file_and_no_other() {
    let root = root();
    let doc = fs::read_to_string(root.join("docs/ARCHITECTURE.md")).expect("the map is readable");
    let maps = file_maps(&doc);
    let mut wrong = Vec::new();
    for src in MAPPED {
        let Some(named) = maps.get(src) else {
            wrong.push(format!("no section \"### Files of `{src}/`\""));
            continue;
        };
        let present = sources(&root.join(src));
        for missing in present.difference(named) {
            wrong.push(format!("{src}/{missing} is not in the map"));
        }
        for stale in named.difference(&present) {
            wrong.push(format!(
                "the map of {src}/ names {stale}, which does not exist"
            ));
        }
    }
    // Elsewhere in the document a file is named from the repository's root
    // or from a crate's source directory; it must exist in one of them.
    for file in named_files(&doc) {
        let exists = root.join(&file).is_file()
            || MAPPED
                .iter()
                .any(|src| root.join(src).join(&file).is_file());
        if !exists {
            wrong.push(format!("{file} is named but exists nowhere"));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/ARCHITECTURE.md is out of date: {wrong:#?}"
    );
}
