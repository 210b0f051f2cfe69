//! README.md's model table is the registry's rows (`arch::FAMILIES`, each family's `Models`):
//! a family added, renamed or dropped without its row, or a row without its family, fails
//! here. docs/MODELS.md points to it and keeps no second copy.

use std::collections::BTreeSet;
use std::path::Path;

use sluice_model::arch::{FAMILIES, family};

mod common;

/// The rows of the table whose header starts with `| \`model_type\``, each as its cells.
fn table(file: &str) -> Vec<Vec<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let mut lines = text
        .lines()
        .skip_while(|l| !l.starts_with("| `model_type` |"));
    assert!(lines.next().is_some(), "{file} has no model table");
    lines
        .skip(1) // the |---| line
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// The registry's rows as the table writes them: `model_type` values in backticks, names,
/// what is distinctive.
fn registry() -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = FAMILIES
        .iter()
        .flat_map(|f| f.models)
        .map(|m| {
            let types: Vec<String> = m.model_types.iter().map(|t| format!("`{t}`")).collect();
            vec![
                types.join(", "),
                m.names.to_string(),
                m.features.to_string(),
            ]
        })
        .collect();
    rows.sort();
    rows
}

fn check(file: &str) {
    let mut rows = table(file);
    rows.sort();
    let want = registry();
    for row in &rows {
        assert!(
            want.contains(row),
            "{file}: a row the registry does not have: {row:?}"
        );
    }
    for row in &want {
        assert!(
            rows.contains(row),
            "{file}: the registry's row is missing: {row:?}"
        );
    }
    assert_eq!(rows.len(), want.len(), "{file}: rows listed twice");
}

#[test]
fn the_readme_lists_every_family_as_the_registry_does() {
    check("README.md");
}

/// docs/MODELS.md has no second table to drift, and points to README's.
#[test]
fn models_md_points_to_the_readme_table() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/MODELS.md");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text.contains("| `model_type` |"),
        "docs/MODELS.md: a second model table"
    );
    assert!(
        text.contains("../README.md#models"),
        "docs/MODELS.md: no link to the table"
    );
}

#[test]
fn every_family_has_a_row() {
    for f in FAMILIES {
        assert!(!f.models.is_empty(), "{} has no models", f.name);
    }
}

/// Every family is checked against its reference: a family added without a fixture in
/// `common::FIXTURES` (a `REF` row) fails.
#[test]
fn every_family_has_a_reference_fixture() {
    let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    let mut covered = BTreeSet::new();
    for name in common::fixtures(common::REF) {
        let path = testdata.join(name).join("config.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let cfg: serde_json::Value = serde_json::from_str(&text).unwrap();
        let model_type = cfg["model_type"]
            .as_str()
            .unwrap_or_else(|| panic!("{path:?}"));
        let f =
            family(model_type).unwrap_or_else(|| panic!("{name}: no family reads {model_type}"));
        covered.insert(f.name);
    }
    for f in FAMILIES {
        assert!(
            covered.contains(f.name),
            "family {} has no reference fixture",
            f.name
        );
    }
}
