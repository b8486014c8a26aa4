//! Simulated attribute lists: storage, the checks of `SetAttrs`, and the
//! reconciliation rules of NvSciBuf and NvSciSync.
//!
//! Values are kept as the bytes the application passed (their C layout), so
//! `GetAttrs` can point into them. Setting a key checks its length and value
//! with the core's typed decoders; output-only keys, keys already set and
//! keys the simulator does not model are refused with BadParameter.

use std::collections::BTreeMap;
use std::sync::Arc;

use tegra_interop_core::nvsci::{BufAttr, SyncAttr};
use tegra_interop_sys::nvsci::{NvSciBufAttrKey, NvSciSyncAttrKey};

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

/// The simulator's own colour-format numbering for `PlaneColorFormat`.
///
/// The project's fact sheet lists no `NvSciBufAttrValColorFmt` values, so
/// the simulator defines a few formats of its own (values that are
/// deliberately unlike any real enum value). Code above the table never
/// interprets colour formats: it reads `PlaneBitsPerPixel` and
/// `PlaneChannelCount` back from the reconciled list, as on hardware.
pub mod color {
    /// One 8-bit channel (a luma plane).
    pub const R8: u32 = 0x5153_0001;
    /// Two 8-bit channels (an interleaved chroma plane).
    pub const R8G8: u32 = 0x5153_0002;
    /// Four 8-bit channels.
    pub const R8G8B8A8: u32 = 0x5153_0003;
    /// One 16-bit channel.
    pub const R16: u32 = 0x5153_0004;
    /// One 32-bit channel.
    pub const R32: u32 = 0x5153_0005;

    /// Bits per pixel and channel count of a simulated colour format.
    pub fn layout(format: u32) -> Option<(u32, u8)> {
        Some(match format {
            R8 => (8, 1),
            R8G8 => (16, 2),
            R8G8B8A8 => (32, 4),
            R16 => (16, 1),
            R32 => (32, 1),
            _ => return None,
        })
    }
}

/// Buf keys (C values).
pub(crate) mod bk {
    pub(crate) const TYPES: u32 = 0x1;
    pub(crate) const NEED_CPU: u32 = 0x2;
    pub(crate) const REQ_PERM: u32 = 0x3;
    pub(crate) const CPU_CACHE: u32 = 0x4;
    pub(crate) const GPU_ID: u32 = 0x5;
    pub(crate) const CPU_SW_COH: u32 = 0x6;
    pub(crate) const ACTUAL_PERM: u32 = 0x7;
    pub(crate) const GPU_CACHE: u32 = 0x9;
    pub(crate) const GPU_SW_COH: u32 = 0xa;
    pub(crate) const RAW_SIZE: u32 = 0x10000;
    pub(crate) const RAW_ALIGN: u32 = 0x10001;
    pub(crate) const LAYOUT: u32 = 0x20000;
    pub(crate) const TOP_PAD: u32 = 0x20001;
    pub(crate) const RIGHT_PAD: u32 = 0x20004;
    pub(crate) const VPR: u32 = 0x20005;
    pub(crate) const IMG_SIZE: u32 = 0x20006;
    pub(crate) const IMG_ALIGN: u32 = 0x20007;
    pub(crate) const PLANE_COUNT: u32 = 0x20008;
    pub(crate) const COLOR_FMT: u32 = 0x20009;
    pub(crate) const COLOR_STD: u32 = 0x2000a;
    pub(crate) const BASE_ALIGN: u32 = 0x2000b;
    pub(crate) const WIDTH: u32 = 0x2000c;
    pub(crate) const HEIGHT: u32 = 0x2000d;
    pub(crate) const SCAN: u32 = 0x2000e;
    pub(crate) const BPP: u32 = 0x2000f;
    pub(crate) const OFFSET: u32 = 0x20010;
    pub(crate) const DATATYPE: u32 = 0x20011;
    pub(crate) const CHANNELS: u32 = 0x20012;
    pub(crate) const SECOND_FIELD: u32 = 0x20013;
    pub(crate) const PITCH: u32 = 0x20014;
    pub(crate) const ALIGNED_H: u32 = 0x20015;
    pub(crate) const ALIGNED_SIZE: u32 = 0x20016;
    pub(crate) const IMAGE_COUNT: u32 = 0x20017;

    /// Keys only the library writes.
    pub(crate) const OUTPUTS: &[u32] = &[
        CPU_SW_COH,
        ACTUAL_PERM,
        GPU_SW_COH,
        IMG_SIZE,
        IMG_ALIGN,
        BPP,
        OFFSET,
        DATATYPE,
        CHANNELS,
        SECOND_FIELD,
        PITCH,
        ALIGNED_H,
        ALIGNED_SIZE,
    ];
}

/// Sync keys (C values).
pub(crate) mod sk {
    pub(crate) const NEED_CPU: u32 = 1;
    pub(crate) const REQ_PERM: u32 = 2;
    pub(crate) const ACTUAL_PERM: u32 = 3;
    pub(crate) const CTX_INSENSITIVE: u32 = 4;
    pub(crate) const TIMESTAMPS: u32 = 5;
    pub(crate) const DETERMINISTIC: u32 = 6;
    pub(crate) const NUM_TS_SLOTS: u32 = 7;
    pub(crate) const MAX_VALUE: u32 = 9;
    pub(crate) const PRIMITIVE: u32 = 10;
    pub(crate) const GPU_ID: u32 = 12;

    /// Keys only the library writes.
    pub(crate) const OUTPUTS: &[u32] = &[ACTUAL_PERM, NUM_TS_SLOTS, MAX_VALUE];
}

/// Buf types.
pub(crate) const TYPE_RAW: u32 = 1;
pub(crate) const TYPE_IMAGE: u32 = 2;
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

// ---------------------------------------------------------------- set checks

/// Why a pair cannot be set.
pub(crate) enum SetRefusal {
    /// Not a key the simulator models (or a wrong length / value).
    Invalid(String),
    /// A key only the library writes.
    Output(u32),
}

/// Checks one buf pair for `SetAttrs`.
pub(crate) fn check_buf_pair(key: u32, bytes: &[u8]) -> Result<(), SetRefusal> {
    if bk::OUTPUTS.contains(&key) {
        return Err(SetRefusal::Output(key));
    }
    let attr = BufAttr::decode(NvSciBufAttrKey(key), bytes)
        .map_err(|e| SetRefusal::Invalid(format!("buf key {key:#x}: {e}")))?;
    attr.validate()
        .map_err(|e| SetRefusal::Invalid(format!("buf key {key:#x}: {e}")))
}

/// Checks one sync pair for `SetAttrs`.
pub(crate) fn check_sync_pair(key: u32, bytes: &[u8]) -> Result<(), SetRefusal> {
    if sk::OUTPUTS.contains(&key) {
        return Err(SetRefusal::Output(key));
    }
    let attr = SyncAttr::decode(NvSciSyncAttrKey(key), bytes)
        .map_err(|e| SetRefusal::Invalid(format!("sync key {key}: {e}")))?;
    attr.validate()
        .map_err(|e| SetRefusal::Invalid(format!("sync key {key}: {e}")))
}

/// Whether `key` is one `GetAttrs` may ask about.
pub(crate) fn known_key(sync: bool, key: u32) -> bool {
    if sync {
        matches!(key, 1..=10 | 12)
    } else {
        matches!(key, 0x1..=0xb | 0x10000 | 0x10001 | 0x20000..=0x20018)
    }
}

// ---------------------------------------------------------------- reconciliation

/// Why a reconciliation failed.
pub(crate) enum Fail {
    /// The keys in conflict (with a value from one of the lists).
    Conflict(AttrMap),
    /// Something the simulator does not model.
    Unsupported(String),
}

fn conflict(key: u32, value: Box<[u8]>) -> Fail {
    let mut m = AttrMap::new();
    m.insert(key, value);
    Fail::Conflict(m)
}

/// A key every list that sets it must set to the same bytes.
fn same(parts: &[&AttrMap], key: u32, out: &mut AttrMap) -> Result<(), Fail> {
    let mut seen: Option<&[u8]> = None;
    for p in parts {
        if let Some(v) = p.get(&key) {
            match seen {
                None => seen = Some(v),
                Some(s) if s == &**v => {}
                Some(_) => return Err(conflict(key, v.clone())),
            }
        }
    }
    if let Some(v) = seen {
        out.insert(key, v.into());
    }
    Ok(())
}

fn any_true(parts: &[&AttrMap], key: u32, out: &mut AttrMap) {
    if parts.iter().any(|p| p.contains_key(&key)) {
        out.insert(key, enc_bool(parts.iter().any(|p| get_bool(p, key))));
    }
}

fn gpu_union(parts: &[&AttrMap], key: u32, out: &mut AttrMap) {
    let mut ids: Vec<[u8; 16]> = Vec::new();
    for p in parts {
        if let Some(v) = p.get(&key) {
            for c in v.chunks_exact(16) {
                let mut id = [0u8; 16];
                id.copy_from_slice(c);
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
    }
    if !ids.is_empty() {
        out.insert(key, ids.concat().into_boxed_slice());
    }
}

fn required(parts: &[&AttrMap], key: u32, zero: Box<[u8]>) -> Result<(), Fail> {
    if parts.iter().any(|p| p.contains_key(&key)) {
        Ok(())
    } else {
        Err(conflict(key, zero))
    }
}

fn align_up(v: u64, a: u64) -> Option<u64> {
    let a = a.max(1);
    v.checked_add(a - 1).map(|x| x / a * a)
}

/// Reconciles NvSciBuf lists (already flattened into their parts).
///
/// Types intersect (none in common: conflict on Types); sizes and
/// alignments take the largest request; booleans are or-ed; permissions
/// take the strongest request (ActualPerm); GPU ids are united; image keys
/// must agree; the image layout (plane pitch, offsets, sizes) is computed.
pub(crate) fn reconcile_buf(parts: &[&AttrMap]) -> Result<AttrMap, Fail> {
    let mut out = AttrMap::new();
    let mut types: Option<Vec<u32>> = None;
    for p in parts {
        if let Some(v) = p.get(&bk::TYPES) {
            let mine = u32s(v);
            types = Some(match types {
                None => mine,
                Some(t) => t.into_iter().filter(|x| mine.contains(x)).collect(),
            });
            if types.as_ref().is_some_and(Vec::is_empty) {
                return Err(conflict(bk::TYPES, v.clone()));
            }
        }
    }
    let Some(types) = types else {
        return Err(conflict(bk::TYPES, enc_u32s(&[0])));
    };
    if let Some(t) = types.iter().find(|t| !matches!(**t, TYPE_RAW | TYPE_IMAGE)) {
        return Err(Fail::Unsupported(format!(
            "NvSciBufType {t} (only RawBuffer and Image are simulated)"
        )));
    }
    out.insert(bk::TYPES, enc_u32s(&types));
    for k in [bk::NEED_CPU, bk::CPU_CACHE, bk::GPU_CACHE, bk::VPR] {
        any_true(parts, k, &mut out);
    }
    let perm = parts
        .iter()
        .filter_map(|p| get_u32(p, bk::REQ_PERM))
        .max()
        .unwrap_or(BUF_READWRITE);
    out.insert(bk::REQ_PERM, enc_u32s(&[perm]));
    out.insert(bk::ACTUAL_PERM, enc_u32s(&[perm]));
    out.insert(bk::CPU_SW_COH, enc_bool(false));
    out.insert(bk::GPU_SW_COH, enc_bool(false));
    gpu_union(parts, bk::GPU_ID, &mut out);

    if types.contains(&TYPE_RAW) {
        required(parts, bk::RAW_SIZE, enc_u64s(&[0]))?;
        let size = parts
            .iter()
            .filter_map(|p| get_u64(p, bk::RAW_SIZE))
            .max()
            .unwrap_or(0);
        let align = parts
            .iter()
            .filter_map(|p| get_u64(p, bk::RAW_ALIGN))
            .max()
            .unwrap_or(1);
        out.insert(bk::RAW_SIZE, enc_u64s(&[size]));
        out.insert(bk::RAW_ALIGN, enc_u64s(&[align]));
    }
    if types.contains(&TYPE_IMAGE) {
        reconcile_image(parts, &mut out)?;
    }
    Ok(out)
}

fn reconcile_image(parts: &[&AttrMap], out: &mut AttrMap) -> Result<(), Fail> {
    for k in [bk::PLANE_COUNT, bk::COLOR_FMT, bk::WIDTH, bk::HEIGHT] {
        required(parts, k, enc_u32s(&[0]))?;
    }
    for k in [
        bk::LAYOUT,
        bk::PLANE_COUNT,
        bk::COLOR_FMT,
        bk::COLOR_STD,
        bk::WIDTH,
        bk::HEIGHT,
        bk::SCAN,
        bk::IMAGE_COUNT,
    ]
    .into_iter()
    .chain(bk::TOP_PAD..=bk::RIGHT_PAD)
    {
        same(parts, k, out)?;
    }
    let planes = out
        .get(&bk::PLANE_COUNT)
        .map(|v| u32s(v))
        .unwrap_or_default();
    let n = planes.first().copied().unwrap_or(0) as usize;
    let formats = out.get(&bk::COLOR_FMT).map(|v| u32s(v)).unwrap_or_default();
    let widths = out.get(&bk::WIDTH).map(|v| u32s(v)).unwrap_or_default();
    let heights = out.get(&bk::HEIGHT).map(|v| u32s(v)).unwrap_or_default();
    for (k, len) in [
        (bk::COLOR_FMT, formats.len()),
        (bk::WIDTH, widths.len()),
        (bk::HEIGHT, heights.len()),
    ] {
        if len != n {
            return Err(conflict(k, out.get(&k).cloned().unwrap_or_default()));
        }
    }
    // Plane base alignment: the largest request per plane (default 256).
    let mut base_align = vec![256u32; n];
    for p in parts {
        if let Some(v) = p.get(&bk::BASE_ALIGN) {
            for (a, req) in base_align.iter_mut().zip(u32s(v)) {
                *a = (*a).max(req);
            }
        }
    }
    let image_count = out
        .get(&bk::IMAGE_COUNT)
        .and_then(|v| u64s(v).first().copied())
        .unwrap_or(1)
        .max(1);
    let (mut bpp, mut chans, mut pitch, mut aheight, mut offset, mut asize) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut end = 0u64;
    let overflow = || conflict(bk::WIDTH, enc_u32s(&widths));
    for i in 0..n {
        let Some((bits, ch)) = color::layout(formats[i]) else {
            return Err(Fail::Unsupported(format!(
                "colour format {:#x} (see tegra_interop_sim::nvsci::color)",
                formats[i]
            )));
        };
        // Pitch-linear rows, tightly packed; block-linear images get the
        // same linear layout (the simulator does not tile).
        let row = u64::from(widths[i]) * u64::from(bits) / 8;
        let p = u32::try_from(row).map_err(|_| overflow())?;
        let size = row
            .checked_mul(u64::from(heights[i]))
            .ok_or_else(overflow)?;
        let off = align_up(end, u64::from(base_align[i])).ok_or_else(overflow)?;
        end = off.checked_add(size).ok_or_else(overflow)?;
        bpp.push(bits);
        chans.push(ch);
        pitch.push(p);
        aheight.push(heights[i]);
        offset.push(off);
        asize.push(size);
    }
    let align = base_align.iter().copied().max().unwrap_or(1);
    let total = end.checked_mul(image_count).ok_or_else(overflow)?;
    out.insert(bk::BASE_ALIGN, enc_u32s(&base_align));
    out.insert(bk::BPP, enc_u32s(&bpp));
    out.insert(bk::CHANNELS, chans.into_boxed_slice());
    out.insert(bk::PITCH, enc_u32s(&pitch));
    out.insert(bk::ALIGNED_H, enc_u32s(&aheight));
    out.insert(bk::OFFSET, enc_u64s(&offset));
    out.insert(bk::ALIGNED_SIZE, enc_u64s(&asize));
    out.insert(bk::IMG_SIZE, enc_u64s(&[total]));
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
/// Exactly one signaller (a part whose RequiredPerm has the signal bit) and
/// at least one waiter (wait bit), else a conflict on RequiredPerm; a
/// primitive every part that names primitives supports (the signaller's
/// order first), else a conflict on PrimitiveInfo; ActualPerm is the union
/// of the permissions; booleans are or-ed; GPU ids united.
pub(crate) fn reconcile_sync(parts: &[&AttrMap], integrated: bool) -> Result<AttrMap, Fail> {
    let perms: Vec<u64> = parts
        .iter()
        .map(|p| get_u64(p, sk::REQ_PERM).unwrap_or(0))
        .collect();
    let signalers = perms.iter().filter(|p| *p & PERM_SIGNAL != 0).count();
    let waiters = perms.iter().filter(|p| *p & PERM_WAIT != 0).count();
    if signalers != 1 || waiters == 0 {
        let value = parts
            .iter()
            .find_map(|p| p.get(&sk::REQ_PERM).cloned())
            .unwrap_or_else(|| enc_u64s(&[0]));
        return Err(conflict(sk::REQ_PERM, value));
    }
    if parts.iter().any(|p| get_bool(p, sk::TIMESTAMPS)) {
        return Err(Fail::Unsupported(
            "WaiterRequireTimestamps (fence timestamps are not simulated)".into(),
        ));
    }
    let signaler = perms
        .iter()
        .position(|p| *p & PERM_SIGNAL != 0)
        .and_then(|i| parts.get(i));
    let default_order: Vec<u32> = if integrated {
        vec![PRIM_SYNCPOINT, PRIM_SYSMEM_SEMAPHORE, 3, 4, 5]
    } else {
        vec![PRIM_SYSMEM_SEMAPHORE, 4, 3, 5, PRIM_SYNCPOINT]
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
                return Err(conflict(sk::PRIMITIVE, v.clone()));
            }
        }
    }
    let Some(&prim) = candidates.first() else {
        return Err(conflict(sk::PRIMITIVE, enc_u32s(&[0])));
    };
    let max = if prim >= 4 {
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
    for k in [sk::NEED_CPU, sk::CTX_INSENSITIVE, sk::DETERMINISTIC] {
        any_true(parts, k, &mut out);
    }
    gpu_union(parts, sk::GPU_ID, &mut out);
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
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        for (k, v) in p.iter() {
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
