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

/// The message of the last panic, recorded by the hook that
/// [`quiet_panics`] installs.
static PANIC_MESSAGE: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Replaces the default panic output (message + backtrace hint) with a silent
/// record, so that a panic inside a dependency (bindgen panics when it cannot
/// load libclang) can be turned into a one-line error by [`catch`].
pub fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info.payload();
        let text = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        let text = match info.location() {
            Some(at) => format!("{text} (at {}:{})", at.file(), at.line()),
            None => text,
        };
        if let Ok(mut slot) = PANIC_MESSAGE.lock() {
            *slot = Some(text.lines().next().unwrap_or_default().to_string());
        }
    }));
}

/// Runs `f`; a panic inside it becomes a [`Failure`] whose message is
/// `what: <panic message>`.
pub fn catch<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(_) => {
            let message = PANIC_MESSAGE
                .lock()
                .ok()
                .and_then(|mut slot| slot.take())
                .unwrap_or_else(|| "panicked".to_string());
            Err(Failure::new(format!("{what}: {message}")))
        }
    }
}
