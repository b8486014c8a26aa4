//! Simulated attribute lists: storage, the simulator's own decoding of raw
//! key/value pairs (`SetAttrs` / `GetAttrs` checks), and the reconciliation
//! rules of NvSciBuf and NvSciSync.
//!
//! Values are kept as the bytes the application passed (their C layout), so
//! `GetAttrs` can point into them. Every key, its direction (input, output,
//! both), its value layout and its valid values come from the project's fact
//! sheet (`nvsci-facts.md`, "Checked against the real headers") and the
//! public header documentation; nothing here uses the core crate's decoders,
//! so the simulator cannot agree with the code under test by construction.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::NvSciRelease;

/// Values of one attribute list, by key.
pub(crate) type AttrMap = BTreeMap<u32, Box<[u8]>>;

/// What an attribute list is.
pub(crate) enum ListKind {
    /// Made by `AttrListCreate` (one part) or imported unreconciled (one
    /// part per exported list).
    Unreconciled(Vec<AttrMap>),
    /// The result of a reconciliation (shared with the objects made from it).
    Reconciled(Arc<AttrMap>),
    /// The conflict list of a failed reconciliation: the keys in conflict.
    Conflict(AttrMap),
}

/// One attribute list handle.
pub(crate) struct AttrListRec {
    /// A sync list (else a buf list).
    pub(crate) sync: bool,
    /// The module it belongs to.
    pub(crate) module: usize,
    pub(crate) kind: ListKind,
    /// The object that owns it (`ObjGetAttrList`): not the application's to free.
    pub(crate) owner: Option<usize>,
    /// Made by `AttrListCreate` (the only kind `SetAttrs` may write; imported
    /// and appended lists are read-only).
    pub(crate) writable: bool,
}

/// The attribute list an object hands out (`Obj*GetAttrList`, shared by
/// NvSciBuf and NvSciSync): made on the first request from the object's
/// reconciled attributes plus its own ActualPerm, registered as owned by the
/// object (not the application's to free), and the same handle afterwards.
pub(crate) fn object_list(
    lists: &mut std::collections::HashMap<usize, AttrListRec>,
    cached: &mut Option<usize>,
    owner: usize,
    module: usize,
    sync: bool,
    reconciled: &AttrMap,
    actual_perm: (u32, Box<[u8]>),
) -> usize {
    if let Some(list) = *cached {
        return list;
    }
    let mut map = reconciled.clone();
    map.insert(actual_perm.0, actual_perm.1);
    let list = super::new_handle(if sync {
        super::Kind::SyncList
    } else {
        super::Kind::BufList
    });
    lists.insert(
        list,
        AttrListRec {
            sync,
            module,
            kind: ListKind::Reconciled(Arc::new(map)),
            owner: Some(owner),
            writable: false,
        },
    );
    *cached = Some(list);
    list
}

impl AttrListRec {
    /// The single map a `GetAttrs` reads (`None` for a list of several parts).
    pub(crate) fn readable(&self) -> Option<&AttrMap> {
        match &self.kind {
            ListKind::Unreconciled(parts) if parts.len() == 1 => parts.first(),
            ListKind::Unreconciled(_) => None,
            ListKind::Reconciled(m) => Some(m),
            ListKind::Conflict(m) => Some(m),
        }
    }
}

/// Real `NvSciBufAttrValColorFmt` and `NvSciBufAttrValColorStd` values (the
/// numbers are the same in every checked release; later releases only
/// append), and how the simulator lays out the formats it models.
///
/// The simulator lays out only the formats whose bits per pixel the fact
/// sheet makes certain (see `layout`); another value inside the real enum's
/// range is refused with `NotSupported` (not simulated), a value outside it
/// with `BadParameter` (what the real library answers for an invalid value).
pub mod color {
    /// Bayer 8-bit RGGB.
    pub const BAYER8_RGGB: u32 = 1;
    /// Bayer 16-bit RGGB.
    pub const BAYER16_RGGB: u32 = 10;
    /// Interleaved chroma, U byte then V byte (NV12's chroma plane).
    pub const U8V8: u32 = 74;
    /// `NvSciColor_U8_V8` (not laid out by the simulator).
    pub const U8_V8: u32 = 75;
    /// Interleaved chroma, V byte then U byte (NV21's chroma plane).
    pub const V8U8: u32 = 76;
    /// `NvSciColor_V8_U8` (not laid out by the simulator).
    pub const V8_U8: u32 = 77;
    /// 8-bit luma.
    pub const Y8: u32 = 84;
    /// 10-bit luma in 16 bits.
    pub const Y10: u32 = 85;
    /// 12-bit luma in 16 bits.
    pub const Y12: u32 = 86;
    /// 16-bit luma.
    pub const Y16: u32 = 87;
    /// 8-bit U plane.
    pub const U8: u32 = 88;
    /// 8-bit V plane.
    pub const V8: u32 = 89;
    /// Packed A, Y, U, V bytes.
    pub const A8Y8U8V8: u32 = 96;
    /// Packed 4:2:2 Y, U, Y, V (not laid out by the simulator).
    pub const Y8U8Y8V8: u32 = 97;
    /// 8-bit alpha (or a single 8-bit channel).
    pub const A8: u32 = 102;
    /// 32-bit BGRA-family format `NvSciColor_B8G8R8A8`.
    pub const B8G8R8A8: u32 = 104;
    /// 32-bit format `NvSciColor_A8R8G8B8`.
    pub const A8R8G8B8: u32 = 105;
    /// 32-bit format `NvSciColor_A8B8G8R8`: bytes in memory R, G, B, A (the
    /// usual RGBA8).
    pub const A8B8G8R8: u32 = 106;
    /// The usual RGBA8 (bytes R, G, B, A in memory): [`A8B8G8R8`].
    pub const R8G8B8A8: u32 = A8B8G8R8;

    /// Colour standards (`NvSciBufAttrValColorStd`).
    pub mod std {
        /// sRGB.
        pub const SRGB: u32 = 0;
        /// BT.601 studio range.
        pub const REC601_SR: u32 = 1;
        /// BT.601 extended range.
        pub const REC601_ER: u32 = 2;
        /// BT.709 studio range.
        pub const REC709_SR: u32 = 3;
        /// BT.709 extended range.
        pub const REC709_ER: u32 = 4;
        /// BT.2020 RGB.
        pub const REC2020_RGB: u32 = 5;
    }

    /// Bits per pixel and channel count of a format the simulator lays out
    /// (`None` for every other value).
    pub fn layout(format: u32) -> Option<(u32, u8)> {
        Some(match format {
            BAYER8_RGGB | Y8 | U8 | V8 | A8 => (8, 1),
            BAYER16_RGGB | Y10 | Y12 | Y16 => (16, 1),
            U8V8 | V8U8 => (16, 2),
            A8Y8U8V8 | B8G8R8A8 | A8R8G8B8 | A8B8G8R8 => (32, 4),
            _ => return None,
        })
    }

    /// `NvSciColor_UpperBound` of an NvSciBuf version (2.0: 117, 2.8: 149,
    /// 2.11: 153; for 2.9, whose header was not checked, the smaller 149).
    pub(crate) fn upper_bound(buf_version: (u32, u32)) -> u32 {
        match buf_version {
            (2, m) if m >= 11 => 153,
            (2, m) if m >= 8 => 149,
            _ => 117,
        }
    }
}

/// Buf keys (C values, from the generated bindings).
pub(crate) mod bk {
    use tegra_interop_sys::nvsci::NvSciBufAttrKey;

    pub(crate) const TYPES: u32 = NvSciBufAttrKey::NvSciBufGeneralAttrKey_Types.0;
    pub(crate) const NEED_CPU: u32 = NvSciBufAttrKey::NvSciBufGeneralAttrKey_NeedCpuAccess.0;
    pub(crate) const REQ_PERM: u32 = NvSciBufAttrKey::NvSciBufGeneralAttrKey_RequiredPerm.0;
    pub(crate) const CPU_CACHE: u32 = NvSciBufAttrKey::NvSciBufGeneralAttrKey_EnableCpuCache.0;
    pub(crate) const GPU_ID: u32 = NvSciBufAttrKey::NvSciBufGeneralAttrKey_GpuId.0;
    pub(crate) const CPU_SW_COH: u32 =
        NvSciBufAttrKey::NvSciBufGeneralAttrKey_CpuNeedSwCacheCoherency.0;
    pub(crate) const ACTUAL_PERM: u32 = NvSciBufAttrKey::NvSciBufGeneralAttrKey_ActualPerm.0;
    pub(crate) const VIDMEM_GPU: u32 = NvSciBufAttrKey::NvSciBufGeneralAttrKey_VidMem_GpuId.0;
    pub(crate) const GPU_CACHE: u32 = NvSciBufAttrKey::NvSciBufGeneralAttrKey_EnableGpuCache.0;
    pub(crate) const GPU_SW_COH: u32 =
        NvSciBufAttrKey::NvSciBufGeneralAttrKey_GpuSwNeedCacheCoherency.0;
    pub(crate) const GPU_COMPRESSION: u32 =
        NvSciBufAttrKey::NvSciBufGeneralAttrKey_EnableGpuCompression.0;
    pub(crate) const RAW_SIZE: u32 = NvSciBufAttrKey::NvSciBufRawBufferAttrKey_Size.0;
    pub(crate) const RAW_ALIGN: u32 = NvSciBufAttrKey::NvSciBufRawBufferAttrKey_Align.0;
    pub(crate) const LAYOUT: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_Layout.0;
    pub(crate) const TOP_PAD: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_TopPadding.0;
    pub(crate) const RIGHT_PAD: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_RightPadding.0;
    pub(crate) const VPR: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_VprFlag.0;
    pub(crate) const IMG_SIZE: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_Size.0;
    pub(crate) const IMG_ALIGN: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_Alignment.0;
    pub(crate) const PLANE_COUNT: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_PlaneCount.0;
    pub(crate) const COLOR_FMT: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_PlaneColorFormat.0;
    pub(crate) const COLOR_STD: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_PlaneColorStd.0;
    pub(crate) const BASE_ALIGN: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_PlaneBaseAddrAlign.0;
    pub(crate) const WIDTH: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_PlaneWidth.0;
    pub(crate) const HEIGHT: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_PlaneHeight.0;
    pub(crate) const SCAN: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_ScanType.0;
    pub(crate) const BPP: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_PlaneBitsPerPixel.0;
    pub(crate) const OFFSET: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_PlaneOffset.0;
    pub(crate) const DATATYPE: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_PlaneDatatype.0;
    pub(crate) const CHANNELS: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_PlaneChannelCount.0;
    pub(crate) const SECOND_FIELD: u32 =
        NvSciBufAttrKey::NvSciBufImageAttrKey_PlaneSecondFieldOffset.0;
    pub(crate) const PITCH: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_PlanePitch.0;
    pub(crate) const ALIGNED_H: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_PlaneAlignedHeight.0;
    pub(crate) const ALIGNED_SIZE: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_PlaneAlignedSize.0;
    pub(crate) const IMAGE_COUNT: u32 = NvSciBufAttrKey::NvSciBufImageAttrKey_ImageCount.0;
}

/// Sync keys (C values, from the generated bindings).
pub(crate) mod sk {
    use tegra_interop_sys::nvsci::NvSciSyncAttrKey;

    pub(crate) const NEED_CPU: u32 = NvSciSyncAttrKey::NvSciSyncAttrKey_NeedCpuAccess.0;
    pub(crate) const REQ_PERM: u32 = NvSciSyncAttrKey::NvSciSyncAttrKey_RequiredPerm.0;
    pub(crate) const ACTUAL_PERM: u32 = NvSciSyncAttrKey::NvSciSyncAttrKey_ActualPerm.0;
    pub(crate) const CTX_INSENSITIVE: u32 =
        NvSciSyncAttrKey::NvSciSyncAttrKey_WaiterContextInsensitiveFenceExports.0;
    pub(crate) const TIMESTAMPS: u32 = NvSciSyncAttrKey::NvSciSyncAttrKey_WaiterRequireTimestamps.0;
    pub(crate) const DETERMINISTIC: u32 =
        NvSciSyncAttrKey::NvSciSyncAttrKey_RequireDeterministicFences.0;
    pub(crate) const MAX_VALUE: u32 = NvSciSyncAttrKey::NvSciSyncAttrKey_MaxPrimitiveValue.0;
    pub(crate) const PRIMITIVE: u32 = NvSciSyncAttrKey::NvSciSyncAttrKey_PrimitiveInfo.0;
    pub(crate) const GPU_ID: u32 = NvSciSyncAttrKey::NvSciSyncAttrKey_GpuId.0;
}

/// Private keys (never valid NvSci keys, so `GetAttrs` refuses them and
/// list IPC strips them): the endpoint an imported unreconciled part came
/// over (u64), and in a reconciled buf list the IPC peers with the
/// permission each was granted ((u64 endpoint, u64 perm) records).
pub(crate) const PRIVATE_PEER: u32 = 0xffff_0001;
pub(crate) const PRIVATE_PEERS: u32 = 0xffff_0002;

/// The IPC peers of a reconciled buf list: (endpoint, granted permission).
pub(crate) fn peers(m: &AttrMap) -> Vec<(u64, u32)> {
    m.get(&PRIVATE_PEERS)
        .map(|v| {
            u64s(v)
                .chunks_exact(2)
                .map(|c| (c[0], c[1] as u32))
                .collect()
        })
        .unwrap_or_default()
}

/// Records, in a reconciled buf map, the peers whose unreconciled lists
/// came over an endpoint, each with the largest RequiredPerm of its lists
/// (Readonly when none).
pub(crate) fn record_peers(parts: &[&AttrMap], out: &mut AttrMap) {
    let mut peers: Vec<(u64, u32)> = Vec::new();
    for p in parts {
        let Some(ep) = get_u64(p, PRIVATE_PEER) else {
            continue;
        };
        let perm = get_u32(p, bk::REQ_PERM).unwrap_or(BUF_READONLY);
        match peers.iter_mut().find(|(e, _)| *e == ep) {
            Some((_, q)) => *q = (*q).max(perm),
            None => peers.push((ep, perm)),
        }
    }
    if !peers.is_empty() {
        let flat: Vec<u64> = peers
            .iter()
            .flat_map(|(e, q)| [*e, u64::from(*q)])
            .collect();
        out.insert(PRIVATE_PEERS, enc_u64s(&flat));
    }
}

/// Buf types.
pub(crate) const TYPE_RAW: u32 = 1;
pub(crate) const TYPE_IMAGE: u32 = 2;
pub(crate) const TYPE_TENSOR: u32 = 3;
/// Buf permissions.
pub(crate) const BUF_READONLY: u32 = 1;
pub(crate) const BUF_READWRITE: u32 = 3;
/// Sync permissions.
pub(crate) const PERM_WAIT: u64 = 1;
pub(crate) const PERM_SIGNAL: u64 = 2;
pub(crate) const PERM_AUTO: u64 = 1 << 63;
/// Sync primitive types.
pub(crate) const PRIM_SYNCPOINT: u32 = 1;
pub(crate) const PRIM_SYSMEM_SEMAPHORE: u32 = 2;
pub(crate) const PRIM_VIDMEM_SEMAPHORE: u32 = 3;
pub(crate) const PRIM_SYSMEM_SEMAPHORE_64: u32 = 4;
pub(crate) const PRIM_VIDMEM_SEMAPHORE_64: u32 = 5;
/// `NvSciDataType` values the simulator writes (`PlaneDatatype`).
const DATATYPE_UINT8: u32 = 3;
const DATATYPE_UINT16: u32 = 5;
/// Bytes of one `NvSciBufAttrValGpuCache` entry ({GpuId[16], bool}, packed).
pub(crate) const GPU_CACHE_ENTRY: usize = 17;
/// Bytes of one `NvSciBufAttrValGpuCompression` entry ({GpuId[16], u32}).
pub(crate) const GPU_COMPRESSION_ENTRY: usize = 20;

// ---------------------------------------------------------------- encoding

pub(crate) fn enc_u32s(v: &[u32]) -> Box<[u8]> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

pub(crate) fn enc_u64s(v: &[u64]) -> Box<[u8]> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

pub(crate) fn enc_bool(b: bool) -> Box<[u8]> {
    Box::new([u8::from(b)])
}

pub(crate) fn u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub(crate) fn u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_ne_bytes(b)
        })
        .collect()
}

pub(crate) fn get_u64(m: &AttrMap, key: u32) -> Option<u64> {
    m.get(&key).and_then(|b| u64s(b).first().copied())
}

pub(crate) fn get_u32(m: &AttrMap, key: u32) -> Option<u32> {
    m.get(&key).and_then(|b| u32s(b).first().copied())
}

pub(crate) fn get_bool(m: &AttrMap, key: u32) -> bool {
    m.get(&key).is_some_and(|b| b.first() == Some(&1))
}

fn gpu_id(bytes: &[u8]) -> [u8; 16] {
    let mut id = [0u8; 16];
    id.copy_from_slice(&bytes[..16]);
    id
}

// ---------------------------------------------------------------- keys

/// Who writes a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    /// Only the application (refused by `GetAttrs` on reconciled lists).
    In,
    /// Both.
    InOut,
    /// Only the library (refused by `SetAttrs`, and by NvSciBuf's
    /// `GetAttrs` on unreconciled lists).
    Out,
}

/// The value layout of a key, with its valid input values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Val {
    /// `NvSciBufType[]`, each General < t < MaxValid (1..=5).
    Types,
    /// `bool`, one byte 0 or 1.
    Bool,
    /// `NvSciBufAttrValAccessPerm` (u32): Readonly 1 or ReadWrite 3.
    BufPerm,
    /// `NvSciRmGpuId[]` (16 bytes each, at least one).
    GpuIds,
    /// One `NvSciRmGpuId`.
    GpuId,
    /// `NvSciBufAttrValGpuCache[]`: packed 17-byte {GpuId, bool} entries.
    GpuCache,
    /// `NvSciBufAttrValGpuCompression[]`: 20-byte {GpuId, u32} entries;
    /// only GenericCompressible (1) may be set (None is the library's).
    GpuCompression,
    /// RawBuffer Size: u64 > 0.
    Size,
    /// u64, a power of two.
    Pow2U64,
    /// `NvSciBufAttrValImageLayoutType` (u32): BlockLinear 0, PitchLinear 1.
    Layout,
    /// `NvSciBufAttrValImageScanType` (u32): Progressive 0, Interlace 1.
    Scan,
    /// u32 in 1..=3.
    PlaneCount,
    /// `NvSciBufAttrValColorFmt[]`.
    ColorFormats,
    /// `NvSciBufAttrValColorStd[]`.
    ColorStds,
    /// u32[], each a power of two.
    Pow2U32s,
    /// u32[].
    U32s,
    /// u64[].
    U64s,
    /// ImageCount: u64, exactly 1.
    ImageCount,
    /// NvSciSync RequiredPerm (u64): WaitOnly 1, SignalOnly 2, WaitSignal 3
    /// (Auto never).
    SyncPerm,
    /// NvSciSync PrimitiveInfo: u32[] of primitive types 1..=5.
    Primitives,
    /// A key only the library writes.
    Output,
}

/// What the simulator knows about one key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyInfo {
    pub(crate) name: &'static str,
    pub(crate) dir: Dir,
    val: Val,
}

/// The answer to "which key is this".
#[derive(Clone, Copy, Debug)]
pub(crate) enum Lookup {
    /// A key the simulator models.
    Known(KeyInfo),
    /// A key that only a later release of the library has (the claimed
    /// release answers like for any unknown key: BadParameter).
    NotInRelease(&'static str),
    /// A real key of this release that the simulator does not model.
    NotSimulated(&'static str),
    /// Not a key of the library.
    Unknown,
}

const fn k(name: &'static str, dir: Dir, val: Val) -> Lookup {
    Lookup::Known(KeyInfo { name, dir, val })
}

/// Looks up an NvSciBuf key for `release`.
pub(crate) fn buf_key(release: NvSciRelease, key: u32) -> Lookup {
    use Dir::*;
    let info = match key {
        bk::TYPES => k("Types", InOut, Val::Types),
        bk::NEED_CPU => k("NeedCpuAccess", InOut, Val::Bool),
        bk::REQ_PERM => k("RequiredPerm", In, Val::BufPerm),
        bk::CPU_CACHE => k("EnableCpuCache", InOut, Val::Bool),
        bk::GPU_ID => k("GpuId", InOut, Val::GpuIds),
        bk::CPU_SW_COH => k("CpuNeedSwCacheCoherency", Out, Val::Output),
        bk::ACTUAL_PERM => k("ActualPerm", Out, Val::Output),
        bk::VIDMEM_GPU => k("VidMem_GpuId", InOut, Val::GpuId),
        bk::GPU_CACHE => k("EnableGpuCache", InOut, Val::GpuCache),
        bk::GPU_SW_COH => k("GpuSwNeedCacheCoherency", Out, Val::Output),
        bk::GPU_COMPRESSION => k("EnableGpuCompression", InOut, Val::GpuCompression),
        12 => Lookup::NotSimulated("PeerLocationInfo"),
        13 => Lookup::NotSimulated("PeerHwEngineArray"),
        bk::RAW_SIZE => k("RawBuffer Size", InOut, Val::Size),
        bk::RAW_ALIGN => k("RawBuffer Align", InOut, Val::Pow2U64),
        bk::LAYOUT => k("Image Layout", InOut, Val::Layout),
        bk::TOP_PAD..=bk::RIGHT_PAD => k("Image padding", InOut, Val::U64s),
        bk::VPR => k("Image VprFlag", InOut, Val::Bool),
        bk::IMG_SIZE => k("Image Size", Out, Val::Output),
        bk::IMG_ALIGN => k("Image Alignment", Out, Val::Output),
        bk::PLANE_COUNT => k("Image PlaneCount", InOut, Val::PlaneCount),
        bk::COLOR_FMT => k("Image PlaneColorFormat", InOut, Val::ColorFormats),
        bk::COLOR_STD => k("Image PlaneColorStd", InOut, Val::ColorStds),
        bk::BASE_ALIGN => k("Image PlaneBaseAddrAlign", InOut, Val::Pow2U32s),
        bk::WIDTH => k("Image PlaneWidth", InOut, Val::U32s),
        bk::HEIGHT => k("Image PlaneHeight", InOut, Val::U32s),
        bk::SCAN => k("Image ScanType", InOut, Val::Scan),
        bk::BPP..=bk::ALIGNED_SIZE => k("Image plane output", Out, Val::Output),
        bk::IMAGE_COUNT => k("Image ImageCount", InOut, Val::ImageCount),
        0x20018..=0x2001f => Lookup::NotSimulated("Image SurfType and the surface-based keys"),
        0x30000..=0x3001f => Lookup::NotSimulated("Tensor keys"),
        0x40000..=0x4001f => Lookup::NotSimulated("Array keys"),
        0x50000..=0x5001f => Lookup::NotSimulated("Pyramid keys"),
        _ => Lookup::Unknown,
    };
    match info {
        Lookup::Known(i)
            if (bk::GPU_CACHE..=bk::GPU_COMPRESSION).contains(&key)
                && release.buf_version() < (2, 8) =>
        {
            Lookup::NotInRelease(i.name)
        }
        other => other,
    }
}

/// Looks up an NvSciSync key for `release`.
pub(crate) fn sync_key(release: NvSciRelease, key: u32) -> Lookup {
    use Dir::*;
    let info = match key {
        sk::NEED_CPU => k("NeedCpuAccess", InOut, Val::Bool),
        sk::REQ_PERM => k("RequiredPerm", In, Val::SyncPerm),
        sk::ACTUAL_PERM => k("ActualPerm", Out, Val::Output),
        sk::CTX_INSENSITIVE => k("WaiterContextInsensitiveFenceExports", InOut, Val::Bool),
        sk::TIMESTAMPS => k("WaiterRequireTimestamps", InOut, Val::Bool),
        sk::DETERMINISTIC => k("RequireDeterministicFences", InOut, Val::Bool),
        7 => k("NumTimestampSlots", Out, Val::Output),
        8 => k("NumTaskStatusSlots", Out, Val::Output),
        sk::MAX_VALUE => k("MaxPrimitiveValue", Out, Val::Output),
        sk::PRIMITIVE => k("PrimitiveInfo", InOut, Val::Primitives),
        11 => Lookup::NotSimulated("PeerLocationInfo"),
        sk::GPU_ID => k("GpuId", InOut, Val::GpuIds),
        13 => Lookup::NotSimulated("PeerHwEngineArray"),
        _ => Lookup::Unknown,
    };
    match info {
        Lookup::Known(KeyInfo { name, .. }) | Lookup::NotSimulated(name)
            if !release.sync_key_known(key) =>
        {
            Lookup::NotInRelease(name)
        }
        other => other,
    }
}

/// Why a value cannot be set.
pub(crate) enum Bad {
    /// An invalid length or value (BadParameter).
    Invalid(String),
    /// A value of the real enum the simulator does not model (NotSupported).
    NotSimulated(String),
}

fn each<const N: usize>(bytes: &[u8], what: &str) -> Result<Vec<[u8; N]>, Bad> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(N) {
        return Err(Bad::Invalid(format!(
            "{what}: length {} is not a non-zero multiple of {N}",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            a
        })
        .collect())
}

fn one<const N: usize>(bytes: &[u8], what: &str) -> Result<[u8; N], Bad> {
    if bytes.len() != N {
        return Err(Bad::Invalid(format!(
            "{what}: length {} (expected {N})",
            bytes.len()
        )));
    }
    let mut a = [0u8; N];
    a.copy_from_slice(bytes);
    Ok(a)
}

fn invalid(what: &str, v: impl std::fmt::Display) -> Bad {
    Bad::Invalid(format!("{what}: invalid value {v}"))
}

/// Checks the length and value of a pair the application sets.
pub(crate) fn check_value(release: NvSciRelease, info: &KeyInfo, bytes: &[u8]) -> Result<(), Bad> {
    let name = info.name;
    match info.val {
        Val::Output => Err(Bad::Invalid(format!("{name} is written by the library"))),
        Val::Types => {
            for t in each::<4>(bytes, name)? {
                let t = u32::from_ne_bytes(t);
                if !(1..=5).contains(&t) {
                    return Err(invalid(name, t));
                }
            }
            Ok(())
        }
        Val::Bool => match one::<1>(bytes, name)? {
            [0] | [1] => Ok(()),
            [b] => Err(invalid(name, b)),
        },
        Val::BufPerm => match u32::from_ne_bytes(one::<4>(bytes, name)?) {
            BUF_READONLY | BUF_READWRITE => Ok(()),
            p => Err(invalid(name, format!("{p} (Readonly 1 or ReadWrite 3)"))),
        },
        Val::GpuIds => each::<16>(bytes, name).map(|_| ()),
        Val::GpuId => one::<16>(bytes, name).map(|_| ()),
        Val::GpuCache => {
            for e in each::<GPU_CACHE_ENTRY>(bytes, name)? {
                if e[16] > 1 {
                    return Err(invalid(name, format!("cacheability byte {}", e[16])));
                }
            }
            Ok(())
        }
        Val::GpuCompression => {
            for e in each::<GPU_COMPRESSION_ENTRY>(bytes, name)? {
                let t = u32::from_ne_bytes([e[16], e[17], e[18], e[19]]);
                if t != 1 {
                    return Err(invalid(
                        name,
                        format!("compression type {t} (only GenericCompressible 1 may be set; None is the library's)"),
                    ));
                }
            }
            Ok(())
        }
        Val::Size => match u64::from_ne_bytes(one::<8>(bytes, name)?) {
            0 => Err(invalid(name, "0 (must be > 0)")),
            _ => Ok(()),
        },
        Val::Pow2U64 => {
            let v = u64::from_ne_bytes(one::<8>(bytes, name)?);
            if v.is_power_of_two() {
                Ok(())
            } else {
                Err(invalid(name, format!("{v} (not a power of two)")))
            }
        }
        Val::Layout | Val::Scan => match u32::from_ne_bytes(one::<4>(bytes, name)?) {
            0 | 1 => Ok(()),
            v => Err(invalid(name, v)),
        },
        Val::PlaneCount => match u32::from_ne_bytes(one::<4>(bytes, name)?) {
            1..=3 => Ok(()),
            v => Err(invalid(name, format!("{v} (1..=3)"))),
        },
        Val::ColorFormats => {
            let upper = color::upper_bound(release.buf_version());
            for f in each::<4>(bytes, name)? {
                let f = u32::from_ne_bytes(f);
                if f == 0 || f >= upper {
                    return Err(invalid(
                        name,
                        format!("{f} (outside the colour enum of {})", release.name()),
                    ));
                }
                if color::layout(f).is_none() {
                    return Err(Bad::NotSimulated(format!(
                        "colour format {f}: its plane layout is not in the fact sheet, so the simulator does not lay it out (not known how the real library sizes it)"
                    )));
                }
            }
            Ok(())
        }
        Val::ColorStds => {
            for s in each::<4>(bytes, name)? {
                let s = u32::from_ne_bytes(s);
                if s > color::std::REC2020_RGB {
                    return Err(Bad::NotSimulated(format!(
                        "colour standard {s} is not in the fact sheet (not known how the real library treats it)"
                    )));
                }
            }
            Ok(())
        }
        Val::Pow2U32s => {
            for a in each::<4>(bytes, name)? {
                let a = u32::from_ne_bytes(a);
                if !a.is_power_of_two() {
                    return Err(invalid(name, format!("{a} (not a power of two)")));
                }
            }
            Ok(())
        }
        Val::U32s => each::<4>(bytes, name).map(|_| ()),
        Val::U64s => each::<8>(bytes, name).map(|_| ()),
        Val::ImageCount => match u64::from_ne_bytes(one::<8>(bytes, name)?) {
            1 => Ok(()),
            v => Err(invalid(name, format!("{v} (only 1 is valid)"))),
        },
        Val::SyncPerm => match u64::from_ne_bytes(one::<8>(bytes, name)?) {
            1..=3 => Ok(()),
            PERM_AUTO => Err(invalid(
                name,
                "Auto (only for IPC export/import, never a RequiredPerm)",
            )),
            p => Err(invalid(name, format!("{p:#x}"))),
        },
        Val::Primitives => {
            for p in each::<4>(bytes, name)? {
                let p = u32::from_ne_bytes(p);
                if !(1..=5).contains(&p) {
                    return Err(invalid(name, p));
                }
            }
            Ok(())
        }
    }
}

/// The buf type a key belongs to (`None` for general keys).
pub(crate) fn buf_key_type(key: u32) -> Option<u32> {
    match key >> 16 {
        0 => None,
        t => Some(t),
    }
}

// ---------------------------------------------------------------- reconciliation

/// What the reconciliation needs to know about the simulated machine.
pub(crate) struct Ctx {
    /// The GPU is a Tegra iGPU.
    pub(crate) integrated: bool,
    /// The UUIDs of the simulated GPUs.
    pub(crate) gpus: Vec<[u8; 16]>,
    pub(crate) release: NvSciRelease,
}

/// Why a reconciliation failed.
pub(crate) enum Fail {
    /// Conflicting values (ReconciliationFailed), with the keys in conflict.
    Conflict(AttrMap, String),
    /// NvSciSync: a signaller/waiter mismatch or an unsupported combination
    /// (UnsupportedConfig), with the keys in conflict.
    Unsupported(AttrMap, String),
    /// A mandatory key unset or a value unsupported for the types involved
    /// (BadParameter).
    Bad(String),
    /// Something the simulator does not model (NotSupported).
    NotSimulated(String),
}

fn conflict(key: u32, value: Box<[u8]>, why: impl Into<String>) -> Fail {
    let mut m = AttrMap::new();
    m.insert(key, value);
    Fail::Conflict(m, why.into())
}

fn unsupported(key: u32, value: Box<[u8]>, why: impl Into<String>) -> Fail {
    let mut m = AttrMap::new();
    m.insert(key, value);
    Fail::Unsupported(m, why.into())
}

/// A key every list that sets it must set to the same bytes.
fn same(parts: &[&AttrMap], key: u32, name: &str, out: &mut AttrMap) -> Result<(), Fail> {
    let mut seen: Option<&[u8]> = None;
    for p in parts {
        if let Some(v) = p.get(&key) {
            match seen {
                None => seen = Some(v),
                Some(s) if s == &**v => {}
                Some(_) => {
                    return Err(conflict(
                        key,
                        v.clone(),
                        format!("{name} differs between the lists (they must be equal)"),
                    ))
                }
            }
        }
    }
    if let Some(v) = seen {
        out.insert(key, v.into());
    }
    Ok(())
}

fn any_true(parts: &[&AttrMap], key: u32) -> bool {
    parts.iter().any(|p| get_bool(p, key))
}

fn gpu_union(parts: &[&AttrMap], key: u32) -> Vec<[u8; 16]> {
    let mut ids: Vec<[u8; 16]> = Vec::new();
    for p in parts {
        if let Some(v) = p.get(&key) {
            for c in v.chunks_exact(16) {
                let id = gpu_id(c);
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
    }
    ids
}

fn align_up(v: u64, a: u64) -> Option<u64> {
    let a = a.max(1);
    v.checked_add(a - 1).map(|x| x / a * a)
}

fn sorted_set(v: &[u8]) -> Vec<u32> {
    let mut t = u32s(v);
    t.sort_unstable();
    t.dedup();
    t
}

/// Reconciles NvSciBuf lists (already flattened into their parts), after the
/// header documentation: Types mandatory in every list and the same in all
/// (only {Image, Tensor} may mix); RawBuffer Size mandatory and equal in
/// every list that sets it; Align the largest power of two; image Layout,
/// ScanType, PlaneCount, formats and sizes mandatory and equal; GpuId the
/// union; ActualPerm the largest RequiredPerm, Readonly when none.
pub(crate) fn reconcile_buf(parts: &[&AttrMap], ctx: &Ctx) -> Result<AttrMap, Fail> {
    let mut out = AttrMap::new();
    let mut types: Option<(Vec<u32>, &[u8])> = None;
    let mut union: Vec<u32> = Vec::new();
    let mut mixed = false;
    for p in parts {
        let Some(v) = p.get(&bk::TYPES) else {
            return Err(Fail::Bad(
                "a list has no Types (mandatory in every list)".into(),
            ));
        };
        let mine = sorted_set(v);
        for t in &mine {
            if !union.contains(t) {
                union.push(*t);
            }
        }
        match &types {
            None => types = Some((mine, v)),
            Some((t, _)) if *t == mine => {}
            Some(_) => mixed = true,
        }
    }
    union.sort_unstable();
    let Some((first, first_bytes)) = types else {
        return Err(Fail::Bad("no lists".into()));
    };
    let types = if mixed {
        if union != [TYPE_IMAGE, TYPE_TENSOR] {
            return Err(conflict(
                bk::TYPES,
                first_bytes.into(),
                format!("the lists name different Types {union:?}; only exactly {{Image, Tensor}} may mix"),
            ));
        }
        union
    } else {
        first
    };
    if types != [TYPE_RAW] && types != [TYPE_IMAGE] {
        return Err(Fail::NotSimulated(format!(
            "buffer Types {types:?}: the simulator models RawBuffer alone and Image alone"
        )));
    }
    out.insert(bk::TYPES, enc_u32s(&types));
    let need_cpu = any_true(parts, bk::NEED_CPU);
    out.insert(bk::NEED_CPU, enc_bool(need_cpu));
    out.insert(bk::CPU_CACHE, enc_bool(any_true(parts, bk::CPU_CACHE)));
    let perm = parts
        .iter()
        .filter_map(|p| get_u32(p, bk::REQ_PERM))
        .max()
        .unwrap_or(BUF_READONLY);
    out.insert(bk::ACTUAL_PERM, enc_u32s(&[perm]));
    // No ISO engine is simulated, so the CPU never needs software coherency.
    out.insert(bk::CPU_SW_COH, enc_bool(false));
    if parts.iter().any(|p| p.contains_key(&bk::VIDMEM_GPU)) {
        return Err(Fail::NotSimulated(
            "VidMem_GpuId (video memory) is not simulated".into(),
        ));
    }
    let gpus = gpu_union(parts, bk::GPU_ID);
    if !gpus.is_empty() {
        out.insert(bk::GPU_ID, gpus.concat().into_boxed_slice());
    }
    reconcile_gpu_keys(parts, ctx, &gpus, need_cpu, &mut out)?;

    if types.contains(&TYPE_RAW) {
        if !parts.iter().any(|p| p.contains_key(&bk::RAW_SIZE)) {
            return Err(Fail::Bad(
                "RawBuffer Size is mandatory and no list sets it".into(),
            ));
        }
        same(parts, bk::RAW_SIZE, "RawBuffer Size", &mut out)?;
        let align = parts
            .iter()
            .filter_map(|p| get_u64(p, bk::RAW_ALIGN))
            .max()
            .unwrap_or(1);
        out.insert(bk::RAW_ALIGN, enc_u64s(&[align]));
    }
    if types.contains(&TYPE_IMAGE) {
        reconcile_image(parts, &mut out)?;
    }
    record_peers(parts, &mut out);
    Ok(out)
}

/// EnableGpuCache (AND per GPU, default true for a Tegra iGPU), the output
/// GpuSwNeedCacheCoherency, and EnableGpuCompression (falls back to None).
fn reconcile_gpu_keys(
    parts: &[&AttrMap],
    ctx: &Ctx,
    gpus: &[[u8; 16]],
    need_cpu: bool,
    out: &mut AttrMap,
) -> Result<(), Fail> {
    let mut cache: Vec<bool> = gpus
        .iter()
        .map(|g| ctx.integrated && ctx.gpus.contains(g))
        .collect();
    for p in parts {
        let Some(v) = p.get(&bk::GPU_CACHE) else {
            continue;
        };
        let entries: Vec<&[u8]> = v.chunks_exact(GPU_CACHE_ENTRY).collect();
        let bad = entries.len() != 1
            || !ctx.integrated
            || entries
                .iter()
                .any(|e| !gpus.contains(&gpu_id(e)) || !ctx.gpus.contains(&gpu_id(e)));
        if bad {
            return Err(conflict(
                bk::GPU_CACHE,
                v.clone(),
                "EnableGpuCache must hold one entry, for an iGPU that is also in GpuId",
            ));
        }
        for e in entries {
            if let Some(i) = gpus.iter().position(|g| *g == gpu_id(e)) {
                cache[i] &= e[16] == 1;
            }
        }
    }
    for p in parts {
        let Some(v) = p.get(&bk::GPU_COMPRESSION) else {
            continue;
        };
        for e in v.chunks_exact(GPU_COMPRESSION_ENTRY) {
            if !gpus.contains(&gpu_id(e)) {
                return Err(conflict(
                    bk::GPU_COMPRESSION,
                    v.clone(),
                    "EnableGpuCompression names a GPU that is not in GpuId",
                ));
            }
        }
    }
    // All lists that set compression for a GPU must agree on its type.
    for g in gpus {
        let mut seen: Option<&[u8]> = None;
        for p in parts {
            if let Some(v) = p.get(&bk::GPU_COMPRESSION) {
                for e in v.chunks_exact(GPU_COMPRESSION_ENTRY) {
                    if gpu_id(e) == *g {
                        match seen {
                            None => seen = Some(&e[16..]),
                            Some(s) if s == &e[16..] => {}
                            Some(_) => {
                                return Err(conflict(
                                    bk::GPU_COMPRESSION,
                                    v.clone(),
                                    "EnableGpuCompression differs between the lists for one GPU",
                                ))
                            }
                        }
                    }
                }
            }
        }
    }
    if ctx.release.buf_version() < (2, 8) || gpus.is_empty() {
        return Ok(());
    }
    let any_uncached = cache.iter().any(|c| !c);
    let mut cache_out = Vec::new();
    let mut coherency_out = Vec::new();
    let mut compression_out = Vec::new();
    for (g, c) in gpus.iter().zip(&cache) {
        cache_out.extend_from_slice(g);
        cache_out.push(u8::from(*c));
        coherency_out.extend_from_slice(g);
        coherency_out.push(u8::from(*c && (any_uncached || need_cpu)));
        compression_out.extend_from_slice(g);
        // Whether the driver would grant compression is not known here:
        // the documented fallback (None) is what the simulator answers.
        compression_out.extend_from_slice(&0u32.to_ne_bytes());
    }
    out.insert(bk::GPU_CACHE, cache_out.into_boxed_slice());
    out.insert(bk::GPU_SW_COH, coherency_out.into_boxed_slice());
    out.insert(bk::GPU_COMPRESSION, compression_out.into_boxed_slice());
    Ok(())
}

fn reconcile_image(parts: &[&AttrMap], out: &mut AttrMap) -> Result<(), Fail> {
    for (k, name) in [
        (bk::LAYOUT, "Image Layout"),
        (bk::SCAN, "Image ScanType"),
        (bk::PLANE_COUNT, "Image PlaneCount"),
        (bk::COLOR_FMT, "Image PlaneColorFormat"),
        (bk::WIDTH, "Image PlaneWidth"),
        (bk::HEIGHT, "Image PlaneHeight"),
    ] {
        if !parts.iter().any(|p| p.contains_key(&k)) {
            return Err(Fail::Bad(format!(
                "{name} is mandatory for an image and no list sets it"
            )));
        }
    }
    for (k, name) in [
        (bk::LAYOUT, "Image Layout"),
        (bk::SCAN, "Image ScanType"),
        (bk::PLANE_COUNT, "Image PlaneCount"),
        (bk::COLOR_FMT, "Image PlaneColorFormat"),
        (bk::COLOR_STD, "Image PlaneColorStd"),
        (bk::WIDTH, "Image PlaneWidth"),
        (bk::HEIGHT, "Image PlaneHeight"),
        (bk::IMAGE_COUNT, "Image ImageCount"),
        (bk::VPR, "Image VprFlag"),
        (bk::TOP_PAD, "Image TopPadding"),
        (bk::TOP_PAD + 1, "Image BottomPadding"),
        (bk::TOP_PAD + 2, "Image LeftPadding"),
        (bk::RIGHT_PAD, "Image RightPadding"),
    ] {
        same(parts, k, name, out)?;
    }
    if get_u32(out, bk::SCAN) == Some(1) {
        return Err(Fail::NotSimulated(
            "interlaced images (ScanType Interlace) are not simulated".into(),
        ));
    }
    if get_bool(out, bk::VPR) {
        return Err(Fail::NotSimulated(
            "protected (VPR) images are not simulated".into(),
        ));
    }
    let n = get_u32(out, bk::PLANE_COUNT).unwrap_or(0) as usize;
    let formats = out.get(&bk::COLOR_FMT).map(|v| u32s(v)).unwrap_or_default();
    let widths = out.get(&bk::WIDTH).map(|v| u32s(v)).unwrap_or_default();
    let heights = out.get(&bk::HEIGHT).map(|v| u32s(v)).unwrap_or_default();
    for (len, name) in [
        (formats.len(), "PlaneColorFormat"),
        (widths.len(), "PlaneWidth"),
        (heights.len(), "PlaneHeight"),
    ] {
        if len != n {
            return Err(Fail::Bad(format!(
                "{name} has {len} entries for PlaneCount {n}"
            )));
        }
    }
    for k in [
        bk::COLOR_STD,
        bk::TOP_PAD,
        bk::TOP_PAD + 1,
        bk::TOP_PAD + 2,
        bk::RIGHT_PAD,
    ] {
        if let Some(v) = out.get(&k) {
            let len = if k == bk::COLOR_STD {
                v.len() / 4
            } else {
                v.len() / 8
            };
            if len != n {
                return Err(Fail::Bad(format!(
                    "image key {k:#x} has {len} entries for PlaneCount {n}"
                )));
            }
        }
    }
    // Padding is not modelled: only zero padding is laid out.
    for k in bk::TOP_PAD..=bk::RIGHT_PAD {
        if out.get(&k).is_some_and(|v| u64s(v).iter().any(|p| *p != 0)) {
            return Err(Fail::NotSimulated("image padding is not simulated".into()));
        }
    }
    if widths.iter().chain(&heights).any(|d| *d == 0) {
        return Err(Fail::Bad("a plane width or height is 0".into()));
    }
    // Plane base alignment: the largest request per plane (default 256).
    let mut base_align = vec![256u32; n];
    for p in parts {
        if let Some(v) = p.get(&bk::BASE_ALIGN) {
            let req = u32s(v);
            if req.len() != n {
                return Err(Fail::Bad(format!(
                    "PlaneBaseAddrAlign has {} entries for PlaneCount {n}",
                    req.len()
                )));
            }
            for (a, r) in base_align.iter_mut().zip(req) {
                *a = (*a).max(r);
            }
        }
    }
    let (mut bpp, mut chans, mut dtype, mut pitch, mut aheight, mut offset, mut asize) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut end = 0u64;
    let overflow = || Fail::Bad("the image size overflows".into());
    for i in 0..n {
        let Some((bits, ch)) = color::layout(formats[i]) else {
            return Err(Fail::NotSimulated(format!(
                "colour format {} is not laid out by the simulator",
                formats[i]
            )));
        };
        // Pitch-linear rows, tightly packed; block-linear images get the
        // same linear layout (the simulator does not tile). Code above the
        // table must read pitch, offsets and sizes back, as on hardware.
        let row = u64::from(widths[i]) * u64::from(bits) / 8;
        let p = u32::try_from(row).map_err(|_| overflow())?;
        let size = row
            .checked_mul(u64::from(heights[i]))
            .ok_or_else(overflow)?;
        let off = align_up(end, u64::from(base_align[i])).ok_or_else(overflow)?;
        end = off.checked_add(size).ok_or_else(overflow)?;
        bpp.push(bits);
        chans.push(ch);
        dtype.push(if bits / u32::from(ch) == 16 {
            DATATYPE_UINT16
        } else {
            DATATYPE_UINT8
        });
        pitch.push(p);
        aheight.push(heights[i]);
        offset.push(off);
        asize.push(size);
    }
    let align = base_align.iter().copied().max().unwrap_or(1);
    out.entry(bk::IMAGE_COUNT).or_insert_with(|| enc_u64s(&[1]));
    out.insert(bk::BASE_ALIGN, enc_u32s(&base_align));
    out.insert(bk::BPP, enc_u32s(&bpp));
    out.insert(bk::CHANNELS, chans.into_boxed_slice());
    out.insert(bk::DATATYPE, enc_u32s(&dtype));
    out.insert(bk::PITCH, enc_u32s(&pitch));
    out.insert(bk::ALIGNED_H, enc_u32s(&aheight));
    out.insert(bk::OFFSET, enc_u64s(&offset));
    out.insert(bk::SECOND_FIELD, enc_u64s(&vec![0; n]));
    out.insert(bk::ALIGNED_SIZE, enc_u64s(&asize));
    out.insert(bk::IMG_SIZE, enc_u64s(&[end]));
    out.insert(bk::IMG_ALIGN, enc_u64s(&[u64::from(align)]));
    Ok(())
}

/// The byte size of an object allocated from a reconciled buf list.
pub(crate) fn buf_size(m: &AttrMap) -> u64 {
    let raw = get_u64(m, bk::RAW_SIZE).unwrap_or(0);
    let image = get_u64(m, bk::IMG_SIZE).unwrap_or(0);
    raw.max(image)
}

/// Reconciles NvSciSync lists (flattened into their parts).
///
/// Exactly one list with the signal permission and at least one with the
/// wait permission, else UnsupportedConfig; WaiterRequireTimestamps needs
/// NeedCpuAccess in the same list (else UnsupportedConfig); video-memory
/// primitives are not supported (UnsupportedConfig); the primitive is one
/// every list accepts (the signaller's order first; a list without
/// PrimitiveInfo accepts Syncpoint and the two sysmem semaphores), else
/// UnsupportedConfig; MaxPrimitiveValue is u64::MAX only for the 64-bit
/// sysmem semaphore; ActualPerm is the union; booleans are or-ed; GpuId the
/// union.
pub(crate) fn reconcile_sync(parts: &[&AttrMap], ctx: &Ctx) -> Result<AttrMap, Fail> {
    let mut perms = Vec::with_capacity(parts.len());
    for p in parts {
        let Some(perm) = get_u64(p, sk::REQ_PERM) else {
            return Err(unsupported(
                sk::REQ_PERM,
                enc_u64s(&[0]),
                "a list without RequiredPerm is neither signaller nor waiter (not known how the real library treats it; refused)",
            ));
        };
        perms.push(perm);
    }
    let signalers = perms.iter().filter(|p| *p & PERM_SIGNAL != 0).count();
    let waiters = perms.iter().filter(|p| *p & PERM_WAIT != 0).count();
    if signalers != 1 || waiters == 0 {
        return Err(unsupported(
            sk::REQ_PERM,
            enc_u64s(&perms),
            format!("{signalers} signaller list(s) and {waiters} waiter list(s); exactly one signaller and at least one waiter are needed"),
        ));
    }
    for p in parts {
        if get_bool(p, sk::TIMESTAMPS) && !get_bool(p, sk::NEED_CPU) {
            return Err(unsupported(
                sk::TIMESTAMPS,
                enc_bool(true),
                "WaiterRequireTimestamps needs NeedCpuAccess in the same list",
            ));
        }
    }
    let vidmem = |t: &u32| matches!(*t, PRIM_VIDMEM_SEMAPHORE | PRIM_VIDMEM_SEMAPHORE_64);
    for p in parts {
        if let Some(v) = p.get(&sk::PRIMITIVE) {
            if u32s(v).iter().any(vidmem) {
                return Err(unsupported(
                    sk::PRIMITIVE,
                    v.clone(),
                    "video-memory semaphore primitives are not supported",
                ));
            }
        }
    }
    if any_true(parts, sk::TIMESTAMPS) {
        return Err(Fail::NotSimulated(
            "WaiterRequireTimestamps (fence timestamps are not simulated)".into(),
        ));
    }
    let signaler = perms
        .iter()
        .position(|p| *p & PERM_SIGNAL != 0)
        .and_then(|i| parts.get(i));
    let default_order: Vec<u32> = if ctx.integrated {
        vec![
            PRIM_SYNCPOINT,
            PRIM_SYSMEM_SEMAPHORE,
            PRIM_SYSMEM_SEMAPHORE_64,
        ]
    } else {
        vec![
            PRIM_SYSMEM_SEMAPHORE,
            PRIM_SYSMEM_SEMAPHORE_64,
            PRIM_SYNCPOINT,
        ]
    };
    let mut candidates = signaler
        .and_then(|p| p.get(&sk::PRIMITIVE))
        .map(|v| u32s(v))
        .unwrap_or(default_order);
    for p in parts {
        if let Some(v) = p.get(&sk::PRIMITIVE) {
            let theirs = u32s(v);
            candidates.retain(|c| theirs.contains(c));
            if candidates.is_empty() {
                return Err(unsupported(
                    sk::PRIMITIVE,
                    v.clone(),
                    "no primitive type that signaller and waiters all support",
                ));
            }
        }
    }
    let Some(&prim) = candidates.first() else {
        return Err(unsupported(
            sk::PRIMITIVE,
            enc_u32s(&[0]),
            "no primitive type",
        ));
    };
    let max = if prim == PRIM_SYSMEM_SEMAPHORE_64 {
        u64::MAX
    } else {
        u64::from(u32::MAX)
    };
    let mut out = AttrMap::new();
    out.insert(
        sk::ACTUAL_PERM,
        enc_u64s(&[perms.iter().fold(0, |a, p| a | p)]),
    );
    out.insert(sk::PRIMITIVE, enc_u32s(&[prim]));
    out.insert(sk::MAX_VALUE, enc_u64s(&[max]));
    for k in [
        sk::NEED_CPU,
        sk::CTX_INSENSITIVE,
        sk::TIMESTAMPS,
        sk::DETERMINISTIC,
    ] {
        if ctx.release.sync_key_known(k) {
            out.insert(k, enc_bool(any_true(parts, k)));
        }
    }
    let gpus = gpu_union(parts, sk::GPU_ID);
    if !gpus.is_empty() {
        out.insert(sk::GPU_ID, gpus.concat().into_boxed_slice());
    }
    Ok(out)
}

// ---------------------------------------------------------------- serialisation

const WIRE_MAGIC: u32 = u32::from_le_bytes(*b"TSAL");

/// Serialises lists for attribute-list IPC.
pub(crate) fn serialize(parts: &[&AttrMap]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&WIRE_MAGIC.to_le_bytes());
    out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for p in parts {
        let public = p.iter().filter(|(k, _)| **k < PRIVATE_PEER);
        out.extend_from_slice(&(public.clone().count() as u32).to_le_bytes());
        for (k, v) in public {
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
    }
    out
}

/// Reads what [`serialize`] wrote; `None` for anything else.
pub(crate) fn deserialize(bytes: &[u8]) -> Option<Vec<AttrMap>> {
    struct Cursor<'a> {
        bytes: &'a [u8],
        at: usize,
    }
    impl<'a> Cursor<'a> {
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            let b = self.bytes.get(self.at..self.at.checked_add(n)?)?;
            self.at += n;
            Some(b)
        }
        fn word(&mut self) -> Option<u32> {
            let b = self.take(4)?;
            Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
    }
    let mut cur = Cursor { bytes, at: 0 };
    if cur.word()? != WIRE_MAGIC {
        return None;
    }
    let nparts = cur.word()?;
    let mut parts = Vec::new();
    for _ in 0..nparts {
        let n = cur.word()?;
        let mut m = AttrMap::new();
        for _ in 0..n {
            let k = cur.word()?;
            let len = cur.word()? as usize;
            m.insert(k, cur.take(len)?.into());
        }
        parts.push(m);
    }
    (cur.at == bytes.len()).then_some(parts)
}
