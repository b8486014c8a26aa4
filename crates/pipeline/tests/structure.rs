//! The shape of `src/`: no function longer than 80 lines, and no circle
//! among the crate's top modules (no two that import each other, directly
//! or through others). Both read the source tree; test modules are left
//! out (a test may reach anywhere).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest function allowed, in lines (signature to closing brace).
const MAX_LINES: usize = 80;

/// Functions over the limit on this branch that another branch of the same
/// change already splits (the program's option checks and its capability
/// report, both split on the CLI work's branch); the list goes once the
/// branches are merged.
const SPLIT_ELSEWHERE: &[(&str, &str)] =
    &[("app/cli.rs", "validate"), ("app/info.rs", "device_lines")];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every source file under `src/`, as (path relative to `src/`, text
/// without its test module).
fn tree() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(&p).unwrap();
            (rel, without_tests(&text))
        })
        .collect()
}

/// `text` up to its `#[cfg(test)]` test module, comment lines dropped.
fn without_tests(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            lines[i].trim() == "#[cfg(test)]"
                && lines[i + 1..]
                    .iter()
                    .take(3)
                    .any(|l| l.trim_start().starts_with("mod tests"))
        })
        .unwrap_or(lines.len());
    lines[..end]
        .iter()
        .filter(|l| !l.trim_start().starts_with("//"))
        .copied()
        .collect::<Vec<_>>()
        .join("\n")
}

/// The name of the function a line declares, if it declares one.
fn declared_fn(line: &str) -> Option<&str> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "fn")?;
    let before_ok = words[..at].iter().all(|w| {
        w.starts_with("pub") || matches!(*w, "const" | "async" | "unsafe" | "extern" | "\"C\"")
    });
    if !before_ok {
        return None;
    }
    let name = words.get(at + 1)?;
    let end = name
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(name.len());
    Some(&name[..end])
}

/// Every function of `text` with its length in lines.
fn functions(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(name) = declared_fn(lines[i]) else {
            i += 1;
            continue;
        };
        let (mut depth, mut opened, mut j) = (0i64, false, i);
        while j < lines.len() {
            for c in lines[j].chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if (opened && depth == 0) || (!opened && lines[j].trim_end().ends_with(';')) {
                break;
            }
            j += 1;
        }
        if opened {
            found.push((name.to_string(), j - i + 1));
            i = j + 1;
        } else {
            i += 1;
        }
    }
    found
}

#[test]
fn no_function_is_longer_than_80_lines() {
    let mut long = Vec::new();
    for (file, text) in tree() {
        for (name, lines) in functions(&text) {
            let excused = SPLIT_ELSEWHERE.contains(&(file.as_str(), name.as_str()));
            if lines > MAX_LINES && !excused {
                long.push(format!("{file}: fn {name} is {lines} lines"));
            }
        }
    }
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:#?}");
}

#[test]
fn the_line_counter_counts() {
    let text = "fn a() {\n    let x = 1;\n}\npub(crate) fn b(\n    y: u8,\n) -> u8 {\n    y\n}\n";
    assert_eq!(
        functions(text),
        [("a".to_string(), 3), ("b".to_string(), 5)]
    );
    assert_eq!(declared_fn("    fn drop(&mut self) {"), Some("drop"));
    assert_eq!(declared_fn("let f = fn_ptr;"), None);
}

/// The top modules each top module names (`crate::x`).
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let files = tree();
    let top = |file: &str| {
        file.split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string()
    };
    let tops: BTreeSet<String> = files.iter().map(|(f, _)| top(f)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, text) in &files {
        let from = top(file);
        if from == "lib" || from == "bin" {
            continue;
        }
        for (at, _) in text.match_indices("crate::") {
            let rest = &text[at + "crate::".len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let to = &rest[..end];
            if to != from && tops.contains(to) {
                edges
                    .entry(from.clone())
                    .or_default()
                    .insert(to.to_string());
            }
        }
    }
    edges
}

/// Whether `to` is reached from `from`.
fn reaches(edges: &BTreeMap<String, BTreeSet<String>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from.to_string()];
    while let Some(m) = stack.pop() {
        for next in edges.get(&m).into_iter().flatten() {
            if next == to {
                return true;
            }
            if seen.insert(next.clone()) {
                stack.push(next.clone());
            }
        }
    }
    false
}

#[test]
fn no_two_modules_import_each_other() {
    let edges = imports();
    let mut circles = Vec::new();
    for (from, tos) in &edges {
        for to in tos {
            if reaches(&edges, to, from) {
                circles.push(format!("{from} -> {to} -> ... -> {from}"));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "circles: {circles:#?}; imports: {edges:#?}"
    );
    // The layering the crate's docs describe.
    for (low, high) in [
        ("frame", "transport"),
        ("error", "consumer"),
        ("slots", "ring"),
        ("transport", "ring"),
        ("consumer", "transport"),
    ] {
        assert!(
            !reaches(&edges, low, high),
            "{low} reaches {high}: {edges:#?}"
        );
    }
}
