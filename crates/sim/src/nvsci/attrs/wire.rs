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

/// Reads what [`serialize`] wrote; `None` for anything else.
pub(crate) fn deserialize(bytes: &[u8]) -> Option<Vec<AttrMap>> {
    struct Cursor<'a> {
        bytes: &'a [u8],
        at: usize,
    }
    impl<'a> Cursor<'a> {
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            let b = self.bytes.get(self.at..self.at.checked_add(n)?)?;
            self.at += n;
            Some(b)
        }
        fn word(&mut self) -> Option<u32> {
            let b = self.take(4)?;
            Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
    }
    let mut cur = Cursor { bytes, at: 0 };
    if cur.word()? != WIRE_MAGIC {
        return None;
    }
    let nparts = cur.word()?;
    let mut parts = Vec::new();
    for _ in 0..nparts {
        let n = cur.word()?;
        let mut m = AttrMap::new();
        for _ in 0..n {
            let k = cur.word()?;
            let len = cur.word()? as usize;
            m.insert(k, cur.take(len)?.into());
        }
        parts.push(m);
    }
    (cur.at == bytes.len()).then_some(parts)
}
