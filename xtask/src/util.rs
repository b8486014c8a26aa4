//! Small helpers shared by the xtask commands.

use std::path::{Path, PathBuf};

/// A failure that ends the xtask with a one-line message.
#[derive(Debug)]
pub struct Failure {
    /// The one line shown after `error: `.
    pub message: String,
    /// True for command-line mistakes (exit code 2).
    pub usage: bool,
}

impl Failure {
    /// A run-time failure (exit code 1).
    pub fn new(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            usage: false,
        }
    }

    /// A command-line mistake (exit code 2).
    pub fn usage(message: String) -> Self {
        Failure {
            message,
            usage: true,
        }
    }
}

/// Result type of the xtask commands.
pub type Result<T> = std::result::Result<T, Failure>;

/// The workspace root (the parent of the xtask package).
pub fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or(manifest_dir)
}

/// Writes a file, naming it in the error.
pub fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents)
        .map_err(|e| Failure::new(format!("cannot write {}: {e}", path.display())))
}

/// Takes the value that follows a `--flag`.
pub fn flag_value<'a>(flag: &str, it: &mut impl Iterator<Item = &'a String>) -> Result<&'a str> {
    it.next()
        .map(String::as_str)
        .filter(|v| !v.starts_with("--"))
        .ok_or_else(|| Failure::usage(format!("{flag} needs a value")))
}
