//! The NvSciSync rules of the fact sheet ("Checked against the real headers"),
//! one test per rule, each calling the simulator's C entry points directly
//! with raw key/value pairs and expecting the real library's documented code.
//! The NvSciBuf rules are in `nvsci_rules_buf.rs`, the per-release ones in
//! `nvsci_versions.rs`; what they share is in `nvsci_rules/`.
#![allow(clippy::unwrap_used)] // tests may unwrap

use tegra_interop_sys::nvsci::*;

#[macro_use]
mod nvsci_common;
#[macro_use]
mod nvsci_rules;
use nvsci_rules as rules;
use rules::*;

#[test]
fn sync_reconcile_needs_exactly_one_signaler_and_a_waiter_else_unsupported_config() {
    let (_sim, t, m) = SciSync::setup();
    let s1 = SciSync::list_of(&t, m, &[req_perm(SIGNAL)]);
    let s2 = SciSync::list_of(&t, m, &[req_perm(SIGNAL)]);
    let w = SciSync::list_of(&t, m, &[req_perm(WAIT)]);
    SciSync::assert_conflict(&t, &[s1, s2, w], UNSUPPORTED_CONFIG);
    assert_eq!(SciSync::reconcile(&t, &[s1]).0, UNSUPPORTED_CONFIG);
    assert_eq!(SciSync::reconcile(&t, &[w]).0, UNSUPPORTED_CONFIG);
    assert_eq!(SciSync::reconcile(&t, &[s1, w]).0, OK);
}

#[test]
fn sync_auto_is_never_a_required_perm() {
    let (_sim, t, m) = SciSync::setup();
    assert_eq!(
        SciSync::list_with(&t, m, &[req_perm(1 << 63)]).0,
        BAD_PARAMETER
    );
}

#[test]
fn sync_vidmem_primitives_are_not_supported() {
    let (_sim, t, m) = SciSync::setup();
    for vidmem in [3u32, 5] {
        let [s, w] = cpu_pair(&t, m, Some(&[vidmem]));
        assert_eq!(SciSync::reconcile(&t, &[s, w]).0, UNSUPPORTED_CONFIG);
    }
}

#[test]
fn sync_max_primitive_value_is_u64_max_only_for_the_64_bit_sysmem_semaphore() {
    let (_sim, t, m) = SciSync::setup();
    for (prim, max) in [
        (1u32, u64::from(u32::MAX)),
        (2, u64::from(u32::MAX)),
        (4, u64::MAX),
    ] {
        let rec = SciSync::reconciled(&t, &cpu_pair(&t, m, Some(&[prim])));
        assert_eq!(
            SciSync::get(&t, rec, S_PRIMITIVE).unwrap(),
            Some(u32b(&[prim]))
        );
        assert_eq!(
            SciSync::get(&t, rec, S_MAX_VALUE).unwrap(),
            Some(u64b(&[max])),
            "primitive {prim}"
        );
    }
}

#[test]
fn sync_need_cpu_access_without_primitive_info_lets_the_library_choose() {
    let (_sim, t, m) = SciSync::setup();
    let rec = SciSync::reconciled(&t, &cpu_pair(&t, m, None));
    let prim = first_u32(&SciSync::get(&t, rec, S_PRIMITIVE).unwrap().unwrap());
    assert!([1, 2, 4].contains(&prim), "{prim}");
}

#[test]
fn sync_waiter_require_timestamps_needs_need_cpu_access() {
    let (_sim, t, m) = SciSync::setup();
    let s = SciSync::list_of(&t, m, &[req_perm(SIGNAL)]);
    let w = SciSync::list_of(&t, m, &[req_perm(WAIT), (S_TIMESTAMPS, vec![1])]);
    assert_eq!(SciSync::reconcile(&t, &[s, w]).0, UNSUPPORTED_CONFIG);
}

#[test]
fn sync_output_only_keys_are_refused_by_setattrs() {
    let (_sim, t, m) = SciSync::setup();
    for output_only in [
        (3, u64b(&[3])),
        (S_MAX_VALUE, u64b(&[5])),
        (S_NUM_TS_SLOTS, u32b(&[1])),
    ] {
        let key = output_only.0;
        assert_eq!(
            SciSync::list_with(&t, m, &[output_only]).0,
            BAD_PARAMETER,
            "key {key}"
        );
    }
}

#[test]
fn sync_update_fence_out_of_range_is_overflow_with_the_output_cleared_first() {
    let (_sim, t, m) = SciSync::setup();
    // A refused update must clear a fence that held something.
    let overflows = |o, id, value| {
        let mut f = NvSciSyncFence { payload: [7; 6] };
        assert_eq!(
            update_fence(&t, o, id, value, &mut f),
            OVERFLOW,
            "id {id} value {value}"
        );
        assert_eq!(f.payload, [0; 6]);
    };
    // Syncpoint (32-bit values), no RequireDeterministicFences.
    let o = SciSync::obj(&t, &cpu_pair(&t, m, Some(&[1])));
    overflows(o, 0, u64::from(u32::MAX) + 1);
    overflows(o, u64::from(u32::MAX), 1);
    // Semaphores: one primitive, id 0 only.
    let sem = SciSync::obj(&t, &cpu_pair(&t, m, Some(&[2])));
    overflows(sem, 1, 1);
    // In range, without deterministic fences: fine.
    let mut f = NvSciSyncFence::default();
    assert_eq!(update_fence(&t, o, 0, u64::from(u32::MAX), &mut f), OK);
    let (mut id, mut v) = (9u64, 9u64);
    assert_eq!(
        call!(t.nvscisync, NvSciSyncFenceExtractFence(&f, &mut id, &mut v)).0,
        OK
    );
    assert_eq!(v, u64::from(u32::MAX));
    // 64-bit semaphore: u64 values.
    let s64 = SciSync::obj(&t, &cpu_pair(&t, m, Some(&[4])));
    assert_eq!(update_fence(&t, s64, 0, u64::MAX, &mut f), OK);
}

#[test]
fn sync_update_fence_does_not_need_deterministic_fences() {
    let (_sim, t, m) = SciSync::setup();
    let lists = cpu_pair(&t, m, None);
    for l in lists {
        // RequireDeterministicFences was never set.
        assert_eq!(SciSync::get(&t, l, S_DETERMINISTIC).unwrap(), None);
    }
    let o = SciSync::obj(&t, &lists);
    let mut f = NvSciSyncFence::default();
    assert_eq!(update_fence(&t, o, 0, 5, &mut f), OK);
}

#[test]
fn sync_fence_dup_needs_distinct_source_and_destination() {
    let (_sim, t, m) = SciSync::setup();
    let o = SciSync::obj(&t, &cpu_pair(&t, m, None));
    let mut f = generate_fence(&t, o);
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
    let (_sim, t, m) = SciSync::setup();
    let ctx = cpu_wait_context(&t, m);
    let f = NvSciSyncFence::default();
    let max = i64::MAX / 1000;
    for bad in [-2, i64::MIN, max + 1, i64::MAX] {
        assert_eq!(fence_wait(&t, &f, ctx, bad), BAD_PARAMETER, "{bad}");
    }
    for good in [-1, 0, 1, max] {
        assert_eq!(fence_wait(&t, &f, ctx, good), OK, "{good}");
    }
}

#[test]
fn sync_cpu_wait_needs_cpu_access_and_wait_permission() {
    let (_sim, t, m) = SciSync::setup();
    let s = SciSync::list_of(&t, m, &[(S_NEED_CPU, vec![1]), req_perm(SIGNAL)]);
    let w = SciSync::list_of(&t, m, &[req_perm(WAIT)]);
    // Neither list grants the waiter... the object handle here has the
    // union of permissions but the waiter did not ask for CPU access; the
    // signaller did, so the object is CPU-accessible: allowed.
    let o = SciSync::obj(&t, &[s, w]);
    let f = generate_fence(&t, o);
    let ctx = cpu_wait_context(&t, m);
    assert_eq!(obj_signal(&t, o), OK);
    assert_eq!(fence_wait(&t, &f, ctx, 0), OK);
    // Without NeedCpuAccess anywhere: a CPU wait is refused.
    let s2 = SciSync::list_of(&t, m, &[req_perm(SIGNAL)]);
    let w2 = SciSync::list_of(&t, m, &[req_perm(WAIT)]);
    let o2 = SciSync::obj(&t, &[s2, w2]);
    let mut f2 = NvSciSyncFence::default();
    assert_eq!(update_fence(&t, o2, 0, 1, &mut f2), OK);
    assert_eq!(fence_wait(&t, &f2, ctx, 0), BAD_PARAMETER);
}

#[test]
fn sync_one_wait_at_a_time_per_cpu_wait_context() {
    let (_sim, t, m) = SciSync::setup();
    let o = SciSync::obj(&t, &cpu_pair(&t, m, None));
    let f = generate_fence(&t, o);
    let ctx = cpu_wait_context(&t, m);
    let (ctx_u, t2) = (ctx as usize, t);
    let waiter = std::thread::spawn(move || {
        let ctx = ctx_u as NvSciSyncCpuWaitContext;
        fence_wait(&t2, &f, ctx, 3_000_000)
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(fence_wait(&t, &f, ctx, 0), BUSY);
    assert_eq!(obj_signal(&t, o), OK);
    assert_eq!(waiter.join().unwrap(), OK);
}
