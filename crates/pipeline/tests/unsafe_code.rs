//! The pipeline denies unsafe code everywhere but one module, `consumer`
//! (issue 24): read from the source tree, so that a new `allow` or an
//! `unsafe` outside it (the binaries included, which the library's
//! `#![deny(unsafe_code)]` does not cover) fails here.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// `text` without its comments (line comments, doc comments and block
/// comments; string literals are kept, a `//` inside one ends the line
/// early, which only hides text from the check, never adds to it: the
/// source has none that matter).
fn code_of(text: &str) -> String {
    let mut code = String::with_capacity(text.len());
    let mut in_block = 0usize;
    for line in text.lines() {
        let mut rest = line;
        loop {
            if in_block > 0 {
                match (rest.find("*/"), rest.find("/*")) {
                    (Some(end), Some(open)) if open < end => {
                        in_block += 1;
                        rest = &rest[open + 2..];
                    }
                    (Some(end), _) => {
                        in_block -= 1;
                        rest = &rest[end + 2..];
                    }
                    (None, _) => break,
                }
                continue;
            }
            let line_comment = rest.find("//");
            let block = rest.find("/*");
            match (line_comment, block) {
                (Some(l), Some(b)) if b < l => {
                    code.push_str(&rest[..b]);
                    in_block = 1;
                    rest = &rest[b + 2..];
                }
                (None, Some(b)) => {
                    code.push_str(&rest[..b]);
                    in_block = 1;
                    rest = &rest[b + 2..];
                }
                (Some(l), _) => {
                    code.push_str(&rest[..l]);
                    break;
                }
                (None, None) => {
                    code.push_str(rest);
                    break;
                }
            }
        }
        code.push('\n');
    }
    code
}

/// Whether `code` has the word `word` (not part of a longer identifier).
fn has_word(code: &str, word: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    code.match_indices(word).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

#[test]
#[cfg_attr(miri, ignore = "reads the source tree from the file system")]
fn only_the_consumer_module_has_unsafe_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let consumer = root.join("consumer");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() >= 20,
        "found only {} source files under {}: the check would not see the crate",
        files.len(),
        root.display()
    );
    let lib = std::fs::read_to_string(root.join("lib.rs")).expect("lib.rs");
    assert!(
        code_of(&lib).contains("#![deny(unsafe_code)]"),
        "lib.rs must deny unsafe code"
    );
    let mut allowed_in = Vec::new();
    let mut offenders = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a source file");
        let code = code_of(&text);
        // Any way of lifting the deny: allow, expect or warn, as an inner or
        // outer attribute, under cfg_attr or not.
        let lifts = ["allow", "expect", "warn"].iter().any(|level| {
            code.match_indices(level).any(|(at, _)| {
                code[at + level.len()..]
                    .trim_start()
                    .strip_prefix('(')
                    .is_some_and(|args| {
                        let args = &args[..args.find(')').unwrap_or(args.len())];
                        args.split(',').any(|a| a.trim() == "unsafe_code")
                    })
            })
        });
        let inside = file.starts_with(&consumer);
        if lifts && inside {
            allowed_in.push(file.clone());
        }
        if !inside && (lifts || has_word(&code, "unsafe")) {
            offenders.push(file.strip_prefix(&root).unwrap_or(file).to_path_buf());
        }
    }
    assert!(
        offenders.is_empty(),
        "unsafe code (or a lint level lifting its deny) outside src/consumer/: {offenders:?}"
    );
    assert_eq!(
        allowed_in,
        vec![consumer.join("mod.rs")],
        "the consumer module allows unsafe code once, at its root"
    );
}

#[test]
fn the_check_sees_what_it_looks_for() {
    // The helpers find what they must and skip comments, so the test above
    // cannot pass for want of looking.
    let code = code_of("let a = 1; // unsafe here\n/* unsafe\n still */ unsafe { x }\n");
    assert!(has_word(&code, "unsafe"));
    assert_eq!(code.matches("unsafe").count(), 1, "{code}");
    assert!(!has_word(
        &code_of("/// an `unsafe` fn\nfn f() {}\n"),
        "unsafe"
    ));
    assert!(!has_word("unsafe_code unsafely", "unsafe"));
    assert!(has_word("pub unsafe fn f()", "unsafe"));
}
