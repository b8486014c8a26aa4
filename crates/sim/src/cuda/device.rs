//! Initialisation and device queries.

use super::*;

pub(crate) fn cuInit(c: &Call, flags: c_uint) -> CUresult {
    if flags != 0 {
        return INVALID_VALUE;
    }
    if c.inst.config.devices == 0 {
        return NO_DEVICE;
    }
    c.state().initialized = true;
    SUCCESS
}

pub(crate) fn cuDriverGetVersion(c: &Call, v: CMut<c_int>) -> CUresult {
    done(put(v, c.inst.config.driver_version))
}

pub(crate) fn cuDeviceGetCount(c: &Call, n: CMut<c_int>) -> CUresult {
    let r = (|| {
        init(&c.state())?;
        let n_dev = c_int::try_from(c.inst.config.devices).unwrap_or(c_int::MAX);
        put(n, n_dev)
    })();
    done(r)
}

pub(crate) fn cuDeviceGet(c: &Call, out: CMut<CUdevice>, ordinal: c_int) -> CUresult {
    let r = (|| {
        init(&c.state())?;
        device(c, ordinal)?;
        put(out, ordinal)
    })();
    done(r)
}

pub(super) fn device_name(c: &Call, d: usize) -> String {
    if c.inst.config.integrated {
        format!("tegra-interop-sim integrated GPU {d}")
    } else {
        format!("tegra-interop-sim discrete GPU {d}")
    }
}

pub(crate) fn cuDeviceGetName(
    c: &Call,
    name: Option<&mut [c_char]>,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    let r = (|| {
        init(&c.state())?;
        let d = device(c, dev)?;
        let cap = usize::try_from(len)
            .ok()
            .filter(|l| *l > 0)
            .ok_or(INVALID_VALUE)?;
        let Some(name) = name else {
            return Err(INVALID_VALUE);
        };
        let s = device_name(c, d);
        let n = s.len().min(cap - 1);
        // `name` holds the caller's `len` chars; `n + 1 <= len` are written.
        for (dst, src) in name.iter_mut().zip(&s.as_bytes()[..n]) {
            *dst = *src as c_char;
        }
        name[n] = 0;
        Ok(())
    })();
    done(r)
}

/// A stable fake UUID per device ordinal.
pub(crate) fn device_uuid(d: usize) -> [u8; 16] {
    let mut b = *b"TISIM-GPU-UUID\0\0";
    b[14] = (d >> 8) as u8;
    b[15] = d as u8;
    b
}

pub(crate) fn cuDeviceGetUuid_v2(c: &Call, out: CMut<CUuuid>, dev: CUdevice) -> CUresult {
    let r = (|| {
        init(&c.state())?;
        let d = device(c, dev)?;
        let bytes = device_uuid(d).map(|b| b as c_char);
        // SAFETY: forwarded caller pointer.
        put(out, CUuuid { bytes })
    })();
    done(r)
}

/// The first attribute number a driver of `version` does not know. The
/// 12.9 header's `CU_DEVICE_ATTRIBUTE_MAX` for 12.9 and later; 120 for
/// CUDA 11.4 and 11.5 (the end of that release's attribute list, after
/// cudarc's `cuda-11040` / `cuda-11050` bindings: 119 is its last, so
/// `DMA_BUF_SUPPORTED` (124, CUDA 11.7) is unknown there). For any other
/// older release the list is not known to the project, so the simulator
/// refuses every attribute from 120 on (never more than the oldest known
/// driver accepts). What a real driver answers for an attribute it does not
/// know is not measured; INVALID_VALUE is the header's code for a bad
/// argument.
fn attribute_limit(version: i32) -> u32 {
    if version >= crate::SimConfig::CUDA_12_9 {
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX.0
    } else {
        120
    }
}

pub(crate) fn cuDeviceGetAttribute(
    c: &Call,
    out: CMut<c_int>,
    attr: CUdevice_attribute,
    dev: CUdevice,
) -> CUresult {
    let r = (|| {
        init(&c.state())?;
        device(c, dev)?;
        let cfg = &c.inst.config;
        if attr.0 >= attribute_limit(cfg.driver_version) {
            return Err(INVALID_VALUE);
        }
        let v = match attr.0 {
            0 => return Err(INVALID_VALUE),
            1 => 1024, // max threads per block
            10 => 32,  // warp size
            16 => {
                if cfg.integrated {
                    16
                } else {
                    132
                }
            } // multiprocessors
            18 => cfg.integrated as c_int, // INTEGRATED
            19 => 1,   // can map host memory
            41 => 1,   // unified addressing
            75 => {
                if cfg.integrated {
                    8
                } else {
                    9
                }
            } // compute capability major
            76 => {
                if cfg.integrated {
                    7
                } else {
                    0
                }
            } // compute capability minor
            103 => 1,  // POSIX fd handles supported
            104 | 105 => 0, // Win32 handles
            114 => cfg.timeline_supported as c_int, // TIMELINE_SEMAPHORE_INTEROP_SUPPORTED
            124 => cfg.dmabuf_supported as c_int, // DMA_BUF_SUPPORTED
            a if a < CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX.0 => 0,
            _ => return Err(INVALID_VALUE),
        };
        put(out, v)
    })();
    done(r)
}
