//! What the NvSci rule tests (`nvsci_rules_buf.rs`, `nvsci_rules_sync.rs`, `nvsci_versions.rs`)
//! share: the codes and raw key numbers of the fact sheet, value encodings, the set-up, and
//! [`AttrLib`], one trait over the attribute-list calls of NvSciBuf and NvSciSync so that the
//! create / set / get / reconcile / allocate helpers exist once for both libraries.
//!
//! It re-exports the general NvSci helpers (`nvsci_common/`, with the `call!` macro) as
//! `base`; a test file declares `#[macro_use] mod nvsci_common;` and then this module.
#![allow(dead_code)]

use std::ffi::c_void;
use std::ptr;

use tegra_interop_sim::{FunctionTable, NvSciRelease, Sim, SimConfig};
use tegra_interop_sys::nvsci::*;

// The shared NvSci helpers; every test that uses these rules declares
// `#[macro_use] mod nvsci_common;` before `mod nvsci_rules;`.
pub(crate) use crate::nvsci_common as base;
pub use base::*;

// NvSciError codes the rules expect.
pub const OK: u32 = 0;
pub const NOT_SUPPORTED: u32 = 0x11;
pub const ACCESS_DENIED: u32 = 0x20;
pub const NOT_PERMITTED: u32 = 0x21;
pub const INVALID_OPERATION: u32 = 0x23;
pub const BAD_PARAMETER: u32 = 0x100;
pub const OVERFLOW: u32 = 0x103;
pub const BUSY: u32 = 0x202;
pub const RECONCILIATION_FAILED: u32 = 0x10100;
pub const UNSUPPORTED_CONFIG: u32 = 0x2000001;
pub const CLEARED_FENCE: u32 = 0x2000002;

// Raw key numbers (fact sheet): NvSciBuf.
pub const B_TYPES: u32 = 1;
pub const B_NEED_CPU: u32 = 2;
pub const B_REQ_PERM: u32 = 3;
pub const B_GPU_ID: u32 = 5;
pub const B_ACTUAL_PERM: u32 = 7;
pub const B_GPU_CACHE: u32 = 9;
pub const B_GPU_SW_COH: u32 = 10;
pub const B_GPU_COMPRESSION: u32 = 11;
pub const B_RAW_SIZE: u32 = 0x10000;
pub const B_RAW_ALIGN: u32 = 0x10001;
pub const B_LAYOUT: u32 = 0x20000;
pub const B_IMG_SIZE: u32 = 0x20006;
pub const B_PLANE_COUNT: u32 = 0x20008;
pub const B_COLOR_FMT: u32 = 0x20009;
pub const B_WIDTH: u32 = 0x2000c;
pub const B_HEIGHT: u32 = 0x2000d;
pub const B_SCAN: u32 = 0x2000e;
pub const B_BPP: u32 = 0x2000f;
pub const B_PITCH: u32 = 0x20014;
pub const B_IMAGE_COUNT: u32 = 0x20017;
// NvSciSync.
pub const S_NEED_CPU: u32 = 1;
pub const S_REQ_PERM: u32 = 2;
pub const S_TIMESTAMPS: u32 = 5;
pub const S_DETERMINISTIC: u32 = 6;
pub const S_NUM_TS_SLOTS: u32 = 7;
pub const S_MAX_VALUE: u32 = 9;
pub const S_PRIMITIVE: u32 = 10;
pub const S_GPU_ID: u32 = 12;
pub const S_PEER_HW: u32 = 13;
// Values: buffer types and access permissions.
pub const RAW: u32 = 1;
pub const IMAGE: u32 = 2;
pub const TENSOR: u32 = 3;
pub const READONLY: u32 = 1;
pub const READWRITE: u32 = 3;

/// `v` as the native-endian bytes of a u32 array value.
pub fn u32b(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// `v` as the native-endian bytes of a u64 array value.
pub fn u64b(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// The first u64 of a value read back.
pub fn first_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_ne_bytes(a)
}

/// The first u32 of a value read back.
pub fn first_u32(b: &[u8]) -> u32 {
    u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

/// A GpuCacheability entry: the 16-byte GPU id `gpu`, then the cacheability byte.
pub fn cache_entry(gpu: &[u8], cacheable: u8) -> Vec<u8> {
    [gpu, &[cacheable]].concat()
}

/// A GpuCompression entry: a 16-byte GPU id filled with `gpu`, then the compression type.
pub fn compression_entry(gpu: u8, ty: u32) -> Vec<u8> {
    let mut e = vec![gpu; 16];
    e.extend_from_slice(&ty.to_ne_bytes());
    e
}

/// A Tegra simulator claiming NvSci `release`, CUDA initialised.
pub fn setup_with(release: NvSciRelease) -> (Sim, FunctionTable) {
    setup_with_config(SimConfig::tegra().with_nvsci_release(release))
}

/// A Tegra simulator at the newest modelled NvSci release.
pub fn setup() -> (Sim, FunctionTable) {
    setup_with(NvSciRelease::V6_0_10)
}

/// A `CheckVersionCompatibility` entry point (same signature in both libraries).
pub type VersionFn = Option<unsafe extern "C" fn(u32, u32, *mut bool) -> NvSciError>;

/// An attribute list of library `L`.
pub type List<L> = *mut <L as AttrLib>::ListRec;
/// A module of library `L`.
pub type Module<L> = *mut <L as AttrLib>::ModuleRec;
/// An object of library `L`.
pub type Obj<L> = *mut <L as AttrLib>::ObjRec;

/// The attribute-list calls of one NvSci library. An implementation only names the
/// library's types and table entries; every helper the tests use is a provided method.
pub trait AttrLib {
    type ModuleRec;
    type ListRec;
    type ObjRec;
    /// The library's key/value pair struct.
    type Pair;

    fn pair(key: u32, value: *const c_void, len: usize) -> Self::Pair;
    /// The value pointer and length a GetAttrs call left in `p`.
    fn pair_value(p: &Self::Pair) -> (*const c_void, usize);
    fn open_module(t: &FunctionTable, m: &mut Module<Self>) -> NvSciError;
    fn create_list(t: &FunctionTable, m: Module<Self>, l: &mut List<Self>) -> NvSciError;
    fn set_attrs(t: &FunctionTable, l: List<Self>, pairs: &mut [Self::Pair]) -> NvSciError;
    fn get_attrs(t: &FunctionTable, l: List<Self>, pairs: &mut [Self::Pair]) -> NvSciError;
    fn reconcile_fn(t: &FunctionTable) -> ReconcileFn<Self::ListRec>;
    fn alloc_obj(t: &FunctionTable, rec: List<Self>, o: &mut Obj<Self>) -> NvSciError;
    fn version_fn(t: &FunctionTable) -> VersionFn;

    /// A simulator at the newest modelled release and a module of this library.
    fn setup() -> (Sim, FunctionTable, Module<Self>) {
        let (sim, t) = setup();
        let m = Self::module(&t);
        (sim, t, m)
    }

    /// Opens a module (must succeed).
    fn module(t: &FunctionTable) -> Module<Self> {
        let mut m = ptr::null_mut();
        assert_eq!(Self::open_module(t, &mut m).0, OK);
        m
    }

    /// Creates an empty list (must succeed).
    fn list(t: &FunctionTable, m: Module<Self>) -> List<Self> {
        let mut l = ptr::null_mut();
        assert_eq!(Self::create_list(t, m, &mut l).0, OK);
        l
    }

    /// Creates a list and sets `pairs` on it: (SetAttrs code, list).
    fn list_with(
        t: &FunctionTable,
        m: Module<Self>,
        pairs: &[(u32, Vec<u8>)],
    ) -> (u32, List<Self>) {
        let l = Self::list(t, m);
        (Self::set(t, l, pairs), l)
    }

    /// Creates a list with `pairs` set on it (both must succeed).
    fn list_of(t: &FunctionTable, m: Module<Self>, pairs: &[(u32, Vec<u8>)]) -> List<Self> {
        let (r, l) = Self::list_with(t, m, pairs);
        assert_eq!(r, OK);
        l
    }

    /// One SetAttrs call with `pairs`: its code.
    fn set(t: &FunctionTable, l: List<Self>, pairs: &[(u32, Vec<u8>)]) -> u32 {
        let mut raw = kv_pairs(pairs, Self::pair);
        Self::set_attrs(t, l, &mut raw).0
    }

    /// One GetAttrs call for `key`: the value (`None` when unset), or the error code.
    fn get(t: &FunctionTable, l: List<Self>, key: u32) -> Result<Option<Vec<u8>>, u32> {
        let mut p = [Self::pair(key, ptr::null(), 0)];
        match Self::get_attrs(t, l, &mut p).0 {
            0 => {
                let (value, len) = Self::pair_value(&p[0]);
                Ok(value_copy(value, len))
            }
            r => Err(r),
        }
    }

    /// Reconciles `lists`: (code, reconciled, conflict).
    fn reconcile(t: &FunctionTable, lists: &[List<Self>]) -> (u32, List<Self>, List<Self>) {
        base::reconcile(Self::reconcile_fn(t), lists)
    }

    /// Reconciling `lists` fails with `code`, gives no list and reports a conflict list.
    fn assert_conflict(t: &FunctionTable, lists: &[List<Self>], code: u32) {
        let (r, out, conflict) = Self::reconcile(t, lists);
        assert_eq!(r, code);
        assert!(out.is_null() && !conflict.is_null());
    }

    /// The reconciled list of `lists` (reconciliation must succeed).
    fn reconciled(t: &FunctionTable, lists: &[List<Self>]) -> List<Self> {
        let (r, rec, _) = Self::reconcile(t, lists);
        assert_eq!(r, OK);
        rec
    }

    /// The value of `key` in the reconciled list of `lists` (reconciliation and GetAttrs
    /// must succeed).
    fn reconciled_value(t: &FunctionTable, lists: &[List<Self>], key: u32) -> Option<Vec<u8>> {
        Self::get(t, Self::reconciled(t, lists), key).unwrap()
    }

    /// Allocates an object from the reconciled list `rec` (must succeed).
    fn alloc(t: &FunctionTable, rec: List<Self>) -> Obj<Self> {
        let mut o = ptr::null_mut();
        assert_eq!(Self::alloc_obj(t, rec, &mut o).0, OK);
        o
    }

    /// Reconciles `lists` and allocates an object from the result (both must succeed).
    fn obj(t: &FunctionTable, lists: &[List<Self>]) -> Obj<Self> {
        Self::alloc(t, Self::reconciled(t, lists))
    }

    /// CheckVersionCompatibility(`major`, `minor`, `out`): its code.
    fn check_version(t: &FunctionTable, major: u32, minor: u32, out: *mut bool) -> u32 {
        let f = Self::version_fn(t).expect("CheckVersionCompatibility missing from the table");
        // SAFETY: `out` is either valid for a bool write or NULL (which the call must refuse).
        unsafe { f(major, minor, out) }.0
    }

    /// CheckVersionCompatibility answers OK and writes `expect`. The flag starts as the
    /// opposite answer, so a call that leaves it untouched fails.
    fn assert_compatible(t: &FunctionTable, major: u32, minor: u32, expect: bool) {
        let mut ok = !expect;
        assert_eq!(Self::check_version(t, major, minor, &mut ok), OK);
        assert_eq!(ok, expect, "{major}.{minor}");
    }
}

/// NvSciBuf.
pub struct SciBuf;

impl AttrLib for SciBuf {
    type ModuleRec = NvSciBufModuleRec;
    type ListRec = NvSciBufAttrListRec;
    type ObjRec = NvSciBufObjRefRec;
    type Pair = NvSciBufAttrKeyValuePair;

    fn pair(key: u32, value: *const c_void, len: usize) -> Self::Pair {
        let key = NvSciBufAttrKey(key);
        NvSciBufAttrKeyValuePair { key, value, len }
    }
    fn pair_value(p: &Self::Pair) -> (*const c_void, usize) {
        (p.value, p.len)
    }
    fn open_module(t: &FunctionTable, m: &mut NvSciBufModule) -> NvSciError {
        call!(t.nvscibuf, NvSciBufModuleOpen(m))
    }
    fn create_list(t: &FunctionTable, m: NvSciBufModule, l: &mut NvSciBufAttrList) -> NvSciError {
        call!(t.nvscibuf, NvSciBufAttrListCreate(m, l))
    }
    fn set_attrs(t: &FunctionTable, l: NvSciBufAttrList, pairs: &mut [Self::Pair]) -> NvSciError {
        let (p, n) = (pairs.as_mut_ptr(), pairs.len());
        call!(t.nvscibuf, NvSciBufAttrListSetAttrs(l, p, n))
    }
    fn get_attrs(t: &FunctionTable, l: NvSciBufAttrList, pairs: &mut [Self::Pair]) -> NvSciError {
        let (p, n) = (pairs.as_mut_ptr(), pairs.len());
        call!(t.nvscibuf, NvSciBufAttrListGetAttrs(l, p, n))
    }
    fn reconcile_fn(t: &FunctionTable) -> ReconcileFn<Self::ListRec> {
        t.nvscibuf.NvSciBufAttrListReconcile
    }
    fn alloc_obj(t: &FunctionTable, rec: NvSciBufAttrList, o: &mut NvSciBufObj) -> NvSciError {
        call!(t.nvscibuf, NvSciBufObjAlloc(rec, o))
    }
    fn version_fn(t: &FunctionTable) -> VersionFn {
        t.nvscibuf.NvSciBufCheckVersionCompatibility
    }
}

/// NvSciSync.
pub struct SciSync;

impl AttrLib for SciSync {
    type ModuleRec = NvSciSyncModuleRec;
    type ListRec = NvSciSyncAttrListRec;
    type ObjRec = NvSciSyncObjRec;
    type Pair = NvSciSyncAttrKeyValuePair;

    fn pair(key: u32, value: *const c_void, len: usize) -> Self::Pair {
        NvSciSyncAttrKeyValuePair {
            attrKey: NvSciSyncAttrKey(key),
            value,
            len,
        }
    }
    fn pair_value(p: &Self::Pair) -> (*const c_void, usize) {
        (p.value, p.len)
    }
    fn open_module(t: &FunctionTable, m: &mut NvSciSyncModule) -> NvSciError {
        call!(t.nvscisync, NvSciSyncModuleOpen(m))
    }
    fn create_list(t: &FunctionTable, m: NvSciSyncModule, l: &mut NvSciSyncAttrList) -> NvSciError {
        call!(t.nvscisync, NvSciSyncAttrListCreate(m, l))
    }
    fn set_attrs(t: &FunctionTable, l: NvSciSyncAttrList, pairs: &mut [Self::Pair]) -> NvSciError {
        // SetAttrs of NvSciSync takes the pairs as const.
        let (p, n) = (pairs.as_ptr(), pairs.len());
        call!(t.nvscisync, NvSciSyncAttrListSetAttrs(l, p, n))
    }
    fn get_attrs(t: &FunctionTable, l: NvSciSyncAttrList, pairs: &mut [Self::Pair]) -> NvSciError {
        let (p, n) = (pairs.as_mut_ptr(), pairs.len());
        call!(t.nvscisync, NvSciSyncAttrListGetAttrs(l, p, n))
    }
    fn reconcile_fn(t: &FunctionTable) -> ReconcileFn<Self::ListRec> {
        t.nvscisync.NvSciSyncAttrListReconcile
    }
    fn alloc_obj(t: &FunctionTable, rec: NvSciSyncAttrList, o: &mut NvSciSyncObj) -> NvSciError {
        call!(t.nvscisync, NvSciSyncObjAlloc(rec, o))
    }
    fn version_fn(t: &FunctionTable) -> VersionFn {
        t.nvscisync.NvSciSyncCheckVersionCompatibility
    }
}

// ---------------------------------------------------------------- sync objects and fences

/// RequiredPerm of a waiter.
pub const WAIT: u64 = 1;
/// RequiredPerm of a signaller.
pub const SIGNAL: u64 = 2;

/// The RequiredPerm pair for `perm`.
pub fn req_perm(perm: u64) -> (u32, Vec<u8>) {
    (S_REQ_PERM, u64b(&[perm]))
}

/// A CPU signaller list and a CPU waiter list, both with PrimitiveInfo `prims` if given.
pub fn cpu_pair(
    t: &FunctionTable,
    m: NvSciSyncModule,
    prims: Option<&[u32]>,
) -> [NvSciSyncAttrList; 2] {
    let mut s = vec![(S_NEED_CPU, vec![1]), req_perm(SIGNAL)];
    let mut w = vec![(S_NEED_CPU, vec![1]), req_perm(WAIT)];
    if let Some(p) = prims {
        s.push((S_PRIMITIVE, u32b(p)));
        w.push((S_PRIMITIVE, u32b(p)));
    }
    [SciSync::list_of(t, m, &s), SciSync::list_of(t, m, &w)]
}

/// A CPU wait context of module `m` (must succeed).
pub fn cpu_wait_context(t: &FunctionTable, m: NvSciSyncModule) -> NvSciSyncCpuWaitContext {
    let mut ctx = ptr::null_mut();
    assert_eq!(
        call!(t.nvscisync, NvSciSyncCpuWaitContextAlloc(m, &mut ctx)).0,
        OK
    );
    ctx
}

/// The next fence of `o` (GenerateFence must succeed).
pub fn generate_fence(t: &FunctionTable, o: NvSciSyncObj) -> NvSciSyncFence {
    let mut f = NvSciSyncFence::default();
    assert_eq!(
        call!(t.nvscisync, NvSciSyncObjGenerateFence(o, &mut f)).0,
        OK
    );
    f
}

/// A CPU signal of `o`: its code.
pub fn obj_signal(t: &FunctionTable, o: NvSciSyncObj) -> u32 {
    call!(t.nvscisync, NvSciSyncObjSignal(o)).0
}

/// UpdateFence(`o`, `id`, `value`) into `f`: its code.
pub fn update_fence(
    t: &FunctionTable,
    o: NvSciSyncObj,
    id: u64,
    value: u64,
    f: &mut NvSciSyncFence,
) -> u32 {
    call!(t.nvscisync, NvSciSyncFenceUpdateFence(o, id, value, f)).0
}

/// A CPU wait for `f` with `timeout_us`: its code.
pub fn fence_wait(
    t: &FunctionTable,
    f: &NvSciSyncFence,
    ctx: NvSciSyncCpuWaitContext,
    timeout_us: i64,
) -> u32 {
    call!(t.nvscisync, NvSciSyncFenceWait(f, ctx, timeout_us)).0
}
