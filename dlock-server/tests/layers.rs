//! The server's floors, checked on its source: no file imports one on a
//! higher floor, `ops` takes nothing from the floors but the table, and no
//! two files import each other, however indirectly (docs/ARCHITECTURE.md,
//! "The server in floors"). A module's own files may use their parent's
//! items, which is how the table's files extend `LockTable`.
//!
//! The check reads every `crate::` and `super::` path outside comments and
//! test modules, and resolves it to the deepest file it names.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The floors from the top; a file may use its own floor and those below.
const FLOORS: [&str; 4] = ["net", "service", "engine", "table"];

/// Beside the floors: used by them, and itself using only the table.
const BESIDE: &str = "ops";

/// Test and fuzz scaffolding, and the crate's root and binary: they sit on
/// top of everything and may use any of it.
const EXEMPT: [&str; 4] = ["testing", "fuzzing", "lib", "main"];

type Module = Vec<String>;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every module of the crate with its file.
fn modules(dir: &Path, prefix: &Module, out: &mut BTreeMap<Module, PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("src is readable")
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
            .filter_map(|p| resolve(p, known))
            .filter(|m| m != module)
            .collect();
        graph.insert(module.clone(), uses);
    }
    graph
}

/// Whether one module is the other's ancestor (a parent and its files).
fn related(a: &Module, b: &Module) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn floor(m: &Module) -> Option<usize> {
    FLOORS
        .iter()
        .position(|f| m.first().is_some_and(|x| x == f))
}

fn name(m: &Module) -> String {
    m.join("::")
}

fn graph() -> BTreeMap<Module, BTreeSet<Module>> {
    let mut known = BTreeMap::new();
    modules(&src(), &Vec::new(), &mut known);
    imports(&known)
}

#[test]
fn no_file_imports_a_higher_floor_and_ops_takes_only_the_table() {
    let graph = graph();
    let mut wrong = Vec::new();
    for (from, uses) in &graph {
        let top = from[0].as_str();
        if EXEMPT.contains(&top) {
            continue;
        }
        for to in uses {
            let ok = match (floor(from), floor(to), top == BESIDE) {
                (_, _, true) => to[0] == BESIDE || to[0] == "table",
                (Some(a), Some(b), _) => b >= a,
                (Some(_), None, _) => to[0] == BESIDE,
                (None, _, _) => false,
            };
            if !ok {
                wrong.push(format!("{} uses {}", name(from), name(to)));
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the floors: {wrong:#?}");
}

#[test]
fn no_two_files_import_each_other() {
    let graph = graph();
    let mut circles = Vec::new();
    for start in graph.keys() {
        // Every module reachable from `start` by imports between unrelated
        // modules, with the path that reached it.
        let mut seen: BTreeMap<&Module, Vec<&Module>> = BTreeMap::new();
        let mut todo = vec![(start, vec![start])];
        while let Some((at, trail)) = todo.pop() {
            for next in graph.get(at).into_iter().flatten() {
                if related(at, next) {
                    continue;
                }
                if next == start {
                    let names: Vec<_> = trail.iter().map(|m| name(m)).collect();
                    circles.push(format!("{} -> {}", names.join(" -> "), name(start)));
                    continue;
                }
                if seen.contains_key(next) {
                    continue;
                }
                let mut longer = trail.clone();
                longer.push(next);
                seen.insert(next, longer.clone());
                todo.push((next, longer));
            }
        }
    }
    assert!(circles.is_empty(), "import circles: {circles:#?}");
}

#[test]
fn the_check_sees_the_imports_it_judges() {
    // A check that resolved nothing would pass on any layout.
    let graph = graph();
    let uses = |from: &[&str], to: &[&str]| {
        let from: Module = from.iter().map(|s| s.to_string()).collect();
        let to: Module = to.iter().map(|s| s.to_string()).collect();
        graph.get(&from).is_some_and(|u| u.contains(&to))
    };
    assert!(uses(&["net", "pipeline"], &["service"]));
    assert!(uses(&["service", "lock"], &["service", "session"]));
    assert!(uses(&["engine", "local"], &["table"]));
    assert!(graph.len() > 60, "only {} modules found", graph.len());
}
