//! The wire form of exported attribute lists.

#![deny(unsafe_code)]

use super::*;

pub(crate) const WIRE_MAGIC: u32 = u32::from_le_bytes(*b"TSAL");

/// Serialises lists for attribute-list IPC.
pub(crate) fn serialize(parts: &[&AttrMap]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&WIRE_MAGIC.to_le_bytes());
    out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for p in parts {
        let public = p.iter().filter(|(k, _)| **k < PRIVATE_PEER);
        out.extend_from_slice(&(public.clone().count() as u32).to_le_bytes());
        for (k, v) in public {
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
    }
    out
}

/// The most lists (parts) one attribute-list descriptor may carry. A
/// chosen bound: an export carries the lists one participant passed (a
/// few); no header states a limit.
pub(crate) const MAX_PARTS: u32 = 64;
/// The most keys one part may carry. A chosen bound, above the number of
/// public keys of either library.
pub(crate) const MAX_KEYS: u32 = 128;
/// The most bytes one value may have. A chosen bound: the largest values
/// are per-GPU arrays of 16 to 20 bytes an entry.
pub(crate) const MAX_VALUE: u32 = 4096;

/// Why descriptor bytes were refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WireError {
    /// Not the simulator's attribute-list form (wrong magic, cut short,
    /// bytes left over).
    Malformed,
    /// A count or size beyond the bounds above.
    Bound(String),
}

/// Reads what [`serialize`] wrote. The bytes come from a peer: the counts
/// and sizes are checked against [`MAX_PARTS`], [`MAX_KEYS`] and
/// [`MAX_VALUE`] before anything is allocated for them, and a key twice in
/// one part is refused, so what a descriptor costs is bounded by its
/// length.
pub(crate) fn deserialize(bytes: &[u8]) -> Result<Vec<AttrMap>, WireError> {
    struct Cursor<'a> {
        bytes: &'a [u8],
        at: usize,
    }
    impl<'a> Cursor<'a> {
        fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
            let end = self.at.checked_add(n).ok_or(WireError::Malformed)?;
            let b = self.bytes.get(self.at..end).ok_or(WireError::Malformed)?;
            self.at = end;
            Ok(b)
        }
        fn word(&mut self) -> Result<u32, WireError> {
            let b = self.take(4)?;
            Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
    }
    let mut cur = Cursor { bytes, at: 0 };
    if cur.word()? != WIRE_MAGIC {
        return Err(WireError::Malformed);
    }
    let nparts = cur.word()?;
    if nparts > MAX_PARTS {
        return Err(WireError::Bound(format!(
            "{nparts} parts (lists); at most {MAX_PARTS} are accepted"
        )));
    }
    let mut parts = Vec::with_capacity(nparts as usize);
    for i in 0..nparts {
        let n = cur.word()?;
        if n > MAX_KEYS {
            return Err(WireError::Bound(format!(
                "part {i} has {n} keys; at most {MAX_KEYS} are accepted"
            )));
        }
        let mut m = AttrMap::new();
        for _ in 0..n {
            let k = cur.word()?;
            let len = cur.word()?;
            if len > MAX_VALUE {
                return Err(WireError::Bound(format!(
                    "key {k:#x} of part {i} has a value of {len} bytes; at most {MAX_VALUE} are accepted"
                )));
            }
            if m.insert(k, cur.take(len as usize)?.into()).is_some() {
                return Err(WireError::Bound(format!(
                    "key {k:#x} appears twice in part {i} (a list holds each key once)"
                )));
            }
        }
        parts.push(m);
    }
    if cur.at == bytes.len() {
        Ok(parts)
    } else {
        Err(WireError::Malformed)
    }
}
