//! Reconciliation of the Image keys (layout, planes, padding, pitch and sizes).

#![deny(unsafe_code)]

use super::*;

pub(super) fn reconcile_image(parts: &[&AttrMap], out: &mut AttrMap) -> Result<(), Fail> {
    for (k, name) in [
        (bk::LAYOUT, "Image Layout"),
        (bk::SCAN, "Image ScanType"),
        (bk::PLANE_COUNT, "Image PlaneCount"),
        (bk::COLOR_FMT, "Image PlaneColorFormat"),
        (bk::WIDTH, "Image PlaneWidth"),
        (bk::HEIGHT, "Image PlaneHeight"),
    ] {
        if !parts.iter().any(|p| p.contains_key(&k)) {
            return Err(Fail::Bad(format!(
                "{name} is mandatory for an image and no list sets it"
            )));
        }
    }
    for (k, name) in [
        (bk::LAYOUT, "Image Layout"),
        (bk::SCAN, "Image ScanType"),
        (bk::PLANE_COUNT, "Image PlaneCount"),
        (bk::COLOR_FMT, "Image PlaneColorFormat"),
        (bk::COLOR_STD, "Image PlaneColorStd"),
        (bk::WIDTH, "Image PlaneWidth"),
        (bk::HEIGHT, "Image PlaneHeight"),
        (bk::IMAGE_COUNT, "Image ImageCount"),
        (bk::VPR, "Image VprFlag"),
        (bk::TOP_PAD, "Image TopPadding"),
        (bk::TOP_PAD + 1, "Image BottomPadding"),
        (bk::TOP_PAD + 2, "Image LeftPadding"),
        (bk::RIGHT_PAD, "Image RightPadding"),
    ] {
        same(parts, k, name, out)?;
    }
    if get_u32(out, bk::SCAN) == Some(1) {
        return Err(Fail::NotSimulated(
            "interlaced images (ScanType Interlace) are not simulated".into(),
        ));
    }
    if get_bool(out, bk::VPR) {
        return Err(Fail::NotSimulated(
            "protected (VPR) images are not simulated".into(),
        ));
    }
    let n = get_u32(out, bk::PLANE_COUNT).unwrap_or(0) as usize;
    let formats = out.get(&bk::COLOR_FMT).map(|v| u32s(v)).unwrap_or_default();
    let widths = out.get(&bk::WIDTH).map(|v| u32s(v)).unwrap_or_default();
    let heights = out.get(&bk::HEIGHT).map(|v| u32s(v)).unwrap_or_default();
    for (len, name) in [
        (formats.len(), "PlaneColorFormat"),
        (widths.len(), "PlaneWidth"),
        (heights.len(), "PlaneHeight"),
    ] {
        if len != n {
            return Err(Fail::Bad(format!(
                "{name} has {len} entries for PlaneCount {n}"
            )));
        }
    }
    for k in [
        bk::COLOR_STD,
        bk::TOP_PAD,
        bk::TOP_PAD + 1,
        bk::TOP_PAD + 2,
        bk::RIGHT_PAD,
    ] {
        if let Some(v) = out.get(&k) {
            let len = if k == bk::COLOR_STD {
                v.len() / 4
            } else {
                v.len() / 8
            };
            if len != n {
                return Err(Fail::Bad(format!(
                    "image key {k:#x} has {len} entries for PlaneCount {n}"
                )));
            }
        }
    }
    // Padding is not modelled: only zero padding is laid out.
    for k in bk::TOP_PAD..=bk::RIGHT_PAD {
        if out.get(&k).is_some_and(|v| u64s(v).iter().any(|p| *p != 0)) {
            return Err(Fail::NotSimulated("image padding is not simulated".into()));
        }
    }
    if widths.iter().chain(&heights).any(|d| *d == 0) {
        return Err(Fail::Bad("a plane width or height is 0".into()));
    }
    // Plane base alignment: the largest request per plane (default 256).
    let mut base_align = vec![256u32; n];
    for p in parts {
        if let Some(v) = p.get(&bk::BASE_ALIGN) {
            let req = u32s(v);
            if req.len() != n {
                return Err(Fail::Bad(format!(
                    "PlaneBaseAddrAlign has {} entries for PlaneCount {n}",
                    req.len()
                )));
            }
            for (a, r) in base_align.iter_mut().zip(req) {
                *a = (*a).max(r);
            }
        }
    }
    let (mut bpp, mut chans, mut dtype, mut pitch, mut aheight, mut offset, mut asize) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut end = 0u64;
    let overflow = || Fail::Bad("the image size overflows".into());
    for i in 0..n {
        let Some((bits, ch)) = color::layout(formats[i]) else {
            return Err(Fail::NotSimulated(format!(
                "colour format {} is not laid out by the simulator",
                formats[i]
            )));
        };
        // Pitch-linear rows, tightly packed; block-linear images get the
        // same linear layout (the simulator does not tile). Code above the
        // table must read pitch, offsets and sizes back, as on hardware.
        let row = u64::from(widths[i]) * u64::from(bits) / 8;
        let p = u32::try_from(row).map_err(|_| overflow())?;
        let size = row
            .checked_mul(u64::from(heights[i]))
            .ok_or_else(overflow)?;
        let off = align_up(end, u64::from(base_align[i])).ok_or_else(overflow)?;
        end = off.checked_add(size).ok_or_else(overflow)?;
        bpp.push(bits);
        chans.push(ch);
        dtype.push(if bits / u32::from(ch) == 16 {
            DATATYPE_UINT16
        } else {
            DATATYPE_UINT8
        });
        pitch.push(p);
        aheight.push(heights[i]);
        offset.push(off);
        asize.push(size);
    }
    let align = base_align.iter().copied().max().unwrap_or(1);
    out.entry(bk::IMAGE_COUNT).or_insert_with(|| enc_u64s(&[1]));
    out.insert(bk::BASE_ALIGN, enc_u32s(&base_align));
    out.insert(bk::BPP, enc_u32s(&bpp));
    out.insert(bk::CHANNELS, chans.into_boxed_slice());
    out.insert(bk::DATATYPE, enc_u32s(&dtype));
    out.insert(bk::PITCH, enc_u32s(&pitch));
    out.insert(bk::ALIGNED_H, enc_u32s(&aheight));
    out.insert(bk::OFFSET, enc_u64s(&offset));
    out.insert(bk::SECOND_FIELD, enc_u64s(&vec![0; n]));
    out.insert(bk::ALIGNED_SIZE, enc_u64s(&asize));
    out.insert(bk::IMG_SIZE, enc_u64s(&[end]));
    out.insert(bk::IMG_ALIGN, enc_u64s(&[u64::from(align)]));
    Ok(())
}
