//! `cargo xtask publish-check CRATE...`: every crate the workspace publishes
//! has what crates.io and docs.rs need, and pins nothing a user would have to
//! fight.
//!
//! Reads `cargo metadata --no-deps` and checks, for each package that is not
//! `publish = false`:
//! - the set of published packages is exactly the list given (CI passes the
//!   crates it packages, so a new crate needs a decision either way);
//! - description, license, repository, documentation, rust-version;
//! - a readme that exists in the package's directory (cargo packages it);
//! - 1 to 5 keywords, each as crates.io accepts them (ASCII letters, digits,
//!   `_`, `-`, `+`, starting with a letter or digit, at most 20 characters);
//! - 1 to 5 categories, each a crates.io category slug ([`CATEGORIES`]);
//! - `[package.metadata.docs.rs]`: present, and where the package has
//!   features of its own, naming the ones docs.rs builds (`features` or
//!   `all-features`); every feature named exists;
//! - no normal or build dependency with an exact (`=x.y.z`) or wildcard
//!   (`*`, also what a path dependency without a version gets) requirement;
//! - the package's file list (`cargo package --list`) holds both licence
//!   texts, `LICENSE-MIT` and `LICENSE-APACHE`, and no history notebook (a
//!   file whose name contains `history`, such as `BENCHMARKS-history.md`);
//! - the licence texts are what their names say (the MIT permission notice,
//!   the Apache License 2.0), and each crate's copies (symlinks or files)
//!   read the same as the workspace root's.
//!
//! Every problem is listed on stdout, one per line, before the command fails
//! with one `error:` line on stderr.

use serde_json::Value;

use crate::util::{Failure, Result};

/// Command-line options of `publish-check`.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// The crates the workspace publishes (all of them, in any order)
    #[arg(required = true, value_name = "CRATE")]
    pub crates: Vec<String>,
}

/// Category slugs of crates.io (`src/boot/categories.toml` of the crates.io
/// repository). A subset: a slug missing here is refused even if crates.io
/// has gained it since; add it after checking crates.io/category_slugs.
pub const CATEGORIES: &[&str] = &[
    "algorithms",
    "api-bindings",
    "asynchronous",
    "authentication",
    "caching",
    "command-line-interface",
    "command-line-utilities",
    "compression",
    "computer-vision",
    "concurrency",
    "config",
    "cryptography",
    "cryptography::cryptocurrencies",
    "data-structures",
    "database",
    "database-implementations",
    "date-and-time",
    "development-tools",
    "development-tools::build-utils",
    "development-tools::cargo-plugins",
    "development-tools::debugging",
    "development-tools::ffi",
    "development-tools::procedural-macro-helpers",
    "development-tools::profiling",
    "development-tools::testing",
    "email",
    "embedded",
    "emulators",
    "encoding",
    "external-ffi-bindings",
    "filesystem",
    "game-development",
    "game-engines",
    "games",
    "graphics",
    "gui",
    "hardware-support",
    "internationalization",
    "localization",
    "mathematics",
    "memory-management",
    "multimedia",
    "multimedia::audio",
    "multimedia::encoding",
    "multimedia::images",
    "multimedia::video",
    "network-programming",
    "no-std",
    "os",
    "os::linux-apis",
    "os::macos-apis",
    "os::unix-apis",
    "os::windows-apis",
    "parser-implementations",
    "parsing",
    "rendering",
    "rendering::data-formats",
    "rendering::engine",
    "rendering::graphics-api",
    "rust-patterns",
    "science",
    "science::robotics",
    "simulation",
    "template-engine",
    "text-editors",
    "text-processing",
    "value-formatting",
    "visualization",
    "wasm",
    "web-programming",
    "web-programming::http-client",
    "web-programming::http-server",
    "web-programming::websocket",
];

/// Runs the check on this workspace.
pub fn run(o: Options) -> Result<()> {
    let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(crate::util::workspace_root())
        .output()
        .map_err(|e| Failure::new(format!("cannot run cargo metadata: {e}")))?;
    if !out.status.success() {
        return Err(Failure::new(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let meta: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| Failure::new(format!("cargo metadata printed no JSON: {e}")))?;
    let mut problems = check(&meta, &o.crates, &|p| p.is_file());
    problems.extend(check_licence_texts(&crate::util::workspace_root()));
    for (name, dir) in published_dirs(&meta) {
        if !o.crates.contains(&name) {
            continue;
        }
        match package_list(&name) {
            Ok(files) => problems.extend(check_package_files(&name, &files)),
            Err(e) => problems.push(format!("{name}: {}", e.message)),
        }
        problems.extend(check_licence_copies(
            &name,
            &crate::util::workspace_root(),
            &dir,
        ));
    }
    if problems.is_empty() {
        println!(
            "publish-check: {} crates have complete metadata, pin nothing, and ship \
             both licence texts and no history notebook",
            o.crates.len()
        );
        Ok(())
    } else {
        // The list on stdout; stderr keeps the xtask's one `error:` line.
        for p in &problems {
            println!("  {p}");
        }
        Err(Failure::new(format!(
            "publish-check: {} problem(s) above",
            problems.len()
        )))
    }
}

/// The licence files every published package ships.
pub const LICENCE_FILES: [&str; 2] = ["LICENSE-MIT", "LICENSE-APACHE"];

/// A phrase each licence text must contain: the file is the licence its
/// name says, not an empty or stray file.
const LICENCE_MARKERS: [(&str, &str); 2] = [
    (
        "LICENSE-MIT",
        "Permission is hereby granted, free of charge, to any",
    ),
    ("LICENSE-APACHE", "Version 2.0, January 2004"),
];

/// Name and directory of each publishable package in `meta`.
fn published_dirs(meta: &Value) -> Vec<(String, std::path::PathBuf)> {
    let empty = Vec::new();
    meta["packages"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter(|p| published(p))
        .filter_map(|p| {
            let name = p["name"].as_str()?;
            let dir = std::path::Path::new(p["manifest_path"].as_str()?).parent()?;
            Some((name.to_owned(), dir.to_path_buf()))
        })
        .collect()
}

/// The files `cargo package --list` puts in the package of `name`.
fn package_list(name: &str) -> Result<Vec<String>> {
    let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["package", "--list", "--allow-dirty", "-p", name])
        .current_dir(crate::util::workspace_root())
        .output()
        .map_err(|e| Failure::new(format!("cannot run cargo package --list: {e}")))?;
    if !out.status.success() {
        return Err(Failure::new(format!(
            "cargo package --list failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// Every problem of one package's file list (as `cargo package --list`
/// prints it): a licence text missing, a history notebook shipped.
pub fn check_package_files(name: &str, files: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    for licence in LICENCE_FILES {
        if !files.iter().any(|f| f == licence) {
            problems.push(format!(
                "{name}: {licence} is not in the package (link or copy the root's \
                 {licence} into the crate directory)"
            ));
        }
    }
    for f in files {
        let file_name = f.rsplit('/').next().unwrap_or(f);
        if file_name.to_ascii_lowercase().contains("history") {
            problems.push(format!(
                "{name}: ships the history notebook {f} (leave it out with `include`/`exclude`)"
            ));
        }
    }
    problems
}

/// Problems of the workspace root's licence texts: missing, or not the
/// licence the name says.
pub fn check_licence_texts(root: &std::path::Path) -> Vec<String> {
    let mut problems = Vec::new();
    for (file, marker) in LICENCE_MARKERS {
        match std::fs::read_to_string(root.join(file)) {
            Ok(text) if text.contains(marker) => {}
            Ok(_) => problems.push(format!(
                "{file} at the workspace root does not contain {marker:?}: not that licence's text"
            )),
            Err(e) => problems.push(format!("{file} at the workspace root: cannot read it: {e}")),
        }
    }
    problems
}

/// Problems of one crate's licence files against the root's: each must
/// read the same (a symlink to the root's, or an identical copy).
pub fn check_licence_copies(
    name: &str,
    root: &std::path::Path,
    dir: &std::path::Path,
) -> Vec<String> {
    let mut problems = Vec::new();
    for file in LICENCE_FILES {
        let (Ok(want), Ok(have)) = (
            std::fs::read(root.join(file)),
            std::fs::read(dir.join(file)),
        ) else {
            // A missing file is reported through the package list.
            continue;
        };
        if want != have {
            problems.push(format!(
                "{name}: {file} differs from the workspace root's {file}"
            ));
        }
    }
    problems
}

/// Whether `cargo metadata` marks the package publishable (`publish` absent
/// or a non-empty registry list).
fn published(pkg: &Value) -> bool {
    match &pkg["publish"] {
        Value::Null => true,
        Value::Array(a) => !a.is_empty(),
        _ => false,
    }
}

fn text<'a>(pkg: &'a Value, key: &str) -> Option<&'a str> {
    pkg[key].as_str().filter(|s| !s.trim().is_empty())
}

/// Whether crates.io accepts `k` as a keyword.
fn valid_keyword(k: &str) -> bool {
    let mut chars = k.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && k.len() <= 20
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+'))
}

/// Every problem of the published packages in `meta` (a `cargo metadata`
/// object); `exists` says whether a file exists (the readme).
pub fn check(
    meta: &Value,
    expected: &[String],
    exists: &dyn Fn(&std::path::Path) -> bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    let empty = Vec::new();
    let packages = meta["packages"].as_array().unwrap_or(&empty);
    let members: Vec<&Value> = packages.iter().filter(|p| published(p)).collect();
    let names: Vec<&str> = members.iter().filter_map(|p| p["name"].as_str()).collect();
    for n in &names {
        if !expected.iter().any(|e| e == n) {
            problems.push(format!(
                "{n}: published (no `publish = false`) but not in the list of crates CI packages"
            ));
        }
    }
    for e in expected {
        if !names.contains(&e.as_str()) {
            problems.push(format!(
                "{e}: in the list of crates to publish, but not a publishable workspace package"
            ));
        }
    }
    for pkg in members {
        let name = pkg["name"].as_str().unwrap_or("?");
        let mut bad = |what: String| problems.push(format!("{name}: {what}"));
        for key in ["description", "repository", "documentation", "rust_version"] {
            if text(pkg, key).is_none() {
                bad(format!("no {}", key.replace('_', "-")));
            }
        }
        if text(pkg, "license").is_none() && text(pkg, "license_file").is_none() {
            bad("no license".into());
        }
        match (text(pkg, "readme"), pkg["manifest_path"].as_str()) {
            (Some(readme), Some(manifest)) => {
                let dir = std::path::Path::new(manifest)
                    .parent()
                    .unwrap_or(std::path::Path::new("."));
                if !exists(&dir.join(readme)) {
                    bad(format!("readme {readme} does not exist beside Cargo.toml"));
                }
            }
            _ => bad("no readme".into()),
        }
        let list = |key: &str| -> Vec<String> {
            pkg[key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        let keywords = list("keywords");
        if keywords.is_empty() || keywords.len() > 5 {
            bad(format!(
                "{} keywords (crates.io takes 1 to 5)",
                keywords.len()
            ));
        }
        for k in keywords.iter().filter(|k| !valid_keyword(k)) {
            bad(format!("keyword {k:?} is not one crates.io accepts"));
        }
        let categories = list("categories");
        if categories.is_empty() || categories.len() > 5 {
            bad(format!(
                "{} categories (crates.io takes 1 to 5)",
                categories.len()
            ));
        }
        for c in categories
            .iter()
            .filter(|c| !CATEGORIES.contains(&c.as_str()))
        {
            bad(format!("category {c:?} is not a crates.io category slug"));
        }
        let docs = &pkg["metadata"]["docs"]["rs"];
        let features: Vec<&str> = pkg["features"]
            .as_object()
            .map(|m| {
                m.keys()
                    .map(String::as_str)
                    .filter(|k| *k != "default")
                    .collect()
            })
            .unwrap_or_default();
        if !docs.is_object() {
            bad("no [package.metadata.docs.rs]".into());
        } else {
            let named: Vec<String> = docs["features"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            let all = docs["all-features"].as_bool() == Some(true);
            if !features.is_empty() && named.is_empty() && !all {
                bad(format!(
                    "[package.metadata.docs.rs] names none of the features ({})",
                    features.join(", ")
                ));
            }
            for f in named.iter().filter(|f| !features.contains(&f.as_str())) {
                bad(format!("[package.metadata.docs.rs] names no feature {f:?}"));
            }
        }
        for dep in pkg["dependencies"].as_array().unwrap_or(&empty) {
            if dep["kind"].as_str() == Some("dev") {
                continue;
            }
            let dname = dep["name"].as_str().unwrap_or("?");
            let req = dep["req"].as_str().unwrap_or("*").trim();
            if req.starts_with('=') {
                bad(format!("dependency {dname} pinned ({req})"));
            } else if req == "*" {
                bad(format!(
                    "dependency {dname} has no version requirement (`*`; a path \
                     dependency needs a version to be published)"
                ));
            }
        }
    }
    problems
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn good() -> Value {
        json!({
            "name": "good",
            "publish": null,
            "description": "A crate.",
            "license": "MIT OR Apache-2.0",
            "license_file": null,
            "repository": "https://example.invalid/r",
            "documentation": "https://docs.rs/good",
            "rust_version": "1.88",
            "readme": "README.md",
            "manifest_path": "/w/crates/good/Cargo.toml",
            "keywords": ["cuda", "no-std", "zero-copy"],
            "categories": ["embedded", "development-tools::testing"],
            "features": {"default": [], "vulkan": []},
            "metadata": {"docs": {"rs": {"features": ["vulkan"]}}},
            "dependencies": [
                {"name": "serde", "req": "^1", "kind": null},
                {"name": "bindgen", "req": "=0.72.1", "kind": "dev"}
            ]
        })
    }

    fn meta(pkgs: Vec<Value>) -> Value {
        json!({ "packages": pkgs })
    }

    fn run_on(pkgs: Vec<Value>, expected: &[&str]) -> Vec<String> {
        let expected: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        check(&meta(pkgs), &expected, &|p| {
            p == std::path::Path::new("/w/crates/good/README.md")
        })
    }

    #[test]
    fn a_complete_package_passes() {
        let unpublished = json!({"name": "fixtures", "publish": []});
        assert_eq!(
            run_on(vec![good(), unpublished], &["good"]),
            Vec::<String>::new()
        );
    }

    #[test]
    fn each_missing_field_is_named() {
        let mut p = good();
        for key in [
            "description",
            "license",
            "repository",
            "documentation",
            "rust_version",
        ] {
            p[key] = Value::Null;
        }
        p["keywords"] = json!([]);
        p["categories"] = json!([]);
        p["metadata"] = Value::Null;
        let problems = run_on(vec![p], &["good"]);
        for want in [
            "no description",
            "no license",
            "no repository",
            "no documentation",
            "no rust-version",
            "0 keywords",
            "0 categories",
            "no [package.metadata.docs.rs]",
        ] {
            assert!(
                problems.iter().any(|p| p.contains(want)),
                "{want} missing from {problems:?}"
            );
        }
    }

    #[test]
    fn a_readme_that_is_not_there_is_refused() {
        let mut p = good();
        p["readme"] = json!("../README.md");
        let problems = run_on(vec![p], &["good"]);
        assert!(
            problems[0].contains("readme ../README.md does not exist"),
            "{problems:?}"
        );
    }

    #[test]
    fn bad_keywords_and_categories_are_refused() {
        let mut p = good();
        p["keywords"] = json!(["a", "b", "c", "d", "e", "f"]);
        p["categories"] = json!(["gpu", "hardware-support"]);
        let problems = run_on(vec![p.clone()], &["good"]);
        assert!(
            problems.iter().any(|p| p.contains("6 keywords")),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(|p| p.contains("category \"gpu\"")),
            "{problems:?}"
        );
        p["keywords"] = json!(["-dash", "has space", "x".repeat(21), "ok_1+2"]);
        let problems = run_on(vec![p], &["good"]);
        let kw: Vec<_> = problems
            .iter()
            .filter(|p| p.contains("keyword \""))
            .collect();
        assert_eq!(kw.len(), 3, "{problems:?}");
    }

    #[test]
    fn docs_rs_must_name_existing_features() {
        let mut p = good();
        p["metadata"] = json!({"docs": {"rs": {"targets": ["x86_64-unknown-linux-gnu"]}}});
        let problems = run_on(vec![p.clone()], &["good"]);
        assert!(
            problems[0].contains("names none of the features (vulkan)"),
            "{problems:?}"
        );
        p["metadata"] = json!({"docs": {"rs": {"features": ["vulkan", "gone"]}}});
        let problems = run_on(vec![p.clone()], &["good"]);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("no feature \"gone\""));
        p["metadata"] = json!({"docs": {"rs": {"all-features": true}}});
        assert!(run_on(vec![p], &["good"]).is_empty());
    }

    #[test]
    fn pins_and_versionless_dependencies_are_refused() {
        let mut p = good();
        p["dependencies"] = json!([
            {"name": "pinned", "req": "=1.2.3", "kind": null},
            {"name": "built", "req": "= 0.1", "kind": "build"},
            {"name": "pathonly", "req": "*", "kind": null},
            {"name": "fine", "req": "^0.9", "kind": null}
        ]);
        let problems = run_on(vec![p], &["good"]);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("pinned pinned (=1.2.3)"));
        assert!(problems[2].contains("pathonly has no version requirement"));
    }

    fn listed(files: &[&str]) -> Vec<String> {
        files.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_package_with_both_licences_and_no_notebook_passes() {
        let files = listed(&[
            "Cargo.toml",
            "LICENSE-APACHE",
            "LICENSE-MIT",
            "README.md",
            "CHANGELOG.md",
            "src/lib.rs",
        ]);
        assert_eq!(check_package_files("good", &files), Vec::<String>::new());
    }

    #[test]
    fn a_missing_licence_text_is_named() {
        let problems = check_package_files("good", &listed(&["Cargo.toml", "LICENSE-MIT"]));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("good: LICENSE-APACHE is not in the package"),
            "{problems:?}"
        );
        let problems = check_package_files("good", &listed(&["Cargo.toml", "docs/LICENSE-MIT"]));
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn a_history_notebook_is_refused() {
        let files = listed(&[
            "LICENSE-APACHE",
            "LICENSE-MIT",
            "BENCHMARKS-history.md",
            "docs/run-History.md",
        ]);
        let problems = check_package_files("good", &files);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].contains("BENCHMARKS-history.md"),
            "{problems:?}"
        );
        assert!(problems[1].contains("docs/run-History.md"), "{problems:?}");
    }

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-publish-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("crates/a")).unwrap();
        dir
    }

    #[test]
    fn licence_texts_must_be_those_licences() {
        let dir = scratch("texts");
        assert_eq!(check_licence_texts(&dir).len(), 2);
        std::fs::write(dir.join("LICENSE-MIT"), "MIT\n").unwrap();
        std::fs::write(
            dir.join("LICENSE-APACHE"),
            "Apache License\nVersion 2.0, January 2004\n",
        )
        .unwrap();
        let problems = check_licence_texts(&dir);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("LICENSE-MIT at the workspace root does not contain"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_crate_copy_that_differs_from_the_root_is_refused() {
        let dir = scratch("copies");
        let krate = dir.join("crates/a");
        for f in LICENCE_FILES {
            std::fs::write(dir.join(f), format!("{f} text\n")).unwrap();
            std::fs::write(krate.join(f), format!("{f} text\n")).unwrap();
        }
        assert!(check_licence_copies("a", &dir, &krate).is_empty());
        std::fs::write(krate.join("LICENSE-MIT"), "edited\n").unwrap();
        let problems = check_licence_copies("a", &dir, &krate);
        assert_eq!(
            problems,
            vec!["a: LICENSE-MIT differs from the workspace root's LICENSE-MIT".to_string()]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_published_set_must_match_the_list() {
        let mut other = good();
        other["name"] = json!("other");
        other["manifest_path"] = json!("/w/crates/good/Cargo.toml");
        let problems = run_on(vec![good(), other], &["good", "missing"]);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("other: published"));
        assert!(problems[1].starts_with("missing: in the list"));
    }
}
