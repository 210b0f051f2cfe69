//! The import graph between the top-level modules of `sluice-model` and of this crate: a module
//! that reaches another which reaches it back is a cycle, and neither crate has one. The test
//! fails when one forms. In `sluice-model` the runtime (`model`) imports the forward pass
//! (`pass`, `mtp`), which is written over the network it reads (`net`), never the reverse:
//! `impl Model` is written in `model.rs` alone, which is checked too.
//!
//! An edge is a `crate::module` path in code, or `crate::Name` for a name the crate root
//! re-exports from `module` (comments and unit tests do not count).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates checked.
const CRATES: &[&str] = &["sluice-model", "sluice"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The names the crate root re-exports from its own modules (`pub use module::{A, B};`), with
/// their module.
fn reexports(src: &Path) -> BTreeMap<String, String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut out = BTreeMap::new();
    for part in lib.split("pub use ").skip(1) {
        let stmt = part.split(';').next().unwrap();
        let Some((module, items)) = stmt.split_once("::") else {
            continue;
        };
        for item in items
            .trim_matches(|c: char| c == '{' || c == '}' || c.is_whitespace())
            .split(',')
        {
            let name = ident(item.trim());
            if !name.is_empty() {
                out.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    out
}

/// Module → the modules it names, for the crate whose sources are in `src`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let alias = reexports(src);
    let module_of = |name: &str| alias.get(name).cloned().unwrap_or_else(|| name.to_string());
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let top = first.trim_end_matches(".rs").to_string();
        if top == "lib"
            || top == "main"
            || (rel.components().count() > 1 && f.ends_with("tests.rs"))
        {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        let text = text.split("#[cfg(test)]\nmod tests {").next().unwrap();
        let deps = g.entry(top.clone()).or_default();
        for line in text.lines() {
            let code = line.split("//").next().unwrap();
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                if let Some(group) = rest.strip_prefix('{') {
                    for item in group.split(',') {
                        deps.insert(module_of(ident(item.trim())));
                    }
                } else {
                    deps.insert(module_of(ident(rest)));
                }
            }
        }
    }
    let names: BTreeSet<String> = g.keys().cloned().collect();
    for (m, deps) in g.iter_mut() {
        deps.retain(|d| names.contains(d) && d != m);
    }
    g
}

/// Modules that reach each other, in groups of two or more.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(m) = todo.pop() {
            for d in &g[&m] {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|m| (m, reach(m))).collect();
    let mut groups: Vec<BTreeSet<String>> = Vec::new();
    for m in g.keys() {
        if groups.iter().any(|c| c.contains(m)) {
            continue;
        }
        let group: BTreeSet<String> = g
            .keys()
            .filter(|o| *o == m || (reaches[m].contains(*o) && reaches[*o].contains(m)))
            .cloned()
            .collect();
        if group.len() > 1 {
            groups.push(group);
        }
    }
    groups
}

#[test]
fn no_import_cycle() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for name in CRATES {
        let g = graph(&crates.join(name).join("src"));
        assert!(g.len() > 5, "{name}: no modules found");
        let found = cycles(&g);
        assert!(found.is_empty(), "{name}: import cycles between {found:?}");
    }
}

/// `impl Model` is written in one file of `sluice-model`.
#[test]
fn impl_model_in_one_file() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sluice-model/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let with: Vec<_> = files
        .iter()
        .filter(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .any(|l| l.trim_start().starts_with("impl Model {"))
        })
        .map(|f| f.strip_prefix(&src).unwrap().display().to_string())
        .collect();
    assert_eq!(with, ["model.rs"], "files with `impl Model`");
}

/// The check sees a cycle where there is one.
#[test]
fn a_cycle_is_found() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let edge = |g: &mut BTreeMap<String, BTreeSet<String>>, a: &str, b: &str| {
        g.entry(a.into()).or_default().insert(b.into());
        g.entry(b.into()).or_default();
    };
    edge(&mut g, "a", "b");
    edge(&mut g, "b", "c");
    edge(&mut g, "c", "a");
    edge(&mut g, "c", "d");
    let found = cycles(&g);
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0],
        ["a", "b", "c"].iter().map(|s| s.to_string()).collect()
    );
}
