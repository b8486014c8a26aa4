//! Which NvSci release the simulator claims to be ([`NvSciRelease`]).
//!
//! A simulator claiming a release lacks what that release lacks, after the
//! versions in the real headers of each release (the crate README lists
//! them: NvSciBuf / NvSciSync 2.0 / 2.0 at DRIVE OS 5.2.6, 2.8 / 2.3 at
//! 6.0.5, 2.9 / 2.5 at 6.0.6, 2.11 / 2.8 at 6.0.8.1 and 6.0.10):
//! sync keys and entry points that appeared later are unknown to it, and its
//! `Nv*CheckVersionCompatibility` answer for its own versions (NvSciIpc's
//! only where the release has one).

#![deny(unsafe_code)]

/// An NvSci release the simulator can claim to be (see
/// [`SimConfig::nvsci_release`](crate::SimConfig::nvsci_release)).
///
/// | release | NvSciBuf | NvSciSync | NvSciIpc |
/// |---|---|---|---|
/// | `V5_2_6` (DRIVE OS 5.2.6) | 2.0 | 2.0 | no version (before 1.0) |
/// | `V6_0_5` (DRIVE OS 6.0.5) | 2.8 | 2.3 | 1.0 |
/// | `JetsonSync2_4` (the public NvSciSync "2.4" header, maybe Jetson Linux) | 2.8 (chosen) | 2.4 | unknown: none claimed |
/// | `V6_0_6` (DRIVE OS 6.0.6) | 2.9 | 2.5 | 1.0 |
/// | `V6_0_10` (DRIVE OS 6.0.8.1 / 6.0.10) | 2.11 | 2.8 | 1.4 |
///
/// The NvSciIpc versions are those of each release's nvsciipc.h
/// (`NvSciIpcMajorVersion` / `NvSciIpcMinorVersion`); 5.2.6's header has
/// no version and no `NvSciIpcCheckVersionCompatibility`.
///
/// The NvSciBuf version that goes with the "2.4" NvSciSync header is not
/// known; the simulator chooses 2.8 (the NvSciBuf of the nearest DRIVE OS
/// release, 6.0.5), so the buf keys 9..=11 exist there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NvSciRelease {
    /// DRIVE OS 5.2.6: NvSciBuf 2.0, NvSciSync 2.0. Sync keys up to
    /// WaiterRequireTimestamps (5); no FenceExtractFence / FenceUpdateFence;
    /// no buf keys 9..=11.
    V5_2_6,
    /// DRIVE OS 6.0.5: NvSciBuf 2.8, NvSciSync 2.3. Sync keys 6..=9
    /// (RequireDeterministicFences .. MaxPrimitiveValue), Extract/UpdateFence,
    /// buf keys EnableGpuCache / GpuSwNeedCacheCoherency / EnableGpuCompression.
    V6_0_5,
    /// The public NvSciSync "2.4" header whose origin may be Jetson Linux:
    /// RequireDeterministicFences (6) but no keys >= 7 and no
    /// FenceExtractFence / FenceUpdateFence. NvSciBuf 2.8 (chosen).
    JetsonSync2_4,
    /// DRIVE OS 6.0.6: NvSciBuf 2.9, NvSciSync 2.5. Sync PrimitiveInfo (10),
    /// PeerLocationInfo (11), GpuId (12).
    V6_0_6,
    /// DRIVE OS 6.0.8.1 / 6.0.10: NvSciBuf 2.11, NvSciSync 2.8. Sync
    /// PeerHwEngineArray (13). The default.
    #[default]
    V6_0_10,
}

impl NvSciRelease {
    /// Every release, oldest first.
    pub const ALL: [NvSciRelease; 5] = [
        NvSciRelease::V5_2_6,
        NvSciRelease::V6_0_5,
        NvSciRelease::JetsonSync2_4,
        NvSciRelease::V6_0_6,
        NvSciRelease::V6_0_10,
    ];

    /// The NvSciBuf (major, minor) version of this release.
    pub fn buf_version(self) -> (u32, u32) {
        match self {
            NvSciRelease::V5_2_6 => (2, 0),
            NvSciRelease::V6_0_5 => (2, 8),
            NvSciRelease::JetsonSync2_4 => (2, 8),
            NvSciRelease::V6_0_6 => (2, 9),
            NvSciRelease::V6_0_10 => (2, 11),
        }
    }

    /// The NvSciSync (major, minor) version of this release.
    pub fn sync_version(self) -> (u32, u32) {
        match self {
            NvSciRelease::V5_2_6 => (2, 0),
            NvSciRelease::V6_0_5 => (2, 3),
            NvSciRelease::JetsonSync2_4 => (2, 4),
            NvSciRelease::V6_0_6 => (2, 5),
            NvSciRelease::V6_0_10 => (2, 8),
        }
    }

    /// The NvSciIpc (major, minor) version of this release; `None` where
    /// the library has no version and no `NvSciIpcCheckVersionCompatibility`
    /// (DRIVE OS 5.2.6; the Jetson "2.4" flavour, whose NvSciIpc is not
    /// known, is treated the same way: absent, not guessed).
    pub fn ipc_version(self) -> Option<(u32, u32)> {
        match self {
            NvSciRelease::V5_2_6 | NvSciRelease::JetsonSync2_4 => None,
            NvSciRelease::V6_0_5 | NvSciRelease::V6_0_6 => Some((1, 0)),
            NvSciRelease::V6_0_10 => Some((1, 4)),
        }
    }

    /// A human-readable name ("DRIVE OS 6.0.10 (NvSciBuf 2.11, NvSciSync 2.8)").
    pub fn name(self) -> &'static str {
        match self {
            NvSciRelease::V5_2_6 => "DRIVE OS 5.2.6 (NvSciBuf 2.0, NvSciSync 2.0)",
            NvSciRelease::V6_0_5 => "DRIVE OS 6.0.5 (NvSciBuf 2.8, NvSciSync 2.3)",
            NvSciRelease::JetsonSync2_4 => {
                "NvSciSync 2.4 flavour, maybe Jetson Linux (NvSciBuf 2.8 chosen, NvSciSync 2.4)"
            }
            NvSciRelease::V6_0_6 => "DRIVE OS 6.0.6 (NvSciBuf 2.9, NvSciSync 2.5)",
            NvSciRelease::V6_0_10 => "DRIVE OS 6.0.10 (NvSciBuf 2.11, NvSciSync 2.8)",
        }
    }

    /// Whether this release's NvSciSync knows the attribute key `key`.
    pub(crate) fn sync_key_known(self, key: u32) -> bool {
        let highest = match self {
            NvSciRelease::V5_2_6 => 5,
            NvSciRelease::JetsonSync2_4 => 6,
            NvSciRelease::V6_0_5 => 9,
            NvSciRelease::V6_0_6 => 12,
            NvSciRelease::V6_0_10 => 13,
        };
        // 0 (LowerBound) and the upper bound are markers, not keys.
        (1..=highest).contains(&key)
    }

    /// Whether this release's NvSciSync has FenceExtractFence and
    /// FenceUpdateFence.
    pub(crate) fn has_fence_extract_update(self) -> bool {
        !matches!(self, NvSciRelease::V5_2_6 | NvSciRelease::JetsonSync2_4)
    }

    /// Whether this release's NvSciIpc has the `*Safe` calls
    /// (CloseEndpointSafe, ResetEndpointSafe, GetEventSafe, ReadSafe,
    /// WriteSafe): from DRIVE OS 6.0.5 on; not in the 5.2.6 header, and not
    /// known for the Jetson "2.4" flavour (so absent: refused, not guessed).
    pub(crate) fn has_ipc_safe_calls(self) -> bool {
        !matches!(self, NvSciRelease::V5_2_6 | NvSciRelease::JetsonSync2_4)
    }
}

impl core::fmt::Display for NvSciRelease {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}
