//! External memory: import descriptors, buffer mappings and mipmapped-array mappings.
//!
//! ```
//! use tegra_interop_core::{ArrayDesc, ArrayFormat, MemoryImport, MipmappedArrayMapping};
//!
//! // An RGBA8 1024x1024 image exported by Vulkan as an opaque fd.
//! let import = MemoryImport::opaque_fd(5, 4 << 20)?.dedicated();
//! let image = ArrayDesc::new_2d(1024, 1024, ArrayFormat::U8, 4)?;
//! let raw = MipmappedArrayMapping::new(0, image, 1).lower_for(&import)?;
//! assert_eq!(raw.numLevels, 1);
//! assert_eq!(raw.arrayDesc.NumChannels, 4);
//! # Ok::<(), tegra_interop_core::ValidationError>(())
//! ```

use core::ffi::c_void;
use core::fmt;

use tegra_interop_sys::cuda::{
    CUarray_format, CUexternalMemoryHandleType, CUDA_ARRAY3D_COLOR_ATTACHMENT,
    CUDA_ARRAY3D_CUBEMAP, CUDA_ARRAY3D_DEFERRED_MAPPING, CUDA_ARRAY3D_DEPTH_TEXTURE,
    CUDA_ARRAY3D_DESCRIPTOR, CUDA_ARRAY3D_LAYERED, CUDA_ARRAY3D_SPARSE, CUDA_ARRAY3D_SURFACE_LDST,
    CUDA_ARRAY3D_TEXTURE_GATHER, CUDA_ARRAY3D_VIDEO_ENCODE_DECODE,
    CUDA_EXTERNAL_MEMORY_BUFFER_DESC, CUDA_EXTERNAL_MEMORY_HANDLE_DESC,
    CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC,
};

use crate::error::ValidationError;
use crate::flags::MemoryImportFlags;
use crate::import::{import_facts, Import};

/// `CU_EXTERNAL_MEMORY_HANDLE_TYPE_DMABUF_FD` (9): a Linux dma-buf fd. Added in CUDA 13.0; the
/// 12.9 header the sys crate is generated from does not have it, so it is defined here.
pub const CU_EXTERNAL_MEMORY_HANDLE_TYPE_DMABUF_FD: CUexternalMemoryHandleType =
    CUexternalMemoryHandleType(9);

/// The kind of handle external memory is imported from (`CUexternalMemoryHandleType`).
///
/// Every kind is describable on every target; a kind the OS cannot provide (Win32/D3D on
/// Linux) is refused by the driver, not here.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum MemoryHandleKind {
    /// POSIX fd from an opaque export (e.g. Vulkan `OPAQUE_FD`). Value 1.
    OpaqueFd = 1,
    /// Win32 NT handle or named object. Value 2.
    OpaqueWin32 = 2,
    /// Win32 global share (KMT) handle. Value 3.
    OpaqueWin32Kmt = 3,
    /// D3D12 heap (NT handle or name). Value 4.
    D3d12Heap = 4,
    /// D3D12 committed resource (NT handle or name); needs DEDICATED. Value 5.
    D3d12Resource = 5,
    /// D3D11 resource (NT handle or name); needs DEDICATED. Value 6.
    D3d11Resource = 6,
    /// D3D11 resource KMT handle; needs DEDICATED. Value 7.
    D3d11ResourceKmt = 7,
    /// An `NvSciBufObj`. Value 8.
    NvSciBuf = 8,
    /// Linux dma-buf fd (CUDA 13.0 and later). Value 9.
    DmaBufFd = 9,
}

impl MemoryHandleKind {
    /// All nine kinds, in value order.
    pub const ALL: [MemoryHandleKind; 9] = [
        Self::OpaqueFd,
        Self::OpaqueWin32,
        Self::OpaqueWin32Kmt,
        Self::D3d12Heap,
        Self::D3d12Resource,
        Self::D3d11Resource,
        Self::D3d11ResourceKmt,
        Self::NvSciBuf,
        Self::DmaBufFd,
    ];

    /// The kind for a raw `CUexternalMemoryHandleType` value.
    pub const fn from_raw(raw: u32) -> Result<Self, ValidationError> {
        Ok(match raw {
            1 => Self::OpaqueFd,
            2 => Self::OpaqueWin32,
            3 => Self::OpaqueWin32Kmt,
            4 => Self::D3d12Heap,
            5 => Self::D3d12Resource,
            6 => Self::D3d11Resource,
            7 => Self::D3d11ResourceKmt,
            8 => Self::NvSciBuf,
            9 => Self::DmaBufFd,
            _ => return Err(ValidationError::UnknownHandleType { raw }),
        })
    }

    /// The C enum value.
    pub const fn raw(self) -> CUexternalMemoryHandleType {
        CUexternalMemoryHandleType(self as u32)
    }

    /// The C name without its common prefix (`OPAQUE_FD`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Self::OpaqueFd => "OPAQUE_FD",
            Self::OpaqueWin32 => "OPAQUE_WIN32",
            Self::OpaqueWin32Kmt => "OPAQUE_WIN32_KMT",
            Self::D3d12Heap => "D3D12_HEAP",
            Self::D3d12Resource => "D3D12_RESOURCE",
            Self::D3d11Resource => "D3D11_RESOURCE",
            Self::D3d11ResourceKmt => "D3D11_RESOURCE_KMT",
            Self::NvSciBuf => "NVSCIBUF",
            Self::DmaBufFd => "DMABUF_FD",
        }
    }

    /// `true` for kinds imported from a file descriptor (ownership passes on success).
    pub const fn is_fd(self) -> bool {
        matches!(self, Self::OpaqueFd | Self::DmaBufFd)
    }

    /// `true` for kinds imported from a Win32 handle or name.
    pub const fn is_win32(self) -> bool {
        matches!(
            self,
            Self::OpaqueWin32
                | Self::OpaqueWin32Kmt
                | Self::D3d12Heap
                | Self::D3d12Resource
                | Self::D3d11Resource
                | Self::D3d11ResourceKmt
        )
    }

    /// `true` for KMT kinds: handle required, name must be NULL.
    pub const fn is_kmt(self) -> bool {
        matches!(self, Self::OpaqueWin32Kmt | Self::D3d11ResourceKmt)
    }

    /// `true` for kinds whose import must set `CUDA_EXTERNAL_MEMORY_DEDICATED`.
    pub const fn requires_dedicated(self) -> bool {
        matches!(
            self,
            Self::D3d12Resource | Self::D3d11Resource | Self::D3d11ResourceKmt
        )
    }
}

impl fmt::Display for MemoryHandleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The handle part of a memory import.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryHandle {
    /// A file descriptor (OPAQUE_FD, DMABUF_FD).
    Fd(i32),
    /// A Win32 NT/KMT handle and/or a named object (`LPCWSTR`).
    Win32 {
        /// The handle (NULL when importing by name).
        handle: *mut c_void,
        /// The object name (NULL when importing by handle).
        name: *const c_void,
    },
    /// An `NvSciBufObj`.
    NvSciBuf(*const c_void),
}

/// A validated external-memory import: the exact `CUDA_EXTERNAL_MEMORY_HANDLE_DESC`, with its
/// kind and size kept for the checks of later mappings.
///
/// The size is what the driver will believe: it does not check it against the real allocation,
/// so take it from the exporter (Vulkan allocation size, NvSciBuf `Size` attribute).
///
/// ```
/// use tegra_interop_core::{MemoryImport, MemoryHandleKind, ValidationError};
///
/// let import = MemoryImport::opaque_fd(3, 65536)?;
/// assert_eq!(import.kind(), MemoryHandleKind::OpaqueFd);
/// assert_eq!(import.raw().size, 65536);
/// assert_eq!(MemoryImport::opaque_fd(-1, 65536).unwrap_err(), ValidationError::NegativeFd { fd: -1 });
/// # Ok::<(), ValidationError>(())
/// ```
pub type MemoryImport = Import<MemoryHandleKind>;

import_facts!(
    MemoryHandleKind,
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC,
    MemoryHandle::NvSciBuf,
    nvSciBufObject,
    "MemoryImport",
    fn debug_fields(desc: &CUDA_EXTERNAL_MEMORY_HANDLE_DESC, out: &mut fmt::DebugStruct<'_, '_>) {
        out.field("size", &desc.size)
            .field("flags", &MemoryImportFlags::from_bits_retain(desc.flags));
    }
);

impl Import<MemoryHandleKind> {
    /// A validated import of `size` bytes of `kind` from `handle`.
    ///
    /// Kinds that require `DEDICATED` get it set here; every other kind starts with no flags.
    pub fn new(
        kind: MemoryHandleKind,
        handle: MemoryHandle,
        size: u64,
    ) -> Result<Self, ValidationError> {
        let mut import = Self::describe(kind, handle)?;
        if size == 0 {
            return Err(ValidationError::ZeroSize);
        }
        import.desc.size = size;
        if kind.requires_dedicated() {
            import.desc.flags = MemoryImportFlags::DEDICATED.bits();
        }
        Ok(import)
    }

    /// Import an opaque POSIX fd (e.g. Vulkan `VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT`).
    pub fn opaque_fd(fd: i32, size: u64) -> Result<Self, ValidationError> {
        Self::new(MemoryHandleKind::OpaqueFd, MemoryHandle::Fd(fd), size)
    }

    /// Import a Linux dma-buf fd (CUDA 13.0 and later).
    pub fn dma_buf_fd(fd: i32, size: u64) -> Result<Self, ValidationError> {
        Self::new(MemoryHandleKind::DmaBufFd, MemoryHandle::Fd(fd), size)
    }

    /// Import a Win32 NT handle or a named object (exactly one of the two non-NULL).
    pub fn opaque_win32(
        handle: *mut c_void,
        name: *const c_void,
        size: u64,
    ) -> Result<Self, ValidationError> {
        Self::new(
            MemoryHandleKind::OpaqueWin32,
            MemoryHandle::Win32 { handle, name },
            size,
        )
    }

    /// Import a Win32 KMT handle (non-NULL; no name).
    pub fn opaque_win32_kmt(handle: *mut c_void, size: u64) -> Result<Self, ValidationError> {
        Self::new(
            MemoryHandleKind::OpaqueWin32Kmt,
            MemoryHandle::Win32 {
                handle,
                name: core::ptr::null(),
            },
            size,
        )
    }

    /// Import a D3D12 heap (exactly one of handle and name non-NULL).
    pub fn d3d12_heap(
        handle: *mut c_void,
        name: *const c_void,
        size: u64,
    ) -> Result<Self, ValidationError> {
        Self::new(
            MemoryHandleKind::D3d12Heap,
            MemoryHandle::Win32 { handle, name },
            size,
        )
    }

    /// Import a D3D12 committed resource (exactly one of handle and name; DEDICATED is set).
    pub fn d3d12_resource(
        handle: *mut c_void,
        name: *const c_void,
        size: u64,
    ) -> Result<Self, ValidationError> {
        Self::new(
            MemoryHandleKind::D3d12Resource,
            MemoryHandle::Win32 { handle, name },
            size,
        )
    }

    /// Import a D3D11 resource (exactly one of handle and name; DEDICATED is set).
    pub fn d3d11_resource(
        handle: *mut c_void,
        name: *const c_void,
        size: u64,
    ) -> Result<Self, ValidationError> {
        Self::new(
            MemoryHandleKind::D3d11Resource,
            MemoryHandle::Win32 { handle, name },
            size,
        )
    }

    /// Import a D3D11 resource by KMT handle (non-NULL; no name; DEDICATED is set).
    pub fn d3d11_resource_kmt(handle: *mut c_void, size: u64) -> Result<Self, ValidationError> {
        Self::new(
            MemoryHandleKind::D3d11ResourceKmt,
            MemoryHandle::Win32 {
                handle,
                name: core::ptr::null(),
            },
            size,
        )
    }

    /// Import an `NvSciBufObj` (non-NULL). Take `size` from the reconciled attribute list's
    /// `Size` (raw buffer) or image `Size`.
    pub fn nvscibuf(obj: *const c_void, size: u64) -> Result<Self, ValidationError> {
        Self::new(
            MemoryHandleKind::NvSciBuf,
            MemoryHandle::NvSciBuf(obj),
            size,
        )
    }

    /// Set `CUDA_EXTERNAL_MEMORY_DEDICATED` (the exporter made a dedicated allocation).
    #[must_use]
    pub fn dedicated(mut self) -> Self {
        self.desc.flags |= MemoryImportFlags::DEDICATED.bits();
        self
    }

    /// Replace the flags: refuses unknown bits, and removing DEDICATED from kinds that need it.
    pub fn with_flags(mut self, flags: MemoryImportFlags) -> Result<Self, ValidationError> {
        if flags.unknown_bits() != 0 {
            return Err(ValidationError::UnknownFlags {
                bits: flags.unknown_bits(),
            });
        }
        if self.kind().requires_dedicated() && !flags.contains(MemoryImportFlags::DEDICATED) {
            return Err(ValidationError::DedicatedRequired { kind: self.kind() });
        }
        self.desc.flags = flags.bits();
        Ok(self)
    }

    /// The size in bytes.
    pub fn size(&self) -> u64 {
        self.desc.size
    }

    /// The flags.
    pub fn flags(&self) -> MemoryImportFlags {
        MemoryImportFlags::from_bits_retain(self.desc.flags)
    }
}

/// `true` when `offset + size` (checked) lies inside `import_size`.
fn range_fits(offset: u64, size: u64, import_size: u64) -> bool {
    match offset.checked_add(size) {
        Some(end) => end <= import_size,
        None => false,
    }
}

/// A byte range of imported memory to map as a device pointer.
///
/// ```
/// use tegra_interop_core::{BufferMapping, ValidationError};
///
/// let raw = BufferMapping::new(4096, 4096).lower(8192)?;
/// assert_eq!((raw.offset, raw.size, raw.flags), (4096, 4096, 0));
/// assert!(matches!(
///     BufferMapping::new(4096, 4097).lower(8192),
///     Err(ValidationError::MappingOutOfRange { .. })
/// ));
/// # Ok::<(), ValidationError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BufferMapping {
    /// Offset into the imported memory.
    pub offset: u64,
    /// Length in bytes.
    pub size: u64,
}

impl BufferMapping {
    /// A mapping of `size` bytes at `offset`.
    pub const fn new(offset: u64, size: u64) -> Self {
        Self { offset, size }
    }

    /// The whole import.
    pub fn whole(import: &MemoryImport) -> Self {
        Self::new(0, import.size())
    }

    /// Validates against an import of `import_size` bytes and builds the C descriptor
    /// (flags and reserved fields zero).
    pub fn lower(
        &self,
        import_size: u64,
    ) -> Result<CUDA_EXTERNAL_MEMORY_BUFFER_DESC, ValidationError> {
        if self.size == 0 {
            return Err(ValidationError::ZeroSize);
        }
        if !range_fits(self.offset, self.size, import_size) {
            return Err(ValidationError::MappingOutOfRange {
                offset: self.offset,
                size: self.size,
                import_size,
            });
        }
        Ok(CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
            offset: self.offset,
            size: self.size,
            flags: 0,
            reserved: [0; 16],
        })
    }

    /// [`lower`](Self::lower) against `import`'s size.
    pub fn lower_for(
        &self,
        import: &MemoryImport,
    ) -> Result<CUDA_EXTERNAL_MEMORY_BUFFER_DESC, ValidationError> {
        self.lower(import.size())
    }

    /// Checks a raw descriptor built elsewhere: flags zero, reserved zero, range inside.
    pub fn from_raw(
        raw: &CUDA_EXTERNAL_MEMORY_BUFFER_DESC,
        import_size: u64,
    ) -> Result<Self, ValidationError> {
        if raw.flags != 0 {
            return Err(ValidationError::BufferFlagsNonZero { flags: raw.flags });
        }
        if raw.reserved.iter().any(|r| *r != 0) {
            return Err(ValidationError::ReservedNonZero);
        }
        let mapping = Self::new(raw.offset, raw.size);
        mapping.lower(import_size)?;
        Ok(mapping)
    }
}

/// Element format of a CUDA array (the subset of `CUarray_format` with 1, 2 or 4 channels of
/// plain integers or floats; packed, video and block-compressed formats have other channel
/// rules and are refused by [`ArrayFormat::from_raw`]).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ArrayFormat {
    /// `CU_AD_FORMAT_UNSIGNED_INT8`.
    U8 = 1,
    /// `CU_AD_FORMAT_UNSIGNED_INT16`.
    U16 = 2,
    /// `CU_AD_FORMAT_UNSIGNED_INT32`.
    U32 = 3,
    /// `CU_AD_FORMAT_SIGNED_INT8`.
    I8 = 8,
    /// `CU_AD_FORMAT_SIGNED_INT16`.
    I16 = 9,
    /// `CU_AD_FORMAT_SIGNED_INT32`.
    I32 = 10,
    /// `CU_AD_FORMAT_HALF`.
    Half = 16,
    /// `CU_AD_FORMAT_FLOAT`.
    Float = 32,
}

impl ArrayFormat {
    /// The format for a raw `CUarray_format` value.
    pub const fn from_raw(raw: u32) -> Result<Self, ValidationError> {
        Ok(match raw {
            1 => Self::U8,
            2 => Self::U16,
            3 => Self::U32,
            8 => Self::I8,
            9 => Self::I16,
            10 => Self::I32,
            16 => Self::Half,
            32 => Self::Float,
            _ => return Err(ValidationError::ArrayFormat { raw }),
        })
    }

    /// The C enum value.
    pub const fn raw(self) -> CUarray_format {
        CUarray_format(self as u32)
    }

    /// Bytes per channel.
    pub const fn channel_bytes(self) -> u64 {
        match self {
            Self::U8 | Self::I8 => 1,
            Self::U16 | Self::I16 | Self::Half => 2,
            Self::U32 | Self::I32 | Self::Float => 4,
        }
    }
}

/// Every `CUDA_ARRAY3D_*` flag bit the 12.9 header names.
pub const ARRAY3D_KNOWN_FLAGS: u32 = CUDA_ARRAY3D_LAYERED
    | CUDA_ARRAY3D_SURFACE_LDST
    | CUDA_ARRAY3D_CUBEMAP
    | CUDA_ARRAY3D_TEXTURE_GATHER
    | CUDA_ARRAY3D_DEPTH_TEXTURE
    | CUDA_ARRAY3D_COLOR_ATTACHMENT
    | CUDA_ARRAY3D_SPARSE
    | CUDA_ARRAY3D_DEFERRED_MAPPING
    | CUDA_ARRAY3D_VIDEO_ENCODE_DECODE;

/// A validated `CUDA_ARRAY3D_DESCRIPTOR`: shape, format, 1/2/4 channels, known flags.
///
/// Shapes: 1D is `width x 0 x 0`, 2D `width x height x 0`, 3D `width x height x depth`;
/// with `CUDA_ARRAY3D_LAYERED`, `depth` is the layer count (at least 1) and height may be 0.
/// A cubemap has `width == height` and depth 6 (a multiple of 6 when layered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ArrayDesc {
    width: usize,
    height: usize,
    depth: usize,
    format: ArrayFormat,
    channels: u32,
    flags: u32,
}

impl ArrayDesc {
    /// A validated descriptor with no flags.
    pub fn new(
        width: usize,
        height: usize,
        depth: usize,
        format: ArrayFormat,
        channels: u32,
    ) -> Result<Self, ValidationError> {
        Self::with_flags(width, height, depth, format, channels, 0)
    }

    /// A 2D descriptor (`depth` 0).
    pub fn new_2d(
        width: usize,
        height: usize,
        format: ArrayFormat,
        channels: u32,
    ) -> Result<Self, ValidationError> {
        Self::new(width, height, 0, format, channels)
    }

    /// A validated descriptor with `CUDA_ARRAY3D_*` flags.
    pub fn with_flags(
        width: usize,
        height: usize,
        depth: usize,
        format: ArrayFormat,
        channels: u32,
        flags: u32,
    ) -> Result<Self, ValidationError> {
        if !matches!(channels, 1 | 2 | 4) {
            return Err(ValidationError::ArrayChannels { channels });
        }
        let unknown = flags & !ARRAY3D_KNOWN_FLAGS;
        if unknown != 0 {
            return Err(ValidationError::UnknownFlags { bits: unknown });
        }
        let extent_err = ValidationError::ArrayExtent {
            width,
            height,
            depth,
        };
        let layered = flags & CUDA_ARRAY3D_LAYERED != 0;
        let shape_ok = width > 0
            && if layered {
                depth > 0
            } else {
                !(height == 0 && depth > 0)
            };
        if !shape_ok {
            return Err(extent_err);
        }
        if flags & CUDA_ARRAY3D_CUBEMAP != 0 {
            let depth_ok = if layered {
                depth.is_multiple_of(6)
            } else {
                depth == 6
            };
            if width != height || !depth_ok {
                return Err(extent_err);
            }
        }
        let desc = Self {
            width,
            height,
            depth,
            format,
            channels,
            flags,
        };
        if desc.level0_bytes().is_none() {
            return Err(extent_err);
        }
        Ok(desc)
    }

    /// Checks a raw descriptor built elsewhere.
    pub fn from_raw(raw: &CUDA_ARRAY3D_DESCRIPTOR) -> Result<Self, ValidationError> {
        let format = ArrayFormat::from_raw(raw.Format.0)?;
        Self::with_flags(
            raw.Width,
            raw.Height,
            raw.Depth,
            format,
            raw.NumChannels,
            raw.Flags,
        )
    }

    /// Width in elements.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Height in elements (0 for 1D).
    pub fn height(&self) -> usize {
        self.height
    }

    /// Depth or layer count (0 for 1D/2D).
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Element format.
    pub fn format(&self) -> ArrayFormat {
        self.format
    }

    /// Channels per element (1, 2 or 4).
    pub fn channels(&self) -> u32 {
        self.channels
    }

    /// `CUDA_ARRAY3D_*` flags.
    pub fn flags(&self) -> u32 {
        self.flags
    }

    /// The smallest number of bytes level 0 can occupy (dense, no padding), or `None` if that
    /// overflows `u64`.
    pub fn level0_bytes(&self) -> Option<u64> {
        let w = u64::try_from(self.width).ok()?;
        let h = u64::try_from(self.height.max(1)).ok()?;
        let d = u64::try_from(self.depth.max(1)).ok()?;
        w.checked_mul(h)?
            .checked_mul(d)?
            .checked_mul(u64::from(self.channels))?
            .checked_mul(self.format.channel_bytes())
    }

    /// The most mip levels this extent has (down to 1x1x1; layers do not shrink).
    pub fn max_levels(&self) -> u32 {
        let layered = self.flags & CUDA_ARRAY3D_LAYERED != 0;
        let depth = if layered { 0 } else { self.depth };
        let largest = self.width.max(self.height).max(depth).max(1);
        usize::BITS - largest.leading_zeros()
    }

    /// The C descriptor.
    pub fn raw(&self) -> CUDA_ARRAY3D_DESCRIPTOR {
        CUDA_ARRAY3D_DESCRIPTOR {
            Width: self.width,
            Height: self.height,
            Depth: self.depth,
            Format: self.format.raw(),
            NumChannels: self.channels,
            Flags: self.flags,
        }
    }
}

/// A mipmapped array over imported memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct MipmappedArrayMapping {
    /// Offset of level 0 in the imported memory.
    pub offset: u64,
    /// Shape and format of level 0.
    pub array: ArrayDesc,
    /// Number of mip levels (1 for NvSciBuf memory).
    pub num_levels: u32,
}

impl MipmappedArrayMapping {
    /// A mapping of `num_levels` levels of `array` at `offset`.
    pub const fn new(offset: u64, array: ArrayDesc, num_levels: u32) -> Self {
        Self {
            offset,
            array,
            num_levels,
        }
    }

    /// Validates against an import of `kind` and `import_size` bytes and builds the C
    /// descriptor: levels in `1..=max_levels` (exactly 1 for NvSciBuf), and level 0's dense
    /// size inside the import (a lower bound: tiled layouts need more, which the driver knows).
    pub fn lower(
        &self,
        kind: MemoryHandleKind,
        import_size: u64,
    ) -> Result<CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC, ValidationError> {
        if self.num_levels == 0 {
            return Err(ValidationError::ArrayLevelsZero);
        }
        if kind == MemoryHandleKind::NvSciBuf && self.num_levels != 1 {
            return Err(ValidationError::NvSciBufArrayLevels {
                num_levels: self.num_levels,
            });
        }
        let max = self.array.max_levels();
        if self.num_levels > max {
            return Err(ValidationError::ArrayTooManyLevels {
                num_levels: self.num_levels,
                max,
            });
        }
        let size = self.array.level0_bytes().unwrap_or(u64::MAX);
        if !range_fits(self.offset, size, import_size) {
            return Err(ValidationError::MappingOutOfRange {
                offset: self.offset,
                size,
                import_size,
            });
        }
        Ok(CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC {
            offset: self.offset,
            arrayDesc: self.array.raw(),
            numLevels: self.num_levels,
            reserved: [0; 16],
        })
    }

    /// [`lower`](Self::lower) against `import`.
    pub fn lower_for(
        &self,
        import: &MemoryImport,
    ) -> Result<CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC, ValidationError> {
        self.lower(import.kind(), import.size())
    }
}
