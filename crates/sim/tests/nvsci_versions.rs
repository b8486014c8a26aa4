//! The NvSci rules that depend on the claimed release (fact sheet, "Checked
//! against the real headers"): version checks, entry points and keys that
//! exist only from some release on. Through the simulator's C entry points,
//! for every modelled release; the release-independent rules are in
//! `nvsci_rules_buf.rs` and `nvsci_rules_sync.rs`.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::ptr;

use tegra_interop_sim::{NvSciRelease, SimConfig};
use tegra_interop_sys::nvsci as nv;

#[macro_use]
mod nvsci_common;
#[macro_use]
mod nvsci_rules;
use nvsci_rules as rules;
use rules::*;

/// The expected code: `OK` where the release has the feature, else BadParameter.
fn ok_if(has: bool) -> u32 {
    if has {
        OK
    } else {
        BAD_PARAMETER
    }
}

#[test]
fn version_check_compatibility_answers_for_the_claimed_release() {
    for r in NvSciRelease::ALL {
        let (_sim, t) = setup_with(r);
        let (bmaj, bmin) = r.buf_version();
        let (smaj, smin) = r.sync_version();
        let name = r.name();
        SciBuf::assert_compatible(&t, bmaj, bmin, true);
        SciBuf::assert_compatible(&t, bmaj, bmin + 1, false);
        SciBuf::assert_compatible(&t, bmaj + 1, 0, false);
        SciSync::assert_compatible(&t, smaj, smin, true);
        SciSync::assert_compatible(&t, smaj, 0, true);
        SciSync::assert_compatible(&t, smaj, smin + 1, false);
        let null = ptr::null_mut();
        assert_eq!(
            SciSync::check_version(&t, smaj, smin, null),
            BAD_PARAMETER,
            "{name}"
        );
        assert_eq!(
            SciBuf::check_version(&t, bmaj, bmin, null),
            BAD_PARAMETER,
            "{name}"
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

/// NvSciIpcCheckVersionCompatibility(major, minor): its code and answer
/// (`out` NULL when `null`).
fn ipc_check(
    t: &tegra_interop_sim::FunctionTable,
    major: u32,
    minor: u32,
    null: bool,
) -> (u32, bool) {
    let mut ok = false;
    let out: *mut bool = if null { ptr::null_mut() } else { &mut ok };
    let r = call!(
        t.nvsciipc,
        NvSciIpcCheckVersionCompatibility(major, minor, out)
    )
    .0;
    (r, ok)
}

#[test]
fn version_nvsciipc_check_version_compatibility_exists_from_6_0_5() {
    // nvsciipc.h: absent in DRIVE OS 5.2.6 (no version at all), NvSciIpc 1.0
    // in 6.0.5 and 6.0.6, 1.4 in 6.0.8.1 and 6.0.10; the Jetson "2.4"
    // flavour's NvSciIpc is not known (absent, like its *Safe calls).
    let versions: Vec<_> = NvSciRelease::ALL.iter().map(|r| r.ipc_version()).collect();
    assert_eq!(
        versions,
        [None, Some((1, 0)), None, Some((1, 0)), Some((1, 4))]
    );
    for r in NvSciRelease::ALL {
        let (_sim, t) = setup_with(r);
        let name = r.name();
        let entry = t.nvsciipc.NvSciIpcCheckVersionCompatibility;
        let Some((major, minor)) = r.ipc_version() else {
            assert!(entry.is_none(), "{name}");
            continue;
        };
        assert!(entry.is_some(), "{name}");
        // Same major and a minor up to the library's.
        assert_eq!(ipc_check(&t, major, minor, false), (OK, true), "{name}");
        assert_eq!(ipc_check(&t, major, 0, false), (OK, true), "{name}");
        assert_eq!(
            ipc_check(&t, major, minor + 1, false),
            (OK, false),
            "{name}"
        );
        assert_eq!(ipc_check(&t, major + 1, 0, false), (OK, false), "{name}");
        assert_eq!(
            ipc_check(&t, major - 1, minor, false),
            (OK, false),
            "{name}"
        );
        // What these bindings were declared from (1.4) only at 1.4.
        let ours = (nv::NvSciIpcMajorVersion, nv::NvSciIpcMinorVersion);
        assert_eq!(
            ipc_check(&t, ours.0, ours.1, false).1,
            (major, minor) >= ours,
            "{name}"
        );
        // NULL out -> BadParameter.
        assert_eq!(ipc_check(&t, major, minor, true).0, BAD_PARAMETER, "{name}");
    }
}

#[test]
fn version_fence_extract_and_update_exist_from_sync_2_3_but_not_in_the_2_4_flavour() {
    for r in NvSciRelease::ALL {
        let (_sim, t) = setup_with(r);
        let expect = !matches!(r, NvSciRelease::V5_2_6 | NvSciRelease::JetsonSync2_4);
        let sync = &t.nvscisync;
        let name = r.name();
        assert_eq!(sync.NvSciSyncFenceExtractFence.is_some(), expect, "{name}");
        assert_eq!(sync.NvSciSyncFenceUpdateFence.is_some(), expect, "{name}");
        assert!(sync.NvSciSyncFenceWait.is_some());
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
        let name = r.name();
        let m = SciSync::module(&t);
        let (_, l) = SciSync::list_with(&t, m, &[req_perm(SIGNAL)]);
        for (key, from) in first {
            let got = SciSync::get(&t, l, key).map(|_| ());
            let expect = if order(r) >= from {
                Ok(())
            } else {
                Err(BAD_PARAMETER)
            };
            assert_eq!(got, expect, "key {key} on {name}");
        }
        // Setting a key the release lacks: BadParameter, like any unknown key.
        let set = |pair: (u32, Vec<u8>)| SciSync::list_with(&t, m, &[pair]).0;
        let det = set((S_DETERMINISTIC, vec![1]));
        assert_eq!(det, ok_if(order(r) >= 1), "{name}");
        let gpu = set((S_GPU_ID, vec![1; 16]));
        assert_eq!(gpu, ok_if(order(r) >= 4), "{name}");
        // PeerHwEngineArray (13) only from 2.8; the simulator does not
        // model it (NotSupported) where it exists.
        let peer = set((S_PEER_HW, vec![0; 8]));
        let expect = if order(r) >= 5 {
            NOT_SUPPORTED
        } else {
            BAD_PARAMETER
        };
        assert_eq!(peer, expect, "{name}");
        // Beyond every release's keys.
        assert_eq!(set((14, vec![1])), BAD_PARAMETER);
    }
}

#[test]
fn version_buf_gpu_cache_keys_exist_from_nvscibuf_2_8() {
    for r in NvSciRelease::ALL {
        let (_sim, t) = setup_with(r);
        let name = r.name();
        let m = SciBuf::module(&t);
        let l = SciBuf::list(&t, m);
        let expect = ok_if(r.buf_version() >= (2, 8));
        let e = cache_entry(&[0; 16], 1);
        assert_eq!(SciBuf::set(&t, l, &[(B_GPU_CACHE, e)]), expect, "{name}");
        let c = compression_entry(0, 1);
        assert_eq!(
            SciBuf::set(&t, l, &[(B_GPU_COMPRESSION, c)]),
            expect,
            "{name}"
        );
    }
}

#[test]
fn version_deterministic_flow_runs_at_every_release() {
    // The flow needs no key the oldest release lacks: signal from the CPU,
    // hand the fence to the waiter, wait.
    for r in NvSciRelease::ALL {
        let (_sim, t) = setup_with(r);
        let m = SciSync::module(&t);
        let o = SciSync::obj(&t, &cpu_pair(&t, m, None));
        let ctx = cpu_wait_context(&t, m);
        for _ in 0..3 {
            let f = generate_fence(&t, o);
            assert_eq!(obj_signal(&t, o), OK);
            assert_eq!(fence_wait(&t, &f, ctx, 1_000_000), OK, "{}", r.name());
        }
    }
}
