//! The one place the driver calls C: every entry point of the function
//! table, the host-function trampoline, the few operating-system calls made
//! around imports, and the thread-safety claims about C handles.
//!
//! For each entry point of sys's generated lists there is one crate-private
//! function here, named as the C function and generated from the same list
//! line as the table field (so the symbol name is never written at a call
//! site):
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
//! first), [`Init`] (`cuInit` once per backend first), [`TryBind`] (the same, best effort, for release calls) or
//! [`Current`] (made current only if it is not already).
//!
//! # Safety
//!
//! The wrappers are safe functions whose soundness rests on invariants the
//! crate keeps (they are `pub(crate)` for that reason; nothing outside the
//! crate can reach them):
//!
//! 1. **The table.** Each entry has the signature of its `PFN_` type: the
//!    loader ([`crate::table::Resolve`]) resolves it from the library its
//!    list names, and [`crate::Backend::from_table`]'s tables are typed by
//!    the same `PFN_` types.
//! 2. **Handles.** Every C handle passed (context, stream, memory, mapping,
//!    semaphore, NvSci module, list, object, fence, endpoint) is owned by a
//!    value of this crate that is alive for the call, and was created by the
//!    same table; release calls are made once, by [`crate::owner::Owned`]
//!    (or the NvSci owners), after which the handle is never passed again.
//! 3. **Pointers.** Out-pointers and arrays come from Rust references or
//!    slices that live for the call, with the element count passed next to
//!    them (the batch arrays come from [`Lowered::as_call`], which returns
//!    the pointers together with the number of entries written); C
//!    descriptors come from the core's validated builders (zeroed reserved
//!    fields, kinds matching their unions); NvSciSync fence pointers inside
//!    parameter blocks come from borrows that outlive the call.
//!
//! Because the wrappers are safe to call, a call site that broke these
//! rules would not be marked `unsafe`: every new call site (and every new
//! kind of pointer or handle passed) is checked against this list in
//! review; the crate-private visibility keeps the list's scope to this
//! crate.
//! 4. **Context.** Calls that act in a context are made through [`Bind`] or
//!    [`Current`] with the context that owns their handles (checked before
//!    the call where the user could mix them: [`crate::Error::WrongContext`]).
//!
//! Anything a caller of the public API must promise instead (a raw handle
//! imported from elsewhere, skipped memory synchronisation) stays an
//! `unsafe fn` of the public API with its own `# Safety` section.
#![allow(unsafe_code)]
#![allow(non_snake_case)] // the wrappers carry the C names

use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::panic::AssertUnwindSafe;

use tegra_interop_core::{CuResult, NvSciError};
use tegra_interop_sys::cuda::{CUexternalSemaphore, CUstream};

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

impl Code for () {
    #[inline]
    fn check(self, _call: &'static str) -> Result<(), Error> {
        Ok(())
    }
}

macro_rules! wrappers {
    (
        [require] $name:ident $library:literal
        $( $field:ident { symbol: $sym:expr, pfn: $pfn:ty, $kind:ident: fn($($a:ident: $t:ty),*) -> $r:ty } )*
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
        $( $field:ident { symbol: $sym:expr, pfn: $pfn:ty, $kind:ident: fn($($a:ident: $t:ty),*) -> $r:ty } )*
    ) => {
        $(
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
                // SAFETY: the module's invariants (table, handles, pointers,
                // context; see the module docs).
                let code = unsafe { f($($a),*) };
                wrappers!(@finish $mode code stringify!($field))
            }
        )*
    };
    (@ret checked $r:ty) => { Result<(), $crate::Error> };
    (@ret raw $r:ty) => { Result<$r, $crate::Error> };
    (@finish checked $code:ident $call:expr) => { $crate::ffi::Code::check($code, $call) };
    (@finish raw $code:ident $call:expr) => { Ok($code) };
}

/// Every entry point, its code checked into [`Error`] naming it.
pub(crate) mod call {
    tegra_interop_sys::cuda_entry_points!(wrappers checked);
    tegra_interop_sys::nvscibuf_entry_points!(wrappers checked);
    tegra_interop_sys::nvscisync_entry_points!(wrappers checked);
    tegra_interop_sys::nvsciipc_entry_points!(wrappers checked);
}

/// Every entry point, its code handed back (for codes that are answers).
pub(crate) mod code {
    tegra_interop_sys::cuda_entry_points!(wrappers raw);
    tegra_interop_sys::nvscibuf_entry_points!(wrappers raw);
    tegra_interop_sys::nvscisync_entry_points!(wrappers raw);
    tegra_interop_sys::nvsciipc_entry_points!(wrappers raw);
}

/// Every entry point's presence alone, for operations that must know all
/// their entries exist before the first step (an IPC exchange that must not
/// consume a message it cannot import).
pub(crate) mod require {
    tegra_interop_sys::cuda_entry_points!(wrappers require);
    tegra_interop_sys::nvscibuf_entry_points!(wrappers require);
    tegra_interop_sys::nvscisync_entry_points!(wrappers require);
    tegra_interop_sys::nvsciipc_entry_points!(wrappers require);
}

// ------------------------------------------------------------ batch arrays

/// The two C arrays of one semaphore batch call (handles and parameter
/// blocks), on the stack with room for `CAP` entries and only the entries
/// pushed ever written: building a batch of 8 touches 8 blocks, not `CAP`.
pub(crate) struct Lowered<P, const CAP: usize> {
    handles: [MaybeUninit<CUexternalSemaphore>; CAP],
    params: [MaybeUninit<P>; CAP],
    len: usize,
}

impl<P: Default, const CAP: usize> Lowered<P, CAP> {
    /// Empty arrays (nothing written).
    #[inline]
    pub(crate) fn new() -> Self {
        Lowered {
            handles: [const { MaybeUninit::uninit() }; CAP],
            params: [const { MaybeUninit::uninit() }; CAP],
            len: 0,
        }
    }

    /// Appends `handle` and a parameter block, zeroed and then filled by
    /// `lower`. Refused past `CAP` (the caller checks the length first).
    #[inline]
    pub(crate) fn push<E>(
        &mut self,
        handle: CUexternalSemaphore,
        lower: impl FnOnce(&mut P) -> Result<(), E>,
    ) -> Result<(), Error>
    where
        Error: From<E>,
    {
        let (Some(h), Some(p)) = (
            self.handles.get_mut(self.len),
            self.params.get_mut(self.len),
        ) else {
            return Err(Error::Validation(
                tegra_interop_core::ValidationError::CapacityExceeded { capacity: CAP },
            ));
        };
        let block = p.write(P::default());
        lower(block)?;
        h.write(handle);
        self.len += 1;
        Ok(())
    }

    /// The two arrays for the call and their entry count: exactly the
    /// entries pushed, all written.
    #[inline]
    pub(crate) fn as_call(&self) -> (*const CUexternalSemaphore, *const P, u32) {
        const { assert!(CAP <= u32::MAX as usize) };
        // `len <= CAP`, which fits (checked at compile time above).
        let count = self.len as u32;
        (
            self.handles.as_ptr().cast(),
            self.params.as_ptr().cast(),
            count,
        )
    }
}

// ------------------------------------------------------------ host functions

/// What the driver calls: the boxed closure, moved out exactly once.
type HostFn = Box<dyn FnOnce() + Send + 'static>;

/// The C entry point the driver calls with the leaked `Box<HostFn>`.
unsafe extern "C" fn run_host_fn(user: *mut c_void) {
    // SAFETY: `user` is the `Box<HostFn>` leaked by `launch_host_fn`, and
    // the driver calls a host function exactly once.
    let f = unsafe { Box::from_raw(user.cast::<HostFn>()) };
    // Unwinding into the driver's thread is not allowed: a panicking
    // closure is stopped here (its panic message is printed by the hook).
    let _ = std::panic::catch_unwind(AssertUnwindSafe(f));
}

/// `cuLaunchHostFunc` with a Rust closure: the closure is boxed and leaked
/// to the driver, which calls [`run_host_fn`] once; if the launch fails the
/// box is reclaimed here and `f` dropped unrun.
pub(crate) fn launch_host_fn(
    ctx: &Context,
    stream: CUstream,
    f: Box<dyn FnOnce() + Send + 'static>,
) -> Result<(), Error> {
    let boxed: Box<HostFn> = Box::new(f);
    let user = Box::into_raw(boxed);
    let result = call::cuLaunchHostFunc(Bind(ctx), stream, Some(run_host_fn), user.cast());
    if result.is_err() {
        // SAFETY: the launch failed (or was not made), so the driver will
        // never call `run_host_fn`: the box is still ours, reclaimed once.
        drop(unsafe { Box::from_raw(user) });
    }
    result
}

// ------------------------------------------------------------------ OS calls

/// `errno` of the last failed libc call on this thread.
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `fcntl(fd, F_DUPFD_CLOEXEC, 0)`: a new descriptor number for an open
/// file, or `Err(errno)`.
pub(crate) fn dup_cloexec(fd: std::os::fd::BorrowedFd<'_>) -> Result<RawFd, i32> {
    use std::os::fd::AsRawFd;
    // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor number for an open fd
    // (borrowed, so open for the call); no memory is involved.
    let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        Err(errno())
    } else {
        Ok(dup)
    }
}

/// Whether `fd` is an open descriptor number of this process (`None`:
/// cannot tell).
pub(crate) fn is_open(fd: RawFd) -> Option<bool> {
    // SAFETY: F_GETFD reads the descriptor flags of a number; harmless on any
    // value.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1 {
        return Some(true);
    }
    if errno() == libc::EBADF {
        Some(false)
    } else {
        None
    }
}

/// `kcmp(KCMP_FILE)`: whether two descriptor numbers of this process name
/// the same open file description (`None`: cannot tell, e.g. seccomp).
pub(crate) fn same_description(a: RawFd, b: RawFd) -> Option<bool> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        const KCMP_FILE: libc::c_long = 0;
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        // SAFETY: kcmp only compares kernel objects named by numbers; it
        // reads no user memory.
        let r = unsafe {
            libc::syscall(
                libc::SYS_kcmp,
                pid,
                pid,
                KCMP_FILE,
                libc::c_long::from(a),
                libc::c_long::from(b),
            )
        };
        match r {
            0 => Some(true),
            1..=3 => Some(false),
            _ => None,
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        let _ = (a, b);
        None
    }
}

/// Takes ownership of a descriptor number.
///
/// Crate invariant (the callers): `fd` is open and owned by nobody else: a
/// duplicate this crate just made, one proven ours with [`is_open`] and
/// [`same_description`], or one a C call handed to us as the new owner.
pub(crate) fn own_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: the crate invariant above.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

// ------------------------------------------------------------- cudarc probe

/// Whether cudarc can load the driver library (it panics when it cannot).
#[cfg(feature = "cudarc")]
pub(crate) fn cudarc_can_load() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library by
    // its usual names (libcuda.so.1 among them, already loaded by
    // `Backend::real`); it has no other effect.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

// ------------------------------------------------------- NvSci attribute reads

/// Reads one key of a live NvSciBuf list (`NvSciBufAttrListGetAttrs`) and
/// decodes the value the library points to.
pub(crate) fn get_buf_attr(
    api: &crate::table::NvSciBufApi,
    list: tegra_interop_sys::nvsci::NvSciBufAttrList,
    key: tegra_interop_sys::nvsci::NvSciBufAttrKey,
) -> Result<Option<tegra_interop_core::nvsci::BufAttr>, Error> {
    let mut pair = tegra_interop_sys::nvsci::NvSciBufAttrKeyValuePair {
        key,
        value: std::ptr::null(),
        len: 0,
    };
    call::NvSciBufAttrListGetAttrs(api, list, &mut pair, 1)?;
    // SAFETY: the pair was just filled by GetAttrs from a live list (held by
    // the caller) that nobody modifies during this call.
    unsafe { tegra_interop_core::nvsci::BufAttr::decode_pair(&pair) }.map_err(Error::Validation)
}

/// Reads one key of a live NvSciSync list (`NvSciSyncAttrListGetAttrs`) and
/// decodes the value the library points to.
pub(crate) fn get_sync_attr(
    api: &crate::table::NvSciSyncApi,
    list: tegra_interop_sys::nvsci::NvSciSyncAttrList,
    key: tegra_interop_sys::nvsci::NvSciSyncAttrKey,
) -> Result<Option<tegra_interop_core::nvsci::SyncAttr>, Error> {
    let mut pair = tegra_interop_sys::nvsci::NvSciSyncAttrKeyValuePair {
        attrKey: key,
        value: std::ptr::null(),
        len: 0,
    };
    call::NvSciSyncAttrListGetAttrs(api, list, &mut pair, 1)?;
    // SAFETY: as for `get_buf_attr`.
    unsafe { tegra_interop_core::nvsci::SyncAttr::decode_pair(&pair) }.map_err(Error::Validation)
}

/// Copies a library-allocated attribute-list descriptor (`len` bytes at
/// `desc`, from an `Nv*AttrListIpcExport*` call) and frees it with `free`
/// (the library's `Nv*AttrListFreeDesc`, called once; a table without it
/// leaks the descriptor).
pub(crate) fn take_desc(
    desc: *mut c_void,
    len: usize,
    free: impl FnOnce(*mut c_void) -> Result<(), Error>,
) -> Vec<u8> {
    if desc.is_null() {
        return Vec::new();
    }
    // SAFETY: the library handed us `len` readable bytes at `desc`, which
    // stay valid until the free below.
    let bytes = unsafe { std::slice::from_raw_parts(desc.cast::<u8>(), len) }.to_vec();
    let _ = free(desc);
    bytes
}

// ---------------------------------------------------- thread-safety of handles

// The C handles below are plain pointers to the driver's or the library's
// objects, so Rust cannot see that they may cross threads. The CUDA driver
// API and NvSciBuf/NvSciSync are thread-safe: any thread may use a handle,
// calls that act in a context bind it first (invariant 4), and the library
// serialises concurrent calls on one object. What `&` allows on each type
// below is only such calls (queries, enqueues, imports, dups); mutation of
// the Rust-side state needs `&mut` or an atomic. The backends they hold are
// `Send + Sync` (fn pointers and loaded libraries).

/// `Send` (and `Sync`, where given) for C-handle holders, each with the
/// reason `&` is sound for it (the common part is said above).
macro_rules! thread_safe {
    ($( $ty:path $(=> sync: $why:literal)?; )*) => {
        $(
            // SAFETY: the handles may cross threads (see above).
            unsafe impl Send for $ty {}
            $(
                #[doc = $why]
                // SAFETY: `$why` (a doc string, so the reason is kept per type).
                unsafe impl Sync for $ty {}
            )?
        )*
    };
}

thread_safe! {
    crate::egl::ResourceRes => sync: "`&ResourceRes` only asks for the mapped frame, which the driver makes thread-safe.";
    // A connection moves between threads; it is not shared (a consumer
    // counts its frames in a `Cell`).
    crate::egl::stream::ConnectionRes;
    crate::context::ContextRes => sync: "`&ContextRes` only allows calls the driver serialises.";
    crate::stream::StreamRes => sync: "The driver serialises concurrent submissions to one stream.";
    crate::memory::MemoryRes => sync: "`&MemoryRes` only allows mapping calls, which the driver makes thread-safe.";
    crate::memory::ArrayRes => sync: "`&ArrayRes` only queries levels, which is thread-safe.";
    crate::semaphore::SemaphoreRes => sync: "`&SemaphoreRes` only enqueues waits (thread-safe in the driver) and sets the atomic `used` flag.";
    // A wait context is never shared (no `Sync`; waits take `&mut`).
    crate::nvsci::CpuWaitContext;
}

// The NvSci module, list and object of either library (see above; NvSciBuf
// and NvSciSync serialise access to a module internally).

// SAFETY: the handles may cross threads (see above).
unsafe impl<L: crate::nvsci::Library> Send for crate::nvsci::common::ModuleInner<L> {}
// SAFETY: `&ModuleInner` only makes calls the library serialises.
unsafe impl<L: crate::nvsci::Library> Sync for crate::nvsci::common::ModuleInner<L> {}
// SAFETY: the handles may cross threads (see above).
unsafe impl<L: crate::nvsci::Library> Send for crate::nvsci::AttrList<L> {}
// SAFETY: `&AttrList` only reads; mutation needs `&mut`.
unsafe impl<L: crate::nvsci::Library> Sync for crate::nvsci::AttrList<L> {}
// SAFETY: the handles may cross threads (see above).
unsafe impl<L: crate::nvsci::Library> Send for crate::nvsci::Obj<L> {}
// SAFETY: `&Obj` only reads attributes and makes fences, imports and dups,
// which the library makes thread-safe.
unsafe impl<L: crate::nvsci::Library> Sync for crate::nvsci::Obj<L> {}

// ------------------------------------------------------------ EGL frames

/// The three plane words of an EGL frame: device pointers of a pitch frame
/// or `CUarray`s of an array frame (which one, `frameType` says).
pub(crate) fn egl_plane_words(f: &tegra_interop_sys::cuda::CUeglFrame) -> [usize; 3] {
    // SAFETY: both members of the union are three pointer-sized values, so
    // reading either as pointers reads initialised bytes (the frame was
    // written whole by the driver, or defaulted to zero).
    let p = unsafe { f.frame.pPitch };
    [p[0] as usize, p[1] as usize, p[2] as usize]
}

/// Writes the three plane words of an EGL frame (device pointers of a pitch
/// frame, `CUarray`s of an array frame).
pub(crate) fn set_egl_plane_words(f: &mut tegra_interop_sys::cuda::CUeglFrame, words: [usize; 3]) {
    f.frame.pPitch = words.map(|w| w as *mut core::ffi::c_void);
}

// ------------------------------------------------------------ polling

/// Waits at most `limit` for `fd` to become readable (an NvSciIpc event fd).
/// A closed or invalid fd only makes `poll` return at once.
pub(crate) fn poll_readable(fd: RawFd, limit: std::time::Duration) {
    let ms = libc::c_int::try_from(limit.as_millis()).unwrap_or(libc::c_int::MAX);
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd record for the duration of the call; poll
    // does not act on the descriptor.
    unsafe { libc::poll(&mut pfd, 1, ms) };
}
