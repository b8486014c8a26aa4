//! One crate-private function per entry point of the function table, named
//! as the C function and generated from the same list line as the table
//! field (so the symbol name is never written at a call site):
//!
//! - `call::<name>(on, args..)` takes the entry out of the table (a missing
//!   one is [`Error::NotSupported`] naming the symbol and its library), runs
//!   the target's preparation (binds the context where the call needs it, see
//!   [`Target`]), makes the call and turns the code into [`Error::Driver`] /
//!   [`Error::NvSci`] naming the symbol; `void` functions give `Ok(())`;
//! - `code::<name>(on, args..)` does the same but hands back the raw code,
//!   for calls whose non-success codes are answers, not failures
//!   (`cuStreamQuery`'s `NOT_READY`);
//! - `require::<name>(api)` only checks that the entry exists (the same
//!   `NotSupported`), for operations that need every entry before their
//!   first step.
//!
//! `on` is what the call is made on: a table struct (`&CudaApi`, ...; no
//! preparation), [`Bind`] (a context made current with `cuCtxSetCurrent`
//! first), [`Init`] (`cuInit` once per backend first), [`TryBind`] (the
//! same, best effort, for release calls) or [`Current`] (made current only
//! if it is not already).
//!
//! # Safety
//!
//! The one `unsafe` call of each wrapper rests on the table invariant and
//! the handle invariant of the [parent module](super). An entry that takes
//! a raw pointer (the lists mark it `unsafe fn`) gets `unsafe fn` wrappers:
//! their caller promises every pointer argument is valid for what the C
//! function documents doing with it, for the call, and writes the reason
//! at the call site. Entries taking only values (handles, integers, enums)
//! get safe wrappers.
#![allow(unsafe_code)]
#![allow(non_snake_case)] // the wrappers carry the C names

use tegra_interop_core::{CuResult, NvSciError};

use crate::table::HasLoaderNotes;
use crate::{Context, Error};

/// What a call is made on: the table struct holding its entry and what must
/// happen before the call.
pub(crate) trait Target {
    /// The table struct (`CudaApi`, `NvSciBufApi`, ...).
    type Api: HasLoaderNotes;
    /// The table struct the entry is taken from.
    fn api(&self) -> &Self::Api;
    /// Runs after the entry was found, before the call.
    #[inline]
    fn prepare(&self) -> Result<(), Error> {
        Ok(())
    }
}

impl<A: HasLoaderNotes> Target for &A {
    type Api = A;
    #[inline]
    fn api(&self) -> &A {
        self
    }
}

/// A call made in a context: `cuCtxSetCurrent` first.
pub(crate) struct Bind<'a>(pub(crate) &'a Context);

impl Target for Bind<'_> {
    type Api = crate::table::CudaApi;
    #[inline]
    fn api(&self) -> &Self::Api {
        self.0.api()
    }
    #[inline]
    fn prepare(&self) -> Result<(), Error> {
        self.0.bind()
    }
}

/// A call that needs CUDA initialised: `cuInit` once per backend first.
pub(crate) struct Init<'a>(pub(crate) &'a crate::Backend);

impl Target for Init<'_> {
    type Api = crate::table::CudaApi;
    #[inline]
    fn api(&self) -> &Self::Api {
        &self.0.table().cuda
    }
    #[inline]
    fn prepare(&self) -> Result<(), Error> {
        self.0.ensure_init()
    }
}

/// A release call: the context bound on a best-effort basis (a failing bind
/// is not reported; the release call's own answer is what counts).
pub(crate) struct TryBind<'a>(pub(crate) &'a Context);

impl Target for TryBind<'_> {
    type Api = crate::table::CudaApi;
    #[inline]
    fn api(&self) -> &Self::Api {
        self.0.api()
    }
    #[inline]
    fn prepare(&self) -> Result<(), Error> {
        let _ = self.0.bind();
        Ok(())
    }
}

/// A call made in a context, made current only if it is not already
/// (`cuCtxGetCurrent` and a compare; the hot path of signals and waits).
pub(crate) struct Current<'a>(pub(crate) &'a Context);

impl Target for Current<'_> {
    type Api = crate::table::CudaApi;
    #[inline]
    fn api(&self) -> &Self::Api {
        self.0.api()
    }
    #[inline]
    fn prepare(&self) -> Result<(), Error> {
        self.0.make_current()
    }
}

/// A C function's return value, checked into the crate's [`Error`].
pub(crate) trait Code: Copy {
    /// `Ok(())` for success, else the error naming `call`.
    fn check(self, call: &'static str) -> Result<(), Error>;
}

impl Code for tegra_interop_sys::cuda::CUresult {
    #[inline]
    fn check(self, call: &'static str) -> Result<(), Error> {
        let code = CuResult::from(self);
        if code.is_success() {
            Ok(())
        } else {
            Err(Error::Driver { call, code })
        }
    }
}

impl Code for tegra_interop_sys::nvsci::NvSciError {
    #[inline]
    fn check(self, call: &'static str) -> Result<(), Error> {
        if self.0 == 0 {
            Ok(())
        } else {
            Err(Error::NvSci {
                call,
                code: NvSciError(self.0),
            })
        }
    }
}

impl Code for tegra_interop_sys::nvrtc::nvrtcResult {
    #[inline]
    fn check(self, call: &'static str) -> Result<(), Error> {
        if self.0 == 0 {
            Ok(())
        } else {
            Err(Error::Nvrtc {
                call,
                code: crate::nvrtc::NvrtcResult(self.0),
            })
        }
    }
}

impl Code for () {
    #[inline]
    fn check(self, _call: &'static str) -> Result<(), Error> {
        Ok(())
    }
}

/// One wrapper of one entry point, safe or `unsafe` as its list line says.
macro_rules! wrapper_fn {
    (safe $mode:ident $name:ident $field:ident ($($a:ident: $t:ty),*) -> $r:ty) => {
        #[inline]
        #[allow(dead_code, clippy::too_many_arguments)]
        pub(crate) fn $field(
            on: impl $crate::ffi::Target<Api = $crate::table::$name>,
            $($a: $t),*
        ) -> wrappers!(@ret $mode $r) {
            let Some(f) = on.api().$field else {
                return Err($crate::table::missing_entry(on.api(), stringify!($field)));
            };
            on.prepare()?;
            // SAFETY: only values cross (handles kept live by their owners,
            // integers, enums): the table and handle invariants of `ffi`.
            let code = unsafe { f($($a),*) };
            wrappers!(@finish $mode code stringify!($field))
        }
    };
    (unsafe $mode:ident $name:ident $field:ident ($($a:ident: $t:ty),*) -> $r:ty) => {
        /// # Safety
        /// Every pointer argument must be valid for what the C function
        /// documents doing with it during the call: out-pointers writable
        /// for one value of their pointee type (or for the count passed next
        /// to them), input pointers readable for theirs and initialised,
        /// descriptors well-formed (from the core's builders); handles as
        /// the `ffi` module's invariants say.
        #[inline]
        #[allow(dead_code, clippy::too_many_arguments)]
        pub(crate) unsafe fn $field(
            on: impl $crate::ffi::Target<Api = $crate::table::$name>,
            $($a: $t),*
        ) -> wrappers!(@ret $mode $r) {
            let Some(f) = on.api().$field else {
                return Err($crate::table::missing_entry(on.api(), stringify!($field)));
            };
            on.prepare()?;
            // SAFETY: the pointers are the caller's promise (above); the
            // table and handle invariants of `ffi` cover the rest.
            let code = unsafe { f($($a),*) };
            wrappers!(@finish $mode code stringify!($field))
        }
    };
}

macro_rules! wrappers {
    (
        [require] $name:ident $library:literal
        $( $field:ident { symbol: $sym:expr, pfn: $pfn:ty, $kind:ident: $safety:ident fn($($a:ident: $t:ty),*) -> $r:ty } )*
    ) => {
        $(
            #[inline]
            #[allow(dead_code)]
            pub(crate) fn $field(api: &$crate::table::$name) -> Result<(), $crate::Error> {
                match api.$field {
                    Some(_) => Ok(()),
                    None => Err($crate::table::missing_entry(api, stringify!($field))),
                }
            }
        )*
    };
    (
        [$mode:ident] $name:ident $library:literal
        $( $field:ident { symbol: $sym:expr, pfn: $pfn:ty, $kind:ident: $safety:ident fn($($a:ident: $t:ty),*) -> $r:ty } )*
    ) => {
        $( wrapper_fn! { $safety $mode $name $field ($($a: $t),*) -> $r } )*
    };
    (@ret checked $r:ty) => { Result<(), $crate::Error> };
    (@ret raw $r:ty) => { Result<$r, $crate::Error> };
    (@finish checked $code:ident $call:expr) => { $crate::ffi::wrappers::Code::check($code, $call) };
    (@finish raw $code:ident $call:expr) => { Ok($code) };
}

/// Every entry point, its code checked into [`Error`] naming it.
pub(crate) mod call {
    tegra_interop_sys::cuda_entry_points!(wrappers checked);
    tegra_interop_sys::nvscibuf_entry_points!(wrappers checked);
    tegra_interop_sys::nvscisync_entry_points!(wrappers checked);
    tegra_interop_sys::nvsciipc_entry_points!(wrappers checked);
    tegra_interop_sys::nvrtc_entry_points!(wrappers checked);
}

/// Every entry point, its code handed back (for codes that are answers).
pub(crate) mod code {
    tegra_interop_sys::cuda_entry_points!(wrappers raw);
    tegra_interop_sys::nvscibuf_entry_points!(wrappers raw);
    tegra_interop_sys::nvscisync_entry_points!(wrappers raw);
    tegra_interop_sys::nvsciipc_entry_points!(wrappers raw);
    tegra_interop_sys::nvrtc_entry_points!(wrappers raw);
}

/// Every entry point's presence alone, for operations that must know all
/// their entries exist before the first step (an IPC exchange that must not
/// consume a message it cannot import).
pub(crate) mod require {
    tegra_interop_sys::cuda_entry_points!(wrappers require);
    tegra_interop_sys::nvscibuf_entry_points!(wrappers require);
    tegra_interop_sys::nvscisync_entry_points!(wrappers require);
    tegra_interop_sys::nvsciipc_entry_points!(wrappers require);
    tegra_interop_sys::nvrtc_entry_points!(wrappers require);
}
