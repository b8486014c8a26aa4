//! Encoding helpers, the key tables of both halves (direction, value shape, release gating) and value checks.

#![deny(unsafe_code)]

use super::*;

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

pub(super) fn gpu_id(bytes: &[u8]) -> [u8; 16] {
    let mut id = [0u8; 16];
    id.copy_from_slice(&bytes[..16]);
    id
}

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
pub(super) enum Val {
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

pub(super) const fn k(name: &'static str, dir: Dir, val: Val) -> Lookup {
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

pub(super) fn each<const N: usize>(bytes: &[u8], what: &str) -> Result<Vec<[u8; N]>, Bad> {
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

pub(super) fn one<const N: usize>(bytes: &[u8], what: &str) -> Result<[u8; N], Bad> {
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

pub(super) fn invalid(what: &str, v: impl std::fmt::Display) -> Bad {
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
