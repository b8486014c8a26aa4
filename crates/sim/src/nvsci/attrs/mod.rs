//! Simulated attribute lists: storage, the simulator's own decoding of raw
//! key/value pairs (`SetAttrs` / `GetAttrs` checks), and the reconciliation
//! rules of NvSciBuf and NvSciSync.
//!
//! Values are kept as the bytes the application passed (their C layout), so
//! `GetAttrs` can point into them. Every key, its direction (input, output,
//! both), its value layout and its valid values come from the real
//! `nvscibuf.h` / `nvscisync.h` of DRIVE OS 5.2.6, 6.0.5, 6.0.6, 6.0.8.1 and
//! 6.0.10 (declarations and documentation, checked key by key); nothing here
//! uses the core crate's decoders,
//! so the simulator cannot agree with the code under test by construction.

#![deny(unsafe_code)]

mod image;
mod keys;
mod reconcile;
mod wire;

use self::image::*;
pub(crate) use self::keys::*;
pub(crate) use self::reconcile::*;
pub(crate) use self::wire::*;

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

/// The IPC peers of a reconciled list: (endpoint, granted permission: a
/// buf `NvSciBufAttrValAccessPerm` or sync `NvSciSyncAccessPerm` bits).
pub(crate) fn peers(m: &AttrMap) -> Vec<(u64, u64)> {
    m.get(&PRIVATE_PEERS)
        .map(|v| u64s(v).chunks_exact(2).map(|c| (c[0], c[1])).collect())
        .unwrap_or_default()
}

/// Records, in a reconciled map, the peers whose unreconciled lists came
/// over an endpoint, each with what its lists required: for buf lists the
/// largest RequiredPerm (Readonly when none), for sync lists the union of
/// the RequiredPerm bits.
pub(crate) fn record_peers(sync: bool, parts: &[&AttrMap], out: &mut AttrMap) {
    let mut peers: Vec<(u64, u64)> = Vec::new();
    for p in parts {
        let Some(ep) = get_u64(p, PRIVATE_PEER) else {
            continue;
        };
        let perm = if sync {
            get_u64(p, sk::REQ_PERM).unwrap_or(0)
        } else {
            u64::from(get_u32(p, bk::REQ_PERM).unwrap_or(BUF_READONLY))
        };
        match peers.iter_mut().find(|(e, _)| *e == ep) {
            Some((_, q)) if sync => *q |= perm,
            Some((_, q)) => *q = (*q).max(perm),
            None => peers.push((ep, perm)),
        }
    }
    if !peers.is_empty() {
        let flat: Vec<u64> = peers.iter().flat_map(|(e, q)| [*e, *q]).collect();
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

// ---------------------------------------------------------------- keys

// ---------------------------------------------------------------- reconciliation

// ---------------------------------------------------------------- serialisation
