//! Typed, fixed-capacity NvSciBuf / NvSciSync attribute lists.
//!
//! A set owns the storage of every value; [`BufAttrSet::lower`] / [`SyncAttrSet::lower`] build
//! the C key/value pair arrays pointing into that storage, valid while the set is borrowed. No
//! allocation happens anywhere.
//!
//! Value layouts follow the public NvSci headers: booleans are 1 byte, enums and `uint32_t`
//! 4 bytes, per-plane values are arrays with one entry per plane, GPU ids are 16-byte UUIDs.
//!
//! ```
//! use tegra_interop_core::nvsci::{BufAttr, BufAttrSet, GpuId};
//! use tegra_interop_core::sys::nvsci::{NvSciBufAttrValAccessPerm, NvSciBufType};
//!
//! let mut attrs = BufAttrSet::<8>::new();
//! attrs.set(BufAttr::types(&[NvSciBufType::NvSciBufType_RawBuffer])?)?;
//! attrs.set(BufAttr::RawSize(1 << 20))?;
//! attrs.set(BufAttr::RawAlign(4096))?;
//! attrs.set(BufAttr::NeedCpuAccess(true))?;
//! attrs.set(BufAttr::RequiredPerm(NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite))?;
//! attrs.set(BufAttr::gpu_ids(&[GpuId([7; 16])])?)?;
//!
//! let pairs = attrs.lower()?;
//! assert_eq!(pairs.as_slice().len(), 6);
//! assert_eq!(pairs.as_slice()[1].len, 8); // RawSize is a u64
//! # Ok::<(), tegra_interop_core::ValidationError>(())
//! ```

use core::ffi::c_void;
use core::marker::PhantomData;
use core::mem::size_of;

use tegra_interop_sys::cuda::CUuuid;
use tegra_interop_sys::nvsci::{
    NvSciBufAttrKey, NvSciBufAttrKeyValuePair, NvSciBufAttrValAccessPerm,
    NvSciBufAttrValImageLayoutType, NvSciBufType, NvSciRmGpuId, NvSciSyncAccessPerm,
    NvSciSyncAttrKey, NvSciSyncAttrKeyValuePair, NvSciSyncAttrValPrimitiveType,
};

use crate::error::ValidationError;

/// Most image planes a [`Planes`] value holds (Y, U, V).
pub const MAX_PLANES: usize = 3;
/// Most GPU ids one `GpuId` attribute holds.
pub const MAX_GPUS: usize = 4;
/// Most buffer types one `Types` attribute holds.
pub const MAX_BUF_TYPES: usize = 4;
/// Most primitive types one `PrimitiveInfo` attribute holds.
pub const MAX_PRIMITIVES: usize = 5;

/// A GPU's UUID as NvSci uses it (`NvSciRmGpuId`): the CUDA device UUID. Same layout as the
/// C structure (16 bytes, alignment 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(transparent)]
pub struct GpuId(pub [u8; 16]);

impl GpuId {
    /// From `cuDeviceGetUuid`'s result (the bytes are reinterpreted, whatever the sign of
    /// `c_char` on the target).
    pub fn from_cuda_uuid(uuid: &CUuuid) -> Self {
        let mut bytes = [0u8; 16];
        for (b, c) in bytes.iter_mut().zip(uuid.bytes.iter()) {
            *b = u8::from_ne_bytes(c.to_ne_bytes());
        }
        Self(bytes)
    }

    /// As the C structure.
    pub const fn raw(self) -> NvSciRmGpuId {
        NvSciRmGpuId { bytes: self.0 }
    }
}

impl From<NvSciRmGpuId> for GpuId {
    fn from(value: NvSciRmGpuId) -> Self {
        Self(value.bytes)
    }
}

/// One entry of the per-GPU cache keys `EnableGpuCache` (input) and `GpuSwNeedCacheCoherency`
/// (output): the C record `{NvSciRmGpuId gpuId; bool cacheability}`, 17 bytes, packed
/// (alignment 1), exactly as the library reads and writes it.
///
/// ```
/// use tegra_interop_core::nvsci::{GpuCache, GpuId};
/// assert_eq!(core::mem::size_of::<GpuCache>(), 17);
/// assert_eq!(core::mem::align_of::<GpuCache>(), 1);
/// let _ = GpuCache::new(GpuId([7; 16]), false);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(C)]
pub struct GpuCache {
    /// The GPU (also listed in `GpuId`).
    pub gpu: GpuId,
    /// `EnableGpuCache`: the GPU may cache the buffer; `GpuSwNeedCacheCoherency`: software
    /// (NvSciSync barriers) must keep that GPU's cache coherent.
    pub enabled: bool,
}

impl GpuCache {
    /// One entry.
    pub const fn new(gpu: GpuId, enabled: bool) -> Self {
        Self { gpu, enabled }
    }
}

/// A GPU compression type (`NvSciBufCompressionType`, 4 bytes): an open set, every documented
/// value named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(transparent)]
pub struct CompressionType(pub u32);

impl CompressionType {
    /// No compression.
    pub const NONE: Self = Self(0);
    /// Generic compressible memory.
    pub const GENERIC_COMPRESSIBLE: Self = Self(1);

    /// `true` for a documented value.
    pub const fn is_documented(self) -> bool {
        self.0 <= 1
    }
}

/// One entry of `EnableGpuCompression`: the C record `{NvSciRmGpuId gpuId; uint32_t
/// compressionType}`, 20 bytes, alignment 4. The library forces `NONE` when the CPU, a non-GPU
/// engine or several GPUs access the buffer.
///
/// ```
/// use tegra_interop_core::nvsci::GpuCompression;
/// assert_eq!(core::mem::size_of::<GpuCompression>(), 20);
/// assert_eq!(core::mem::align_of::<GpuCompression>(), 4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(C)]
pub struct GpuCompression {
    /// The GPU.
    pub gpu: GpuId,
    /// The compression it asks for.
    pub kind: CompressionType,
}

impl GpuCompression {
    /// One entry.
    pub const fn new(gpu: GpuId, kind: CompressionType) -> Self {
        Self { gpu, kind }
    }
}

/// Image scan type (`NvSciBufAttrValImageScanType`, 4 bytes; key `ScanType`, mandatory for
/// images like `Layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(transparent)]
pub struct ScanType(pub u32);

impl ScanType {
    /// Progressive (whole frames).
    pub const PROGRESSIVE: Self = Self(0);
    /// Interlaced (two fields).
    pub const INTERLACE: Self = Self(1);
}

/// An image plane colour format (`NvSciBufAttrValColorFmt`, 4 bytes). An open set: the values
/// below are the ones the project names (identical in every NvSci release checked); any other
/// value is passed through for the library to judge.
///
/// The name lists the components from the most significant bit of a packed pixel, so
/// [`A8B8G8R8`](Self::A8B8G8R8) has the bytes R, G, B, A in memory: the usual RGBA8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(transparent)]
pub struct ColorFormat(pub u32);

macro_rules! color_formats {
    ($($(#[$doc:meta])* $name:ident = $value:expr;)*) => {
        impl ColorFormat {
            $($(#[$doc])* pub const $name: Self = Self($value);)*

            /// The name of a value the project names (`None` for any other).
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($value => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

color_formats! {
    /// 8-bit Bayer, RGGB.
    BAYER8_RGGB = 1;
    /// 16-bit Bayer, RGGB.
    BAYER16_RGGB = 10;
    /// Interleaved chroma, bytes U then V (NV12's second plane).
    U8V8 = 74;
    /// Interleaved chroma, 16-bit U8_V8 packing.
    U8_V8 = 75;
    /// Interleaved chroma, bytes V then U (NV21's second plane).
    V8U8 = 76;
    /// Interleaved chroma, 16-bit V8_U8 packing.
    V8_U8 = 77;
    /// 8-bit luma.
    Y8 = 84;
    /// 10-bit luma.
    Y10 = 85;
    /// 12-bit luma.
    Y12 = 86;
    /// 16-bit luma.
    Y16 = 87;
    /// 8-bit U plane.
    U8 = 88;
    /// 8-bit V plane.
    V8 = 89;
    /// Packed AYUV, 8 bits each.
    A8Y8U8V8 = 96;
    /// Packed YUYV (4:2:2), 8 bits each.
    Y8U8Y8V8 = 97;
    /// 8-bit alpha.
    A8 = 102;
    /// Packed B8G8R8A8 (components named from the most significant bit).
    B8G8R8A8 = 104;
    /// Packed A8R8G8B8 (components named from the most significant bit).
    A8R8G8B8 = 105;
    /// Bytes R, G, B, A in memory: RGBA8.
    A8B8G8R8 = 106;
}

/// An image plane colour standard (`NvSciBufAttrValColorStd`, 4 bytes). An open set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[repr(transparent)]
pub struct ColorStd(pub u32);

impl ColorStd {
    /// sRGB.
    pub const SRGB: Self = Self(0);
    /// BT.601, studio (limited) range.
    pub const REC601_SR: Self = Self(1);
    /// BT.601, extended (full) range.
    pub const REC601_ER: Self = Self(2);
    /// BT.709, studio range.
    pub const REC709_SR: Self = Self(3);
    /// BT.709, extended range.
    pub const REC709_ER: Self = Self(4);
    /// BT.2020 RGB.
    pub const REC2020_RGB: Self = Self(5);
}

/// One value per image plane (1 to [`MAX_PLANES`] entries).
pub type Planes<T> = heapless::Vec<T, MAX_PLANES>;

fn list<T: Copy, const M: usize>(values: &[T]) -> Result<heapless::Vec<T, M>, ValidationError> {
    heapless::Vec::from_slice(values).map_err(|_| ValidationError::CapacityExceeded { capacity: M })
}

fn planes<T: Copy>(values: &[T]) -> Result<Planes<T>, ValidationError> {
    heapless::Vec::from_slice(values).map_err(|_| ValidationError::TooManyPlanes {
        count: values.len(),
        max: MAX_PLANES,
    })
}

fn ptr_len<T>(value: &T) -> (*const c_void, usize) {
    (core::ptr::from_ref(value).cast(), size_of::<T>())
}

fn slice_ptr_len<T>(values: &[T]) -> (*const c_void, usize) {
    (values.as_ptr().cast(), core::mem::size_of_val(values))
}

/// Reads one fixed-size value from `bytes` (its whole length must be `W`).
fn exact<const W: usize>(key: u32, bytes: &[u8]) -> Result<[u8; W], ValidationError> {
    <[u8; W]>::try_from(bytes).map_err(|_| ValidationError::AttrLength {
        key,
        len: bytes.len(),
    })
}

fn read_bool(key: u32, bytes: &[u8]) -> Result<bool, ValidationError> {
    match exact::<1>(key, bytes)?[0] {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(ValidationError::InvalidAttrValue { key }),
    }
}

/// Reads packed 17-byte `{GpuId, bool}` entries (the bool must be 0 or 1).
fn read_gpu_cache(
    key: u32,
    bytes: &[u8],
) -> Result<heapless::Vec<GpuCache, MAX_GPUS>, ValidationError> {
    let entries = read_array::<_, 17, MAX_GPUS>(key, bytes, |b| b)?;
    let mut out = heapless::Vec::new();
    for b in entries {
        let mut gpu = [0u8; 16];
        gpu.copy_from_slice(&b[..16]);
        let enabled = read_bool(key, &b[16..])?;
        out.push(GpuCache::new(GpuId(gpu), enabled))
            .map_err(|_| ValidationError::CapacityExceeded { capacity: MAX_GPUS })?;
    }
    Ok(out)
}

fn read_u32(key: u32, bytes: &[u8]) -> Result<u32, ValidationError> {
    Ok(u32::from_ne_bytes(exact::<4>(key, bytes)?))
}

fn read_u64(key: u32, bytes: &[u8]) -> Result<u64, ValidationError> {
    Ok(u64::from_ne_bytes(exact::<8>(key, bytes)?))
}

/// The C form of a `GpuId` attribute's value (at most [`MAX_GPUS`] ids).
fn raw_gpu_ids(ids: &[GpuId]) -> Result<heapless::Vec<NvSciRmGpuId, MAX_GPUS>, ValidationError> {
    let mut out = heapless::Vec::new();
    for id in ids {
        out.push(id.raw())
            .map_err(|_| ValidationError::CapacityExceeded { capacity: MAX_GPUS })?;
    }
    Ok(out)
}

/// Reads a `GpuId` attribute's value: 16-byte UUIDs.
fn read_gpu_ids(
    key: u32,
    bytes: &[u8],
) -> Result<heapless::Vec<NvSciRmGpuId, MAX_GPUS>, ValidationError> {
    read_array::<_, 16, MAX_GPUS>(key, bytes, |b| NvSciRmGpuId { bytes: b })
}

/// Reads an array of `W`-byte elements into a fixed-capacity list.
fn read_array<T, const W: usize, const M: usize>(
    key: u32,
    bytes: &[u8],
    convert: impl Fn([u8; W]) -> T,
) -> Result<heapless::Vec<T, M>, ValidationError> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(W) || bytes.len() / W > M {
        return Err(ValidationError::AttrLength {
            key,
            len: bytes.len(),
        });
    }
    let mut out = heapless::Vec::new();
    for chunk in bytes.chunks_exact(W) {
        let item = convert(exact::<W>(key, chunk)?);
        out.push(item).map_err(|_| ValidationError::AttrLength {
            key,
            len: bytes.len(),
        })?;
    }
    Ok(out)
}

fn check_buf_perm(perm: NvSciBufAttrValAccessPerm) -> Result<(), ValidationError> {
    match perm {
        NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_Readonly
        | NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_ReadWrite => Ok(()),
        NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_Auto => {
            Err(ValidationError::AutoPermNotAllowed)
        }
        other => Err(ValidationError::InvalidPerm {
            raw: u64::from(other.0),
        }),
    }
}

fn check_sync_perm(perm: NvSciSyncAccessPerm) -> Result<(), ValidationError> {
    match perm {
        NvSciSyncAccessPerm::NvSciSyncAccessPerm_WaitOnly
        | NvSciSyncAccessPerm::NvSciSyncAccessPerm_SignalOnly
        | NvSciSyncAccessPerm::NvSciSyncAccessPerm_WaitSignal => Ok(()),
        NvSciSyncAccessPerm::NvSciSyncAccessPerm_Auto => Err(ValidationError::AutoPermNotAllowed),
        other => Err(ValidationError::InvalidPerm { raw: other.0 }),
    }
}

/// One NvSciBuf attribute with its value (the value's C layout is kept in place so that a
/// lowered pair can point at it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BufAttr {
    /// `GeneralAttrKey_Types` (`NvSciBufType[]`).
    Types(heapless::Vec<NvSciBufType, MAX_BUF_TYPES>),
    /// `GeneralAttrKey_NeedCpuAccess` (bool).
    NeedCpuAccess(bool),
    /// `GeneralAttrKey_RequiredPerm`: Readonly or ReadWrite (Auto is refused).
    RequiredPerm(NvSciBufAttrValAccessPerm),
    /// `GeneralAttrKey_EnableCpuCache` (bool).
    EnableCpuCache(bool),
    /// `GeneralAttrKey_GpuId` (`NvSciRmGpuId[]`): the GPUs that access the buffer.
    GpuId(heapless::Vec<NvSciRmGpuId, MAX_GPUS>),
    /// `GeneralAttrKey_CpuNeedSwCacheCoherency` (bool, output only).
    CpuNeedSwCacheCoherency(bool),
    /// `GeneralAttrKey_ActualPerm` (output only).
    ActualPerm(NvSciBufAttrValAccessPerm),
    /// `GeneralAttrKey_EnableGpuCache` (NvSciBuf 2.8+): one 17-byte [`GpuCache`] entry per GPU
    /// (for an iGPU, the one also listed in `GpuId`); reconciled by AND, true by default on
    /// Tegra.
    EnableGpuCache(heapless::Vec<GpuCache, MAX_GPUS>),
    /// `GeneralAttrKey_GpuSwNeedCacheCoherency` (NvSciBuf 2.8+, output only): per GPU, whether
    /// NvSciSync barriers must keep its cache coherent.
    GpuSwNeedCacheCoherency(heapless::Vec<GpuCache, MAX_GPUS>),
    /// `GeneralAttrKey_EnableGpuCompression` (NvSciBuf 2.8+): one 20-byte [`GpuCompression`]
    /// entry per GPU.
    EnableGpuCompression(heapless::Vec<GpuCompression, MAX_GPUS>),
    /// `RawBufferAttrKey_Size` (u64, bytes; non-zero).
    RawSize(u64),
    /// `RawBufferAttrKey_Align` (u64, bytes; a power of two).
    RawAlign(u64),
    /// `ImageAttrKey_Layout`: block linear or pitch linear.
    Layout(NvSciBufAttrValImageLayoutType),
    /// `ImageAttrKey_TopPadding` (u64 per plane).
    TopPadding(Planes<u64>),
    /// `ImageAttrKey_BottomPadding` (u64 per plane).
    BottomPadding(Planes<u64>),
    /// `ImageAttrKey_LeftPadding` (u64 per plane).
    LeftPadding(Planes<u64>),
    /// `ImageAttrKey_RightPadding` (u64 per plane).
    RightPadding(Planes<u64>),
    /// `ImageAttrKey_VprFlag` (bool).
    VprFlag(bool),
    /// `ImageAttrKey_Size` (u64, output).
    ImageSize(u64),
    /// `ImageAttrKey_Alignment` (u64, output).
    ImageAlignment(u64),
    /// `ImageAttrKey_PlaneCount` (u32, 1..=[`MAX_PLANES`]).
    PlaneCount(u32),
    /// `ImageAttrKey_PlaneColorFormat` ([`ColorFormat`] per plane).
    PlaneColorFormat(Planes<ColorFormat>),
    /// `ImageAttrKey_PlaneColorStd` ([`ColorStd`] per plane).
    PlaneColorStd(Planes<ColorStd>),
    /// `ImageAttrKey_PlaneBaseAddrAlign` (u32 per plane).
    PlaneBaseAddrAlign(Planes<u32>),
    /// `ImageAttrKey_PlaneWidth` (u32 per plane).
    PlaneWidth(Planes<u32>),
    /// `ImageAttrKey_PlaneHeight` (u32 per plane).
    PlaneHeight(Planes<u32>),
    /// `ImageAttrKey_ScanType` (also named `PlaneScanType`): mandatory for images.
    ScanType(ScanType),
    /// `ImageAttrKey_PlaneBitsPerPixel` (u32 per plane, output).
    PlaneBitsPerPixel(Planes<u32>),
    /// `ImageAttrKey_PlaneOffset` (u64 per plane, output).
    PlaneOffset(Planes<u64>),
    /// `ImageAttrKey_PlaneDatatype` (raw `NvSciBufAttrValDataType` per plane, output).
    PlaneDatatype(Planes<u32>),
    /// `ImageAttrKey_PlaneChannelCount` (u8 per plane, output).
    PlaneChannelCount(Planes<u8>),
    /// `ImageAttrKey_PlaneSecondFieldOffset` (u64 per plane, output).
    PlaneSecondFieldOffset(Planes<u64>),
    /// `ImageAttrKey_PlanePitch` (u32 per plane, output).
    PlanePitch(Planes<u32>),
    /// `ImageAttrKey_PlaneAlignedHeight` (u32 per plane, output).
    PlaneAlignedHeight(Planes<u32>),
    /// `ImageAttrKey_PlaneAlignedSize` (u64 per plane, output).
    PlaneAlignedSize(Planes<u64>),
    /// `ImageAttrKey_ImageCount` (u64).
    ImageCount(u64),
}

impl BufAttr {
    /// `Types` from a slice (at most [`MAX_BUF_TYPES`]).
    pub fn types(types: &[NvSciBufType]) -> Result<Self, ValidationError> {
        Ok(Self::Types(list(types)?))
    }

    /// `GpuId` from a slice (at most [`MAX_GPUS`]).
    pub fn gpu_ids(ids: &[GpuId]) -> Result<Self, ValidationError> {
        Ok(Self::GpuId(raw_gpu_ids(ids)?))
    }

    /// `PlaneWidth` from a slice (at most [`MAX_PLANES`]).
    pub fn plane_widths(widths: &[u32]) -> Result<Self, ValidationError> {
        Ok(Self::PlaneWidth(planes(widths)?))
    }

    /// `PlaneHeight` from a slice (at most [`MAX_PLANES`]).
    pub fn plane_heights(heights: &[u32]) -> Result<Self, ValidationError> {
        Ok(Self::PlaneHeight(planes(heights)?))
    }

    /// `PlaneColorFormat` from a slice (at most [`MAX_PLANES`]).
    pub fn plane_color_formats(formats: &[ColorFormat]) -> Result<Self, ValidationError> {
        Ok(Self::PlaneColorFormat(planes(formats)?))
    }

    /// `PlaneColorStd` from a slice (at most [`MAX_PLANES`]).
    pub fn plane_color_stds(stds: &[ColorStd]) -> Result<Self, ValidationError> {
        Ok(Self::PlaneColorStd(planes(stds)?))
    }

    /// `EnableGpuCache` from a slice of per-GPU entries (at most [`MAX_GPUS`]).
    pub fn gpu_cache(entries: &[GpuCache]) -> Result<Self, ValidationError> {
        Ok(Self::EnableGpuCache(list(entries)?))
    }

    /// `EnableGpuCompression` from a slice of per-GPU entries (at most [`MAX_GPUS`]).
    pub fn gpu_compression(entries: &[GpuCompression]) -> Result<Self, ValidationError> {
        Ok(Self::EnableGpuCompression(list(entries)?))
    }

    /// `true` for keys that reconciliation computes (`ActualPerm`, the coherency keys, image
    /// size, alignment and per-plane layout outputs): they can be read from a reconciled list
    /// but never set, and [`BufAttrSet::set`] refuses them.
    pub fn is_output_only(&self) -> bool {
        Self::is_output_only_key(self.key())
    }

    /// `true` for the output-only keys of [`is_output_only`](Self::is_output_only): the
    /// library refuses to set them, and to read them from an unreconciled list.
    pub fn is_output_only_key(key: NvSciBufAttrKey) -> bool {
        type K = NvSciBufAttrKey;
        matches!(
            key,
            K::NvSciBufGeneralAttrKey_CpuNeedSwCacheCoherency
                | K::NvSciBufGeneralAttrKey_ActualPerm
                | K::NvSciBufGeneralAttrKey_GpuSwNeedCacheCoherency
                | K::NvSciBufImageAttrKey_Size
                | K::NvSciBufImageAttrKey_Alignment
                | K::NvSciBufImageAttrKey_PlaneBitsPerPixel
                | K::NvSciBufImageAttrKey_PlaneOffset
                | K::NvSciBufImageAttrKey_PlaneDatatype
                | K::NvSciBufImageAttrKey_PlaneChannelCount
                | K::NvSciBufImageAttrKey_PlaneSecondFieldOffset
                | K::NvSciBufImageAttrKey_PlanePitch
                | K::NvSciBufImageAttrKey_PlaneAlignedHeight
                | K::NvSciBufImageAttrKey_PlaneAlignedSize
        )
    }

    /// `true` for input-only keys (`RequiredPerm`): the library refuses to read them from a
    /// reconciled list (read `ActualPerm` there).
    pub fn is_input_only_key(key: NvSciBufAttrKey) -> bool {
        key == NvSciBufAttrKey::NvSciBufGeneralAttrKey_RequiredPerm
    }

    /// One padding key (`which` is top, bottom, left or right) for every plane.
    pub fn padding(which: Padding, per_plane: &[u64]) -> Result<Self, ValidationError> {
        let p = planes(per_plane)?;
        Ok(match which {
            Padding::Top => Self::TopPadding(p),
            Padding::Bottom => Self::BottomPadding(p),
            Padding::Left => Self::LeftPadding(p),
            Padding::Right => Self::RightPadding(p),
        })
    }

    /// The C key.
    pub fn key(&self) -> NvSciBufAttrKey {
        type K = NvSciBufAttrKey;
        match self {
            Self::Types(_) => K::NvSciBufGeneralAttrKey_Types,
            Self::NeedCpuAccess(_) => K::NvSciBufGeneralAttrKey_NeedCpuAccess,
            Self::RequiredPerm(_) => K::NvSciBufGeneralAttrKey_RequiredPerm,
            Self::EnableCpuCache(_) => K::NvSciBufGeneralAttrKey_EnableCpuCache,
            Self::GpuId(_) => K::NvSciBufGeneralAttrKey_GpuId,
            Self::CpuNeedSwCacheCoherency(_) => K::NvSciBufGeneralAttrKey_CpuNeedSwCacheCoherency,
            Self::ActualPerm(_) => K::NvSciBufGeneralAttrKey_ActualPerm,
            Self::EnableGpuCache(_) => K::NvSciBufGeneralAttrKey_EnableGpuCache,
            Self::GpuSwNeedCacheCoherency(_) => K::NvSciBufGeneralAttrKey_GpuSwNeedCacheCoherency,
            Self::EnableGpuCompression(_) => K::NvSciBufGeneralAttrKey_EnableGpuCompression,
            Self::RawSize(_) => K::NvSciBufRawBufferAttrKey_Size,
            Self::RawAlign(_) => K::NvSciBufRawBufferAttrKey_Align,
            Self::Layout(_) => K::NvSciBufImageAttrKey_Layout,
            Self::TopPadding(_) => K::NvSciBufImageAttrKey_TopPadding,
            Self::BottomPadding(_) => K::NvSciBufImageAttrKey_BottomPadding,
            Self::LeftPadding(_) => K::NvSciBufImageAttrKey_LeftPadding,
            Self::RightPadding(_) => K::NvSciBufImageAttrKey_RightPadding,
            Self::VprFlag(_) => K::NvSciBufImageAttrKey_VprFlag,
            Self::ImageSize(_) => K::NvSciBufImageAttrKey_Size,
            Self::ImageAlignment(_) => K::NvSciBufImageAttrKey_Alignment,
            Self::PlaneCount(_) => K::NvSciBufImageAttrKey_PlaneCount,
            Self::PlaneColorFormat(_) => K::NvSciBufImageAttrKey_PlaneColorFormat,
            Self::PlaneColorStd(_) => K::NvSciBufImageAttrKey_PlaneColorStd,
            Self::PlaneBaseAddrAlign(_) => K::NvSciBufImageAttrKey_PlaneBaseAddrAlign,
            Self::PlaneWidth(_) => K::NvSciBufImageAttrKey_PlaneWidth,
            Self::PlaneHeight(_) => K::NvSciBufImageAttrKey_PlaneHeight,
            Self::ScanType(_) => K::NvSciBufImageAttrKey_ScanType,
            Self::PlaneBitsPerPixel(_) => K::NvSciBufImageAttrKey_PlaneBitsPerPixel,
            Self::PlaneOffset(_) => K::NvSciBufImageAttrKey_PlaneOffset,
            Self::PlaneDatatype(_) => K::NvSciBufImageAttrKey_PlaneDatatype,
            Self::PlaneChannelCount(_) => K::NvSciBufImageAttrKey_PlaneChannelCount,
            Self::PlaneSecondFieldOffset(_) => K::NvSciBufImageAttrKey_PlaneSecondFieldOffset,
            Self::PlanePitch(_) => K::NvSciBufImageAttrKey_PlanePitch,
            Self::PlaneAlignedHeight(_) => K::NvSciBufImageAttrKey_PlaneAlignedHeight,
            Self::PlaneAlignedSize(_) => K::NvSciBufImageAttrKey_PlaneAlignedSize,
            Self::ImageCount(_) => K::NvSciBufImageAttrKey_ImageCount,
        }
    }

    /// Number of per-plane entries, for per-plane keys.
    pub fn plane_entries(&self) -> Option<usize> {
        Some(match self {
            Self::TopPadding(p)
            | Self::BottomPadding(p)
            | Self::LeftPadding(p)
            | Self::RightPadding(p)
            | Self::PlaneOffset(p)
            | Self::PlaneSecondFieldOffset(p)
            | Self::PlaneAlignedSize(p) => p.len(),
            Self::PlaneColorFormat(p) => p.len(),
            Self::PlaneColorStd(p) => p.len(),
            Self::PlaneBaseAddrAlign(p)
            | Self::PlaneWidth(p)
            | Self::PlaneHeight(p)
            | Self::PlaneBitsPerPixel(p)
            | Self::PlaneDatatype(p)
            | Self::PlanePitch(p)
            | Self::PlaneAlignedHeight(p) => p.len(),
            Self::PlaneChannelCount(p) => p.len(),
            _ => return None,
        })
    }

    /// Checks the value alone (not against other keys).
    pub fn validate(&self) -> Result<(), ValidationError> {
        let key = self.key().0;
        let invalid = ValidationError::InvalidAttrValue { key };
        match self {
            Self::RequiredPerm(p) => check_buf_perm(*p),
            Self::Types(t) if t.is_empty() => Err(invalid),
            Self::GpuId(g) if g.is_empty() => Err(invalid),
            Self::EnableGpuCache(g) | Self::GpuSwNeedCacheCoherency(g) if g.is_empty() => {
                Err(invalid)
            }
            Self::EnableGpuCompression(g)
                if g.is_empty() || g.iter().any(|e| !e.kind.is_documented()) =>
            {
                Err(invalid)
            }
            Self::ScanType(t) if t.0 > 1 => Err(invalid),
            Self::RawSize(0) => Err(ValidationError::ZeroSize),
            Self::RawAlign(a) if !a.is_power_of_two() => Err(invalid),
            Self::Layout(l) if l.0 > 1 => Err(invalid),
            Self::PlaneCount(0) => Err(invalid),
            Self::PlaneCount(n) if *n as usize > MAX_PLANES => {
                Err(ValidationError::TooManyPlanes {
                    count: *n as usize,
                    max: MAX_PLANES,
                })
            }
            _ => match self.plane_entries() {
                Some(0) => Err(invalid),
                _ => Ok(()),
            },
        }
    }

    /// Pointer to the value (inside `self`) and its length in bytes.
    fn value_ptr_len(&self) -> (*const c_void, usize) {
        match self {
            Self::Types(v) => slice_ptr_len(v.as_slice()),
            Self::GpuId(v) => slice_ptr_len(v.as_slice()),
            Self::NeedCpuAccess(b)
            | Self::EnableCpuCache(b)
            | Self::CpuNeedSwCacheCoherency(b)
            | Self::VprFlag(b) => ptr_len(b),
            Self::EnableGpuCache(v) | Self::GpuSwNeedCacheCoherency(v) => {
                slice_ptr_len(v.as_slice())
            }
            Self::EnableGpuCompression(v) => slice_ptr_len(v.as_slice()),
            Self::ScanType(t) => ptr_len(t),
            Self::RequiredPerm(p) | Self::ActualPerm(p) => ptr_len(p),
            Self::RawSize(v)
            | Self::RawAlign(v)
            | Self::ImageSize(v)
            | Self::ImageAlignment(v)
            | Self::ImageCount(v) => ptr_len(v),
            Self::Layout(l) => ptr_len(l),
            Self::PlaneCount(v) => ptr_len(v),
            Self::TopPadding(p)
            | Self::BottomPadding(p)
            | Self::LeftPadding(p)
            | Self::RightPadding(p)
            | Self::PlaneOffset(p)
            | Self::PlaneSecondFieldOffset(p)
            | Self::PlaneAlignedSize(p) => slice_ptr_len(p.as_slice()),
            Self::PlaneColorFormat(p) => slice_ptr_len(p.as_slice()),
            Self::PlaneColorStd(p) => slice_ptr_len(p.as_slice()),
            Self::PlaneBaseAddrAlign(p)
            | Self::PlaneWidth(p)
            | Self::PlaneHeight(p)
            | Self::PlaneBitsPerPixel(p)
            | Self::PlaneDatatype(p)
            | Self::PlanePitch(p)
            | Self::PlaneAlignedHeight(p) => slice_ptr_len(p.as_slice()),
            Self::PlaneChannelCount(p) => slice_ptr_len(p.as_slice()),
        }
    }

    /// Decodes a value read back with `NvSciBufAttrListGetAttrs` (`bytes` is the `len` bytes at
    /// `value`). Checks the length against the key's type; does not apply [`validate`](Self::validate).
    pub fn decode(key: NvSciBufAttrKey, bytes: &[u8]) -> Result<Self, ValidationError> {
        type K = NvSciBufAttrKey;
        let k = key.0;
        let u32s = |b: &[u8]| read_array::<u32, 4, MAX_PLANES>(k, b, u32::from_ne_bytes);
        let u64s = |b: &[u8]| read_array::<u64, 8, MAX_PLANES>(k, b, u64::from_ne_bytes);
        Ok(match key {
            K::NvSciBufGeneralAttrKey_Types => {
                Self::Types(read_array::<_, 4, MAX_BUF_TYPES>(k, bytes, |b| {
                    NvSciBufType(u32::from_ne_bytes(b))
                })?)
            }
            K::NvSciBufGeneralAttrKey_NeedCpuAccess => Self::NeedCpuAccess(read_bool(k, bytes)?),
            K::NvSciBufGeneralAttrKey_RequiredPerm => {
                Self::RequiredPerm(NvSciBufAttrValAccessPerm(read_u32(k, bytes)?))
            }
            K::NvSciBufGeneralAttrKey_EnableCpuCache => Self::EnableCpuCache(read_bool(k, bytes)?),
            K::NvSciBufGeneralAttrKey_GpuId => Self::GpuId(read_gpu_ids(k, bytes)?),
            K::NvSciBufGeneralAttrKey_CpuNeedSwCacheCoherency => {
                Self::CpuNeedSwCacheCoherency(read_bool(k, bytes)?)
            }
            K::NvSciBufGeneralAttrKey_ActualPerm => {
                Self::ActualPerm(NvSciBufAttrValAccessPerm(read_u32(k, bytes)?))
            }
            K::NvSciBufGeneralAttrKey_EnableGpuCache => {
                Self::EnableGpuCache(read_gpu_cache(k, bytes)?)
            }
            K::NvSciBufGeneralAttrKey_GpuSwNeedCacheCoherency => {
                Self::GpuSwNeedCacheCoherency(read_gpu_cache(k, bytes)?)
            }
            K::NvSciBufGeneralAttrKey_EnableGpuCompression => {
                Self::EnableGpuCompression(read_array::<_, 20, MAX_GPUS>(k, bytes, |b| {
                    let mut gpu = [0u8; 16];
                    gpu.copy_from_slice(&b[..16]);
                    let mut kind = [0u8; 4];
                    kind.copy_from_slice(&b[16..]);
                    GpuCompression::new(GpuId(gpu), CompressionType(u32::from_ne_bytes(kind)))
                })?)
            }
            K::NvSciBufRawBufferAttrKey_Size => Self::RawSize(read_u64(k, bytes)?),
            K::NvSciBufRawBufferAttrKey_Align => Self::RawAlign(read_u64(k, bytes)?),
            K::NvSciBufImageAttrKey_Layout => {
                Self::Layout(NvSciBufAttrValImageLayoutType(read_u32(k, bytes)?))
            }
            K::NvSciBufImageAttrKey_TopPadding => Self::TopPadding(u64s(bytes)?),
            K::NvSciBufImageAttrKey_BottomPadding => Self::BottomPadding(u64s(bytes)?),
            K::NvSciBufImageAttrKey_LeftPadding => Self::LeftPadding(u64s(bytes)?),
            K::NvSciBufImageAttrKey_RightPadding => Self::RightPadding(u64s(bytes)?),
            K::NvSciBufImageAttrKey_VprFlag => Self::VprFlag(read_bool(k, bytes)?),
            K::NvSciBufImageAttrKey_Size => Self::ImageSize(read_u64(k, bytes)?),
            K::NvSciBufImageAttrKey_Alignment => Self::ImageAlignment(read_u64(k, bytes)?),
            K::NvSciBufImageAttrKey_PlaneCount => Self::PlaneCount(read_u32(k, bytes)?),
            K::NvSciBufImageAttrKey_PlaneColorFormat => {
                Self::PlaneColorFormat(read_array::<_, 4, MAX_PLANES>(k, bytes, |b| {
                    ColorFormat(u32::from_ne_bytes(b))
                })?)
            }
            K::NvSciBufImageAttrKey_PlaneColorStd => {
                Self::PlaneColorStd(read_array::<_, 4, MAX_PLANES>(k, bytes, |b| {
                    ColorStd(u32::from_ne_bytes(b))
                })?)
            }
            K::NvSciBufImageAttrKey_PlaneBaseAddrAlign => Self::PlaneBaseAddrAlign(u32s(bytes)?),
            K::NvSciBufImageAttrKey_PlaneWidth => Self::PlaneWidth(u32s(bytes)?),
            K::NvSciBufImageAttrKey_PlaneHeight => Self::PlaneHeight(u32s(bytes)?),
            K::NvSciBufImageAttrKey_ScanType => Self::ScanType(ScanType(read_u32(k, bytes)?)),
            K::NvSciBufImageAttrKey_PlaneBitsPerPixel => Self::PlaneBitsPerPixel(u32s(bytes)?),
            K::NvSciBufImageAttrKey_PlaneOffset => Self::PlaneOffset(u64s(bytes)?),
            K::NvSciBufImageAttrKey_PlaneDatatype => Self::PlaneDatatype(u32s(bytes)?),
            K::NvSciBufImageAttrKey_PlaneChannelCount => {
                Self::PlaneChannelCount(read_array::<u8, 1, MAX_PLANES>(k, bytes, |b| b[0])?)
            }
            K::NvSciBufImageAttrKey_PlaneSecondFieldOffset => {
                Self::PlaneSecondFieldOffset(u64s(bytes)?)
            }
            K::NvSciBufImageAttrKey_PlanePitch => Self::PlanePitch(u32s(bytes)?),
            K::NvSciBufImageAttrKey_PlaneAlignedHeight => Self::PlaneAlignedHeight(u32s(bytes)?),
            K::NvSciBufImageAttrKey_PlaneAlignedSize => Self::PlaneAlignedSize(u64s(bytes)?),
            K::NvSciBufImageAttrKey_ImageCount => Self::ImageCount(read_u64(k, bytes)?),
            _ => return Err(ValidationError::UnknownAttrKey { key: k }),
        })
    }

    /// Decodes a pair filled by `NvSciBufAttrListGetAttrs`. `Ok(None)` when the key is not set
    /// (NULL value or zero length).
    ///
    /// # Safety
    ///
    /// `pair.value` must be NULL or point to `pair.len` readable, initialised bytes that stay
    /// unchanged for the duration of the call (true for a pair just filled by GetAttrs while
    /// its attribute list is alive and not modified).
    pub unsafe fn decode_pair(
        pair: &NvSciBufAttrKeyValuePair,
    ) -> Result<Option<Self>, ValidationError> {
        // SAFETY: the caller upholds the same contract `decode_pair` states.
        unsafe { decode_pair(pair) }
    }
}

/// Which image padding key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Padding {
    /// `TopPadding`.
    Top,
    /// `BottomPadding`.
    Bottom,
    /// `LeftPadding`.
    Left,
    /// `RightPadding`.
    Right,
}

/// One NvSciSync attribute with its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncAttr {
    /// `NeedCpuAccess` (bool): the CPU signals or waits.
    NeedCpuAccess(bool),
    /// `RequiredPerm`: WaitOnly, SignalOnly or WaitSignal (Auto is refused).
    RequiredPerm(NvSciSyncAccessPerm),
    /// `ActualPerm` (output only).
    ActualPerm(NvSciSyncAccessPerm),
    /// `WaiterContextInsensitiveFenceExports` (bool).
    WaiterContextInsensitiveFenceExports(bool),
    /// `WaiterRequireTimestamps` (bool).
    WaiterRequireTimestamps(bool),
    /// `RequireDeterministicFences` (bool): each signal increments the primitive by exactly 1.
    RequireDeterministicFences(bool),
    /// `NumTimestampSlots` (u32, output only).
    NumTimestampSlots(u32),
    /// `MaxPrimitiveValue` (u64, output only): `u32::MAX` or `u64::MAX`, the primitive's wrap.
    MaxPrimitiveValue(u64),
    /// `PrimitiveInfo` (`NvSciSyncAttrValPrimitiveType[]`).
    PrimitiveInfo(heapless::Vec<NvSciSyncAttrValPrimitiveType, MAX_PRIMITIVES>),
    /// `GpuId` (`NvSciRmGpuId[]`).
    GpuId(heapless::Vec<NvSciRmGpuId, MAX_GPUS>),
}

impl SyncAttr {
    /// `GpuId` from a slice (at most [`MAX_GPUS`]).
    pub fn gpu_ids(ids: &[GpuId]) -> Result<Self, ValidationError> {
        Ok(Self::GpuId(raw_gpu_ids(ids)?))
    }

    /// `PrimitiveInfo` from a slice (at most [`MAX_PRIMITIVES`]).
    pub fn primitive_info(
        types: &[NvSciSyncAttrValPrimitiveType],
    ) -> Result<Self, ValidationError> {
        Ok(Self::PrimitiveInfo(list(types)?))
    }

    /// `true` for keys that reconciliation computes (`ActualPerm`, `NumTimestampSlots`,
    /// `MaxPrimitiveValue`): readable from a reconciled list, refused by
    /// [`SyncAttrSet::set`].
    pub fn is_output_only(&self) -> bool {
        matches!(
            self,
            Self::ActualPerm(_) | Self::NumTimestampSlots(_) | Self::MaxPrimitiveValue(_)
        )
    }

    /// The C key.
    pub fn key(&self) -> NvSciSyncAttrKey {
        type K = NvSciSyncAttrKey;
        match self {
            Self::NeedCpuAccess(_) => K::NvSciSyncAttrKey_NeedCpuAccess,
            Self::RequiredPerm(_) => K::NvSciSyncAttrKey_RequiredPerm,
            Self::ActualPerm(_) => K::NvSciSyncAttrKey_ActualPerm,
            Self::WaiterContextInsensitiveFenceExports(_) => {
                K::NvSciSyncAttrKey_WaiterContextInsensitiveFenceExports
            }
            Self::WaiterRequireTimestamps(_) => K::NvSciSyncAttrKey_WaiterRequireTimestamps,
            Self::RequireDeterministicFences(_) => K::NvSciSyncAttrKey_RequireDeterministicFences,
            Self::NumTimestampSlots(_) => K::NvSciSyncAttrKey_NumTimestampSlots,
            Self::MaxPrimitiveValue(_) => K::NvSciSyncAttrKey_MaxPrimitiveValue,
            Self::PrimitiveInfo(_) => K::NvSciSyncAttrKey_PrimitiveInfo,
            Self::GpuId(_) => K::NvSciSyncAttrKey_GpuId,
        }
    }

    /// Checks the value alone.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let key = self.key().0;
        match self {
            Self::RequiredPerm(p) => check_sync_perm(*p),
            Self::PrimitiveInfo(v) => {
                if v.is_empty() {
                    return Err(ValidationError::InvalidAttrValue { key });
                }
                match v.iter().find(|t| !(1..=5).contains(&t.0)) {
                    Some(t) => Err(ValidationError::UnknownPrimitiveType { raw: t.0 }),
                    None => Ok(()),
                }
            }
            Self::GpuId(v) if v.is_empty() => Err(ValidationError::InvalidAttrValue { key }),
            _ => Ok(()),
        }
    }

    fn value_ptr_len(&self) -> (*const c_void, usize) {
        match self {
            Self::NeedCpuAccess(b)
            | Self::WaiterContextInsensitiveFenceExports(b)
            | Self::WaiterRequireTimestamps(b)
            | Self::RequireDeterministicFences(b) => ptr_len(b),
            Self::RequiredPerm(p) | Self::ActualPerm(p) => ptr_len(p),
            Self::NumTimestampSlots(v) => ptr_len(v),
            Self::MaxPrimitiveValue(v) => ptr_len(v),
            Self::PrimitiveInfo(v) => slice_ptr_len(v.as_slice()),
            Self::GpuId(v) => slice_ptr_len(v.as_slice()),
        }
    }

    /// Decodes a value read back with `NvSciSyncAttrListGetAttrs`.
    pub fn decode(key: NvSciSyncAttrKey, bytes: &[u8]) -> Result<Self, ValidationError> {
        type K = NvSciSyncAttrKey;
        let k = key.0;
        Ok(match key {
            K::NvSciSyncAttrKey_NeedCpuAccess => Self::NeedCpuAccess(read_bool(k, bytes)?),
            K::NvSciSyncAttrKey_RequiredPerm => {
                Self::RequiredPerm(NvSciSyncAccessPerm(read_u64(k, bytes)?))
            }
            K::NvSciSyncAttrKey_ActualPerm => {
                Self::ActualPerm(NvSciSyncAccessPerm(read_u64(k, bytes)?))
            }
            K::NvSciSyncAttrKey_WaiterContextInsensitiveFenceExports => {
                Self::WaiterContextInsensitiveFenceExports(read_bool(k, bytes)?)
            }
            K::NvSciSyncAttrKey_WaiterRequireTimestamps => {
                Self::WaiterRequireTimestamps(read_bool(k, bytes)?)
            }
            K::NvSciSyncAttrKey_RequireDeterministicFences => {
                Self::RequireDeterministicFences(read_bool(k, bytes)?)
            }
            K::NvSciSyncAttrKey_NumTimestampSlots => Self::NumTimestampSlots(read_u32(k, bytes)?),
            K::NvSciSyncAttrKey_MaxPrimitiveValue => Self::MaxPrimitiveValue(read_u64(k, bytes)?),
            K::NvSciSyncAttrKey_PrimitiveInfo => {
                Self::PrimitiveInfo(read_array::<_, 4, MAX_PRIMITIVES>(k, bytes, |b| {
                    NvSciSyncAttrValPrimitiveType(u32::from_ne_bytes(b))
                })?)
            }
            K::NvSciSyncAttrKey_GpuId => Self::GpuId(read_gpu_ids(k, bytes)?),
            _ => return Err(ValidationError::UnknownAttrKey { key: k }),
        })
    }

    /// Decodes a pair filled by `NvSciSyncAttrListGetAttrs`. `Ok(None)` when the key is not set.
    ///
    /// # Safety
    ///
    /// `pair.value` must be NULL or point to `pair.len` readable, initialised bytes that stay
    /// unchanged for the duration of the call.
    pub unsafe fn decode_pair(
        pair: &NvSciSyncAttrKeyValuePair,
    ) -> Result<Option<Self>, ValidationError> {
        // SAFETY: the caller upholds the same contract `decode_pair` states.
        unsafe { decode_pair(pair) }
    }
}

/// The per-library facts the shared set code needs, out of the public API (the pair
/// structures point at values; only this module builds and reads them).
mod facts {
    use core::ffi::c_void;

    use crate::error::ValidationError;

    /// What NvSciBuf and NvSciSync attributes differ in; everything else of a set is written
    /// once, over this trait.
    pub trait AttrFacts: Clone + Sized {
        /// The C key (`NvSciBufAttrKey`, `NvSciSyncAttrKey`).
        type Key: Copy + PartialEq + core::fmt::Debug;
        /// The C key/value pair (the two name their key field differently).
        type Pair: core::fmt::Debug;
        /// The attribute's key.
        fn key_of(&self) -> Self::Key;
        /// The key's number, as errors carry it.
        fn raw_key(key: Self::Key) -> u32;
        /// The value checked alone.
        fn check(&self) -> Result<(), ValidationError>;
        /// `true` for keys only reconciliation writes.
        fn output_only(&self) -> bool;
        /// The keys of one list checked against each other (nothing to check by default).
        fn check_together(_attrs: &[Self]) -> Result<(), ValidationError> {
            Ok(())
        }
        /// A value read back for `key`.
        fn decode_from(key: Self::Key, bytes: &[u8]) -> Result<Self, ValidationError>;
        /// Where the value lies (inside `self`) and its length in bytes.
        fn value(&self) -> (*const c_void, usize);
        /// The C pair.
        fn pair(key: Self::Key, value: *const c_void, len: usize) -> Self::Pair;
        /// A C pair's key, value pointer and length.
        fn parts(pair: &Self::Pair) -> (Self::Key, *const c_void, usize);
    }
}

/// An NvSci library's attribute type, [`BufAttr`] or [`SyncAttr`] (sealed): the one shape
/// [`AttrSet`], [`LoweredAttrs`] and [`decode_pair`] are written over, the way the driver's
/// `nvsci::Library` shares its list and object code between the two libraries.
pub trait AttrKind: facts::AttrFacts {}

impl AttrKind for BufAttr {}
impl AttrKind for SyncAttr {}

/// The facts both attribute types answer with their own inherent methods (`key`,
/// `validate`, `is_output_only`, `decode`, `value_ptr_len`).
macro_rules! facts_from_inherent {
    ($key:ty) => {
        fn key_of(&self) -> $key {
            self.key()
        }
        fn raw_key(key: $key) -> u32 {
            key.0
        }
        fn check(&self) -> Result<(), ValidationError> {
            self.validate()
        }
        fn output_only(&self) -> bool {
            self.is_output_only()
        }
        fn decode_from(key: $key, bytes: &[u8]) -> Result<Self, ValidationError> {
            Self::decode(key, bytes)
        }
        fn value(&self) -> (*const c_void, usize) {
            self.value_ptr_len()
        }
    };
}

impl facts::AttrFacts for BufAttr {
    type Key = NvSciBufAttrKey;
    type Pair = NvSciBufAttrKeyValuePair;

    facts_from_inherent!(NvSciBufAttrKey);
    /// Every per-plane key has `PlaneCount` entries.
    fn check_together(attrs: &[Self]) -> Result<(), ValidationError> {
        let plane_count = attrs.iter().find_map(|a| match a {
            BufAttr::PlaneCount(n) => Some(*n as usize),
            _ => None,
        });
        let Some(expected) = plane_count else {
            return Ok(());
        };
        for attr in attrs {
            match attr.plane_entries() {
                Some(actual) if actual != expected => {
                    return Err(ValidationError::PlaneCountMismatch {
                        key: attr.key().0,
                        expected,
                        actual,
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }
    fn pair(key: NvSciBufAttrKey, value: *const c_void, len: usize) -> NvSciBufAttrKeyValuePair {
        NvSciBufAttrKeyValuePair { key, value, len }
    }
    fn parts(pair: &NvSciBufAttrKeyValuePair) -> (NvSciBufAttrKey, *const c_void, usize) {
        (pair.key, pair.value, pair.len)
    }
}

impl facts::AttrFacts for SyncAttr {
    type Key = NvSciSyncAttrKey;
    type Pair = NvSciSyncAttrKeyValuePair;

    facts_from_inherent!(NvSciSyncAttrKey);
    fn pair(key: NvSciSyncAttrKey, value: *const c_void, len: usize) -> NvSciSyncAttrKeyValuePair {
        NvSciSyncAttrKeyValuePair {
            attrKey: key,
            value,
            len,
        }
    }
    fn parts(pair: &NvSciSyncAttrKeyValuePair) -> (NvSciSyncAttrKey, *const c_void, usize) {
        (pair.attrKey, pair.value, pair.len)
    }
}

/// Decodes a pair filled by `NvSciBufAttrListGetAttrs` / `NvSciSyncAttrListGetAttrs`.
/// `Ok(None)` when the key is not set (NULL value or zero length). Checks the length against
/// the key's type; does not apply the value's `validate`.
///
/// # Safety
///
/// `pair.value` must be NULL or point to `pair.len` readable, initialised bytes that stay
/// unchanged for the duration of the call (true for a pair just filled by GetAttrs while
/// its attribute list is alive and not modified).
pub unsafe fn decode_pair<A: AttrKind>(pair: &A::Pair) -> Result<Option<A>, ValidationError> {
    let (key, value, len) = A::parts(pair);
    if value.is_null() || len == 0 {
        return Ok(None);
    }
    // SAFETY: non-NULL, and the caller guarantees `len` readable initialised bytes there.
    let bytes = unsafe { core::slice::from_raw_parts(value.cast::<u8>(), len) };
    A::decode_from(key, bytes).map(Some)
}

/// A validated NvSci attribute list of at most `N` keys, each at most once: a
/// [`BufAttrSet`] or a [`SyncAttrSet`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttrSet<A: AttrKind, const N: usize> {
    attrs: heapless::Vec<A, N>,
}

/// A validated NvSciBuf attribute list of at most `N` keys, each at most once.
pub type BufAttrSet<const N: usize> = AttrSet<BufAttr, N>;

/// A validated NvSciSync attribute list of at most `N` keys, each at most once.
///
/// ```
/// use tegra_interop_core::nvsci::{SyncAttr, SyncAttrSet};
/// use tegra_interop_core::sys::nvsci::NvSciSyncAccessPerm;
/// use tegra_interop_core::ValidationError;
///
/// let mut attrs = SyncAttrSet::<4>::new();
/// attrs.set(SyncAttr::NeedCpuAccess(true))?;
/// attrs.set(SyncAttr::RequireDeterministicFences(true))?;
/// assert_eq!(
///     attrs.set(SyncAttr::RequiredPerm(NvSciSyncAccessPerm::NvSciSyncAccessPerm_Auto)).unwrap_err(),
///     ValidationError::AutoPermNotAllowed,
/// );
/// assert_eq!(attrs.lower()?.len(), 2);
/// # Ok::<(), ValidationError>(())
/// ```
pub type SyncAttrSet<const N: usize> = AttrSet<SyncAttr, N>;

impl<A: AttrKind, const N: usize> Default for AttrSet<A, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<A: AttrKind, const N: usize> AttrSet<A, N> {
    /// An empty set.
    pub const fn new() -> Self {
        Self {
            attrs: heapless::Vec::new(),
        }
    }

    /// Adds `attr` after checking its value, that it is an input (output-only keys are
    /// refused, as the library does), that its key is not set yet (each key at most once
    /// per list), and the capacity.
    pub fn set(&mut self, attr: A) -> Result<&mut Self, ValidationError> {
        attr.check()?;
        let key = attr.key_of();
        if attr.output_only() {
            return Err(ValidationError::OutputOnlyKey {
                key: A::raw_key(key),
            });
        }
        if self.attrs.iter().any(|a| a.key_of() == key) {
            return Err(ValidationError::DuplicateKey {
                key: A::raw_key(key),
            });
        }
        self.attrs
            .push(attr)
            .map_err(|_| ValidationError::CapacityExceeded { capacity: N })?;
        Ok(self)
    }

    /// The attribute with `key`, if set.
    pub fn get(&self, key: A::Key) -> Option<&A> {
        self.attrs.iter().find(|a| a.key_of() == key)
    }

    /// The attributes, in insertion order.
    pub fn attrs(&self) -> &[A] {
        &self.attrs
    }

    /// Number of keys set.
    pub fn len(&self) -> usize {
        self.attrs.len()
    }

    /// `true` when no key is set.
    pub fn is_empty(&self) -> bool {
        self.attrs.is_empty()
    }

    /// Checks the keys against each other (NvSciBuf: every per-plane key has `PlaneCount`
    /// entries; NvSciSync: nothing to check).
    pub fn validate(&self) -> Result<(), ValidationError> {
        A::check_together(&self.attrs)
    }

    /// Validates and builds the C pair array for `NvSciBufAttrListSetAttrs` /
    /// `NvSciSyncAttrListSetAttrs`, pointing into this set's storage (valid while the
    /// returned value lives). No allocation.
    pub fn lower(&self) -> Result<LoweredAttrs<'_, A, N>, ValidationError> {
        self.validate()?;
        let mut pairs = heapless::Vec::new();
        for attr in &self.attrs {
            let (value, len) = attr.value();
            pairs
                .push(A::pair(attr.key_of(), value, len))
                .map_err(|_| ValidationError::CapacityExceeded { capacity: N })?;
        }
        Ok(LoweredAttrs {
            pairs,
            _set: PhantomData,
        })
    }
}

/// The C pairs of an [`AttrSet`], borrowing its value storage.
#[derive(Debug)]
pub struct LoweredAttrs<'a, A: AttrKind, const N: usize> {
    pairs: heapless::Vec<A::Pair, N>,
    _set: PhantomData<&'a AttrSet<A, N>>,
}

/// The C pairs of a [`BufAttrSet`].
pub type LoweredBufAttrs<'a, const N: usize> = LoweredAttrs<'a, BufAttr, N>;

/// The C pairs of a [`SyncAttrSet`].
pub type LoweredSyncAttrs<'a, const N: usize> = LoweredAttrs<'a, SyncAttr, N>;

impl<A: AttrKind, const N: usize> LoweredAttrs<'_, A, N> {
    /// The pairs (`NvSciSyncAttrListSetAttrs` takes a const pointer: `as_slice().as_ptr()`).
    pub fn as_slice(&self) -> &[A::Pair] {
        &self.pairs
    }

    /// Pointer for `NvSciBufAttrListSetAttrs` (which takes a mutable pointer but only reads).
    pub fn as_mut_ptr(&mut self) -> *mut A::Pair {
        self.pairs.as_mut_ptr()
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// `true` when there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}
