//! External semaphores: import descriptors and signal/wait parameters.
//!
//! Parameters are built kind-agnostic ([`SignalParams::timeline`], [`WaitParams::keyed_mutex`],
//! ...) and checked against the semaphore's kind when lowered, so a fence value never reaches a
//! binary semaphore and a keyed-mutex key never reaches a fence.
//!
//! ```
//! use tegra_interop_core::{SemaphoreHandleKind, SemaphoreImport, SignalParams, ValidationError, WaitParams};
//!
//! let sem = SemaphoreImport::timeline_fd(9)?;
//! let signal = SignalParams::timeline(42).lower_for(sem.kind())?;
//! let wait = WaitParams::timeline(42).lower_for(sem.kind())?;
//! assert_eq!(signal.params.fence.value, 42);
//! assert_eq!(wait.params.fence.value, 42);
//!
//! // A binary semaphore has no fence value.
//! assert_eq!(
//!     SignalParams::timeline(1).lower_for(SemaphoreHandleKind::OpaqueFd).err(),
//!     Some(ValidationError::FenceValueNotSupported { kind: SemaphoreHandleKind::OpaqueFd }),
//! );
//! # Ok::<(), ValidationError>(())
//! ```

use core::ffi::c_void;
use core::fmt;

use tegra_interop_sys::cuda::{
    CUexternalSemaphoreHandleType, CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC,
    CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS, CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS,
};
use tegra_interop_sys::nvsci::NvSciSyncFence;

use crate::error::ValidationError;
use crate::flags::{SignalFlags, WaitFlags};
use crate::import::{import_facts, Import};

/// Keyed-mutex wait timeout meaning "wait forever" (`INFINITE`, 0xFFFFFFFF milliseconds).
pub const KEYED_MUTEX_INFINITE: u32 = 0xFFFF_FFFF;

/// The kind of handle an external semaphore is imported from
/// (`CUexternalSemaphoreHandleType`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum SemaphoreHandleKind {
    /// Binary semaphore from an opaque POSIX fd. Value 1.
    OpaqueFd = 1,
    /// Binary semaphore from a Win32 NT handle or name. Value 2.
    OpaqueWin32 = 2,
    /// Binary semaphore from a Win32 KMT handle. Value 3.
    OpaqueWin32Kmt = 3,
    /// D3D12 fence (64-bit value). Value 4.
    D3d12Fence = 4,
    /// D3D11 fence (64-bit value). Value 5.
    D3d11Fence = 5,
    /// `NvSciSyncObj`. Value 6.
    NvSciSync = 6,
    /// D3D11 keyed mutex (NT handle or name). Value 7.
    D3d11KeyedMutex = 7,
    /// D3D11 keyed mutex (KMT handle). Value 8.
    D3d11KeyedMutexKmt = 8,
    /// Timeline semaphore from an opaque POSIX fd. Value 9.
    TimelineSemaphoreFd = 9,
    /// Timeline semaphore from a Win32 NT handle or name. Value 10.
    TimelineSemaphoreWin32 = 10,
}

impl SemaphoreHandleKind {
    /// All ten kinds, in value order.
    pub const ALL: [SemaphoreHandleKind; 10] = [
        Self::OpaqueFd,
        Self::OpaqueWin32,
        Self::OpaqueWin32Kmt,
        Self::D3d12Fence,
        Self::D3d11Fence,
        Self::NvSciSync,
        Self::D3d11KeyedMutex,
        Self::D3d11KeyedMutexKmt,
        Self::TimelineSemaphoreFd,
        Self::TimelineSemaphoreWin32,
    ];

    /// The kind for a raw `CUexternalSemaphoreHandleType` value.
    pub const fn from_raw(raw: u32) -> Result<Self, ValidationError> {
        Ok(match raw {
            1 => Self::OpaqueFd,
            2 => Self::OpaqueWin32,
            3 => Self::OpaqueWin32Kmt,
            4 => Self::D3d12Fence,
            5 => Self::D3d11Fence,
            6 => Self::NvSciSync,
            7 => Self::D3d11KeyedMutex,
            8 => Self::D3d11KeyedMutexKmt,
            9 => Self::TimelineSemaphoreFd,
            10 => Self::TimelineSemaphoreWin32,
            _ => return Err(ValidationError::UnknownHandleType { raw }),
        })
    }

    /// The C enum value.
    pub const fn raw(self) -> CUexternalSemaphoreHandleType {
        CUexternalSemaphoreHandleType(self as u32)
    }

    /// The C name without its common prefix.
    pub const fn name(self) -> &'static str {
        match self {
            Self::OpaqueFd => "OPAQUE_FD",
            Self::OpaqueWin32 => "OPAQUE_WIN32",
            Self::OpaqueWin32Kmt => "OPAQUE_WIN32_KMT",
            Self::D3d12Fence => "D3D12_FENCE",
            Self::D3d11Fence => "D3D11_FENCE",
            Self::NvSciSync => "NVSCISYNC",
            Self::D3d11KeyedMutex => "D3D11_KEYED_MUTEX",
            Self::D3d11KeyedMutexKmt => "D3D11_KEYED_MUTEX_KMT",
            Self::TimelineSemaphoreFd => "TIMELINE_SEMAPHORE_FD",
            Self::TimelineSemaphoreWin32 => "TIMELINE_SEMAPHORE_WIN32",
        }
    }

    /// `true` for kinds imported from a file descriptor.
    pub const fn is_fd(self) -> bool {
        matches!(self, Self::OpaqueFd | Self::TimelineSemaphoreFd)
    }

    /// `true` for kinds imported from a Win32 handle or name.
    pub const fn is_win32(self) -> bool {
        matches!(
            self,
            Self::OpaqueWin32
                | Self::OpaqueWin32Kmt
                | Self::D3d12Fence
                | Self::D3d11Fence
                | Self::D3d11KeyedMutex
                | Self::D3d11KeyedMutexKmt
                | Self::TimelineSemaphoreWin32
        )
    }

    /// `true` for KMT kinds: handle required, name must be NULL.
    pub const fn is_kmt(self) -> bool {
        matches!(self, Self::OpaqueWin32Kmt | Self::D3d11KeyedMutexKmt)
    }

    /// `true` for kinds whose signal/wait carries a 64-bit fence value
    /// (timeline semaphores, D3D12 and D3D11 fences).
    pub const fn has_fence_value(self) -> bool {
        matches!(
            self,
            Self::D3d12Fence
                | Self::D3d11Fence
                | Self::TimelineSemaphoreFd
                | Self::TimelineSemaphoreWin32
        )
    }

    /// `true` for keyed mutexes (signal: key; wait: key and timeout).
    pub const fn is_keyed_mutex(self) -> bool {
        matches!(self, Self::D3d11KeyedMutex | Self::D3d11KeyedMutexKmt)
    }

    /// `true` for NvSciSync objects (signal/wait through an `NvSciSyncFence`).
    #[inline]
    pub const fn is_nvscisync(self) -> bool {
        matches!(self, Self::NvSciSync)
    }
}

impl fmt::Display for SemaphoreHandleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The handle part of a semaphore import.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SemaphoreHandle {
    /// A file descriptor (OPAQUE_FD, TIMELINE_SEMAPHORE_FD).
    Fd(i32),
    /// A Win32 NT/KMT handle and/or a named object (`LPCWSTR`).
    Win32 {
        /// The handle (NULL when importing by name).
        handle: *mut c_void,
        /// The object name (NULL when importing by handle).
        name: *const c_void,
    },
    /// An `NvSciSyncObj`.
    NvSciSync(*const c_void),
}

/// A validated external-semaphore import: the exact `CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC`
/// (flags and reserved zero) and its kind.
///
/// ```
/// use tegra_interop_core::{SemaphoreImport, SemaphoreHandleKind};
/// let sem = SemaphoreImport::opaque_fd(4)?;
/// assert_eq!(sem.kind(), SemaphoreHandleKind::OpaqueFd);
/// assert_eq!(sem.raw().flags, 0);
/// # Ok::<(), tegra_interop_core::ValidationError>(())
/// ```
pub type SemaphoreImport = Import<SemaphoreHandleKind>;

import_facts!(
    SemaphoreHandleKind,
    CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC,
    SemaphoreHandle::NvSciSync,
    nvSciSyncObj,
    "SemaphoreImport"
);

impl Import<SemaphoreHandleKind> {
    /// A validated import of `kind` from `handle`.
    pub fn new(
        kind: SemaphoreHandleKind,
        handle: SemaphoreHandle,
    ) -> Result<Self, ValidationError> {
        Self::describe(kind, handle)
    }

    fn win32(
        kind: SemaphoreHandleKind,
        handle: *mut c_void,
        name: *const c_void,
    ) -> Result<Self, ValidationError> {
        Self::new(kind, SemaphoreHandle::Win32 { handle, name })
    }

    /// A binary semaphore from an opaque fd.
    pub fn opaque_fd(fd: i32) -> Result<Self, ValidationError> {
        Self::new(SemaphoreHandleKind::OpaqueFd, SemaphoreHandle::Fd(fd))
    }

    /// A timeline semaphore from an opaque fd.
    pub fn timeline_fd(fd: i32) -> Result<Self, ValidationError> {
        Self::new(
            SemaphoreHandleKind::TimelineSemaphoreFd,
            SemaphoreHandle::Fd(fd),
        )
    }

    /// A binary semaphore from a Win32 NT handle or name (exactly one non-NULL).
    pub fn opaque_win32(handle: *mut c_void, name: *const c_void) -> Result<Self, ValidationError> {
        Self::win32(SemaphoreHandleKind::OpaqueWin32, handle, name)
    }

    /// A binary semaphore from a Win32 KMT handle (non-NULL).
    pub fn opaque_win32_kmt(handle: *mut c_void) -> Result<Self, ValidationError> {
        Self::win32(
            SemaphoreHandleKind::OpaqueWin32Kmt,
            handle,
            core::ptr::null(),
        )
    }

    /// A D3D12 fence (exactly one of handle and name non-NULL).
    pub fn d3d12_fence(handle: *mut c_void, name: *const c_void) -> Result<Self, ValidationError> {
        Self::win32(SemaphoreHandleKind::D3d12Fence, handle, name)
    }

    /// A D3D11 fence (exactly one of handle and name non-NULL).
    pub fn d3d11_fence(handle: *mut c_void, name: *const c_void) -> Result<Self, ValidationError> {
        Self::win32(SemaphoreHandleKind::D3d11Fence, handle, name)
    }

    /// A D3D11 keyed mutex (exactly one of handle and name non-NULL).
    pub fn d3d11_keyed_mutex(
        handle: *mut c_void,
        name: *const c_void,
    ) -> Result<Self, ValidationError> {
        Self::win32(SemaphoreHandleKind::D3d11KeyedMutex, handle, name)
    }

    /// A D3D11 keyed mutex from a KMT handle (non-NULL).
    pub fn d3d11_keyed_mutex_kmt(handle: *mut c_void) -> Result<Self, ValidationError> {
        Self::win32(
            SemaphoreHandleKind::D3d11KeyedMutexKmt,
            handle,
            core::ptr::null(),
        )
    }

    /// A timeline semaphore from a Win32 NT handle or name (exactly one non-NULL).
    pub fn timeline_win32(
        handle: *mut c_void,
        name: *const c_void,
    ) -> Result<Self, ValidationError> {
        Self::win32(SemaphoreHandleKind::TimelineSemaphoreWin32, handle, name)
    }

    /// An `NvSciSyncObj` (non-NULL). CUDA can signal it only if its attribute list was filled
    /// with `CUDA_NVSCISYNC_ATTR_SIGNAL`, wait only with `_WAIT`.
    pub fn nvscisync(obj: *const c_void) -> Result<Self, ValidationError> {
        Self::new(
            SemaphoreHandleKind::NvSciSync,
            SemaphoreHandle::NvSciSync(obj),
        )
    }
}

/// What a signal or wait carries, independent of flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Payload {
    /// Nothing: binary semaphores (OPAQUE_FD / OPAQUE_WIN32 / OPAQUE_WIN32_KMT).
    Binary,
    /// A 64-bit fence value: timeline semaphores, D3D12 and D3D11 fences.
    Fence(u64),
    /// An `NvSciSyncFence`: filled by a signal, read by a wait.
    NvSciSync(*mut NvSciSyncFence),
    /// A keyed-mutex key, and for waits a timeout in milliseconds.
    KeyedMutex {
        /// The key.
        key: u64,
        /// Timeout in milliseconds (waits only; [`KEYED_MUTEX_INFINITE`] waits forever).
        timeout_ms: u32,
    },
}

/// The checking and lowering methods signal and wait parameters share; each
/// type supplies its own `fill` (the wait side also writes a timeout).
macro_rules! params_lowering {
    ($raw:ty) => {
        /// Checks these parameters against `kind` and builds the C structure (all other fields
        /// and reserved words zero).
        #[inline]
        pub fn lower_for(&self, kind: SemaphoreHandleKind) -> Result<$raw, ValidationError> {
            let mut raw = <$raw>::default();
            self.lower_into(kind, &mut raw)?;
            Ok(raw)
        }

        /// The checks of [`lower_for`](Self::lower_for) without building the structure.
        #[inline]
        pub fn check_for(&self, kind: SemaphoreHandleKind) -> Result<(), ValidationError> {
            if self.flags.unknown_bits() != 0 {
                return Err(ValidationError::UnknownFlags {
                    bits: self.flags.unknown_bits(),
                });
            }
            check_payload(kind, self.payload, self.flags.bits())
        }

        /// [`lower_for`](Self::lower_for) writing into `raw` in place (no 144-byte structure is
        /// built and moved): checks these parameters against `kind`, then writes the payload
        /// fields and flags. `raw` must be zeroed (for example from `Default`); the fields this
        /// kind does not use are left as they are. On error `raw` is untouched.
        #[inline]
        pub fn lower_into(
            &self,
            kind: SemaphoreHandleKind,
            raw: &mut $raw,
        ) -> Result<(), ValidationError> {
            self.check_for(kind)?;
            self.fill(raw);
            Ok(())
        }
    };
}

/// Checks a payload and flag bits against a semaphore kind.
#[inline]
fn check_payload(
    kind: SemaphoreHandleKind,
    payload: Payload,
    flags: u32,
) -> Result<(), ValidationError> {
    if flags != 0 && !kind.is_nvscisync() {
        return Err(ValidationError::SemaphoreFlagsNotAllowed { kind, flags });
    }
    match payload {
        Payload::Binary => {
            if kind.has_fence_value() {
                Err(ValidationError::FenceValueRequired { kind })
            } else if kind.is_keyed_mutex() {
                Err(ValidationError::KeyedMutexRequired { kind })
            } else if kind.is_nvscisync() {
                Err(ValidationError::NvSciSyncFenceRequired)
            } else {
                Ok(())
            }
        }
        Payload::Fence(_) if kind.has_fence_value() => Ok(()),
        Payload::Fence(_) => Err(ValidationError::FenceValueNotSupported { kind }),
        Payload::NvSciSync(fence) if kind.is_nvscisync() => {
            if fence.is_null() {
                Err(ValidationError::NvSciSyncFenceRequired)
            } else {
                Ok(())
            }
        }
        Payload::NvSciSync(_) => Err(ValidationError::NvSciSyncFenceNotSupported { kind }),
        Payload::KeyedMutex { .. } if kind.is_keyed_mutex() => Ok(()),
        Payload::KeyedMutex { .. } => Err(ValidationError::KeyedMutexNotSupported { kind }),
    }
}

/// Parameters of one signal, checked against the semaphore kind by [`lower_for`](Self::lower_for).
///
/// ```
/// use tegra_interop_core::{SemaphoreHandleKind, SignalParams};
/// let raw = SignalParams::binary().lower_for(SemaphoreHandleKind::OpaqueFd)?;
/// assert_eq!(raw.flags, 0);
/// # Ok::<(), tegra_interop_core::ValidationError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct SignalParams {
    payload: Payload,
    flags: SignalFlags,
}

impl SignalParams {
    /// Signal a binary semaphore.
    pub const fn binary() -> Self {
        Self {
            payload: Payload::Binary,
            flags: SignalFlags::empty(),
        }
    }

    /// Set a timeline semaphore or D3D12/D3D11 fence to `value`.
    pub const fn timeline(value: u64) -> Self {
        Self {
            payload: Payload::Fence(value),
            flags: SignalFlags::empty(),
        }
    }

    /// Same as [`timeline`](Self::timeline), named for D3D fences.
    pub const fn fence(value: u64) -> Self {
        Self::timeline(value)
    }

    /// Signal an NvSciSync object; the driver writes the resulting fence to `*fence`
    /// (which must stay valid until the call returns; start it zeroed).
    pub const fn nvscisync(fence: *mut NvSciSyncFence) -> Self {
        Self {
            payload: Payload::NvSciSync(fence),
            flags: SignalFlags::empty(),
        }
    }

    /// Release a keyed mutex with `key`.
    pub const fn keyed_mutex(key: u64) -> Self {
        Self {
            payload: Payload::KeyedMutex { key, timeout_ms: 0 },
            flags: SignalFlags::empty(),
        }
    }

    /// Skip the NvSciBuf memory synchronisation this signal would otherwise perform
    /// (`CUDA_EXTERNAL_SEMAPHORE_SIGNAL_SKIP_NVSCIBUF_MEMSYNC`).
    ///
    /// Only NvSciSync semaphores accept it: [`lower_for`](Self::lower_for) refuses it on every
    /// other kind (the driver itself answers INVALID_VALUE on a timeline semaphore).
    ///
    /// # Safety
    ///
    /// Sound only when nothing ordered before this signal writes NvSciBuf-backed memory that a
    /// waiter reads through a path needing the driver's flush: either the work before the signal
    /// does not touch NvSciBuf memory at all, or every reader accesses it coherently with the
    /// writer (you did the cache maintenance yourself, e.g. `NvSciBufObjFlushCpuCacheRange`).
    /// Otherwise waiters may read stale data, which is undefined behaviour.
    #[must_use]
    pub unsafe fn skip_nvscibuf_memsync(mut self) -> Self {
        self.flags |= SignalFlags::SKIP_NVSCIBUF_MEMSYNC;
        self
    }

    /// What the signal carries.
    pub const fn payload(&self) -> Payload {
        self.payload
    }

    /// The flags.
    pub const fn flags(&self) -> SignalFlags {
        self.flags
    }

    params_lowering!(CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS);

    /// Writes the payload fields and flags into `raw`, which must be zeroed (others untouched).
    #[inline]
    pub(crate) fn fill(&self, raw: &mut CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS) {
        match self.payload {
            Payload::Binary => {}
            Payload::Fence(value) => raw.params.fence.value = value,
            Payload::NvSciSync(fence) => raw.params.nvSciSync.fence = fence.cast(),
            Payload::KeyedMutex { key, .. } => raw.params.keyedMutex.key = key,
        }
        raw.flags = self.flags.bits();
    }
}

/// Parameters of one wait, checked against the semaphore kind by [`lower_for`](Self::lower_for).
///
/// ```
/// use tegra_interop_core::{SemaphoreHandleKind, WaitParams, KEYED_MUTEX_INFINITE};
/// let raw = WaitParams::keyed_mutex(1, KEYED_MUTEX_INFINITE)
///     .lower_for(SemaphoreHandleKind::D3d11KeyedMutex)?;
/// assert_eq!(raw.params.keyedMutex.timeoutMs, 0xFFFF_FFFF);
/// # Ok::<(), tegra_interop_core::ValidationError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct WaitParams {
    payload: Payload,
    flags: WaitFlags,
}

impl WaitParams {
    /// Wait on a binary semaphore.
    pub const fn binary() -> Self {
        Self {
            payload: Payload::Binary,
            flags: WaitFlags::empty(),
        }
    }

    /// Wait until a timeline semaphore or D3D12/D3D11 fence reaches `value`.
    pub const fn timeline(value: u64) -> Self {
        Self {
            payload: Payload::Fence(value),
            flags: WaitFlags::empty(),
        }
    }

    /// Same as [`timeline`](Self::timeline), named for D3D fences.
    pub const fn fence(value: u64) -> Self {
        Self::timeline(value)
    }

    /// Wait on the NvSciSync fence at `fence` (read during the call).
    pub const fn nvscisync(fence: *const NvSciSyncFence) -> Self {
        Self {
            payload: Payload::NvSciSync(fence.cast_mut()),
            flags: WaitFlags::empty(),
        }
    }

    /// Acquire a keyed mutex with `key`, giving up after `timeout_ms` milliseconds
    /// ([`KEYED_MUTEX_INFINITE`] waits forever).
    pub const fn keyed_mutex(key: u64, timeout_ms: u32) -> Self {
        Self {
            payload: Payload::KeyedMutex { key, timeout_ms },
            flags: WaitFlags::empty(),
        }
    }

    /// Skip the NvSciBuf memory synchronisation this wait would otherwise perform
    /// (`CUDA_EXTERNAL_SEMAPHORE_WAIT_SKIP_NVSCIBUF_MEMSYNC`).
    ///
    /// Only NvSciSync semaphores accept it: [`lower_for`](Self::lower_for) refuses it on every
    /// other kind (the driver itself answers INVALID_VALUE on a timeline semaphore).
    ///
    /// # Safety
    ///
    /// Sound only when the work ordered after this wait does not read NvSciBuf-backed memory
    /// written by the signaler through a path needing the driver's invalidation: either it does
    /// not touch NvSciBuf memory, or the signaler's writes are already coherent for it (you did
    /// the cache maintenance yourself). Otherwise the GPU may read stale data, which is undefined
    /// behaviour.
    #[must_use]
    pub unsafe fn skip_nvscibuf_memsync(mut self) -> Self {
        self.flags |= WaitFlags::SKIP_NVSCIBUF_MEMSYNC;
        self
    }

    /// What the wait carries.
    pub const fn payload(&self) -> Payload {
        self.payload
    }

    /// The flags.
    pub const fn flags(&self) -> WaitFlags {
        self.flags
    }

    params_lowering!(CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS);

    /// Writes the payload fields and flags into `raw`, which must be zeroed (others untouched).
    #[inline]
    pub(crate) fn fill(&self, raw: &mut CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS) {
        match self.payload {
            Payload::Binary => {}
            Payload::Fence(value) => raw.params.fence.value = value,
            Payload::NvSciSync(fence) => raw.params.nvSciSync.fence = fence.cast(),
            Payload::KeyedMutex { key, timeout_ms } => {
                raw.params.keyedMutex.key = key;
                raw.params.keyedMutex.timeoutMs = timeout_ms;
            }
        }
        raw.flags = self.flags.bits();
    }
}
