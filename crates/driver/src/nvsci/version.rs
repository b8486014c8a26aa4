//! The versions of the loaded NvSci libraries and what each version has.
//!
//! Read once per module at [`BufModule::open`](super::BufModule::open) /
//! [`SyncModule::open`](super::SyncModule::open) by probing
//! `Nv*CheckVersionCompatibility` (compatible means: same major, and a minor
//! not above the library's), so the largest compatible minor is the
//! library's. Keys and entry points that appeared after 2.0 are then checked
//! against it before any call (the version table of the project's NvSci fact
//! sheet):
//!
//! | what | NvSciSync | NvSciBuf |
//! |---|---|---|
//! | sync keys 1..=5, every entry point but the two below | 2.0 | |
//! | sync key 6 `RequireDeterministicFences` | 2.3 (also the 2.4 flavour) | |
//! | sync keys 7..=9, `FenceExtractFence`, `FenceUpdateFence` | 2.3, not the 2.4 flavour | |
//! | sync keys 10..=12 (`PrimitiveInfo`, `PeerLocationInfo`, `GpuId`) | 2.5 | |
//! | sync key 13 `PeerHwEngineArray` | 2.8 | |
//! | buf keys 9..=11 (GPU cache, coherency, compression) | | 2.8 |
//!
//! NvSciIpc has its own numbers: 1.0 from DRIVE OS 6.0.5 (with
//! `NvSciIpcCheckVersionCompatibility`), 1.4 in 6.0.8.1 and 6.0.10; 5.2.6's
//! has no version and no such call
//! ([`NvSciIpc::check_version_compatibility`](super::NvSciIpc::check_version_compatibility)
//! refuses there with [`Error::NotInLibraryVersion`], loaded version
//! [`LibVersion::UNVERSIONED`]).
//!
//! NvSciSync 2.4 is taken to be the public "2.4" header's flavour (the one
//! that may ship with Jetson Linux): it has `RequireDeterministicFences` but
//! no keys >= 7 and no `FenceExtractFence` / `FenceUpdateFence`. A library
//! whose version cannot be read (no `CheckVersionCompatibility`, or no
//! compatible major 1..=3) is treated as 2.0, the oldest documented one.

use std::fmt;

use tegra_interop_sys::nvsci::{NvSciBufAttrKey, NvSciSyncAttrKey};

use crate::{logging, Error};

/// A library version, `major.minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LibVersion {
    /// Major version (2 for every documented NvSci release).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl LibVersion {
    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// 0.0: what a library that reports no version at all is given: the
    /// NvSciIpc of DRIVE OS 5.2.6, which predates NvSciIpc 1.0 and its
    /// `NvSciIpcCheckVersionCompatibility`. No NvSci library has this
    /// version; it prints as "unversioned".
    pub const UNVERSIONED: LibVersion = LibVersion::new(0, 0);
}

impl fmt::Display for LibVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Self::UNVERSIONED {
            return f.write_str("unversioned (older than its first numbered version)");
        }
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// How a module learned its library's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VersionSource {
    /// Probed with `Nv*CheckVersionCompatibility`.
    Probed,
    /// The library has no `Nv*CheckVersionCompatibility`, or it accepted no
    /// probe: assumed 2.0 (everything newer is treated as absent).
    Assumed,
}

/// The version of one loaded NvSci library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NvSciVersion {
    /// The version (2.0 when [`source`](Self::source) is `Assumed`).
    pub version: LibVersion,
    /// Where it came from.
    pub source: VersionSource,
}

impl fmt::Display for NvSciVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.source {
            VersionSource::Probed => write!(f, "{}", self.version),
            VersionSource::Assumed => write!(f, "{} (assumed: not reported)", self.version),
        }
    }
}

/// The oldest documented version, assumed when none can be read.
const OLDEST: LibVersion = LibVersion::new(2, 0);
/// Highest minor probed.
const MAX_MINOR: u32 = 255;

/// Finds the library's version from its compatibility check.
pub(crate) fn probe(has_check: bool, compatible: impl Fn(u32, u32) -> bool) -> NvSciVersion {
    let assumed = NvSciVersion {
        version: OLDEST,
        source: VersionSource::Assumed,
    };
    if !has_check {
        return assumed;
    }
    for major in [2, 1, 3] {
        if !compatible(major, 0) {
            continue;
        }
        let mut minor = 0;
        while minor < MAX_MINOR && compatible(major, minor + 1) {
            minor += 1;
        }
        return NvSciVersion {
            version: LibVersion::new(major, minor),
            source: VersionSource::Probed,
        };
    }
    assumed
}

/// What a version has. `Err(needed)` names the version that has it.
type Have = Result<(), &'static str>;

fn at_least(v: LibVersion, major: u32, minor: u32, needed: &'static str) -> Have {
    if v.major == major && v.minor >= minor || v.major > major {
        Ok(())
    } else {
        Err(needed)
    }
}

/// `true` for the NvSciSync 2.4 flavour (no keys >= 7, no Extract/UpdateFence).
fn is_sync_2_4(v: LibVersion) -> bool {
    v == LibVersion::new(2, 4)
}

const SYNC_2_3_NOT_2_4: &str = "2.3 or 2.5+ (the 2.4 flavour lacks it)";

impl NvSciVersion {
    /// Whether this NvSciSync version knows `key`.
    pub fn sync_key(&self, key: NvSciSyncAttrKey) -> Result<(), &'static str> {
        let v = self.version;
        match key.0 {
            1..=5 => Ok(()),
            6 => at_least(v, 2, 3, "2.3"),
            7..=9 if is_sync_2_4(v) => Err(SYNC_2_3_NOT_2_4),
            7..=9 => at_least(v, 2, 3, "2.3"),
            10..=12 => at_least(v, 2, 5, "2.5"),
            13 => at_least(v, 2, 8, "2.8"),
            _ => Err("no release (not a documented key)"),
        }
    }

    /// Whether this NvSciSync version has `NvSciSyncFenceExtractFence` and
    /// `NvSciSyncFenceUpdateFence`.
    pub fn sync_has_extract_update(&self) -> Result<(), &'static str> {
        if is_sync_2_4(self.version) {
            return Err(SYNC_2_3_NOT_2_4);
        }
        at_least(self.version, 2, 3, "2.3")
    }

    /// Whether this NvSciBuf version knows `key` (general keys 9..=11 from
    /// 2.8; the raw-buffer and image keys the project uses from 2.0).
    pub fn buf_key(&self, key: NvSciBufAttrKey) -> Result<(), &'static str> {
        match key.0 {
            9..=11 => at_least(self.version, 2, 8, "2.8"),
            _ => Ok(()),
        }
    }
}

/// The error for something the loaded library lacks.
pub(crate) fn too_old(
    item: &'static str,
    library: &'static str,
    needed: &'static str,
    loaded: NvSciVersion,
) -> Error {
    logging::debug!(
        target: logging::NVSCI,
        "{library} {loaded} lacks {item} (needs {needed}): NotInLibraryVersion"
    );
    Error::NotInLibraryVersion {
        item,
        library,
        needed,
        loaded: loaded.version,
    }
}

/// The C name of a sync key (for messages).
pub(crate) fn sync_key_name(key: NvSciSyncAttrKey) -> &'static str {
    match key.0 {
        1 => "NvSciSyncAttrKey_NeedCpuAccess",
        2 => "NvSciSyncAttrKey_RequiredPerm",
        3 => "NvSciSyncAttrKey_ActualPerm",
        4 => "NvSciSyncAttrKey_WaiterContextInsensitiveFenceExports",
        5 => "NvSciSyncAttrKey_WaiterRequireTimestamps",
        6 => "NvSciSyncAttrKey_RequireDeterministicFences",
        7 => "NvSciSyncAttrKey_NumTimestampSlots",
        8 => "NvSciSyncAttrKey_NumTaskStatusSlots",
        9 => "NvSciSyncAttrKey_MaxPrimitiveValue",
        10 => "NvSciSyncAttrKey_PrimitiveInfo",
        11 => "NvSciSyncAttrKey_PeerLocationInfo",
        12 => "NvSciSyncAttrKey_GpuId",
        13 => "NvSciSyncAttrKey_PeerHwEngineArray",
        _ => "an undocumented NvSciSync key",
    }
}

/// The C name of a buf general key the version table gates (for messages).
pub(crate) fn buf_key_name(key: NvSciBufAttrKey) -> &'static str {
    match key.0 {
        9 => "NvSciBufGeneralAttrKey_EnableGpuCache",
        10 => "NvSciBufGeneralAttrKey_GpuSwNeedCacheCoherency",
        11 => "NvSciBufGeneralAttrKey_EnableGpuCompression",
        _ => "an NvSciBuf key",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32) -> NvSciVersion {
        NvSciVersion {
            version: LibVersion::new(major, minor),
            source: VersionSource::Probed,
        }
    }

    #[test]
    fn the_version_table() {
        let k = NvSciSyncAttrKey;
        assert!(v(2, 0).sync_key(k(5)).is_ok());
        assert!(v(2, 0).sync_key(k(6)).is_err());
        assert!(v(2, 4).sync_key(k(6)).is_ok());
        assert!(v(2, 4).sync_key(k(9)).is_err());
        assert!(v(2, 3).sync_key(k(9)).is_ok());
        assert!(v(2, 3).sync_key(k(10)).is_err());
        assert!(v(2, 5).sync_key(k(12)).is_ok());
        assert!(v(2, 5).sync_key(k(13)).is_err());
        assert!(v(2, 8).sync_key(k(13)).is_ok());
        assert!(v(2, 0).sync_has_extract_update().is_err());
        assert!(v(2, 4).sync_has_extract_update().is_err());
        assert!(v(2, 3).sync_has_extract_update().is_ok());
        assert!(v(2, 8).sync_has_extract_update().is_ok());
        assert!(v(2, 0).buf_key(NvSciBufAttrKey(9)).is_err());
        assert!(v(2, 8).buf_key(NvSciBufAttrKey(11)).is_ok());
        assert!(v(2, 0).buf_key(NvSciBufAttrKey(0x10000)).is_ok());
    }

    #[test]
    fn an_unversioned_library_says_so() {
        assert_eq!(LibVersion::new(1, 4).to_string(), "1.4");
        assert_eq!(LibVersion::new(2, 0).to_string(), "2.0");
        assert!(LibVersion::UNVERSIONED
            .to_string()
            .starts_with("unversioned"));
        assert!(LibVersion::UNVERSIONED < LibVersion::new(1, 0));
    }
}
