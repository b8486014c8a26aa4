//! Logging for integrators, behind the optional `log` feature.
//!
//! With the feature on, the macros here forward to the [`log`] crate
//! (`log::trace!` ... `log::warn!`), each with a fixed target per area (the
//! constants below), so a host application's logger shows the driver's
//! decisions and can filter them by area. With the feature off they expand
//! to an `if false` block: the arguments are still type-checked (a call
//! site that compiles without the feature compiles with it), nothing is
//! evaluated, and the crate does not depend on `log`.
//!
//! Levels: `warn` for what may cost the application something (the CUDA
//! driver not loading, a possible fd leak, an error `Drop` had to keep);
//! `info` for decisions made once (a library loaded or not and why, the
//! backend chosen, an NvSci library's version and what it refuses);
//! `debug` for per-object outcomes (each missing symbol, each duplicate fd
//! after a failed import, the fence source); `trace` for routine steps.

/// The run-time loader: each library tried, loaded or not and why, missing
/// symbols, the NVRTC search.
pub(crate) const LOADER: &str = "tegra_interop::loader";
/// The backend chosen (`Backend::real`, `Backend::from_table`) and `cuInit`.
pub(crate) const BACKEND: &str = "tegra_interop::backend";
/// What happened to the duplicate fd after a failed import (the fd audit).
pub(crate) const FD: &str = "tegra_interop::fd";
/// Errors that a `Drop` could not return and kept on the backend.
pub(crate) const DROP: &str = "tegra_interop::drop";
/// NvSci version gating: versions probed, keys and entry points refused,
/// the fence source chosen.
pub(crate) const NVSCI: &str = "tegra_interop::nvsci";

/// One log record at `$level` (`trace`, `debug`, `info`, `warn`) with
/// `target: $target`; nothing (arguments type-checked only) without the
/// `log` feature.
macro_rules! event {
    ($level:ident, $target:expr, $($arg:tt)+) => {{
        #[cfg(feature = "log")]
        {
            ::log::$level!(target: $target, $($arg)+);
        }
        #[cfg(not(feature = "log"))]
        {
            if false {
                let _: &str = $target;
                let _ = ::core::format_args!($($arg)+);
            }
        }
    }};
}

/// `trace!(target: T, "fmt", args..)`: see `event!`.
macro_rules! trace {
    (target: $target:expr, $($arg:tt)+) => {
        $crate::logging::event!(trace, $target, $($arg)+)
    };
}

/// `debug!(target: T, "fmt", args..)`: see `event!`.
macro_rules! debug {
    (target: $target:expr, $($arg:tt)+) => {
        $crate::logging::event!(debug, $target, $($arg)+)
    };
}

/// `info!(target: T, "fmt", args..)`: see `event!`.
macro_rules! info {
    (target: $target:expr, $($arg:tt)+) => {
        $crate::logging::event!(info, $target, $($arg)+)
    };
}

/// `warn!(target: T, "fmt", args..)`: see `event!`.
// Named `warn_` here: a macro named `warn` cannot be re-exported by `use`
// (the name is ambiguous with the built-in `#[warn]` attribute); it is
// re-exported as `warn` below and called as `logging::warn!`.
macro_rules! warn_ {
    (target: $target:expr, $($arg:tt)+) => {
        $crate::logging::event!(warn, $target, $($arg)+)
    };
}

#[allow(unused_imports)] // each macro is used by some areas only
pub(crate) use {debug, event, info, trace, warn_ as warn};
