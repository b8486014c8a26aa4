//! The in-place lowering the semaphore hot path uses (`lower_into`, written
//! straight into the C parameter arrays by `Stream::signal_batch` /
//! `wait_batch`) against the core's `lower_for`.
#![allow(clippy::unwrap_used)] // tests may unwrap
use std::ptr;

use tegra_interop_core::KEYED_MUTEX_INFINITE;
use tegra_interop_core::{SemaphoreHandleKind, SignalParams, WaitParams};
use tegra_interop_sys::cuda::{
    CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS, CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS,
};
use tegra_interop_sys::nvsci::NvSciSyncFence;

fn kinds() -> impl Iterator<Item = SemaphoreHandleKind> {
    (1..=10).map(|raw| SemaphoreHandleKind::from_raw(raw).unwrap())
}

fn fence() -> *mut NvSciSyncFence {
    ptr::NonNull::<NvSciSyncFence>::dangling().as_ptr()
}

fn signal_fields(raw: &CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS) -> impl PartialEq + std::fmt::Debug {
    // SAFETY: both members of the union are plain 64-bit values; reading
    // either is defined for any bit pattern.
    let nvsci = unsafe { raw.params.nvSciSync.reserved };
    (
        raw.params.fence.value,
        nvsci,
        raw.params.keyedMutex.key,
        raw.params.reserved,
        raw.flags,
        raw.reserved,
    )
}

fn wait_fields(raw: &CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS) -> impl PartialEq + std::fmt::Debug {
    // SAFETY: as above.
    let nvsci = unsafe { raw.params.nvSciSync.reserved };
    (
        raw.params.fence.value,
        nvsci,
        raw.params.keyedMutex.key,
        raw.params.keyedMutex.timeoutMs,
        raw.params.reserved,
        raw.flags,
        raw.reserved,
    )
}

/// The in-place lowering the hot path uses (`lower_into`) refuses what
/// `lower_for` refuses and writes exactly what it builds, for every kind
/// and every kind of parameters (including the memsync flags).
#[test]
fn lowering_matches_the_core() {
    let mut signals = vec![
        SignalParams::binary(),
        SignalParams::timeline(7),
        SignalParams::timeline(u64::MAX),
        SignalParams::nvscisync(fence()),
        SignalParams::nvscisync(ptr::null_mut()),
        SignalParams::keyed_mutex(3),
    ];
    // SAFETY: only lowered, never submitted.
    signals.push(unsafe { SignalParams::nvscisync(fence()).skip_nvscibuf_memsync() });
    // SAFETY: only lowered, never submitted.
    signals.push(unsafe { SignalParams::timeline(1).skip_nvscibuf_memsync() });
    let mut waits = vec![
        WaitParams::binary(),
        WaitParams::timeline(9),
        WaitParams::nvscisync(fence()),
        WaitParams::nvscisync(ptr::null()),
        WaitParams::keyed_mutex(4, 250),
        WaitParams::keyed_mutex(5, KEYED_MUTEX_INFINITE),
    ];
    // SAFETY: only lowered, never submitted.
    waits.push(unsafe { WaitParams::nvscisync(fence()).skip_nvscibuf_memsync() });
    // SAFETY: only lowered, never submitted.
    waits.push(unsafe { WaitParams::binary().skip_nvscibuf_memsync() });

    let (mut accepted, mut refused) = (0, 0);
    for kind in kinds() {
        for params in &signals {
            let mut raw = CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default();
            let ours = params.lower_into(kind, &mut raw);
            match params.lower_for(kind) {
                Ok(core) => {
                    assert_eq!(ours, Ok(()), "{kind:?} {params:?}");
                    assert_eq!(
                        signal_fields(&raw),
                        signal_fields(&core),
                        "{kind:?} {params:?}"
                    );
                    accepted += 1;
                }
                Err(e) => {
                    assert_eq!(ours, Err(e), "{kind:?} {params:?}");
                    refused += 1;
                }
            }
        }
        for params in &waits {
            let mut raw = CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default();
            let ours = params.lower_into(kind, &mut raw);
            match params.lower_for(kind) {
                Ok(core) => {
                    assert_eq!(ours, Ok(()), "{kind:?} {params:?}");
                    assert_eq!(wait_fields(&raw), wait_fields(&core), "{kind:?} {params:?}");
                    accepted += 1;
                }
                Err(e) => {
                    assert_eq!(ours, Err(e), "{kind:?} {params:?}");
                    refused += 1;
                }
            }
        }
    }
    // Both sides of every rule were exercised.
    assert!(
        accepted >= 20 && refused >= 100,
        "{accepted} accepted, {refused} refused"
    );
}
