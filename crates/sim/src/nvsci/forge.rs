//! What a hostile peer sends, for tests and fuzzing: rewriting the
//! simulator's attribute-list descriptors (its wire form, `attrs::wire`) and
//! NvSciBuf object descriptors the way a peer that does not go through the
//! library could.
//!
//! Nothing here is trusted by the simulator: every import path checks what
//! arrives (see the "hostile peer" rows of the crate's README).

use std::collections::BTreeMap;

use tegra_interop_sys::nvsci::NvSciBufObjIpcExportDescriptor;

/// The first key the simulator keeps to itself (the IPC topology); export
/// never sends it or any key above it, so an import refuses them.
pub const FIRST_PRIVATE_KEY: u32 = super::attrs::PRIVATE_PEER;

/// The parts of an attribute-list descriptor: per part, key -> value bytes.
/// `None` for bytes that are not one, or one beyond the bounds an import
/// checks (see the crate README's "hostile peer" rows).
pub fn list_parts(desc: &[u8]) -> Option<Vec<BTreeMap<u32, Vec<u8>>>> {
    let parts = super::attrs::deserialize(desc).ok()?;
    Some(
        parts
            .into_iter()
            .map(|p| p.into_iter().map(|(k, v)| (k, v.to_vec())).collect())
            .collect(),
    )
}

/// Writes `parts` in the descriptor form, every key included (private ones
/// too, unlike the library's export).
pub fn list_desc(parts: &[BTreeMap<u32, Vec<u8>>]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&super::attrs::WIRE_MAGIC.to_le_bytes());
    out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for p in parts {
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        for (k, v) in p {
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
    }
    out
}

/// `desc` with `key` set to `value` in every part; `None` if `desc` is not
/// an attribute-list descriptor.
pub fn with_key(desc: &[u8], key: u32, value: &[u8]) -> Option<Vec<u8>> {
    let mut parts = list_parts(desc)?;
    for p in &mut parts {
        p.insert(key, value.to_vec());
    }
    Some(list_desc(&parts))
}

/// The size an NvSciBuf object descriptor claims.
pub fn buf_desc_size(d: &NvSciBufObjIpcExportDescriptor) -> u64 {
    let words = d.data;
    words[2]
}

/// `d` claiming `size` bytes instead.
pub fn buf_desc_with_size(
    d: &NvSciBufObjIpcExportDescriptor,
    size: u64,
) -> NvSciBufObjIpcExportDescriptor {
    let mut words = d.data;
    words[2] = size;
    NvSciBufObjIpcExportDescriptor { data: words }
}
