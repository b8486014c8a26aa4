//! `cuMemcpy3D`: the sides of a 3D copy and their checks.

use super::*;

/// One side of a cuMemcpy3D.
pub(super) struct Side {
    /// Host memory of the caller (reached through the descriptor), or
    /// simulator memory at `base`.
    host: bool,
    base: usize,
    pitch: usize,
    height: usize,
}

/// Byte offsets of the first and one-past-the-last byte a 3D copy touches.
pub(super) fn span(
    (x, y, z): (usize, usize, usize),
    (pitch, height): (usize, usize),
    (w, h, d): (usize, usize, usize),
) -> Option<(usize, usize)> {
    let slice = pitch.checked_mul(height)?;
    let first = z
        .checked_mul(slice)?
        .checked_add(y.checked_mul(pitch)?)?
        .checked_add(x)?;
    let last_row = (z + d - 1)
        .checked_mul(slice)?
        .checked_add((y + h - 1).checked_mul(pitch)?)?
        .checked_add(x)?;
    Some((first, last_row.checked_add(w)?))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn resolve_side(
    c: &Call,
    st: &State,
    kind: CUmemorytype,
    host: usize,
    dev: CUdeviceptr,
    array: CUarray,
    pitch: usize,
    height: usize,
    (x, y, z): (usize, usize, usize),
    (w, h, d): (usize, usize, usize),
) -> R<Side> {
    let kind = match kind.0 {
        4 if st
            .allocations
            .range(..=dev)
            .next_back()
            .is_some_and(|(s, a)| dev < s + a.len as u64) =>
        {
            2
        }
        4 => 1,
        k => k,
    };
    match kind {
        1 => {
            if host == 0 && dev == 0 {
                return Err(INVALID_VALUE);
            }
            let base = if host != 0 { host } else { dev as usize };
            Ok(Side {
                host: true,
                base,
                pitch: if pitch == 0 { w } else { pitch },
                height: if height == 0 { h } else { height },
            })
        }
        2 => {
            let pitch = if pitch == 0 { w } else { pitch };
            let height = if height == 0 { h } else { height };
            if pitch < w || (d > 1 && height < h) {
                return Err(INVALID_VALUE);
            }
            let (first, end) = span((x, y, z), (pitch, height), (w, h, d)).ok_or(INVALID_VALUE)?;
            device_range(
                c,
                st,
                dev.checked_add(first as u64).ok_or(INVALID_VALUE)?,
                end - first,
            )?;
            Ok(Side {
                host: false,
                base: dev as usize,
                pitch,
                height,
            })
        }
        3 => {
            let ah = array as usize as u64;
            let a = match st.arrays.get(&ah) {
                Some(a) => *a,
                None => return Err(not_live(c, st, "CUDA array", ah, false, INVALID_HANDLE)),
            };
            let fits = x.checked_add(w).is_some_and(|e| e <= a.row_bytes)
                && y.checked_add(h).is_some_and(|e| e <= a.height)
                && z.checked_add(d).is_some_and(|e| e <= a.depth);
            if !fits {
                return Err(INVALID_VALUE);
            }
            Ok(Side {
                host: false,
                base: a.ptr,
                pitch: a.row_bytes,
                height: a.height,
            })
        }
        _ => Err(INVALID_VALUE),
    }
}

pub(crate) fn cuMemcpy3D(c: &Call, p: CPtr<CUDA_MEMCPY3D>) -> CUresult {
    let r = (|| {
        let m: CIn<CUDA_MEMCPY3D> = p.read_in().ok_or(INVALID_VALUE)?;
        legacy_sync(c)?;
        if m.srcLOD != 0 || m.dstLOD != 0 || !m.reserved0.is_null() || !m.reserved1.is_null() {
            return Err(INVALID_VALUE);
        }
        let (w, h, d) = (m.WidthInBytes, m.Height.max(1), m.Depth.max(1));
        if w == 0 {
            return Ok(());
        }
        let st = c.state();
        let src = resolve_side(
            c,
            &st,
            m.srcMemoryType,
            m.srcHost as usize,
            m.srcDevice,
            m.srcArray,
            m.srcPitch,
            m.srcHeight,
            (m.srcXInBytes, m.srcY, m.srcZ),
            (w, h, d),
        )?;
        let dst = resolve_side(
            c,
            &st,
            m.dstMemoryType,
            m.dstHost as usize,
            m.dstDevice,
            m.dstArray,
            m.dstPitch,
            m.dstHeight,
            (m.dstXInBytes, m.dstY, m.dstZ),
            (w, h, d),
        )?;
        let mut row = vec![0u8; w];
        for zz in 0..d {
            for yy in 0..h {
                let so = (m.srcZ + zz) * src.pitch * src.height
                    + (m.srcY + yy) * src.pitch
                    + m.srcXInBytes;
                let dof = (m.dstZ + zz) * dst.pitch * dst.height
                    + (m.dstY + yy) * dst.pitch
                    + m.dstXInBytes;
                // Row by row through a buffer of ours: host sides are read and
                // written through the descriptor (checked against the range it
                // describes), device and array sides through the simulator's
                // mapping of the live range (checked above, kept alive by the
                // held lock); overlapping sides copy as the bytes were before.
                let ok = if src.host {
                    m.read_host_src(so, &mut row)
                } else {
                    st.device_read((src.base + so) as u64, &mut row)
                } && if dst.host {
                    m.write_host_dst(dof, &row)
                } else {
                    st.device_write((dst.base + dof) as u64, &row)
                };
                if !ok {
                    c.diag(
                        D::Internal,
                        format!("cuMemcpy3D row of {w} bytes outside the ranges checked"),
                    );
                    return Err(INVALID_VALUE);
                }
            }
        }
        Ok(())
    })();
    done(r)
}
