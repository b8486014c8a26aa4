//! Device and driver queries.
#![allow(unsafe_code)] // calls of pointer-taking entry points, each with its `// SAFETY:` line

use std::ffi::{c_char, c_int, CStr};

use tegra_interop_sys::cuda::{CUdevice, CUdevice_attribute, CUuuid};

use crate::ffi::{call, Init};
use crate::{Backend, Error};

/// Device attributes the interop code asks about.
pub mod attribute {
    use tegra_interop_sys::cuda::CUdevice_attribute;

    /// `CU_DEVICE_ATTRIBUTE_INTEGRATED` (18): the GPU shares memory with the
    /// CPU (Jetson / DRIVE).
    pub const INTEGRATED: CUdevice_attribute = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_INTEGRATED;
    /// `CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED` (114).
    pub const TIMELINE_SEMAPHORE_INTEROP_SUPPORTED: CUdevice_attribute =
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED;
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (124).
    pub const DMA_BUF_SUPPORTED: CUdevice_attribute =
        CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED;
}

impl Backend {
    /// Number of CUDA devices (`cuDeviceGetCount`).
    pub fn device_count(&self) -> Result<i32, Error> {
        let mut count: c_int = 0;
        // SAFETY: `count` is a local the driver writes one `int` to.
        unsafe { call::cuDeviceGetCount(Init(self), &mut count) }?;
        Ok(count)
    }

    /// The driver's CUDA version, as `1000 * major + 10 * minor`
    /// (`cuDriverGetVersion`; 13000 is CUDA 13.0).
    pub fn driver_version(&self) -> Result<i32, Error> {
        let mut version: c_int = 0;
        // SAFETY: `version` is a local the driver writes one `int` to.
        unsafe { call::cuDriverGetVersion(&self.table().cuda, &mut version) }?;
        Ok(version)
    }

    /// Device `ordinal` (`cuDeviceGet`).
    pub fn device(&self, ordinal: i32) -> Result<Device<'_>, Error> {
        let mut raw: CUdevice = 0;
        // SAFETY: `raw` is a local the driver writes one `CUdevice` to.
        unsafe { call::cuDeviceGet(Init(self), &mut raw, ordinal) }?;
        Ok(Device {
            backend: self,
            ordinal,
            raw,
        })
    }
}

/// A CUDA device, for queries.
#[derive(Debug, Clone, Copy)]
pub struct Device<'b> {
    backend: &'b Backend,
    ordinal: i32,
    raw: CUdevice,
}

impl Device<'_> {
    /// The ordinal it was opened with.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// The raw `CUdevice`.
    pub fn as_raw(&self) -> CUdevice {
        self.raw
    }

    /// The device name (`cuDeviceGetName`).
    pub fn name(&self) -> Result<String, Error> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: `buf` is a local array of `buf.len()` chars, the length passed; the driver writes
        // a NUL-terminated string of at most that length.
        unsafe {
            call::cuDeviceGetName(
                &self.backend.table().cuda,
                buf.as_mut_ptr(),
                buf.len() as c_int,
                self.raw,
            )
        }?;
        let bytes = buf.map(|c| c as u8);
        // A buffer filled to the end without a NUL is cut at its end.
        let name = CStr::from_bytes_until_nul(&bytes)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_else(|_| String::from_utf8_lossy(&bytes[..bytes.len() - 1]).into_owned());
        Ok(name)
    }

    /// The device UUID (`cuDeviceGetUuid_v2`), 16 bytes.
    pub fn uuid(&self) -> Result<[u8; 16], Error> {
        let mut uuid = CUuuid { bytes: [0; 16] };
        // SAFETY: `uuid` is a local the driver writes one `CUuuid` to.
        unsafe { call::cuDeviceGetUuid_v2(&self.backend.table().cuda, &mut uuid, self.raw) }?;
        Ok(uuid.bytes.map(|b| b as u8))
    }

    /// Any device attribute (`cuDeviceGetAttribute`); see [`attribute`].
    pub fn attribute(&self, attribute: CUdevice_attribute) -> Result<i32, Error> {
        let mut value: c_int = 0;
        // SAFETY: `value` is a local the driver writes one `int` to (an unknown attribute is
        // answered with INVALID_VALUE).
        unsafe {
            call::cuDeviceGetAttribute(&self.backend.table().cuda, &mut value, attribute, self.raw)
        }?;
        Ok(value)
    }

    /// `true` on an integrated GPU (Jetson / DRIVE).
    pub fn is_integrated(&self) -> Result<bool, Error> {
        Ok(self.attribute(attribute::INTEGRATED)? != 0)
    }

    /// `true` if timeline semaphores can be imported.
    pub fn supports_timeline_semaphore_interop(&self) -> Result<bool, Error> {
        Ok(self.attribute(attribute::TIMELINE_SEMAPHORE_INTEROP_SUPPORTED)? != 0)
    }

    /// `true` if dma-buf memory can be imported.
    pub fn supports_dma_buf(&self) -> Result<bool, Error> {
        Ok(self.attribute(attribute::DMA_BUF_SUPPORTED)? != 0)
    }
}
