//! The NvSci rules of the fact sheet ("Checked against the real headers"),
//! one test per rule, each calling the simulator's C entry points directly
//! with raw key/value pairs and expecting the real library's documented code.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::ffi::c_void;
use std::ptr;

use tegra_interop_sim::nvsci::{color, IpcConfigFile};
use tegra_interop_sim::FunctionTable;
use tegra_interop_sim::{DiagnosticKind, NvSciRelease, Sim, SimConfig};
use tegra_interop_sys::nvsci::*;

#[path = "common/nvsci.rs"]
#[macro_use]
mod nvsci_common;
use nvsci_common::*;

const OK: u32 = 0;
const NOT_SUPPORTED: u32 = 0x11;
const ACCESS_DENIED: u32 = 0x20;
const NOT_PERMITTED: u32 = 0x21;
const INVALID_OPERATION: u32 = 0x23;
const BAD_PARAMETER: u32 = 0x100;
const OVERFLOW: u32 = 0x103;
const BUSY: u32 = 0x202;
const RECONCILIATION_FAILED: u32 = 0x10100;
const UNSUPPORTED_CONFIG: u32 = 0x2000001;
const CLEARED_FENCE: u32 = 0x2000002;

// Raw key numbers (fact sheet).
const B_TYPES: u32 = 1;
const B_NEED_CPU: u32 = 2;
const B_REQ_PERM: u32 = 3;
const B_GPU_ID: u32 = 5;
const B_ACTUAL_PERM: u32 = 7;
const B_GPU_CACHE: u32 = 9;
const B_GPU_SW_COH: u32 = 10;
const B_GPU_COMPRESSION: u32 = 11;
const B_RAW_SIZE: u32 = 0x10000;
const B_RAW_ALIGN: u32 = 0x10001;
const B_LAYOUT: u32 = 0x20000;
const B_IMG_SIZE: u32 = 0x20006;
const B_PLANE_COUNT: u32 = 0x20008;
const B_COLOR_FMT: u32 = 0x20009;
const B_WIDTH: u32 = 0x2000c;
const B_HEIGHT: u32 = 0x2000d;
const B_SCAN: u32 = 0x2000e;
const B_BPP: u32 = 0x2000f;
const B_PITCH: u32 = 0x20014;
const B_IMAGE_COUNT: u32 = 0x20017;
const S_NEED_CPU: u32 = 1;
const S_REQ_PERM: u32 = 2;
const S_TIMESTAMPS: u32 = 5;
const S_DETERMINISTIC: u32 = 6;
const S_NUM_TS_SLOTS: u32 = 7;
const S_MAX_VALUE: u32 = 9;
const S_PRIMITIVE: u32 = 10;
const S_GPU_ID: u32 = 12;
const S_PEER_HW: u32 = 13;
const RAW: u32 = 1;
const IMAGE: u32 = 2;
const TENSOR: u32 = 3;
const READONLY: u32 = 1;
const READWRITE: u32 = 3;

fn u32b(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}
fn u64b(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}
fn first_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_ne_bytes(a)
}
fn first_u32(b: &[u8]) -> u32 {
    u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

fn setup_with(release: NvSciRelease) -> (Sim, FunctionTable) {
    setup_with_config(SimConfig::tegra().with_nvsci_release(release))
}
fn setup() -> (Sim, FunctionTable) {
    setup_with(NvSciRelease::V6_0_10)
}

// ---------------------------------------------------------------- buf helpers

fn bmod(t: &FunctionTable) -> NvSciBufModule {
    let mut m = ptr::null_mut();
    assert_eq!(call!(t.nvscibuf, NvSciBufModuleOpen(&mut m)).0, 0);
    m
}
fn blist(t: &FunctionTable, m: NvSciBufModule) -> NvSciBufAttrList {
    let mut l = ptr::null_mut();
    assert_eq!(call!(t.nvscibuf, NvSciBufAttrListCreate(m, &mut l)).0, 0);
    l
}
fn bset(t: &FunctionTable, l: NvSciBufAttrList, pairs: &[(u32, Vec<u8>)]) -> u32 {
    let mut raw = kv_pairs(pairs, |k, value, len| NvSciBufAttrKeyValuePair {
        key: NvSciBufAttrKey(k),
        value,
        len,
    });
    call!(
        t.nvscibuf,
        NvSciBufAttrListSetAttrs(l, raw.as_mut_ptr(), raw.len())
    )
    .0
}
fn bget(t: &FunctionTable, l: NvSciBufAttrList, key: u32) -> Result<Option<Vec<u8>>, u32> {
    let mut p = NvSciBufAttrKeyValuePair {
        key: NvSciBufAttrKey(key),
        value: ptr::null(),
        len: 0,
    };
    match call!(t.nvscibuf, NvSciBufAttrListGetAttrs(l, &mut p, 1)).0 {
        0 => Ok(value_copy(p.value, p.len)),
        r => Err(r),
    }
}
/// Reconciles: (code, reconciled, conflict).
fn brec(
    t: &FunctionTable,
    lists: &[NvSciBufAttrList],
) -> (u32, NvSciBufAttrList, NvSciBufAttrList) {
    reconcile(t.nvscibuf.NvSciBufAttrListReconcile, lists)
}
fn raw_list(t: &FunctionTable, m: NvSciBufModule, size: u64) -> NvSciBufAttrList {
    let l = blist(t, m);
    assert_eq!(
        bset(
            t,
            l,
            &[
                (B_TYPES, u32b(&[RAW])),
                (B_RAW_SIZE, u64b(&[size])),
                (B_NEED_CPU, vec![1]),
                (B_REQ_PERM, u32b(&[READWRITE])),
            ]
        ),
        OK
    );
    l
}
fn image_pairs(format: u32, w: u32, h: u32) -> Vec<(u32, Vec<u8>)> {
    vec![
        (B_TYPES, u32b(&[IMAGE])),
        (B_LAYOUT, u32b(&[1])),
        (B_SCAN, u32b(&[0])),
        (B_PLANE_COUNT, u32b(&[1])),
        (B_COLOR_FMT, u32b(&[format])),
        (B_WIDTH, u32b(&[w])),
        (B_HEIGHT, u32b(&[h])),
    ]
}
fn balloc(t: &FunctionTable, l: NvSciBufAttrList) -> NvSciBufObj {
    let mut o = ptr::null_mut();
    assert_eq!(call!(t.nvscibuf, NvSciBufObjAlloc(l, &mut o)).0, 0);
    o
}

// ---------------------------------------------------------------- buf: SetAttrs

#[test]
fn buf_setattrs_each_key_at_most_once_per_list() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let l = blist(&t, m);
    // Twice in one call.
    assert_eq!(
        bset(&t, l, &[(B_TYPES, u32b(&[RAW])), (B_TYPES, u32b(&[RAW]))]),
        BAD_PARAMETER
    );
    // Nothing of the refused call was stored.
    assert_eq!(bset(&t, l, &[(B_TYPES, u32b(&[RAW]))]), OK);
    // Again in a later call.
    assert_eq!(bset(&t, l, &[(B_TYPES, u32b(&[RAW]))]), BAD_PARAMETER);
}

#[test]
fn buf_setattrs_refuses_output_only_keys() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let l = blist(&t, m);
    assert_eq!(bset(&t, l, &[(B_TYPES, u32b(&[IMAGE]))]), OK);
    assert_eq!(
        bset(&t, l, &[(B_ACTUAL_PERM, u32b(&[READWRITE]))]),
        BAD_PARAMETER
    );
    assert_eq!(bset(&t, l, &[(B_GPU_SW_COH, vec![0; 17])]), BAD_PARAMETER);
    assert_eq!(bset(&t, l, &[(B_IMG_SIZE, u64b(&[4096]))]), BAD_PARAMETER);
    assert_eq!(bset(&t, l, &[(B_PITCH, u32b(&[256]))]), BAD_PARAMETER);
}

#[test]
fn buf_setattrs_key_buffer_type_must_be_in_types() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    // Before Types: refused (Types must come first or in the same call).
    let l = blist(&t, m);
    assert_eq!(bset(&t, l, &[(B_RAW_SIZE, u64b(&[4096]))]), BAD_PARAMETER);
    // In the same call, in either order: accepted.
    assert_eq!(
        bset(
            &t,
            l,
            &[(B_RAW_SIZE, u64b(&[4096])), (B_TYPES, u32b(&[RAW]))]
        ),
        OK
    );
    // An image key on a RawBuffer list: refused.
    assert_eq!(bset(&t, l, &[(B_LAYOUT, u32b(&[1]))]), BAD_PARAMETER);
}

#[test]
fn buf_setattrs_imported_lists_are_read_only() {
    let cfg = IpcConfigFile::inter_process(&[("a", "b", 16, 4096)]).unwrap();
    let (_sim, t) = setup_with_config(SimConfig::tegra().with_nvsciipc_config(cfg.path()));
    assert_eq!(call!(t.nvsciipc, NvSciIpcInit()).0, 0);
    let (mut ea, mut eb) = (0u64, 0u64);
    assert_eq!(
        call!(t.nvsciipc, NvSciIpcOpenEndpoint(c"a".as_ptr(), &mut ea)).0,
        0
    );
    assert_eq!(
        call!(t.nvsciipc, NvSciIpcOpenEndpoint(c"b".as_ptr(), &mut eb)).0,
        0
    );
    let m = bmod(&t);
    let l = raw_list(&t, m, 4096);
    let (mut desc, mut len) = (ptr::null_mut::<c_void>(), 0usize);
    assert_eq!(
        call!(
            t.nvscibuf,
            NvSciBufAttrListIpcExportUnreconciled([l].as_ptr(), 1, ea, &mut desc, &mut len)
        )
        .0,
        0
    );
    let mut imported = ptr::null_mut();
    assert_eq!(
        call!(
            t.nvscibuf,
            NvSciBufAttrListIpcImportUnreconciled(m, eb, desc, len, &mut imported)
        )
        .0,
        0
    );
    assert_eq!(
        bset(&t, imported, &[(B_GPU_ID, vec![7; 16])]),
        BAD_PARAMETER
    );
    call!(t.nvscibuf, NvSciBufAttrListFreeDesc(desc));
}

#[test]
fn buf_gpu_cache_values_are_17_byte_gpu_entries() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let l = blist(&t, m);
    // A 1-byte bool (the old, wrong value type): BadParameter.
    assert_eq!(bset(&t, l, &[(B_GPU_CACHE, vec![1])]), BAD_PARAMETER);
    assert_eq!(bset(&t, l, &[(B_GPU_CACHE, vec![0; 16])]), BAD_PARAMETER);
    assert_eq!(bset(&t, l, &[(B_GPU_CACHE, vec![0; 18])]), BAD_PARAMETER);
    // Cacheability byte other than 0/1.
    let mut e = vec![0u8; 17];
    e[16] = 2;
    assert_eq!(bset(&t, l, &[(B_GPU_CACHE, e)]), BAD_PARAMETER);
    let mut e = vec![0u8; 17];
    e[16] = 1;
    assert_eq!(bset(&t, l, &[(B_GPU_CACHE, e)]), OK);
}

#[test]
fn buf_gpu_sw_need_cache_coherency_is_output_only() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let l = blist(&t, m);
    let mut e = vec![0u8; 17];
    e[16] = 1;
    assert_eq!(bset(&t, l, &[(B_GPU_SW_COH, e)]), BAD_PARAMETER);
    // And not readable from an unreconciled list.
    assert_eq!(bget(&t, l, B_GPU_SW_COH), Err(BAD_PARAMETER));
}

#[test]
fn buf_gpu_compression_values_are_20_byte_entries_and_none_is_not_settable() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let l = blist(&t, m);
    let entry = |ty: u32| {
        let mut e = vec![3u8; 16];
        e.extend_from_slice(&ty.to_ne_bytes());
        e
    };
    assert_eq!(
        bset(&t, l, &[(B_GPU_COMPRESSION, vec![0; 17])]),
        BAD_PARAMETER
    );
    assert_eq!(bset(&t, l, &[(B_GPU_COMPRESSION, entry(0))]), BAD_PARAMETER);
    assert_eq!(bset(&t, l, &[(B_GPU_COMPRESSION, entry(1))]), OK);
}

#[test]
fn buf_colour_formats_are_the_real_enum_values() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    assert_eq!(color::A8B8G8R8, 106);
    assert_eq!(color::R8G8B8A8, 106);
    assert_eq!((color::Y8, color::U8V8, color::B8G8R8A8), (84, 74, 104));
    // A8B8G8R8 (106) is 32 bits per pixel: pitch = 4 x width.
    let l = blist(&t, m);
    assert_eq!(bset(&t, l, &image_pairs(106, 64, 8)), OK);
    let (r, rec, _) = brec(&t, &[l]);
    assert_eq!(r, OK);
    assert_eq!(first_u32(&bget(&t, rec, B_BPP).unwrap().unwrap()), 32);
    assert_eq!(first_u32(&bget(&t, rec, B_PITCH).unwrap().unwrap()), 256);
    assert!(first_u64(&bget(&t, rec, B_IMG_SIZE).unwrap().unwrap()) >= 256 * 8);
    // The simulator's former private numbers are no colour format at all.
    let l2 = blist(&t, m);
    let mut p = image_pairs(0x5153_0003, 64, 8);
    p.truncate(5);
    assert_eq!(bset(&t, l2, &p[..4]), OK);
    assert_eq!(bset(&t, l2, &p[4..]), BAD_PARAMETER);
    // 0 is the enum's lower bound, not a format.
    assert_eq!(bset(&t, l2, &[(B_COLOR_FMT, u32b(&[0]))]), BAD_PARAMETER);
}

// ---------------------------------------------------------------- buf: GetAttrs

#[test]
fn buf_getattrs_output_only_keys_fail_on_unreconciled_lists() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let l = raw_list(&t, m, 4096);
    assert_eq!(bget(&t, l, B_ACTUAL_PERM), Err(BAD_PARAMETER));
    assert_eq!(bget(&t, l, B_IMG_SIZE), Err(BAD_PARAMETER));
    // An input key is fine.
    assert_eq!(bget(&t, l, B_RAW_SIZE).unwrap(), Some(u64b(&[4096])));
}

#[test]
fn buf_getattrs_input_only_keys_fail_on_reconciled_lists() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let l = raw_list(&t, m, 4096);
    let (r, rec, _) = brec(&t, &[l]);
    assert_eq!(r, OK);
    assert_eq!(bget(&t, rec, B_REQ_PERM), Err(BAD_PARAMETER));
    assert!(bget(&t, rec, B_ACTUAL_PERM).unwrap().is_some());
}

#[test]
fn buf_obj_attr_list_is_read_only_and_freeing_it_is_a_diagnostic() {
    let (sim, t) = setup();
    let m = bmod(&t);
    let l = raw_list(&t, m, 4096);
    let (_, rec, _) = brec(&t, &[l]);
    let o = balloc(&t, rec);
    let mut ol = ptr::null_mut();
    assert_eq!(call!(t.nvscibuf, NvSciBufObjGetAttrList(o, &mut ol)).0, 0);
    assert_eq!(bset(&t, ol, &[(B_GPU_ID, vec![1; 16])]), BAD_PARAMETER);
    let _ = sim.take_diagnostics();
    call!(t.nvscibuf, NvSciBufAttrListFree(ol));
    assert!(sim
        .take_diagnostics()
        .iter()
        .any(|d| d.kind == DiagnosticKind::Misuse && d.message.contains("ObjGetAttrList")));
    // Still the object's, still readable.
    assert!(bget(&t, ol, B_RAW_SIZE).unwrap().is_some());
}

// ---------------------------------------------------------------- buf: reconcile

#[test]
fn buf_reconcile_types_is_mandatory_in_every_list() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let a = raw_list(&t, m, 4096);
    let b = blist(&t, m);
    assert_eq!(bset(&t, b, &[(B_NEED_CPU, vec![1])]), OK);
    assert_eq!(brec(&t, &[a, b]).0, BAD_PARAMETER);
}

#[test]
fn buf_reconcile_types_must_agree() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let a = raw_list(&t, m, 4096);
    let b = blist(&t, m);
    assert_eq!(bset(&t, b, &image_pairs(color::Y8, 64, 64)), OK);
    let (r, out, conflict) = brec(&t, &[a, b]);
    assert_eq!(r, RECONCILIATION_FAILED);
    assert!(out.is_null() && !conflict.is_null());
    // {RawBuffer} against {RawBuffer, Image}: not the one allowed mix.
    let c = blist(&t, m);
    assert_eq!(bset(&t, c, &[(B_TYPES, u32b(&[RAW, IMAGE]))]), OK);
    assert_eq!(brec(&t, &[a, c]).0, RECONCILIATION_FAILED);
}

#[test]
fn buf_reconcile_only_image_and_tensor_may_mix() {
    let (sim, t) = setup();
    let m = bmod(&t);
    let a = blist(&t, m);
    assert_eq!(bset(&t, a, &image_pairs(color::Y8, 64, 64)), OK);
    let b = blist(&t, m);
    assert_eq!(bset(&t, b, &[(B_TYPES, u32b(&[IMAGE, TENSOR]))]), OK);
    // Allowed by the rule, so not a reconciliation failure; the simulator
    // does not model tensors and says so.
    let _ = sim.take_diagnostics();
    assert_eq!(brec(&t, &[a, b]).0, NOT_SUPPORTED);
    assert!(sim
        .take_diagnostics()
        .iter()
        .any(|d| d.kind == DiagnosticKind::Unimplemented));
}

#[test]
fn buf_reconcile_raw_size_is_mandatory() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let l = blist(&t, m);
    assert_eq!(bset(&t, l, &[(B_TYPES, u32b(&[RAW]))]), OK);
    assert_eq!(brec(&t, &[l]).0, BAD_PARAMETER);
}

#[test]
fn buf_raw_size_must_be_greater_than_zero() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let l = blist(&t, m);
    assert_eq!(
        bset(&t, l, &[(B_TYPES, u32b(&[RAW])), (B_RAW_SIZE, u64b(&[0]))]),
        BAD_PARAMETER
    );
}

#[test]
fn buf_reconcile_raw_sizes_must_be_equal_not_the_max() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let a = raw_list(&t, m, 8192);
    let b = raw_list(&t, m, 4096);
    let (r, out, conflict) = brec(&t, &[a, b]);
    assert_eq!(r, RECONCILIATION_FAILED);
    assert!(out.is_null() && !conflict.is_null());
    let c = raw_list(&t, m, 8192);
    let (r, out, _) = brec(&t, &[a, c]);
    assert_eq!(r, OK);
    assert_eq!(bget(&t, out, B_RAW_SIZE).unwrap(), Some(u64b(&[8192])));
}

#[test]
fn buf_raw_align_is_a_power_of_two_and_the_max_is_taken() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let a = raw_list(&t, m, 4096);
    assert_eq!(bset(&t, a, &[(B_RAW_ALIGN, u64b(&[48]))]), BAD_PARAMETER);
    assert_eq!(bset(&t, a, &[(B_RAW_ALIGN, u64b(&[64]))]), OK);
    let b = raw_list(&t, m, 4096);
    assert_eq!(bset(&t, b, &[(B_RAW_ALIGN, u64b(&[1024]))]), OK);
    let (r, out, _) = brec(&t, &[a, b]);
    assert_eq!(r, OK);
    assert_eq!(bget(&t, out, B_RAW_ALIGN).unwrap(), Some(u64b(&[1024])));
}

#[test]
fn buf_reconcile_image_layout_and_scan_type_are_mandatory() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    for missing in [
        B_LAYOUT,
        B_SCAN,
        B_PLANE_COUNT,
        B_COLOR_FMT,
        B_WIDTH,
        B_HEIGHT,
    ] {
        let l = blist(&t, m);
        let pairs: Vec<_> = image_pairs(color::A8B8G8R8, 32, 32)
            .into_iter()
            .filter(|(k, _)| *k != missing)
            .collect();
        assert_eq!(bset(&t, l, &pairs), OK);
        assert_eq!(brec(&t, &[l]).0, BAD_PARAMETER, "without key {missing:#x}");
    }
}

#[test]
fn buf_image_plane_count_is_1_to_3_and_image_count_is_1() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let l = blist(&t, m);
    assert_eq!(bset(&t, l, &[(B_TYPES, u32b(&[IMAGE]))]), OK);
    assert_eq!(bset(&t, l, &[(B_PLANE_COUNT, u32b(&[0]))]), BAD_PARAMETER);
    assert_eq!(bset(&t, l, &[(B_PLANE_COUNT, u32b(&[4]))]), BAD_PARAMETER);
    assert_eq!(bset(&t, l, &[(B_IMAGE_COUNT, u64b(&[2]))]), BAD_PARAMETER);
    assert_eq!(bset(&t, l, &[(B_IMAGE_COUNT, u64b(&[1]))]), OK);
}

#[test]
fn buf_reconcile_gpu_id_is_the_union() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let a = raw_list(&t, m, 4096);
    let b = raw_list(&t, m, 4096);
    assert_eq!(bset(&t, a, &[(B_GPU_ID, vec![1; 16])]), OK);
    assert_eq!(
        bset(&t, b, &[(B_GPU_ID, [vec![2; 16], vec![1; 16]].concat())]),
        OK
    );
    let (r, out, _) = brec(&t, &[a, b]);
    assert_eq!(r, OK);
    assert_eq!(
        bget(&t, out, B_GPU_ID).unwrap(),
        Some([vec![1; 16], vec![2; 16]].concat())
    );
}

#[test]
fn buf_actual_perm_defaults_to_readonly_and_an_allocated_object_gets_readwrite() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let l = blist(&t, m);
    assert_eq!(
        bset(
            &t,
            l,
            &[(B_TYPES, u32b(&[RAW])), (B_RAW_SIZE, u64b(&[4096]))]
        ),
        OK
    );
    let (r, rec, _) = brec(&t, &[l]);
    assert_eq!(r, OK);
    assert_eq!(
        bget(&t, rec, B_ACTUAL_PERM).unwrap(),
        Some(u32b(&[READONLY]))
    );
    let o = balloc(&t, rec);
    let mut ol = ptr::null_mut();
    assert_eq!(call!(t.nvscibuf, NvSciBufObjGetAttrList(o, &mut ol)).0, 0);
    assert_eq!(
        bget(&t, ol, B_ACTUAL_PERM).unwrap(),
        Some(u32b(&[READWRITE]))
    );
}

#[test]
fn buf_gpu_cache_reconciles_by_and_for_the_igpu_in_gpu_id() {
    let (_sim, t) = setup();
    // The simulated iGPU's UUID, as CUDA reports it.
    let mut uuid = tegra_interop_sys::cuda::CUuuid_st::default();
    assert_eq!(call!(t.cuda, cuDeviceGetUuid_v2(&mut uuid, 0)).0, 0);
    let id: Vec<u8> = uuid.bytes.iter().map(|b| *b as u8).collect();
    let m = bmod(&t);
    let a = raw_list(&t, m, 4096);
    let b = raw_list(&t, m, 4096);
    assert_eq!(bset(&t, a, &[(B_GPU_ID, id.clone())]), OK);
    // b turns caching off; a leaves the default (true for a Tegra iGPU).
    assert_eq!(
        bset(&t, b, &[(B_GPU_CACHE, [id.clone(), vec![0]].concat())]),
        OK
    );
    let (r, out, _) = brec(&t, &[a, b]);
    assert_eq!(r, OK);
    assert_eq!(
        bget(&t, out, B_GPU_CACHE).unwrap(),
        Some([id.clone(), vec![0]].concat())
    );
    // An entry for a GPU that is not in GpuId: reconciliation failure.
    let c = raw_list(&t, m, 4096);
    assert_eq!(
        bset(&t, c, &[(B_GPU_CACHE, [vec![9; 16], vec![1]].concat())]),
        OK
    );
    assert_eq!(brec(&t, &[a, c]).0, RECONCILIATION_FAILED);
}

#[test]
fn buf_reconcile_refuses_a_list_given_twice_and_a_null_conflict_pointer() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let a = raw_list(&t, m, 4096);
    assert_eq!(brec(&t, &[a, a]).0, BAD_PARAMETER);
    let mut out = ptr::null_mut();
    assert_eq!(
        call!(
            t.nvscibuf,
            NvSciBufAttrListReconcile([a].as_ptr(), 1, &mut out, ptr::null_mut())
        )
        .0,
        BAD_PARAMETER
    );
}

// ---------------------------------------------------------------- buf: objects

#[test]
fn buf_cpu_ptr_needs_need_cpu_access_and_readwrite() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let no_cpu = blist(&t, m);
    assert_eq!(
        bset(
            &t,
            no_cpu,
            &[(B_TYPES, u32b(&[RAW])), (B_RAW_SIZE, u64b(&[4096]))]
        ),
        OK
    );
    let (_, rec, _) = brec(&t, &[no_cpu]);
    let o = balloc(&t, rec);
    let mut p: *mut c_void = ptr::null_mut();
    assert_eq!(
        call!(t.nvscibuf, NvSciBufObjGetCpuPtr(o, &mut p)).0,
        BAD_PARAMETER
    );
    let cpu = raw_list(&t, m, 4096);
    let (_, rec, _) = brec(&t, &[cpu]);
    let o = balloc(&t, rec);
    let mut ro = ptr::null_mut();
    assert_eq!(
        call!(
            t.nvscibuf,
            NvSciBufObjDupWithReducePerm(o, NvSciBufAttrValAccessPerm(READONLY), &mut ro)
        )
        .0,
        0
    );
    assert_eq!(
        call!(t.nvscibuf, NvSciBufObjGetCpuPtr(ro, &mut p)).0,
        BAD_PARAMETER
    );
    let mut cp: *const c_void = ptr::null();
    assert_eq!(
        call!(t.nvscibuf, NvSciBufObjGetConstCpuPtr(ro, &mut cp)).0,
        OK
    );
    assert_eq!(call!(t.nvscibuf, NvSciBufObjGetCpuPtr(o, &mut p)).0, OK);
}

#[test]
fn buf_flush_cpu_cache_range_needs_len_and_bounds() {
    let (_sim, t) = setup();
    let m = bmod(&t);
    let l = raw_list(&t, m, 4096);
    let (_, rec, _) = brec(&t, &[l]);
    let o = balloc(&t, rec);
    assert_eq!(
        call!(t.nvscibuf, NvSciBufObjFlushCpuCacheRange(o, 0, 0)).0,
        BAD_PARAMETER
    );
    assert_eq!(
        call!(t.nvscibuf, NvSciBufObjFlushCpuCacheRange(o, 4000, 97)).0,
        BAD_PARAMETER
    );
    assert_eq!(
        call!(t.nvscibuf, NvSciBufObjFlushCpuCacheRange(o, u64::MAX, 2)).0,
        BAD_PARAMETER
    );
    assert_eq!(
        call!(t.nvscibuf, NvSciBufObjFlushCpuCacheRange(o, 4000, 96)).0,
        OK
    );
}

/// Two simulators (the two processes) connected by an established endpoint pair.
struct Peers {
    a: (Sim, FunctionTable, u64),
    b: (Sim, FunctionTable, u64),
    _cfg: IpcConfigFile,
}
fn peers() -> Peers {
    let cfg = IpcConfigFile::inter_process(&[("a", "b", 16, 4096)]).unwrap();
    let mk = || setup_with_config(SimConfig::tegra().with_nvsciipc_config(cfg.path()));
    let (sa, ta) = mk();
    let (sb, tb) = mk();
    let (ea, eb) = connect_endpoints(&ta, &tb, "a", "b");
    Peers {
        a: (sa, ta, ea),
        b: (sb, tb, eb),
        _cfg: cfg,
    }
}

/// Sends b's unreconciled list to a; a reconciles it with its own list.
fn reconcile_across(p: &Peers, b_perm: u32) -> (NvSciBufAttrList, NvSciBufModule) {
    let (ta, ea) = (&p.a.1, p.a.2);
    let (tb, eb) = (&p.b.1, p.b.2);
    let mb = bmod(tb);
    let lb = blist(tb, mb);
    assert_eq!(
        bset(
            tb,
            lb,
            &[
                (B_TYPES, u32b(&[RAW])),
                (B_RAW_SIZE, u64b(&[4096])),
                (B_REQ_PERM, u32b(&[b_perm]))
            ]
        ),
        OK
    );
    let (mut desc, mut len) = (ptr::null_mut::<c_void>(), 0usize);
    assert_eq!(
        call!(
            tb.nvscibuf,
            NvSciBufAttrListIpcExportUnreconciled([lb].as_ptr(), 1, eb, &mut desc, &mut len)
        )
        .0,
        0
    );
    let ma = bmod(ta);
    let mut imported = ptr::null_mut();
    assert_eq!(
        call!(
            ta.nvscibuf,
            NvSciBufAttrListIpcImportUnreconciled(ma, ea, desc, len, &mut imported)
        )
        .0,
        0
    );
    call!(tb.nvscibuf, NvSciBufAttrListFreeDesc(desc));
    let la = raw_list(ta, ma, 4096);
    let (r, rec, _) = brec(ta, &[la, imported]);
    assert_eq!(r, OK);
    (rec, mb)
}

#[test]
fn buf_obj_ipc_export_must_go_back_along_the_path_the_peer_list_came_by() {
    let p = peers();
    let (rec, _) = reconcile_across(&p, READONLY);
    let ta = &p.a.1;
    let o = balloc(ta, rec);
    let mut d = NvSciBufObjIpcExportDescriptor::default();
    // A locally reconciled object (no peer list came over any endpoint).
    let m = bmod(ta);
    let local = raw_list(ta, m, 4096);
    let (_, lrec, _) = brec(ta, &[local]);
    let lo = balloc(ta, lrec);
    assert_eq!(
        call!(
            ta.nvscibuf,
            NvSciBufObjIpcExport(lo, NvSciBufAttrValAccessPerm(READWRITE), p.a.2, &mut d)
        )
        .0,
        NOT_PERMITTED
    );
    // Invalid permission value.
    assert_eq!(
        call!(
            ta.nvscibuf,
            NvSciBufObjIpcExport(o, NvSciBufAttrValAccessPerm(2), p.a.2, &mut d)
        )
        .0,
        BAD_PARAMETER
    );
    assert_eq!(
        call!(
            ta.nvscibuf,
            NvSciBufObjIpcExport(o, NvSciBufAttrValAccessPerm(READONLY), p.a.2, &mut d)
        )
        .0,
        OK
    );
}

#[test]
fn buf_obj_ipc_export_below_the_peer_grant_is_invalid_and_import_above_the_export_is_denied() {
    let p = peers();
    let (rec, _) = reconcile_across(&p, READWRITE);
    let (ta, ea) = (&p.a.1, p.a.2);
    let o = balloc(ta, rec);
    let mut d = NvSciBufObjIpcExportDescriptor::default();
    // The peer was granted ReadWrite: exporting Readonly to it is refused.
    assert_eq!(
        call!(
            ta.nvscibuf,
            NvSciBufObjIpcExport(o, NvSciBufAttrValAccessPerm(READONLY), ea, &mut d)
        )
        .0,
        INVALID_OPERATION
    );
    // Auto gives the peer what it was granted.
    assert_eq!(
        call!(
            ta.nvscibuf,
            NvSciBufObjIpcExport(o, NvSciBufAttrValAccessPerm(4), ea, &mut d)
        )
        .0,
        OK
    );
    // The peer's reconciled list shows its own ActualPerm (ReadWrite).
    let (mut desc, mut len) = (ptr::null_mut::<c_void>(), 0usize);
    assert_eq!(
        call!(
            ta.nvscibuf,
            NvSciBufAttrListIpcExportReconciled(rec, ea, &mut desc, &mut len)
        )
        .0,
        0
    );
    let (tb, eb) = (&p.b.1, p.b.2);
    let mb = bmod(tb);
    let mut brec_l = ptr::null_mut();
    assert_eq!(
        call!(
            tb.nvscibuf,
            NvSciBufAttrListIpcImportReconciled(mb, eb, desc, len, ptr::null(), 0, &mut brec_l)
        )
        .0,
        0
    );
    call!(ta.nvscibuf, NvSciBufAttrListFreeDesc(desc));
    assert_eq!(
        bget(tb, brec_l, B_ACTUAL_PERM).unwrap(),
        Some(u32b(&[READWRITE]))
    );
    let mut ob = ptr::null_mut();
    // The timeout is ignored (-5 is no error).
    assert_eq!(
        call!(
            tb.nvscibuf,
            NvSciBufObjIpcImport(
                eb,
                &d,
                brec_l,
                NvSciBufAttrValAccessPerm(READWRITE),
                -5,
                &mut ob
            )
        )
        .0,
        OK
    );
    // The descriptor imports once.
    let mut again = ptr::null_mut();
    assert_eq!(
        call!(
            tb.nvscibuf,
            NvSciBufObjIpcImport(
                eb,
                &d,
                brec_l,
                NvSciBufAttrValAccessPerm(READONLY),
                0,
                &mut again
            )
        )
        .0,
        BAD_PARAMETER
    );
    // A Readonly export cannot be imported as ReadWrite... (exported to a
    // peer granted Readonly).
    let q = peers();
    let (rec2, _) = reconcile_across(&q, READONLY);
    let o2 = balloc(&q.a.1, rec2);
    let mut d2 = NvSciBufObjIpcExportDescriptor::default();
    assert_eq!(
        call!(
            q.a.1.nvscibuf,
            NvSciBufObjIpcExport(o2, NvSciBufAttrValAccessPerm(READONLY), q.a.2, &mut d2)
        )
        .0,
        OK
    );
    let (mut desc, mut len) = (ptr::null_mut::<c_void>(), 0usize);
    assert_eq!(
        call!(
            q.a.1.nvscibuf,
            NvSciBufAttrListIpcExportReconciled(rec2, q.a.2, &mut desc, &mut len)
        )
        .0,
        0
    );
    let mb2 = bmod(&q.b.1);
    let mut l2 = ptr::null_mut();
    assert_eq!(
        call!(
            q.b.1.nvscibuf,
            NvSciBufAttrListIpcImportReconciled(mb2, q.b.2, desc, len, ptr::null(), 0, &mut l2)
        )
        .0,
        0
    );
    call!(q.a.1.nvscibuf, NvSciBufAttrListFreeDesc(desc));
    let mut ob2 = ptr::null_mut();
    assert_eq!(
        call!(
            q.b.1.nvscibuf,
            NvSciBufObjIpcImport(
                q.b.2,
                &d2,
                l2,
                NvSciBufAttrValAccessPerm(READWRITE),
                0,
                &mut ob2
            )
        )
        .0,
        ACCESS_DENIED
    );
}

// ---------------------------------------------------------------- sync helpers

fn smod(t: &FunctionTable) -> NvSciSyncModule {
    let mut m = ptr::null_mut();
    assert_eq!(call!(t.nvscisync, NvSciSyncModuleOpen(&mut m)).0, 0);
    m
}
fn slist(
    t: &FunctionTable,
    m: NvSciSyncModule,
    pairs: &[(u32, Vec<u8>)],
) -> (u32, NvSciSyncAttrList) {
    let mut l = ptr::null_mut();
    assert_eq!(call!(t.nvscisync, NvSciSyncAttrListCreate(m, &mut l)).0, 0);
    (sset(t, l, pairs), l)
}
fn sset(t: &FunctionTable, l: NvSciSyncAttrList, pairs: &[(u32, Vec<u8>)]) -> u32 {
    let raw = kv_pairs(pairs, |k, value, len| NvSciSyncAttrKeyValuePair {
        attrKey: NvSciSyncAttrKey(k),
        value,
        len,
    });
    call!(
        t.nvscisync,
        NvSciSyncAttrListSetAttrs(l, raw.as_ptr(), raw.len())
    )
    .0
}
fn sget(t: &FunctionTable, l: NvSciSyncAttrList, key: u32) -> Result<Option<Vec<u8>>, u32> {
    let mut p = NvSciSyncAttrKeyValuePair {
        attrKey: NvSciSyncAttrKey(key),
        value: ptr::null(),
        len: 0,
    };
    match call!(t.nvscisync, NvSciSyncAttrListGetAttrs(l, &mut p, 1)).0 {
        0 => Ok(value_copy(p.value, p.len)),
        r => Err(r),
    }
}
fn srec(
    t: &FunctionTable,
    lists: &[NvSciSyncAttrList],
) -> (u32, NvSciSyncAttrList, NvSciSyncAttrList) {
    reconcile(t.nvscisync.NvSciSyncAttrListReconcile, lists)
}
fn cpu_pair(
    t: &FunctionTable,
    m: NvSciSyncModule,
    prims: Option<&[u32]>,
) -> [NvSciSyncAttrList; 2] {
    let mut s = vec![(S_NEED_CPU, vec![1]), (S_REQ_PERM, u64b(&[2]))];
    let mut w = vec![(S_NEED_CPU, vec![1]), (S_REQ_PERM, u64b(&[1]))];
    if let Some(p) = prims {
        s.push((S_PRIMITIVE, u32b(p)));
        w.push((S_PRIMITIVE, u32b(p)));
    }
    let (r1, a) = slist(t, m, &s);
    let (r2, b) = slist(t, m, &w);
    assert_eq!((r1, r2), (OK, OK));
    [a, b]
}
fn salloc(t: &FunctionTable, lists: &[NvSciSyncAttrList]) -> NvSciSyncObj {
    let (r, rec, _) = srec(t, lists);
    assert_eq!(r, OK);
    let mut o = ptr::null_mut();
    assert_eq!(call!(t.nvscisync, NvSciSyncObjAlloc(rec, &mut o)).0, 0);
    o
}

// ---------------------------------------------------------------- sync rules

#[test]
fn sync_reconcile_needs_exactly_one_signaler_and_a_waiter_else_unsupported_config() {
    let (_sim, t) = setup();
    let m = smod(&t);
    let (_, s1) = slist(&t, m, &[(S_REQ_PERM, u64b(&[2]))]);
    let (_, s2) = slist(&t, m, &[(S_REQ_PERM, u64b(&[2]))]);
    let (_, w) = slist(&t, m, &[(S_REQ_PERM, u64b(&[1]))]);
    let (r, out, conflict) = srec(&t, &[s1, s2, w]);
    assert_eq!(r, UNSUPPORTED_CONFIG);
    assert!(out.is_null() && !conflict.is_null());
    assert_eq!(srec(&t, &[s1]).0, UNSUPPORTED_CONFIG);
    assert_eq!(srec(&t, &[w]).0, UNSUPPORTED_CONFIG);
    assert_eq!(srec(&t, &[s1, w]).0, OK);
}

#[test]
fn sync_auto_is_never_a_required_perm() {
    let (_sim, t) = setup();
    let m = smod(&t);
    assert_eq!(
        slist(&t, m, &[(S_REQ_PERM, u64b(&[1 << 63]))]).0,
        BAD_PARAMETER
    );
}

#[test]
fn sync_vidmem_primitives_are_not_supported() {
    let (_sim, t) = setup();
    let m = smod(&t);
    for vidmem in [3u32, 5] {
        let [s, w] = cpu_pair(&t, m, Some(&[vidmem]));
        assert_eq!(srec(&t, &[s, w]).0, UNSUPPORTED_CONFIG);
    }
}

#[test]
fn sync_max_primitive_value_is_u64_max_only_for_the_64_bit_sysmem_semaphore() {
    let (_sim, t) = setup();
    let m = smod(&t);
    for (prim, max) in [
        (1u32, u64::from(u32::MAX)),
        (2, u64::from(u32::MAX)),
        (4, u64::MAX),
    ] {
        let [s, w] = cpu_pair(&t, m, Some(&[prim]));
        let (r, rec, _) = srec(&t, &[s, w]);
        assert_eq!(r, OK);
        assert_eq!(sget(&t, rec, S_PRIMITIVE).unwrap(), Some(u32b(&[prim])));
        assert_eq!(
            sget(&t, rec, S_MAX_VALUE).unwrap(),
            Some(u64b(&[max])),
            "primitive {prim}"
        );
    }
}

#[test]
fn sync_need_cpu_access_without_primitive_info_lets_the_library_choose() {
    let (_sim, t) = setup();
    let m = smod(&t);
    let [s, w] = cpu_pair(&t, m, None);
    let (r, rec, _) = srec(&t, &[s, w]);
    assert_eq!(r, OK);
    let prim = first_u32(&sget(&t, rec, S_PRIMITIVE).unwrap().unwrap());
    assert!([1, 2, 4].contains(&prim), "{prim}");
}

#[test]
fn sync_waiter_require_timestamps_needs_need_cpu_access() {
    let (_sim, t) = setup();
    let m = smod(&t);
    let (_, s) = slist(&t, m, &[(S_REQ_PERM, u64b(&[2]))]);
    let (_, w) = slist(&t, m, &[(S_REQ_PERM, u64b(&[1])), (S_TIMESTAMPS, vec![1])]);
    assert_eq!(srec(&t, &[s, w]).0, UNSUPPORTED_CONFIG);
}

#[test]
fn sync_output_only_keys_are_refused_by_setattrs() {
    let (_sim, t) = setup();
    let m = smod(&t);
    assert_eq!(slist(&t, m, &[(3, u64b(&[3]))]).0, BAD_PARAMETER);
    assert_eq!(slist(&t, m, &[(S_MAX_VALUE, u64b(&[5]))]).0, BAD_PARAMETER);
    assert_eq!(
        slist(&t, m, &[(S_NUM_TS_SLOTS, u32b(&[1]))]).0,
        BAD_PARAMETER
    );
}

#[test]
fn sync_update_fence_out_of_range_is_overflow_with_the_output_cleared_first() {
    let (_sim, t) = setup();
    let m = smod(&t);
    // Syncpoint (32-bit values), no RequireDeterministicFences.
    let o = salloc(&t, &cpu_pair(&t, m, Some(&[1])));
    let mut f = NvSciSyncFence { payload: [7; 6] };
    assert_eq!(
        call!(
            t.nvscisync,
            NvSciSyncFenceUpdateFence(o, 0, u64::from(u32::MAX) + 1, &mut f)
        )
        .0,
        OVERFLOW
    );
    assert_eq!(f.payload, [0; 6]);
    f.payload = [7; 6];
    assert_eq!(
        call!(
            t.nvscisync,
            NvSciSyncFenceUpdateFence(o, u64::from(u32::MAX), 1, &mut f)
        )
        .0,
        OVERFLOW
    );
    assert_eq!(f.payload, [0; 6]);
    // Semaphores: one primitive, id 0 only.
    let sem = salloc(&t, &cpu_pair(&t, m, Some(&[2])));
    f.payload = [7; 6];
    assert_eq!(
        call!(t.nvscisync, NvSciSyncFenceUpdateFence(sem, 1, 1, &mut f)).0,
        OVERFLOW
    );
    assert_eq!(f.payload, [0; 6]);
    // In range, without deterministic fences: fine.
    assert_eq!(
        call!(
            t.nvscisync,
            NvSciSyncFenceUpdateFence(o, 0, u64::from(u32::MAX), &mut f)
        )
        .0,
        OK
    );
    let (mut id, mut v) = (9u64, 9u64);
    assert_eq!(
        call!(t.nvscisync, NvSciSyncFenceExtractFence(&f, &mut id, &mut v)).0,
        OK
    );
    assert_eq!(v, u64::from(u32::MAX));
    // 64-bit semaphore: u64 values.
    let s64 = salloc(&t, &cpu_pair(&t, m, Some(&[4])));
    assert_eq!(
        call!(
            t.nvscisync,
            NvSciSyncFenceUpdateFence(s64, 0, u64::MAX, &mut f)
        )
        .0,
        OK
    );
}

#[test]
fn sync_update_fence_does_not_need_deterministic_fences() {
    let (_sim, t) = setup();
    let m = smod(&t);
    let lists = cpu_pair(&t, m, None);
    for l in lists {
        // RequireDeterministicFences was never set.
        assert_eq!(sget(&t, l, S_DETERMINISTIC).unwrap(), None);
    }
    let o = salloc(&t, &lists);
    let mut f = NvSciSyncFence::default();
    assert_eq!(
        call!(t.nvscisync, NvSciSyncFenceUpdateFence(o, 0, 5, &mut f)).0,
        OK
    );
}

#[test]
fn sync_fence_dup_needs_distinct_source_and_destination() {
    let (_sim, t) = setup();
    let m = smod(&t);
    let o = salloc(&t, &cpu_pair(&t, m, None));
    let mut f = NvSciSyncFence::default();
    assert_eq!(
        call!(t.nvscisync, NvSciSyncObjGenerateFence(o, &mut f)).0,
        OK
    );
    let p: *mut NvSciSyncFence = &mut f;
    assert_eq!(call!(t.nvscisync, NvSciSyncFenceDup(p, p)).0, BAD_PARAMETER);
    let mut g = NvSciSyncFence::default();
    assert_eq!(call!(t.nvscisync, NvSciSyncFenceDup(p, &mut g)).0, OK);
}

#[test]
fn sync_extract_and_get_timestamp_on_a_cleared_fence_are_cleared_fence() {
    let (_sim, t) = setup();
    let f = NvSciSyncFence::default();
    let (mut id, mut v, mut ts) = (0u64, 0u64, 0u64);
    assert_eq!(
        call!(t.nvscisync, NvSciSyncFenceExtractFence(&f, &mut id, &mut v)).0,
        CLEARED_FENCE
    );
    assert_eq!(
        call!(t.nvscisync, NvSciSyncFenceGetTimestamp(&f, &mut ts)).0,
        CLEARED_FENCE
    );
}

#[test]
fn sync_fence_wait_timeout_range_is_minus_one_or_0_to_max() {
    let (_sim, t) = setup();
    let m = smod(&t);
    let mut ctx = ptr::null_mut();
    assert_eq!(
        call!(t.nvscisync, NvSciSyncCpuWaitContextAlloc(m, &mut ctx)).0,
        0
    );
    let f = NvSciSyncFence::default();
    let max = i64::MAX / 1000;
    for bad in [-2, i64::MIN, max + 1, i64::MAX] {
        assert_eq!(
            call!(t.nvscisync, NvSciSyncFenceWait(&f, ctx, bad)).0,
            BAD_PARAMETER,
            "{bad}"
        );
    }
    for good in [-1, 0, 1, max] {
        assert_eq!(
            call!(t.nvscisync, NvSciSyncFenceWait(&f, ctx, good)).0,
            OK,
            "{good}"
        );
    }
}

#[test]
fn sync_cpu_wait_needs_cpu_access_and_wait_permission() {
    let (_sim, t) = setup();
    let m = smod(&t);
    let (_, s) = slist(&t, m, &[(S_NEED_CPU, vec![1]), (S_REQ_PERM, u64b(&[2]))]);
    let (_, w) = slist(&t, m, &[(S_REQ_PERM, u64b(&[1]))]);
    // Neither list grants the waiter... the object handle here has the
    // union of permissions but the waiter did not ask for CPU access; the
    // signaller did, so the object is CPU-accessible: allowed.
    let o = salloc(&t, &[s, w]);
    let mut f = NvSciSyncFence::default();
    assert_eq!(
        call!(t.nvscisync, NvSciSyncObjGenerateFence(o, &mut f)).0,
        OK
    );
    let mut ctx = ptr::null_mut();
    assert_eq!(
        call!(t.nvscisync, NvSciSyncCpuWaitContextAlloc(m, &mut ctx)).0,
        0
    );
    assert_eq!(call!(t.nvscisync, NvSciSyncObjSignal(o)).0, OK);
    assert_eq!(call!(t.nvscisync, NvSciSyncFenceWait(&f, ctx, 0)).0, OK);
    // Without NeedCpuAccess anywhere: a CPU wait is refused.
    let (_, s2) = slist(&t, m, &[(S_REQ_PERM, u64b(&[2]))]);
    let (_, w2) = slist(&t, m, &[(S_REQ_PERM, u64b(&[1]))]);
    let o2 = salloc(&t, &[s2, w2]);
    let mut f2 = NvSciSyncFence::default();
    assert_eq!(
        call!(t.nvscisync, NvSciSyncFenceUpdateFence(o2, 0, 1, &mut f2)).0,
        OK
    );
    assert_eq!(
        call!(t.nvscisync, NvSciSyncFenceWait(&f2, ctx, 0)).0,
        BAD_PARAMETER
    );
}

#[test]
fn sync_one_wait_at_a_time_per_cpu_wait_context() {
    let (_sim, t) = setup();
    let m = smod(&t);
    let o = salloc(&t, &cpu_pair(&t, m, None));
    let mut f = NvSciSyncFence::default();
    assert_eq!(
        call!(t.nvscisync, NvSciSyncObjGenerateFence(o, &mut f)).0,
        OK
    );
    let mut ctx = ptr::null_mut();
    assert_eq!(
        call!(t.nvscisync, NvSciSyncCpuWaitContextAlloc(m, &mut ctx)).0,
        0
    );
    let (ctx_u, t2) = (ctx as usize, t);
    let waiter = std::thread::spawn(move || {
        let ctx = ctx_u as NvSciSyncCpuWaitContext;
        call!(t2.nvscisync, NvSciSyncFenceWait(&f, ctx, 3_000_000)).0
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(call!(t.nvscisync, NvSciSyncFenceWait(&f, ctx, 0)).0, BUSY);
    assert_eq!(call!(t.nvscisync, NvSciSyncObjSignal(o)).0, OK);
    assert_eq!(waiter.join().unwrap(), OK);
}

// ---------------------------------------------------------------- versions

#[test]
fn version_check_compatibility_answers_for_the_claimed_release() {
    for r in NvSciRelease::ALL {
        let (_sim, t) = setup_with(r);
        let (bmaj, bmin) = r.buf_version();
        let (smaj, smin) = r.sync_version();
        let mut ok = false;
        assert_eq!(
            call!(
                t.nvscibuf,
                NvSciBufCheckVersionCompatibility(bmaj, bmin, &mut ok)
            )
            .0,
            0
        );
        assert!(ok, "{}", r.name());
        assert_eq!(
            call!(
                t.nvscibuf,
                NvSciBufCheckVersionCompatibility(bmaj, bmin + 1, &mut ok)
            )
            .0,
            0
        );
        assert!(!ok);
        assert_eq!(
            call!(
                t.nvscibuf,
                NvSciBufCheckVersionCompatibility(bmaj + 1, 0, &mut ok)
            )
            .0,
            0
        );
        assert!(!ok);
        assert_eq!(
            call!(
                t.nvscisync,
                NvSciSyncCheckVersionCompatibility(smaj, smin, &mut ok)
            )
            .0,
            0
        );
        assert!(ok);
        assert_eq!(
            call!(
                t.nvscisync,
                NvSciSyncCheckVersionCompatibility(smaj, 0, &mut ok)
            )
            .0,
            0
        );
        assert!(ok);
        assert_eq!(
            call!(
                t.nvscisync,
                NvSciSyncCheckVersionCompatibility(smaj, smin + 1, &mut ok)
            )
            .0,
            0
        );
        assert!(!ok);
        assert_eq!(
            call!(
                t.nvscisync,
                NvSciSyncCheckVersionCompatibility(smaj, smin, ptr::null_mut())
            )
            .0,
            BAD_PARAMETER
        );
        assert_eq!(
            call!(
                t.nvscibuf,
                NvSciBufCheckVersionCompatibility(bmaj, bmin, ptr::null_mut())
            )
            .0,
            BAD_PARAMETER
        );
    }
}

#[test]
fn version_release_table() {
    use NvSciRelease::*;
    assert_eq!(
        NvSciRelease::ALL,
        [V5_2_6, V6_0_5, JetsonSync2_4, V6_0_6, V6_0_10]
    );
    let buf: Vec<_> = NvSciRelease::ALL.iter().map(|r| r.buf_version()).collect();
    let sync: Vec<_> = NvSciRelease::ALL.iter().map(|r| r.sync_version()).collect();
    assert_eq!(buf, [(2, 0), (2, 8), (2, 8), (2, 9), (2, 11)]);
    assert_eq!(sync, [(2, 0), (2, 3), (2, 4), (2, 5), (2, 8)]);
    assert_eq!(SimConfig::default().nvsci_release, V6_0_10);
}

#[test]
fn version_fence_extract_and_update_exist_from_sync_2_3_but_not_in_the_2_4_flavour() {
    for r in NvSciRelease::ALL {
        let (_sim, t) = setup_with(r);
        let expect = !matches!(r, NvSciRelease::V5_2_6 | NvSciRelease::JetsonSync2_4);
        assert_eq!(
            t.nvscisync.NvSciSyncFenceExtractFence.is_some(),
            expect,
            "{}",
            r.name()
        );
        assert_eq!(
            t.nvscisync.NvSciSyncFenceUpdateFence.is_some(),
            expect,
            "{}",
            r.name()
        );
        assert!(t.nvscisync.NvSciSyncFenceWait.is_some());
    }
}

#[test]
fn version_sync_keys_exist_only_from_their_release() {
    // (key, first release that has it); GetAttrs on an unreconciled list
    // answers OK for a known key (NULL value) and BadParameter otherwise.
    let first: [(u32, u32); 6] = [(5, 0), (6, 1), (7, 2), (9, 2), (10, 4), (12, 4)];
    let order = |r: NvSciRelease| match r {
        NvSciRelease::V5_2_6 => 0,
        NvSciRelease::JetsonSync2_4 => 1,
        NvSciRelease::V6_0_5 => 2,
        NvSciRelease::V6_0_6 => 4,
        NvSciRelease::V6_0_10 => 5,
    };
    for r in NvSciRelease::ALL {
        let (_sim, t) = setup_with(r);
        let m = smod(&t);
        let (_, l) = slist(&t, m, &[(S_REQ_PERM, u64b(&[2]))]);
        for (key, from) in first {
            let got = sget(&t, l, key).map(|_| ());
            let expect = if order(r) >= from {
                Ok(())
            } else {
                Err(BAD_PARAMETER)
            };
            assert_eq!(got, expect, "key {key} on {}", r.name());
        }
        // Setting a key the release lacks: BadParameter, like any unknown key.
        let det = slist(&t, m, &[(S_DETERMINISTIC, vec![1])]).0;
        assert_eq!(
            det,
            if order(r) >= 1 { OK } else { BAD_PARAMETER },
            "{}",
            r.name()
        );
        let gpu = slist(&t, m, &[(S_GPU_ID, vec![1; 16])]).0;
        assert_eq!(
            gpu,
            if order(r) >= 4 { OK } else { BAD_PARAMETER },
            "{}",
            r.name()
        );
        // PeerHwEngineArray (13) only from 2.8; the simulator does not
        // model it (NotSupported) where it exists.
        let peer = slist(&t, m, &[(S_PEER_HW, vec![0; 8])]).0;
        assert_eq!(
            peer,
            if order(r) >= 5 {
                NOT_SUPPORTED
            } else {
                BAD_PARAMETER
            },
            "{}",
            r.name()
        );
        // Beyond every release's keys.
        assert_eq!(slist(&t, m, &[(14, vec![1])]).0, BAD_PARAMETER);
    }
}

#[test]
fn version_buf_gpu_cache_keys_exist_from_nvscibuf_2_8() {
    for r in NvSciRelease::ALL {
        let (_sim, t) = setup_with(r);
        let m = bmod(&t);
        let l = blist(&t, m);
        let mut e = vec![0u8; 17];
        e[16] = 1;
        let expect = if r.buf_version() >= (2, 8) {
            OK
        } else {
            BAD_PARAMETER
        };
        assert_eq!(bset(&t, l, &[(B_GPU_CACHE, e)]), expect, "{}", r.name());
        let mut c = vec![0u8; 16];
        c.extend_from_slice(&1u32.to_ne_bytes());
        assert_eq!(
            bset(&t, l, &[(B_GPU_COMPRESSION, c)]),
            expect,
            "{}",
            r.name()
        );
    }
}

#[test]
fn version_deterministic_flow_runs_at_every_release() {
    // The flow needs no key the oldest release lacks: signal from the CPU,
    // hand the fence to the waiter, wait.
    for r in NvSciRelease::ALL {
        let (_sim, t) = setup_with(r);
        let m = smod(&t);
        let o = salloc(&t, &cpu_pair(&t, m, None));
        let mut ctx = ptr::null_mut();
        assert_eq!(
            call!(t.nvscisync, NvSciSyncCpuWaitContextAlloc(m, &mut ctx)).0,
            0
        );
        for _ in 0..3 {
            let mut f = NvSciSyncFence::default();
            assert_eq!(
                call!(t.nvscisync, NvSciSyncObjGenerateFence(o, &mut f)).0,
                OK
            );
            assert_eq!(call!(t.nvscisync, NvSciSyncObjSignal(o)).0, OK);
            assert_eq!(
                call!(t.nvscisync, NvSciSyncFenceWait(&f, ctx, 1_000_000)).0,
                OK,
                "{}",
                r.name()
            );
        }
    }
}
