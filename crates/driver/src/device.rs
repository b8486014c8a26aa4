//! Device and driver queries.

use std::ffi::{c_char, c_int, CStr};

use tegra_interop_sys::cuda::{CUdevice, CUdevice_attribute, CUuuid};

use crate::error::check;
use crate::{entry, Backend, Error};

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
        let count_fn = entry!(self.table().cuda, cuDeviceGetCount);
        self.ensure_init()?;
        let mut count: c_int = 0;
        // SAFETY: `count` is a valid out-pointer.
        check("cuDeviceGetCount", unsafe { count_fn(&mut count) })?;
        Ok(count)
    }

    /// The driver's CUDA version, as `1000 * major + 10 * minor`
    /// (`cuDriverGetVersion`; 13000 is CUDA 13.0).
    pub fn driver_version(&self) -> Result<i32, Error> {
        let version_fn = entry!(self.table().cuda, cuDriverGetVersion);
        let mut version: c_int = 0;
        // SAFETY: `version` is a valid out-pointer.
        check("cuDriverGetVersion", unsafe { version_fn(&mut version) })?;
        Ok(version)
    }

    /// Device `ordinal` (`cuDeviceGet`).
    pub fn device(&self, ordinal: i32) -> Result<Device<'_>, Error> {
        let get = entry!(self.table().cuda, cuDeviceGet);
        self.ensure_init()?;
        let mut raw: CUdevice = 0;
        // SAFETY: `raw` is a valid out-pointer.
        check("cuDeviceGet", unsafe { get(&mut raw, ordinal) })?;
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
        let name_fn = entry!(self.backend.table().cuda, cuDeviceGetName);
        let mut buf = [0 as c_char; 256];
        // SAFETY: `buf` is writable for its full length, which we pass (the
        // driver writes a NUL-terminated string of at most that many bytes).
        check("cuDeviceGetName", unsafe {
            name_fn(buf.as_mut_ptr(), buf.len() as c_int, self.raw)
        })?;
        // Guarantee termination even if the driver filled the buffer.
        buf[buf.len() - 1] = 0;
        // SAFETY: `buf` holds a NUL-terminated string (forced above) and
        // outlives the borrow.
        let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
        Ok(name.to_string_lossy().into_owned())
    }

    /// The device UUID (`cuDeviceGetUuid_v2`), 16 bytes.
    pub fn uuid(&self) -> Result<[u8; 16], Error> {
        let uuid_fn = entry!(self.backend.table().cuda, cuDeviceGetUuid_v2);
        let mut uuid = CUuuid { bytes: [0; 16] };
        // SAFETY: `uuid` is a valid out-pointer of the right type.
        check("cuDeviceGetUuid_v2", unsafe {
            uuid_fn(&mut uuid, self.raw)
        })?;
        Ok(uuid.bytes.map(|b| b as u8))
    }

    /// Any device attribute (`cuDeviceGetAttribute`); see [`attribute`].
    pub fn attribute(&self, attribute: CUdevice_attribute) -> Result<i32, Error> {
        let attr_fn = entry!(self.backend.table().cuda, cuDeviceGetAttribute);
        let mut value: c_int = 0;
        // SAFETY: `value` is a valid out-pointer; an unknown attribute is
        // answered with INVALID_VALUE, not undefined behaviour.
        check("cuDeviceGetAttribute", unsafe {
            attr_fn(&mut value, attribute, self.raw)
        })?;
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
