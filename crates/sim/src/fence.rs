//! How the simulator fills an `NvSciSyncFence` (48 opaque bytes).
//!
//! The real layout is private to NvSciSync. The simulator's own layout,
//! shared by its CUDA part (which writes fences in
//! `cuSignalExternalSemaphoresAsync` and reads them in
//! `cuWaitExternalSemaphoresAsync`) and its NvSci part:
//!
//! | word | meaning                                        |
//! |------|------------------------------------------------|
//! | 0    | [`FENCE_TAG`] (zero in a cleared fence)        |
//! | 1    | id of the sync object (see [`crate::SyncObjectHandle::id`]) |
//! | 2    | the counter value the fence stands for         |
//! | 3..6 | zero                                           |
//!
//! An all-zero fence is "cleared": waiting on it completes at once.

#![deny(unsafe_code)]

use tegra_interop_sys::nvsci::NvSciSyncFence;

/// Marker in word 0 of a fence the simulator wrote.
pub const FENCE_TAG: u64 = u64::from_le_bytes(*b"TISIMFNC");

/// A decoded simulator fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimFence {
    /// Id of the sync object the fence belongs to.
    pub object_id: u64,
    /// Counter value that completes the fence.
    pub value: u64,
}

/// What a fence's bytes say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceContent {
    /// All zero: nothing to wait for.
    Cleared,
    /// A fence the simulator wrote.
    Fence(SimFence),
    /// Bytes the simulator did not write.
    Garbage,
}

/// Writes `fence` into `out`.
pub fn encode(fence: SimFence) -> NvSciSyncFence {
    NvSciSyncFence {
        payload: [FENCE_TAG, fence.object_id, fence.value, 0, 0, 0],
    }
}

/// Reads a fence.
pub fn decode(fence: &NvSciSyncFence) -> FenceContent {
    let p = fence.payload;
    if p.iter().all(|w| *w == 0) {
        FenceContent::Cleared
    } else if p[0] == FENCE_TAG && p[1] != 0 && p[3..].iter().all(|w| *w == 0) {
        FenceContent::Fence(SimFence {
            object_id: p[1],
            value: p[2],
        })
    } else {
        FenceContent::Garbage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_cleared() {
        let f = SimFence {
            object_id: 7,
            value: 0xffff_ffff,
        };
        assert_eq!(decode(&encode(f)), FenceContent::Fence(f));
        assert_eq!(
            decode(&NvSciSyncFence { payload: [0; 6] }),
            FenceContent::Cleared
        );
        assert_eq!(
            decode(&NvSciSyncFence {
                payload: [1, 2, 3, 4, 5, 6]
            }),
            FenceContent::Garbage
        );
    }
}
