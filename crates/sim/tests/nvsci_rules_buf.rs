//! The NvSciBuf rules of the fact sheet ("Checked against the real headers"),
//! one test per rule, each calling the simulator's C entry points directly
//! with raw key/value pairs and expecting the real library's documented code.
//! The NvSciSync rules are in `nvsci_rules_sync.rs`, the per-release ones in
//! `nvsci_versions.rs`; what they share is in `nvsci_rules/`.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::ffi::{c_void, CStr};
use std::ptr;

use tegra_interop_sim::nvsci::{color, IpcConfigFile};
use tegra_interop_sim::{Diagnostic, DiagnosticKind, FunctionTable, NvSciRelease, Sim, SimConfig};
use tegra_interop_sys::nvsci::*;

#[macro_use]
mod nvsci_common;
#[macro_use]
mod nvsci_rules;
use nvsci_rules as rules;
use rules::*;

/// Types = {RawBuffer} and RawBuffer.Size = `size`.
fn raw_pairs(size: u64) -> Vec<(u32, Vec<u8>)> {
    vec![(B_TYPES, u32b(&[RAW])), (B_RAW_SIZE, u64b(&[size]))]
}

/// A raw buffer list of `size` bytes with CPU access and ReadWrite required.
fn raw_list(t: &FunctionTable, m: NvSciBufModule, size: u64) -> NvSciBufAttrList {
    let mut pairs = raw_pairs(size);
    pairs.extend([(B_NEED_CPU, vec![1]), (B_REQ_PERM, u32b(&[READWRITE]))]);
    SciBuf::list_of(t, m, &pairs)
}

/// A one-plane pitch-linear progressive image of `format`, `w` x `h`.
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

/// The attribute list an object reports (must succeed).
fn obj_attr_list(t: &FunctionTable, o: NvSciBufObj) -> NvSciBufAttrList {
    let mut l = ptr::null_mut();
    assert_eq!(call!(t.nvscibuf, NvSciBufObjGetAttrList(o, &mut l)).0, OK);
    l
}

/// GetCpuPtr of `o`: its code.
fn cpu_ptr(t: &FunctionTable, o: NvSciBufObj) -> u32 {
    let mut p: *mut c_void = ptr::null_mut();
    call!(t.nvscibuf, NvSciBufObjGetCpuPtr(o, &mut p)).0
}

/// Whether a diagnostic taken from `sim` now matches `pred`.
fn diagnosed(sim: &Sim, pred: impl Fn(&Diagnostic) -> bool) -> bool {
    sim.take_diagnostics().iter().any(pred)
}

// ---------------------------------------------------------------- buf: SetAttrs

#[test]
fn buf_setattrs_each_key_at_most_once_per_list() {
    let (_sim, t, m) = SciBuf::setup();
    let l = SciBuf::list(&t, m);
    // Twice in one call.
    assert_eq!(
        SciBuf::set(&t, l, &[(B_TYPES, u32b(&[RAW])), (B_TYPES, u32b(&[RAW]))]),
        BAD_PARAMETER
    );
    // Nothing of the refused call was stored.
    assert_eq!(SciBuf::set(&t, l, &[(B_TYPES, u32b(&[RAW]))]), OK);
    // Again in a later call.
    assert_eq!(
        SciBuf::set(&t, l, &[(B_TYPES, u32b(&[RAW]))]),
        BAD_PARAMETER
    );
}

#[test]
fn buf_setattrs_refuses_output_only_keys() {
    let (_sim, t, m) = SciBuf::setup();
    let l = SciBuf::list_of(&t, m, &[(B_TYPES, u32b(&[IMAGE]))]);
    for output_only in [
        (B_ACTUAL_PERM, u32b(&[READWRITE])),
        (B_GPU_SW_COH, vec![0; 17]),
        (B_IMG_SIZE, u64b(&[4096])),
        (B_PITCH, u32b(&[256])),
    ] {
        let key = output_only.0;
        assert_eq!(
            SciBuf::set(&t, l, &[output_only]),
            BAD_PARAMETER,
            "{key:#x}"
        );
    }
}

#[test]
fn buf_setattrs_key_buffer_type_must_be_in_types() {
    let (_sim, t, m) = SciBuf::setup();
    // Before Types: refused (Types must come first or in the same call).
    let l = SciBuf::list(&t, m);
    assert_eq!(
        SciBuf::set(&t, l, &[(B_RAW_SIZE, u64b(&[4096]))]),
        BAD_PARAMETER
    );
    // In the same call, in either order: accepted.
    assert_eq!(
        SciBuf::set(
            &t,
            l,
            &[(B_RAW_SIZE, u64b(&[4096])), (B_TYPES, u32b(&[RAW]))]
        ),
        OK
    );
    // An image key on a RawBuffer list: refused.
    assert_eq!(SciBuf::set(&t, l, &[(B_LAYOUT, u32b(&[1]))]), BAD_PARAMETER);
}

#[test]
fn buf_setattrs_imported_lists_are_read_only() {
    let cfg = IpcConfigFile::inter_process(&[("a", "b", 16, 4096)]).unwrap();
    let (_sim, t) = setup_with_config(SimConfig::tegra().with_nvsciipc_config(cfg.path()));
    assert_eq!(call!(t.nvsciipc, NvSciIpcInit()).0, 0);
    let open = |name: &CStr| {
        let mut ep = 0u64;
        assert_eq!(
            call!(t.nvsciipc, NvSciIpcOpenEndpoint(name.as_ptr(), &mut ep)).0,
            0
        );
        ep
    };
    let (ea, eb) = (open(c"a"), open(c"b"));
    let m = SciBuf::module(&t);
    let l = raw_list(&t, m, 4096);
    let imported = send_unreconciled((&t, ea), l, (&t, eb), m);
    assert_eq!(
        SciBuf::set(&t, imported, &[(B_GPU_ID, vec![7; 16])]),
        BAD_PARAMETER
    );
}

#[test]
fn buf_gpu_cache_values_are_17_byte_gpu_entries() {
    let (_sim, t, m) = SciBuf::setup();
    let l = SciBuf::list(&t, m);
    // A 1-byte bool (the old, wrong value type): BadParameter.
    assert_eq!(SciBuf::set(&t, l, &[(B_GPU_CACHE, vec![1])]), BAD_PARAMETER);
    assert_eq!(
        SciBuf::set(&t, l, &[(B_GPU_CACHE, vec![0; 16])]),
        BAD_PARAMETER
    );
    assert_eq!(
        SciBuf::set(&t, l, &[(B_GPU_CACHE, vec![0; 18])]),
        BAD_PARAMETER
    );
    // Cacheability byte other than 0/1.
    let e = cache_entry(&[0; 16], 2);
    assert_eq!(SciBuf::set(&t, l, &[(B_GPU_CACHE, e)]), BAD_PARAMETER);
    let e = cache_entry(&[0; 16], 1);
    assert_eq!(SciBuf::set(&t, l, &[(B_GPU_CACHE, e)]), OK);
}

#[test]
fn buf_gpu_sw_need_cache_coherency_is_output_only() {
    let (_sim, t, m) = SciBuf::setup();
    let l = SciBuf::list(&t, m);
    let e = cache_entry(&[0; 16], 1);
    assert_eq!(SciBuf::set(&t, l, &[(B_GPU_SW_COH, e)]), BAD_PARAMETER);
    // And not readable from an unreconciled list.
    assert_eq!(SciBuf::get(&t, l, B_GPU_SW_COH), Err(BAD_PARAMETER));
}

#[test]
fn buf_gpu_compression_values_are_20_byte_entries_and_none_is_not_settable() {
    let (_sim, t, m) = SciBuf::setup();
    let l = SciBuf::list(&t, m);
    let entry = |ty: u32| compression_entry(3, ty);
    assert_eq!(
        SciBuf::set(&t, l, &[(B_GPU_COMPRESSION, vec![0; 17])]),
        BAD_PARAMETER
    );
    assert_eq!(
        SciBuf::set(&t, l, &[(B_GPU_COMPRESSION, entry(0))]),
        BAD_PARAMETER
    );
    assert_eq!(SciBuf::set(&t, l, &[(B_GPU_COMPRESSION, entry(1))]), OK);
}

#[test]
fn buf_colour_formats_are_the_real_enum_values() {
    let (_sim, t, m) = SciBuf::setup();
    assert_eq!(color::A8B8G8R8, 106);
    assert_eq!(color::R8G8B8A8, 106);
    assert_eq!((color::Y8, color::U8V8, color::B8G8R8A8), (84, 74, 104));
    // A8B8G8R8 (106) is 32 bits per pixel: pitch = 4 x width.
    let l = SciBuf::list_of(&t, m, &image_pairs(106, 64, 8));
    let rec = SciBuf::reconciled(&t, &[l]);
    let value = |key| SciBuf::get(&t, rec, key).unwrap().unwrap();
    assert_eq!(first_u32(&value(B_BPP)), 32);
    assert_eq!(first_u32(&value(B_PITCH)), 256);
    assert!(first_u64(&value(B_IMG_SIZE)) >= 256 * 8);
    // The simulator's former private numbers are no colour format at all.
    let mut p = image_pairs(0x5153_0003, 64, 8);
    p.truncate(5);
    let l2 = SciBuf::list_of(&t, m, &p[..4]);
    assert_eq!(SciBuf::set(&t, l2, &p[4..]), BAD_PARAMETER);
    // 0 is the enum's lower bound, not a format.
    assert_eq!(
        SciBuf::set(&t, l2, &[(B_COLOR_FMT, u32b(&[0]))]),
        BAD_PARAMETER
    );
}

// ---------------------------------------------------------------- buf: GetAttrs

#[test]
fn buf_getattrs_output_only_keys_fail_on_unreconciled_lists() {
    let (_sim, t, m) = SciBuf::setup();
    let l = raw_list(&t, m, 4096);
    assert_eq!(SciBuf::get(&t, l, B_ACTUAL_PERM), Err(BAD_PARAMETER));
    assert_eq!(SciBuf::get(&t, l, B_IMG_SIZE), Err(BAD_PARAMETER));
    // An input key is fine.
    assert_eq!(SciBuf::get(&t, l, B_RAW_SIZE).unwrap(), Some(u64b(&[4096])));
}

#[test]
fn buf_getattrs_input_only_keys_fail_on_reconciled_lists() {
    let (_sim, t, m) = SciBuf::setup();
    let rec = SciBuf::reconciled(&t, &[raw_list(&t, m, 4096)]);
    assert_eq!(SciBuf::get(&t, rec, B_REQ_PERM), Err(BAD_PARAMETER));
    assert!(SciBuf::get(&t, rec, B_ACTUAL_PERM).unwrap().is_some());
}

#[test]
fn buf_obj_attr_list_is_read_only_and_freeing_it_is_a_diagnostic() {
    let (sim, t, m) = SciBuf::setup();
    let o = SciBuf::obj(&t, &[raw_list(&t, m, 4096)]);
    let ol = obj_attr_list(&t, o);
    assert_eq!(
        SciBuf::set(&t, ol, &[(B_GPU_ID, vec![1; 16])]),
        BAD_PARAMETER
    );
    let _ = sim.take_diagnostics();
    call!(t.nvscibuf, NvSciBufAttrListFree(ol));
    assert!(diagnosed(&sim, |d| d.kind == DiagnosticKind::Misuse
        && d.message.contains("ObjGetAttrList")));
    // Still the object's, still readable.
    assert!(SciBuf::get(&t, ol, B_RAW_SIZE).unwrap().is_some());
}

// ---------------------------------------------------------------- buf: reconcile

#[test]
fn buf_reconcile_types_is_mandatory_in_every_list() {
    let (_sim, t, m) = SciBuf::setup();
    let a = raw_list(&t, m, 4096);
    let b = SciBuf::list_of(&t, m, &[(B_NEED_CPU, vec![1])]);
    assert_eq!(SciBuf::reconcile(&t, &[a, b]).0, BAD_PARAMETER);
}

#[test]
fn buf_reconcile_types_must_agree() {
    let (_sim, t, m) = SciBuf::setup();
    let a = raw_list(&t, m, 4096);
    let b = SciBuf::list_of(&t, m, &image_pairs(color::Y8, 64, 64));
    SciBuf::assert_conflict(&t, &[a, b], RECONCILIATION_FAILED);
    // {RawBuffer} against {RawBuffer, Image}: not the one allowed mix.
    let c = SciBuf::list_of(&t, m, &[(B_TYPES, u32b(&[RAW, IMAGE]))]);
    assert_eq!(SciBuf::reconcile(&t, &[a, c]).0, RECONCILIATION_FAILED);
}

#[test]
fn buf_reconcile_only_image_and_tensor_may_mix() {
    let (sim, t, m) = SciBuf::setup();
    let a = SciBuf::list_of(&t, m, &image_pairs(color::Y8, 64, 64));
    let b = SciBuf::list_of(&t, m, &[(B_TYPES, u32b(&[IMAGE, TENSOR]))]);
    // Allowed by the rule, so not a reconciliation failure; the simulator
    // does not model tensors and says so.
    let _ = sim.take_diagnostics();
    assert_eq!(SciBuf::reconcile(&t, &[a, b]).0, NOT_SUPPORTED);
    assert!(diagnosed(&sim, |d| d.kind == DiagnosticKind::Unimplemented));
}

#[test]
fn buf_reconcile_raw_size_is_mandatory() {
    let (_sim, t, m) = SciBuf::setup();
    let l = SciBuf::list_of(&t, m, &[(B_TYPES, u32b(&[RAW]))]);
    assert_eq!(SciBuf::reconcile(&t, &[l]).0, BAD_PARAMETER);
}

#[test]
fn buf_raw_size_must_be_greater_than_zero() {
    let (_sim, t, m) = SciBuf::setup();
    let l = SciBuf::list(&t, m);
    assert_eq!(SciBuf::set(&t, l, &raw_pairs(0)), BAD_PARAMETER);
}

#[test]
fn buf_reconcile_raw_sizes_must_be_equal_not_the_max() {
    let (_sim, t, m) = SciBuf::setup();
    let a = raw_list(&t, m, 8192);
    let b = raw_list(&t, m, 4096);
    SciBuf::assert_conflict(&t, &[a, b], RECONCILIATION_FAILED);
    let c = raw_list(&t, m, 8192);
    assert_eq!(
        SciBuf::reconciled_value(&t, &[a, c], B_RAW_SIZE),
        Some(u64b(&[8192]))
    );
}

#[test]
fn buf_raw_align_is_a_power_of_two_and_the_max_is_taken() {
    let (_sim, t, m) = SciBuf::setup();
    let a = raw_list(&t, m, 4096);
    assert_eq!(
        SciBuf::set(&t, a, &[(B_RAW_ALIGN, u64b(&[48]))]),
        BAD_PARAMETER
    );
    assert_eq!(SciBuf::set(&t, a, &[(B_RAW_ALIGN, u64b(&[64]))]), OK);
    let b = raw_list(&t, m, 4096);
    assert_eq!(SciBuf::set(&t, b, &[(B_RAW_ALIGN, u64b(&[1024]))]), OK);
    assert_eq!(
        SciBuf::reconciled_value(&t, &[a, b], B_RAW_ALIGN),
        Some(u64b(&[1024]))
    );
}

#[test]
fn buf_reconcile_image_layout_and_scan_type_are_mandatory() {
    let (_sim, t, m) = SciBuf::setup();
    for missing in [
        B_LAYOUT,
        B_SCAN,
        B_PLANE_COUNT,
        B_COLOR_FMT,
        B_WIDTH,
        B_HEIGHT,
    ] {
        let pairs: Vec<_> = image_pairs(color::A8B8G8R8, 32, 32)
            .into_iter()
            .filter(|(k, _)| *k != missing)
            .collect();
        let l = SciBuf::list_of(&t, m, &pairs);
        assert_eq!(
            SciBuf::reconcile(&t, &[l]).0,
            BAD_PARAMETER,
            "without key {missing:#x}"
        );
    }
}

#[test]
fn buf_image_plane_count_is_1_to_3_and_image_count_is_1() {
    let (_sim, t, m) = SciBuf::setup();
    let l = SciBuf::list_of(&t, m, &[(B_TYPES, u32b(&[IMAGE]))]);
    assert_eq!(
        SciBuf::set(&t, l, &[(B_PLANE_COUNT, u32b(&[0]))]),
        BAD_PARAMETER
    );
    assert_eq!(
        SciBuf::set(&t, l, &[(B_PLANE_COUNT, u32b(&[4]))]),
        BAD_PARAMETER
    );
    assert_eq!(
        SciBuf::set(&t, l, &[(B_IMAGE_COUNT, u64b(&[2]))]),
        BAD_PARAMETER
    );
    assert_eq!(SciBuf::set(&t, l, &[(B_IMAGE_COUNT, u64b(&[1]))]), OK);
}

#[test]
fn buf_reconcile_gpu_id_is_the_union() {
    let (_sim, t, m) = SciBuf::setup();
    let a = raw_list(&t, m, 4096);
    let b = raw_list(&t, m, 4096);
    assert_eq!(SciBuf::set(&t, a, &[(B_GPU_ID, vec![1; 16])]), OK);
    assert_eq!(
        SciBuf::set(&t, b, &[(B_GPU_ID, [vec![2; 16], vec![1; 16]].concat())]),
        OK
    );
    assert_eq!(
        SciBuf::reconciled_value(&t, &[a, b], B_GPU_ID),
        Some([vec![1; 16], vec![2; 16]].concat())
    );
}

#[test]
fn buf_actual_perm_defaults_to_readonly_and_an_allocated_object_gets_readwrite() {
    let (_sim, t, m) = SciBuf::setup();
    let rec = SciBuf::reconciled(&t, &[SciBuf::list_of(&t, m, &raw_pairs(4096))]);
    assert_eq!(
        SciBuf::get(&t, rec, B_ACTUAL_PERM).unwrap(),
        Some(u32b(&[READONLY]))
    );
    let ol = obj_attr_list(&t, SciBuf::alloc(&t, rec));
    assert_eq!(
        SciBuf::get(&t, ol, B_ACTUAL_PERM).unwrap(),
        Some(u32b(&[READWRITE]))
    );
}

#[test]
fn buf_gpu_cache_reconciles_by_and_for_the_igpu_in_gpu_id() {
    let (_sim, t, m) = SciBuf::setup();
    // The simulated iGPU's UUID, as CUDA reports it.
    let mut uuid = tegra_interop_sys::cuda::CUuuid_st::default();
    assert_eq!(call!(t.cuda, cuDeviceGetUuid_v2(&mut uuid, 0)).0, 0);
    let id: Vec<u8> = uuid.bytes.iter().map(|b| *b as u8).collect();
    let a = raw_list(&t, m, 4096);
    let b = raw_list(&t, m, 4096);
    assert_eq!(SciBuf::set(&t, a, &[(B_GPU_ID, id.clone())]), OK);
    // b turns caching off; a leaves the default (true for a Tegra iGPU).
    assert_eq!(
        SciBuf::set(&t, b, &[(B_GPU_CACHE, cache_entry(&id, 0))]),
        OK
    );
    assert_eq!(
        SciBuf::reconciled_value(&t, &[a, b], B_GPU_CACHE),
        Some(cache_entry(&id, 0))
    );
    // An entry for a GPU that is not in GpuId: reconciliation failure.
    let c = raw_list(&t, m, 4096);
    assert_eq!(
        SciBuf::set(&t, c, &[(B_GPU_CACHE, cache_entry(&[9; 16], 1))]),
        OK
    );
    assert_eq!(SciBuf::reconcile(&t, &[a, c]).0, RECONCILIATION_FAILED);
}

#[test]
fn buf_reconcile_refuses_a_list_given_twice_and_a_null_conflict_pointer() {
    let (_sim, t, m) = SciBuf::setup();
    let a = raw_list(&t, m, 4096);
    assert_eq!(SciBuf::reconcile(&t, &[a, a]).0, BAD_PARAMETER);
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
    let (_sim, t, m) = SciBuf::setup();
    let no_cpu = SciBuf::list_of(&t, m, &raw_pairs(4096));
    let o = SciBuf::obj(&t, &[no_cpu]);
    assert_eq!(cpu_ptr(&t, o), BAD_PARAMETER);
    let o = SciBuf::obj(&t, &[raw_list(&t, m, 4096)]);
    let mut ro = ptr::null_mut();
    assert_eq!(
        call!(
            t.nvscibuf,
            NvSciBufObjDupWithReducePerm(o, NvSciBufAttrValAccessPerm(READONLY), &mut ro)
        )
        .0,
        0
    );
    assert_eq!(cpu_ptr(&t, ro), BAD_PARAMETER);
    let mut cp: *const c_void = ptr::null();
    assert_eq!(
        call!(t.nvscibuf, NvSciBufObjGetConstCpuPtr(ro, &mut cp)).0,
        OK
    );
    assert_eq!(cpu_ptr(&t, o), OK);
}

#[test]
fn buf_flush_cpu_cache_range_needs_len_and_bounds() {
    let (_sim, t, m) = SciBuf::setup();
    let o = SciBuf::obj(&t, &[raw_list(&t, m, 4096)]);
    let flush =
        |offset: u64, len: u64| call!(t.nvscibuf, NvSciBufObjFlushCpuCacheRange(o, offset, len)).0;
    assert_eq!(flush(0, 0), BAD_PARAMETER);
    assert_eq!(flush(4000, 97), BAD_PARAMETER);
    assert_eq!(flush(u64::MAX, 2), BAD_PARAMETER);
    assert_eq!(flush(4000, 96), OK);
}

// ---------------------------------------------------------------- buf: across processes

/// One simulator (one process) and its end of an endpoint pair.
struct Peer {
    _sim: Sim,
    t: FunctionTable,
    ep: u64,
}

impl Peer {
    fn end(&self) -> (&FunctionTable, u64) {
        (&self.t, self.ep)
    }
}

/// Two simulators (the two processes) connected by an established endpoint pair.
struct Peers {
    a: Peer,
    b: Peer,
    _cfg: IpcConfigFile,
}

fn peers() -> Peers {
    let cfg = IpcConfigFile::inter_process(&[("a", "b", 16, 4096)]).unwrap();
    let mk = || setup_with_config(SimConfig::tegra().with_nvsciipc_config(cfg.path()));
    let (sa, ta) = mk();
    let (sb, tb) = mk();
    let (ea, eb) = connect_endpoints(&ta, &tb, "a", "b");
    Peers {
        a: Peer {
            _sim: sa,
            t: ta,
            ep: ea,
        },
        b: Peer {
            _sim: sb,
            t: tb,
            ep: eb,
        },
        _cfg: cfg,
    }
}

/// Carries an attribute-list descriptor across: `export` writes it (through
/// `tf`, which frees it afterwards), `import` makes the receiver's list from
/// it. Both must succeed.
fn carry(
    tf: &FunctionTable,
    export: impl FnOnce(*mut *mut c_void, *mut usize) -> NvSciError,
    import: impl FnOnce(*const c_void, usize, *mut NvSciBufAttrList) -> NvSciError,
) -> NvSciBufAttrList {
    let (mut desc, mut len) = (ptr::null_mut::<c_void>(), 0usize);
    assert_eq!(export(&mut desc, &mut len).0, OK);
    let mut imported = ptr::null_mut();
    assert_eq!(import(desc, len, &mut imported).0, OK);
    call!(tf.nvscibuf, NvSciBufAttrListFreeDesc(desc));
    imported
}

/// The unreconciled list `l`, exported over `from` and imported into module
/// `m` over `to`: the receiver's copy.
fn send_unreconciled(
    from: (&FunctionTable, u64),
    l: NvSciBufAttrList,
    to: (&FunctionTable, u64),
    m: NvSciBufModule,
) -> NvSciBufAttrList {
    let ((tf, ef), (tt, et)) = (from, to);
    carry(
        tf,
        |desc, len| {
            let lists = [l];
            call!(
                tf.nvscibuf,
                NvSciBufAttrListIpcExportUnreconciled(lists.as_ptr(), 1, ef, desc, len)
            )
        },
        |desc, len, out| {
            call!(
                tt.nvscibuf,
                NvSciBufAttrListIpcImportUnreconciled(m, et, desc, len, out)
            )
        },
    )
}

/// The reconciled list `rec`, exported over `from` and imported (with no
/// lists to validate against) into a new module over `to`: the receiver's
/// copy.
fn send_reconciled(
    from: (&FunctionTable, u64),
    rec: NvSciBufAttrList,
    to: (&FunctionTable, u64),
) -> NvSciBufAttrList {
    let ((tf, ef), (tt, et)) = (from, to);
    let m = SciBuf::module(tt);
    carry(
        tf,
        |desc, len| {
            call!(
                tf.nvscibuf,
                NvSciBufAttrListIpcExportReconciled(rec, ef, desc, len)
            )
        },
        |desc, len, out| {
            call!(
                tt.nvscibuf,
                NvSciBufAttrListIpcImportReconciled(m, et, desc, len, ptr::null(), 0, out)
            )
        },
    )
}

/// NvSciBufObjIpcExport of `o` with permission `perm` over `ep`: (code, descriptor).
fn obj_export(
    t: &FunctionTable,
    o: NvSciBufObj,
    perm: u32,
    ep: u64,
) -> (u32, NvSciBufObjIpcExportDescriptor) {
    let mut d = NvSciBufObjIpcExportDescriptor::default();
    let perm = NvSciBufAttrValAccessPerm(perm);
    let r = call!(t.nvscibuf, NvSciBufObjIpcExport(o, perm, ep, &mut d)).0;
    (r, d)
}

/// NvSciBufObjIpcImport of `d` with the reconciled list `l`, permission `perm` and
/// `timeout_us`, over `ep`: its code.
fn obj_import(
    t: &FunctionTable,
    ep: u64,
    d: &NvSciBufObjIpcExportDescriptor,
    l: NvSciBufAttrList,
    perm: u32,
    timeout_us: i64,
) -> u32 {
    let mut o = ptr::null_mut();
    let perm = NvSciBufAttrValAccessPerm(perm);
    call!(
        t.nvscibuf,
        NvSciBufObjIpcImport(ep, d, l, perm, timeout_us, &mut o)
    )
    .0
}

/// Sends b's unreconciled raw list (requiring `b_perm`) to a; a reconciles it with its
/// own list. The reconciled list, in a.
fn reconcile_across(p: &Peers, b_perm: u32) -> NvSciBufAttrList {
    let tb = &p.b.t;
    let mb = SciBuf::module(tb);
    let mut pairs = raw_pairs(4096);
    pairs.push((B_REQ_PERM, u32b(&[b_perm])));
    let lb = SciBuf::list_of(tb, mb, &pairs);
    let ma = SciBuf::module(&p.a.t);
    let imported = send_unreconciled(p.b.end(), lb, p.a.end(), ma);
    let la = raw_list(&p.a.t, ma, 4096);
    SciBuf::reconciled(&p.a.t, &[la, imported])
}

/// Connected peers where a reconciled b's list (requiring `b_perm`) with its
/// own: the peers, a's reconciled list, and an object a allocated from it.
fn shared_obj(b_perm: u32) -> (Peers, NvSciBufAttrList, NvSciBufObj) {
    let p = peers();
    let rec = reconcile_across(&p, b_perm);
    let o = SciBuf::alloc(&p.a.t, rec);
    (p, rec, o)
}

#[test]
fn buf_obj_ipc_export_must_go_back_along_the_path_the_peer_list_came_by() {
    let (p, _, o) = shared_obj(READONLY);
    let (ta, ea) = p.a.end();
    // A locally reconciled object (no peer list came over any endpoint).
    let m = SciBuf::module(ta);
    let lo = SciBuf::obj(ta, &[raw_list(ta, m, 4096)]);
    assert_eq!(obj_export(ta, lo, READWRITE, ea).0, NOT_PERMITTED);
    // Invalid permission value.
    assert_eq!(obj_export(ta, o, 2, ea).0, BAD_PARAMETER);
    assert_eq!(obj_export(ta, o, READONLY, ea).0, OK);
}

/// NvSciBufAttrListIpcExportReconciled of `rec` over `ep`: `Ok` (the
/// descriptor freed again) or the code; a refusal hands out nothing.
fn export_reconciled(t: &FunctionTable, rec: NvSciBufAttrList, ep: u64) -> Result<(), u32> {
    let (mut desc, mut len) = (ptr::null_mut::<c_void>(), 0usize);
    let r = call!(
        t.nvscibuf,
        NvSciBufAttrListIpcExportReconciled(rec, ep, &mut desc, &mut len)
    )
    .0;
    if r != OK {
        assert!(
            desc.is_null() && len == 0,
            "a refused export handed out a descriptor"
        );
        return Err(r);
    }
    assert!(!desc.is_null() && len > 0);
    call!(t.nvscibuf, NvSciBufAttrListFreeDesc(desc));
    Ok(())
}

#[test]
fn buf_reconciled_list_export_goes_back_only_along_a_peer_list_path() {
    // The same rule in nvscibuf.h of DRIVE OS 5.2.6, 6.0.5, 6.0.6, 6.0.8.1, 6.0.10.
    for release in NvSciRelease::ALL {
        // Process A holds endpoints a and c; b and d are two other processes.
        let cfg =
            IpcConfigFile::inter_process(&[("a", "b", 16, 4096), ("c", "d", 16, 4096)]).unwrap();
        let mk = || {
            setup_with_config(
                SimConfig::tegra()
                    .with_nvsciipc_config(cfg.path())
                    .with_nvsci_release(release),
            )
        };
        let ((sa, ta), (_sb, tb), (_sd, td)) = (mk(), mk(), mk());
        let (ea, eb) = connect_endpoints(&ta, &tb, "a", "b");
        let (ec, _ed) = connect_endpoints(&ta, &td, "c", "d");
        // b's list comes to A over a; A reconciles it with its own.
        let mb = SciBuf::module(&tb);
        let lb = raw_list(&tb, mb, 4096);
        let ma = SciBuf::module(&ta);
        let imported = send_unreconciled((&tb, eb), lb, (&ta, ea), ma);
        let rec = SciBuf::reconciled(&ta, &[raw_list(&ta, ma, 4096), imported]);
        // Over c, by which no list came: NotPermitted, with the reason.
        assert_eq!(
            export_reconciled(&ta, rec, ec),
            Err(NOT_PERMITTED),
            "{release}"
        );
        assert!(diagnosed(&sa, |d| d.kind == DiagnosticKind::Misuse
            && d.message.contains(
                "no unreconciled list of its reconciliation came by"
            )));
        // A list reconciled from local lists only goes nowhere.
        let local = SciBuf::reconciled(&ta, &[raw_list(&ta, ma, 4096), raw_list(&ta, ma, 4096)]);
        assert_eq!(
            export_reconciled(&ta, local, ea),
            Err(NOT_PERMITTED),
            "{release}"
        );
        assert_eq!(
            export_reconciled(&ta, local, ec),
            Err(NOT_PERMITTED),
            "{release}"
        );
        // Back the way b's list came: allowed, and b imports it.
        assert_eq!(export_reconciled(&ta, rec, ea), Ok(()), "{release}");
        let lb_rec = send_reconciled((&ta, ea), rec, (&tb, eb));
        assert!(!lb_rec.is_null());
    }
}

#[test]
fn buf_obj_ipc_export_below_the_peer_grant_is_invalid_and_import_above_the_export_is_denied() {
    let (p, rec, o) = shared_obj(READWRITE);
    let (ta, ea) = p.a.end();
    // The peer was granted ReadWrite: exporting Readonly to it is refused.
    assert_eq!(obj_export(ta, o, READONLY, ea).0, INVALID_OPERATION);
    // Auto gives the peer what it was granted.
    let (r, d) = obj_export(ta, o, 4, ea);
    assert_eq!(r, OK);
    // The peer's reconciled list shows its own ActualPerm (ReadWrite).
    let (tb, eb) = p.b.end();
    let lb = send_reconciled((ta, ea), rec, (tb, eb));
    assert_eq!(
        SciBuf::get(tb, lb, B_ACTUAL_PERM).unwrap(),
        Some(u32b(&[READWRITE]))
    );
    // The timeout is ignored (-5 is no error).
    assert_eq!(obj_import(tb, eb, &d, lb, READWRITE, -5), OK);
    // The descriptor imports once.
    assert_eq!(obj_import(tb, eb, &d, lb, READONLY, 0), BAD_PARAMETER);
    // A Readonly export cannot be imported as ReadWrite... (exported to a
    // peer granted Readonly).
    let (q, rec2, o2) = shared_obj(READONLY);
    let (r, d2) = obj_export(&q.a.t, o2, READONLY, q.a.ep);
    assert_eq!(r, OK);
    let l2 = send_reconciled(q.a.end(), rec2, q.b.end());
    assert_eq!(
        obj_import(&q.b.t, q.b.ep, &d2, l2, READWRITE, 0),
        ACCESS_DENIED
    );
}
