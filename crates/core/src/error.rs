//! Error types: the driver's result codes as open newtypes, and the one validation error.
//!
//! [`CuResult`] and [`NvSciError`] keep any value the libraries return (an unknown code is
//! kept and printed as a number, never mapped to a catch-all). [`ValidationError`] is every
//! rule this crate checks before a call. Where the project knows the usual cause of a code,
//! [`CuResult::hint`] / [`NvSciError::hint`] return it with a fix.

use core::fmt;

use crate::fence::StreamId;
use crate::memory::MemoryHandleKind;
use crate::semaphore::SemaphoreHandleKind;

/// A likely cause of an error and what to do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Hint {
    /// What usually leads to this code.
    pub cause: &'static str,
    /// What to change.
    pub fix: &'static str,
}

impl fmt::Display for Hint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "likely cause: {}; fix: {}", self.cause, self.fix)
    }
}

macro_rules! open_codes {
    // The form the generated lists of `tegra-interop-sys` call back with.
    ([$ty:ident, $repr:ty, $unknown_prefix:literal] $($name:ident = $value:expr, $cname:literal, $c_str:literal;)*) => {
        open_codes! { $ty, $repr, $unknown_prefix; $($name = $value, $cname;)* }
    };
    ($ty:ident, $repr:ty, $unknown_prefix:literal; $($name:ident = $value:expr, $cname:literal;)*) => {
        impl $ty {
            $(
                #[doc = concat!("`", $cname, "`.")]
                pub const $name: $ty = $ty($value);
            )*

            /// Every named code, in ascending order of value.
            pub const ALL_NAMED: &'static [$ty] = &[$($ty::$name,)*];

            /// The C name of the code (`None` for a value this crate has no name for).
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $(v if v == $value => Some($cname),)*
                    _ => None,
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.name() {
                    Some(name) => write!(f, "{} ({})", name, self.0),
                    None => write!(f, concat!($unknown_prefix, "({})"), self.0),
                }
            }
        }

        #[cfg(feature = "defmt")]
        impl defmt::Format for $ty {
            fn format(&self, f: defmt::Formatter<'_>) {
                match self.name() {
                    Some(name) => defmt::write!(f, "{=str} ({=u32})", name, self.0),
                    None => defmt::write!(f, "{=str}({=u32})", $unknown_prefix, self.0),
                }
            }
        }
    };
}

/// A `CUresult` from the CUDA driver API, as an open set.
///
/// Any `u32` is a valid value: codes added by later drivers are kept and shown as numbers.
///
/// ```
/// use tegra_interop_core::CuResult;
///
/// assert_eq!(CuResult::INVALID_VALUE.to_string(), "CUDA_ERROR_INVALID_VALUE (1)");
/// assert_eq!(CuResult(1234).to_string(), "CUresult(1234)");
/// assert!(CuResult::SUCCESS.ok().is_ok());
/// let hint = CuResult::UNKNOWN.hint().unwrap();
/// assert!(hint.cause.contains("-1"));
/// ```
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CuResult(pub u32);

// Every named value of the header, from the one generated list.
tegra_interop_sys::cuda_result_codes!(open_codes CuResult, u32, "CUresult");

/// Calls that take or use an external semaphore: their INVALID_VALUE / INVALID_HANDLE mostly
/// mean a semaphore that is no longer valid for that stream.
const SEMAPHORE_CALLS: &[&str] = &[
    "cuSignalExternalSemaphoresAsync",
    "cuSignalExternalSemaphoresAsync_ptsz",
    "cuWaitExternalSemaphoresAsync",
    "cuWaitExternalSemaphoresAsync_ptsz",
    "cuDestroyExternalSemaphore",
];

const HINT_SEMAPHORE_STALE: Hint = Hint {
    cause: "the external semaphore was already destroyed, was never imported, or was imported in \
            another CUDA context than the one owning the stream it is used on",
    fix: "keep the semaphore alive while work that uses it is queued, and signal/wait it only \
          on streams of the context it was imported in (import it once per context)",
};

/// Measured on an H200 (driver 580.159): the EGLStream calls answer
/// CUDA_ERROR_UNKNOWN in these cases.
const HINT_EGL_STREAM_UNKNOWN: Hint = Hint {
    cause: "an EGLStream call out of order: a producer connecting before the consumer, a \
            return of frames before anything was presented, or an acquire whose timeout passed \
            (all measured to answer UNKNOWN)",
    fix: "connect the consumer first, ask for returned frames only after a present, and treat \
          an acquire's UNKNOWN after its whole timeout as 'no frame'",
};

/// cudaEGL.h: a registered EGL image needs no map or unmap; it stays
/// mapped while registered (on a Jetson the mapping cannot be undone).
const HINT_EGL_MAPPING: Hint = Hint {
    cause: "an EGL image's registration is mapped for as long as it is registered (no map or \
            unmap is needed, and on a Jetson the mapping cannot be undone): a map/unmap call on \
            it, or a frame asked of a resource that is not (or no longer) registered",
    fix: "take frames with EglImage::frame only, and end the mapping by unregistering \
          (EglImage::unregister) after the last use of its planes",
};

const HINT_DRIVER_GONE: Hint = Hint {
    cause: "the CUDA driver is shutting down or has shut down (process exit handlers already \
            ran, or a reset tore the context down while other threads still used it)",
    fix: "release CUDA objects before process exit and before resetting a device; in Drop, \
          treat this code as 'already released' instead of an error",
};

impl CuResult {
    /// `true` for `CUDA_SUCCESS`.
    pub const fn is_success(self) -> bool {
        self.0 == 0
    }

    /// `Ok(())` for `CUDA_SUCCESS`, else `Err(self)`.
    pub const fn ok(self) -> Result<(), CuResult> {
        if self.is_success() {
            Ok(())
        } else {
            Err(self)
        }
    }

    /// `true` when the driver is gone (`DEINITIALIZED` or `NOT_INITIALIZED`): releasing an
    /// object at that point has nothing left to release.
    pub const fn is_driver_shut_down(self) -> bool {
        matches!(self, CuResult::DEINITIALIZED | CuResult::NOT_INITIALIZED)
    }

    /// The usual cause of this code in external-resource interop, and its fix.
    pub const fn hint(self) -> Option<Hint> {
        Some(match self {
            CuResult::INVALID_VALUE => Hint {
                cause: "a descriptor field the driver refused (buffer flags not 0, a mapping past \
                        the end of the import, a NULL NvSci object), or a semaphore used after \
                        destroy or with a stream of another context",
                fix: "build descriptors with tegra-interop-core (it checks these rules first) and \
                      use each semaphore only on streams of the context it was imported in",
            },
            CuResult::INVALID_HANDLE => HINT_SEMAPHORE_STALE,
            CuResult::DEINITIALIZED | CuResult::NOT_INITIALIZED => HINT_DRIVER_GONE,
            CuResult::UNKNOWN => Hint {
                cause: "often an invalid file descriptor (e.g. -1) passed to an fd import",
                fix: "pass a valid, open fd exported for this allocation (the core rejects fd < 0 \
                      before the call)",
            },
            CuResult::NOT_SUPPORTED => Hint {
                cause: "the handle type or NvSci is not available on this platform/driver, or an \
                        NvSciSync object was used to signal (wait) without an attribute list made \
                        with CUDA_NVSCISYNC_ATTR_SIGNAL (WAIT)",
                fix: "check device attributes before importing; request the SIGNAL/WAIT flags \
                      that match how CUDA uses the NvSciSync object",
            },
            CuResult::INVALID_CONTEXT | CuResult::CONTEXT_IS_DESTROYED => Hint {
                cause: "no current context, or the context the object belongs to was destroyed",
                fix: "make the importing context current and keep it alive longer than every \
                      object imported into it",
            },
            CuResult::OUT_OF_MEMORY => Hint {
                cause: "the mapping or array could not be allocated on the device",
                fix: "map smaller ranges or free device memory first",
            },
            _ => return None,
        })
    }

    /// Like [`hint`](Self::hint), but knowing which C call returned the code: for semaphore
    /// signal/wait/destroy calls, INVALID_VALUE and INVALID_HANDLE mean a semaphore used after
    /// destroy or with another context.
    pub fn hint_for(self, call: &str) -> Option<Hint> {
        let semaphore_call = SEMAPHORE_CALLS.contains(&call);
        if semaphore_call && matches!(self, CuResult::INVALID_VALUE | CuResult::INVALID_HANDLE) {
            return Some(HINT_SEMAPHORE_STALE);
        }
        if call.starts_with("cuEGLStream") && self == CuResult::UNKNOWN {
            return Some(HINT_EGL_STREAM_UNKNOWN);
        }
        if call.starts_with("cuGraphics")
            && matches!(
                self,
                CuResult::ALREADY_MAPPED
                    | CuResult::NOT_MAPPED
                    | CuResult::NOT_MAPPED_AS_ARRAY
                    | CuResult::NOT_MAPPED_AS_POINTER
            )
        {
            return Some(HINT_EGL_MAPPING);
        }
        self.hint()
    }
}

impl From<tegra_interop_sys::cuda::CUresult> for CuResult {
    fn from(value: tegra_interop_sys::cuda::CUresult) -> Self {
        CuResult(value.0)
    }
}

impl From<CuResult> for tegra_interop_sys::cuda::CUresult {
    fn from(value: CuResult) -> Self {
        tegra_interop_sys::cuda::CUresult(value.0)
    }
}

impl core::error::Error for CuResult {}

/// An `NvSciError` from NvSciBuf / NvSciSync / NvSciIpc, as an open set.
///
/// ```
/// use tegra_interop_core::NvSciError;
///
/// assert_eq!(NvSciError::BAD_PARAMETER.to_string(), "NvSciError_BadParameter (256)");
/// assert_eq!(NvSciError(7).to_string(), "NvSciError(7)");
/// ```
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NvSciError(pub u32);

// Every named value of the project's NvSci header, from the one generated list.
tegra_interop_sys::nvsci_error_codes!(open_codes NvSciError, u32, "NvSciError");

impl NvSciError {
    /// `true` for `NvSciError_Success`.
    pub const fn is_success(self) -> bool {
        self.0 == 0
    }

    /// `Ok(())` for success, else `Err(self)`.
    pub const fn ok(self) -> Result<(), NvSciError> {
        if self.is_success() {
            Ok(())
        } else {
            Err(self)
        }
    }

    /// The usual cause of this code, and its fix.
    pub const fn hint(self) -> Option<Hint> {
        Some(match self {
            NvSciError::NOT_SUPPORTED => Hint {
                cause: "the NvSci libraries or this feature are not present (NvSci exists only on \
                        Tegra: Jetson / DRIVE)",
                fix: "run on a Tegra system with the BSP's libnvscibuf/libnvscisync, or use the \
                      fd-based (Vulkan / dma-buf) path",
            },
            NvSciError::BAD_PARAMETER => Hint {
                cause: "a NULL or stale object, a key set twice, or a value of the wrong size",
                fix: "build attribute lists with tegra-interop-core's typed sets",
            },
            NvSciError::RECONCILIATION_FAILED => Hint {
                cause: "the participants' attribute lists conflict (e.g. sizes, layouts, or a \
                        sync list set without exactly one signaler and at least one waiter)",
                fix: "read the conflict list returned by reconciliation and align the attributes",
            },
            NvSciError::UNSUPPORTED_CONFIG => Hint {
                cause: "NvSciSync reconciliation without exactly one SignalOnly list and at \
                        least one WaitOnly list, or with a combination the library does not \
                        support",
                fix: "reconcile one signaller's list with the waiters' lists",
            },
            NvSciError::OVERFLOW => Hint {
                cause: "a fence id or value past the primitive's range (FenceUpdateFence: value \
                        above u32::MAX on a 32-bit primitive)",
                fix: "wrap values at the primitive's width (SyncObj::width / DeterministicCounter)",
            },
            NvSciError::ACCESS_DENIED => Hint {
                cause: "the object was imported or duplicated with fewer permissions than needed",
                fix: "request ReadWrite (buffers) or WaitSignal/SignalOnly (sync) where you write \
                      or signal",
            },
            NvSciError::CLEARED_FENCE => Hint {
                cause: "the fence is cleared (all zero): nothing was signalled into it yet",
                fix: "wait on a fence filled by a signal or built with FenceUpdateFence",
            },
            NvSciError::TIMEOUT => Hint {
                cause: "the fence was not signalled within the timeout",
                fix: "check that the signaler's work was submitted and is not waiting on you",
            },
            NvSciError::NOT_INITIALIZED => Hint {
                cause: "the module was not opened or was already closed (NvSciIpc: NvSciIpcInit \
                        was not called, or NvSciIpcDeinit ran while endpoints were open)",
                fix:
                    "keep the module open while any attribute list, object or fence of it lives; \
                      initialise NvSciIpc once per process and deinitialise after the last endpoint",
            },
            NvSciError::NO_SUCH_ENTRY => Hint {
                cause: "the NvSciIpc endpoint name is not in the system's NvSciIpc configuration",
                fix: "use a name from the BSP's /etc/nvsciipc.cfg (INTER_PROCESS lines name the \
                      two endpoints of a pair)",
            },
            NvSciError::BUSY => Hint {
                cause: "the NvSciIpc endpoint is already open (in this or another process), or a \
                        CPU wait context is in use",
                fix: "open each endpoint once; give each process its own end of the pair",
            },
            NvSciError::CONNECTION_RESET => Hint {
                cause: "the NvSciIpc connection was reset: the peer closed or reset its endpoint, \
                        or its process ended",
                fix: "close this endpoint; a new connection needs both ends opened again",
            },
            _ => return None,
        })
    }
}

impl NvSciError {
    /// The cause and fix of this code as returned by `call`: the import
    /// calls (`...IpcImport...`) get their own for `BadParameter` (the
    /// descriptor the peer sent was refused) and `Timeout` (the peer did
    /// not send in time); other calls get [`hint`](Self::hint).
    ///
    /// ```
    /// use tegra_interop_core::NvSciError;
    ///
    /// let h = NvSciError::BAD_PARAMETER.hint_for("NvSciBufObjIpcImport").unwrap();
    /// assert!(h.cause.contains("descriptor"));
    /// let h = NvSciError::BAD_PARAMETER.hint_for("NvSciBufAttrListSetAttrs").unwrap();
    /// assert!(h.fix.contains("typed sets"));
    /// ```
    pub fn hint_for(self, call: &str) -> Option<Hint> {
        if call.contains("IpcImport") {
            match self {
                NvSciError::BAD_PARAMETER => {
                    return Some(Hint {
                        cause: "the library refused the descriptor received from the peer: \
                                malformed, truncated, or not exported by this library for this \
                                module (a peer is not trusted; it may send anything)",
                        fix: "check what the peer sends and that both sides run the same \
                              library; nothing was imported",
                    })
                }
                NvSciError::TIMEOUT => {
                    return Some(Hint {
                        cause: "the peer did not export what the import waits for within the \
                                timeout (never sent, or the peer is stopped or slow)",
                        fix: "check that the peer exported and sent it; raise the import's \
                              timeout if the peer is only slow",
                    })
                }
                _ => {}
            }
        }
        self.hint()
    }
}

impl From<tegra_interop_sys::nvsci::NvSciError> for NvSciError {
    fn from(value: tegra_interop_sys::nvsci::NvSciError) -> Self {
        NvSciError(value.0)
    }
}

impl From<NvSciError> for tegra_interop_sys::nvsci::NvSciError {
    fn from(value: NvSciError) -> Self {
        tegra_interop_sys::nvsci::NvSciError(value.0)
    }
}

impl core::error::Error for NvSciError {}

/// Every rule the core checks, as one error type.
///
/// Each variant names one rule; its `Display` says what was wrong in words. The type is
/// `Copy` and small, so it can be returned from the per-frame paths at no cost.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ValidationError {
    /// A file descriptor below zero (the driver answers `CUDA_ERROR_UNKNOWN` to it).
    NegativeFd {
        /// The refused descriptor.
        fd: i32,
    },
    /// An import or mapping of zero bytes.
    ZeroSize,
    /// A required handle, object or pointer is NULL.
    NullHandle,
    /// A Win32 import gave both a handle and a name: exactly one is allowed.
    Win32HandleAndName,
    /// A Win32 import gave neither a handle nor a name: exactly one is required.
    Win32NoHandleOrName,
    /// A KMT import gave a name: KMT handles are imported by handle only.
    Win32KmtName,
    /// This memory handle type must be imported with `CUDA_EXTERNAL_MEMORY_DEDICATED`.
    DedicatedRequired {
        /// The handle type that needs it.
        kind: MemoryHandleKind,
    },
    /// Flag bits this crate does not know (or that the structure does not allow).
    UnknownFlags {
        /// The bits that were refused.
        bits: u32,
    },
    /// A reserved field of a raw descriptor is not zero.
    ReservedNonZero,
    /// The handle given does not fit the handle type (e.g. an fd for a Win32 kind).
    HandleKindMismatch,
    /// A raw handle-type value that is not one of the documented kinds.
    UnknownHandleType {
        /// The raw value.
        raw: u32,
    },
    /// `CUDA_EXTERNAL_MEMORY_BUFFER_DESC::flags` must be zero.
    BufferFlagsNonZero {
        /// The flags given.
        flags: u32,
    },
    /// A mapping that does not lie inside the imported memory (or whose end overflows).
    MappingOutOfRange {
        /// Start of the mapping.
        offset: u64,
        /// Length of the mapping (for arrays: the smallest size the level-0 data needs).
        size: u64,
        /// Size of the imported memory.
        import_size: u64,
    },
    /// A mipmapped array with zero levels.
    ArrayLevelsZero,
    /// Arrays mapped from NvSciBuf memory must have exactly one level.
    NvSciBufArrayLevels {
        /// The level count given.
        num_levels: u32,
    },
    /// More mip levels than the extent allows.
    ArrayTooManyLevels {
        /// The level count given.
        num_levels: u32,
        /// The largest count for this extent.
        max: u32,
    },
    /// Array channel count other than 1, 2 or 4.
    ArrayChannels {
        /// The count given.
        channels: u32,
    },
    /// An array format this crate does not describe.
    ArrayFormat {
        /// The raw `CUarray_format` value.
        raw: u32,
    },
    /// An array extent that is not a valid 1D/2D/3D/layered shape or whose byte size overflows.
    ArrayExtent {
        /// Width in elements.
        width: usize,
        /// Height in elements (0 for 1D).
        height: usize,
        /// Depth in elements or layers (0 for 1D/2D).
        depth: usize,
    },
    /// Signal/wait flags are only allowed on NvSciSync semaphores.
    SemaphoreFlagsNotAllowed {
        /// The semaphore kind the flags were given for.
        kind: SemaphoreHandleKind,
        /// The flags given.
        flags: u32,
    },
    /// A fence value was given for a semaphore kind that has none.
    FenceValueNotSupported {
        /// The semaphore kind.
        kind: SemaphoreHandleKind,
    },
    /// This semaphore kind needs a fence value (timeline, D3D12 fence, D3D11 fence).
    FenceValueRequired {
        /// The semaphore kind.
        kind: SemaphoreHandleKind,
    },
    /// Keyed-mutex parameters were given for a kind that is not a keyed mutex.
    KeyedMutexNotSupported {
        /// The semaphore kind.
        kind: SemaphoreHandleKind,
    },
    /// A keyed mutex needs keyed-mutex parameters (key, and for waits a timeout).
    KeyedMutexRequired {
        /// The semaphore kind.
        kind: SemaphoreHandleKind,
    },
    /// An NvSciSync fence pointer was given for a kind that is not NvSciSync.
    NvSciSyncFenceNotSupported {
        /// The semaphore kind.
        kind: SemaphoreHandleKind,
    },
    /// An NvSciSync semaphore needs a (non-NULL) NvSciSync fence pointer.
    NvSciSyncFenceRequired,
    /// A timeline value that does not increase.
    FenceNotIncreasing {
        /// The last value committed.
        last: u64,
        /// The value asked for.
        requested: u64,
    },
    /// A 64-bit timeline at `u64::MAX` has no next value (or a signal count overflowed).
    FenceExhausted,
    /// A fence value wider than the primitive it belongs to (e.g. above `u32::MAX` for a
    /// 32-bit syncpoint).
    FenceValueTooWide {
        /// The value given.
        value: u64,
    },
    /// A reservation is already outstanding: commit or abort it first.
    ReservationPending,
    /// The reservation does not belong to this tracker's outstanding reservation.
    ReservationMismatch,
    /// A timeline or deterministic semaphore is signalled from a second stream with no ordering
    /// stated.
    StreamNotOrdered {
        /// The stream asking to signal.
        stream: StreamId,
        /// The stream that signalled last.
        last: StreamId,
    },
    /// An NvSciSync primitive type value that is not documented.
    UnknownPrimitiveType {
        /// The raw value.
        raw: u32,
    },
    /// An index past the end of a batch or list.
    IndexOutOfRange {
        /// The index given.
        index: usize,
        /// The current length.
        len: usize,
    },
    /// A fixed-capacity container is full.
    CapacityExceeded {
        /// Its capacity.
        capacity: usize,
    },
    /// The same attribute key was set twice in one list.
    DuplicateKey {
        /// The raw key.
        key: u32,
    },
    /// `Auto` permission is only for import/export, never a required permission.
    AutoPermNotAllowed,
    /// A permission value that is not documented.
    InvalidPerm {
        /// The raw value.
        raw: u64,
    },
    /// More image planes than supported.
    TooManyPlanes {
        /// Planes given.
        count: usize,
        /// The maximum.
        max: usize,
    },
    /// A per-plane attribute has a different number of entries than `PlaneCount`.
    PlaneCountMismatch {
        /// The raw key of the per-plane attribute.
        key: u32,
        /// `PlaneCount`.
        expected: usize,
        /// Entries given.
        actual: usize,
    },
    /// An attribute value of the wrong byte length (decoding).
    AttrLength {
        /// The raw key.
        key: u32,
        /// The length found.
        len: usize,
    },
    /// An attribute key this crate does not describe (decoding).
    UnknownAttrKey {
        /// The raw key.
        key: u32,
    },
    /// An attribute value out of its documented range.
    InvalidAttrValue {
        /// The raw key.
        key: u32,
    },
    /// `cuDeviceGetNvSciSyncAttributes` needs SIGNAL, WAIT or both.
    NoNvSciSyncAttrFlags,
    /// An output-only attribute key (computed by reconciliation, e.g. `ActualPerm`) given as
    /// an input: the library refuses to set it.
    OutputOnlyKey {
        /// The raw key.
        key: u32,
    },
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ValidationError as E;
        match *self {
            E::NegativeFd { fd } => write!(f, "file descriptor {fd} is negative; pass an open fd"),
            E::ZeroSize => f.write_str("size is zero; imports and mappings need at least one byte"),
            E::NullHandle => f.write_str("a required handle or pointer is NULL"),
            E::Win32HandleAndName => {
                f.write_str("both a Win32 handle and a name were given; give exactly one")
            }
            E::Win32NoHandleOrName => {
                f.write_str("neither a Win32 handle nor a name was given; give exactly one")
            }
            E::Win32KmtName => f.write_str("KMT handle types are imported by handle; name must be NULL"),
            E::DedicatedRequired { kind } => write!(
                f,
                "{} memory must be imported with the DEDICATED flag",
                kind.name()
            ),
            E::UnknownFlags { bits } => write!(f, "flag bits {bits:#x} are not allowed here"),
            E::HandleKindMismatch => {
                f.write_str("the handle given does not fit the handle type (fd, Win32 or NvSci)")
            }
            E::ReservedNonZero => f.write_str("a reserved field is not zero"),
            E::UnknownHandleType { raw } => write!(f, "handle type {raw} is not a documented kind"),
            E::BufferFlagsNonZero { flags } => {
                write!(f, "buffer mapping flags must be 0 (got {flags:#x})")
            }
            E::MappingOutOfRange {
                offset,
                size,
                import_size,
            } => write!(
                f,
                "mapping of {size} bytes at offset {offset} does not fit in the {import_size}-byte import"
            ),
            E::ArrayLevelsZero => f.write_str("a mipmapped array needs at least one level"),
            E::NvSciBufArrayLevels { num_levels } => write!(
                f,
                "arrays mapped from NvSciBuf memory must have exactly 1 level (got {num_levels})"
            ),
            E::ArrayTooManyLevels { num_levels, max } => {
                write!(f, "{num_levels} mip levels requested; this extent allows at most {max}")
            }
            E::ArrayChannels { channels } => {
                write!(f, "array channel count must be 1, 2 or 4 (got {channels})")
            }
            E::ArrayFormat { raw } => write!(f, "array format {raw} is not supported by the core"),
            E::ArrayExtent {
                width,
                height,
                depth,
            } => write!(f, "array extent {width}x{height}x{depth} is not a valid shape"),
            E::SemaphoreFlagsNotAllowed { kind, flags } => write!(
                f,
                "flags {flags:#x} are only allowed on NvSciSync semaphores, not {}",
                kind.name()
            ),
            E::FenceValueNotSupported { kind } => {
                write!(f, "{} semaphores take no fence value", kind.name())
            }
            E::FenceValueRequired { kind } => {
                write!(f, "{} semaphores need a fence value", kind.name())
            }
            E::KeyedMutexNotSupported { kind } => {
                write!(f, "{} is not a keyed mutex; key/timeout not allowed", kind.name())
            }
            E::KeyedMutexRequired { kind } => {
                write!(f, "{} needs keyed-mutex parameters", kind.name())
            }
            E::NvSciSyncFenceNotSupported { kind } => {
                write!(f, "{} takes no NvSciSync fence", kind.name())
            }
            E::NvSciSyncFenceRequired => {
                f.write_str("NvSciSync semaphores need a non-NULL NvSciSyncFence pointer")
            }
            E::FenceNotIncreasing { last, requested } => write!(
                f,
                "fence value {requested} does not increase past the last value {last}"
            ),
            E::FenceExhausted => f.write_str("the 64-bit timeline is at its maximum value"),
            E::FenceValueTooWide { value } => {
                write!(f, "fence value {value} does not fit the primitive's width")
            }
            E::ReservationPending => {
                f.write_str("a reservation is outstanding; commit or abort it first")
            }
            E::ReservationMismatch => {
                f.write_str("this reservation is not the tracker's outstanding reservation")
            }
            E::StreamNotOrdered { stream, last } => write!(
                f,
                "stream {} signals a semaphore (timeline or deterministic) last signalled from stream {} with no ordering stated between them: the signals may complete out of call order; state it with `order_after` (after making the streams ordered, e.g. with an event)",
                stream.0, last.0
            ),
            E::UnknownPrimitiveType { raw } => {
                write!(f, "NvSciSync primitive type {raw} is not documented")
            }
            E::IndexOutOfRange { index, len } => {
                write!(f, "index {index} is out of range for length {len}")
            }
            E::CapacityExceeded { capacity } => write!(f, "capacity of {capacity} exceeded"),
            E::DuplicateKey { key } => write!(f, "attribute key {key:#x} is set twice"),
            E::AutoPermNotAllowed => {
                f.write_str("Auto permission is for import/export only, not a required permission")
            }
            E::InvalidPerm { raw } => write!(f, "permission value {raw:#x} is not documented"),
            E::TooManyPlanes { count, max } => {
                write!(f, "{count} image planes given; at most {max} are supported")
            }
            E::PlaneCountMismatch {
                key,
                expected,
                actual,
            } => write!(
                f,
                "attribute {key:#x} has {actual} plane entries but PlaneCount is {expected}"
            ),
            E::AttrLength { key, len } => {
                write!(f, "attribute {key:#x} has an unexpected value length {len}")
            }
            E::UnknownAttrKey { key } => write!(f, "attribute key {key:#x} is not described"),
            E::InvalidAttrValue { key } => write!(f, "attribute {key:#x} has an invalid value"),
            E::NoNvSciSyncAttrFlags => f.write_str(
                "cuDeviceGetNvSciSyncAttributes needs CUDA_NVSCISYNC_ATTR_SIGNAL, _WAIT or both",
            ),
            E::OutputOnlyKey { key } => write!(
                f,
                "attribute key {key:#x} is output-only (reconciliation computes it); read it from the reconciled list instead of setting it"
            ),
        }
    }
}

impl core::error::Error for ValidationError {}
