//! `NvSciIpcCheckVersionCompatibility`, for the NvSciIpc version the
//! claimed release has ([`crate::NvSciRelease::ipc_version`]). The table
//! entry is absent where the release has none (see `slots::ipc_table`).

#![deny(unsafe_code)]

use tegra_interop_sys::nvsci::NvSciError;

use crate::cmem::CMut;
use crate::instance::Call;
use crate::nvsci::{done, err, put};
use crate::DiagnosticKind as D;

/// Compatible iff the same major version and a requested minor no newer
/// than the library's (nvsciipc.h of DRIVE OS 6.0.5 to 6.0.10); NULL `out`
/// -> BadParameter.
pub(crate) fn NvSciIpcCheckVersionCompatibility(
    c: &Call,
    major: u32,
    minor: u32,
    out: CMut<bool>,
) -> NvSciError {
    let Some((lib_major, lib_minor)) = c.inst.config.nvsci_release.ipc_version() else {
        // Not reachable through the table (the entry is absent there).
        c.diag(
            D::Misuse,
            "NvSciIpcCheckVersionCompatibility called on a release without it".into(),
        );
        return err::NOT_SUPPORTED;
    };
    done(put(out, major == lib_major && minor <= lib_minor))
}
