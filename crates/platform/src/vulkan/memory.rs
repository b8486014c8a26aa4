//! Vulkan memory: allocation, export, host access.

use super::*;

/// Memory allocated and exported once by [`VulkanExporter::export_memory`].
#[derive(Debug)]
pub struct ExportedMemory {
    /// The opaque fd; an importer takes ownership of it.
    pub fd: OwnedFd,
    /// The allocation size: the size the importer must use.
    pub size: u64,
    /// Whether it is a dedicated allocation (CUDA: `CUDA_EXTERNAL_MEMORY_DEDICATED`).
    pub dedicated: bool,
    /// The Vulkan object (keep it alive while the memory is used).
    pub memory: VulkanMemory,
}

/// A buffer and its own device-memory allocation, exportable as an opaque fd.
pub struct VulkanMemory {
    pub(super) shared: Arc<Shared>,
    pub(super) buffer: vk::Buffer,
    pub(super) memory: vk::DeviceMemory,
    pub(super) size: u64,
    pub(super) requested: u64,
    pub(super) location: MemoryLocation,
    pub(super) memory_type: u32,
    pub(super) dedicated: bool,
    pub(super) exportable: bool,
    /// Start of the persistent host mapping (host-visible memory only).
    pub(super) mapped: Option<std::ptr::NonNull<u8>>,
    pub(super) last_use: LastUse,
}

// SAFETY: the mapping pointer is only an address inside a mapping owned by this object, valid
// from any thread. The type is deliberately not `Sync`: host writes go through `&self` (the
// memory is shared with other APIs anyway), so two threads must not hold it at once.
unsafe impl Send for VulkanMemory {}

impl fmt::Debug for VulkanMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanMemory")
            .field("size", &self.size)
            .field("requested", &self.requested)
            .field("location", &self.location)
            .field("memory_type", &self.memory_type)
            .field("dedicated", &self.dedicated)
            .finish_non_exhaustive()
    }
}

/// `Ok` when `offset..offset + len` lies inside `0..size` (an end past `u64::MAX` does not).
pub(super) fn range_within(size: u64, offset: u64, len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::OutOfRange { offset, len, size }),
    }
}

pub(super) fn pick_memory_type(
    props: &vk::PhysicalDeviceMemoryProperties,
    allowed: u32,
    location: MemoryLocation,
) -> Option<u32> {
    let (need, prefer_absent) = match location {
        MemoryLocation::DeviceLocal => (
            vk::MemoryPropertyFlags::DEVICE_LOCAL,
            vk::MemoryPropertyFlags::HOST_VISIBLE,
        ),
        MemoryLocation::HostVisible => (
            vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT,
            vk::MemoryPropertyFlags::DEVICE_LOCAL,
        ),
        MemoryLocation::DeviceLocalHostVisible => (
            vk::MemoryPropertyFlags::DEVICE_LOCAL
                | vk::MemoryPropertyFlags::HOST_VISIBLE
                | vk::MemoryPropertyFlags::HOST_COHERENT,
            vk::MemoryPropertyFlags::empty(),
        ),
        MemoryLocation::HostCached => (
            vk::MemoryPropertyFlags::HOST_VISIBLE
                | vk::MemoryPropertyFlags::HOST_COHERENT
                | vk::MemoryPropertyFlags::HOST_CACHED,
            vk::MemoryPropertyFlags::DEVICE_LOCAL,
        ),
    };
    let count = (props.memory_type_count as usize).min(props.memory_types.len());
    let candidates = || {
        (0..count).filter(move |&i| {
            allowed & (1u32 << i) != 0 && props.memory_types[i].property_flags.contains(need)
        })
    };
    let best = candidates()
        .find(|&i| {
            !props.memory_types[i]
                .property_flags
                .intersects(prefer_absent)
        })
        .or_else(|| candidates().next())?;
    u32::try_from(best).ok()
}

impl VulkanMemory {
    pub(super) fn create(
        shared: &Arc<Shared>,
        size: u64,
        location: MemoryLocation,
        exportable: bool,
    ) -> Result<Self> {
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        let d = shared.device();
        let usage = vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST
            | vk::BufferUsageFlags::STORAGE_BUFFER;
        let handle = vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD;
        let mut dedicated_only = false;
        if exportable {
            let query = vk::PhysicalDeviceExternalBufferInfo::default()
                .usage(usage)
                .handle_type(handle);
            let mut out = vk::ExternalBufferProperties::default();
            // SAFETY: 1.1 core query on our physical device; structs outlive the call.
            unsafe {
                shared
                    .inst
                    .instance
                    .get_physical_device_external_buffer_properties(
                        shared.physical,
                        &query,
                        &mut out,
                    )
            };
            let features = out.external_memory_properties.external_memory_features;
            if !features.contains(vk::ExternalMemoryFeatureFlags::EXPORTABLE) {
                return Err(Error::NotExportable {
                    what: "buffer memory",
                });
            }
            dedicated_only = features.contains(vk::ExternalMemoryFeatureFlags::DEDICATED_ONLY);
        }
        let mut ext_info = vk::ExternalMemoryBufferCreateInfo::default().handle_types(handle);
        let mut buffer_info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        if exportable {
            buffer_info = buffer_info.push_next(&mut ext_info);
        }
        // SAFETY: valid create info for a live device.
        let buffer =
            unsafe { d.create_buffer(&buffer_info, None) }.map_err(vk_err("vkCreateBuffer"))?;
        let mut this = VulkanMemory {
            shared: Arc::clone(shared),
            buffer,
            memory: vk::DeviceMemory::null(),
            size: 0,
            requested: size,
            location,
            memory_type: 0,
            dedicated: false,
            exportable,
            mapped: None,
            last_use: LastUse::default(),
        };
        // From here `this` owns the buffer: an early return destroys it.
        let mut ded_req = vk::MemoryDedicatedRequirements::default();
        let mut req2 = vk::MemoryRequirements2::default().push_next(&mut ded_req);
        let req_info = vk::BufferMemoryRequirementsInfo2::default().buffer(buffer);
        // SAFETY: 1.1 core query for our live buffer.
        unsafe { d.get_buffer_memory_requirements2(&req_info, &mut req2) };
        let req = req2.memory_requirements;
        let requires_dedicated = ded_req.requires_dedicated_allocation == vk::TRUE;
        let memory_type = pick_memory_type(&shared.memory_props, req.memory_type_bits, location)
            .ok_or(Error::NoMemoryType { location })?;
        let dedicated = exportable && (dedicated_only || requires_dedicated);
        let mut export_info = vk::ExportMemoryAllocateInfo::default().handle_types(handle);
        let mut dedicated_info = vk::MemoryDedicatedAllocateInfo::default().buffer(buffer);
        let mut alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(memory_type);
        if exportable {
            alloc = alloc.push_next(&mut export_info);
        }
        if dedicated {
            alloc = alloc.push_next(&mut dedicated_info);
        }
        // SAFETY: valid allocate info for a live device; the chain outlives the call.
        this.memory =
            unsafe { d.allocate_memory(&alloc, None) }.map_err(vk_err("vkAllocateMemory"))?;
        this.size = req.size;
        this.memory_type = memory_type;
        this.dedicated = dedicated;
        // SAFETY: binding fresh memory of a type allowed by the requirements, at offset 0.
        unsafe { d.bind_buffer_memory(buffer, this.memory, 0) }
            .map_err(vk_err("vkBindBufferMemory"))?;
        if location.is_host_visible() {
            // SAFETY: host-visible memory, mapped once for its whole size.
            let ptr = unsafe {
                d.map_memory(this.memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
            }
            .map_err(vk_err("vkMapMemory"))?;
            this.mapped = std::ptr::NonNull::new(ptr.cast::<u8>());
            if this.mapped.is_none() {
                return Err(Error::Vulkan {
                    call: "vkMapMemory",
                    result: vk::Result::ERROR_MEMORY_MAP_FAILED,
                });
            }
        }
        Ok(this)
    }

    /// The allocation size in bytes (at least the size asked for): import this size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The size that was asked for.
    pub fn requested_size(&self) -> u64 {
        self.requested
    }

    /// Where the memory lives.
    pub fn location(&self) -> MemoryLocation {
        self.location
    }

    /// Whether this is a dedicated allocation (import with `CUDA_EXTERNAL_MEMORY_DEDICATED`).
    pub fn dedicated(&self) -> bool {
        self.dedicated
    }

    /// The index of the Vulkan memory type used.
    pub fn memory_type_index(&self) -> u32 {
        self.memory_type
    }

    /// Exports the memory as a new opaque fd (each call gives a fresh fd).
    pub fn export_fd(&self) -> Result<OwnedFd> {
        if !self.exportable {
            return Err(Error::NotExportable {
                what: "a staging allocation",
            });
        }
        let info = vk::MemoryGetFdInfoKHR::default()
            .memory(self.memory)
            .handle_type(vk::ExternalMemoryHandleTypeFlags::OPAQUE_FD);
        // SAFETY: the memory was allocated with OPAQUE_FD in its export info.
        let fd = unsafe { self.shared.mem_fd.get_memory_fd(&info) }
            .map_err(vk_err("vkGetMemoryFdKHR"))?;
        if fd < 0 {
            return Err(Error::Vulkan {
                call: "vkGetMemoryFdKHR",
                result: vk::Result::ERROR_INVALID_EXTERNAL_HANDLE,
            });
        }
        // SAFETY: a successful vkGetMemoryFdKHR gives a new fd owned by the caller.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub(super) fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        range_within(self.size, offset, len)
    }

    /// Writes `data` at `offset` through the host mapping (host-visible memory only).
    ///
    /// The memory is shared with the GPU and other APIs, so this takes `&self` (like a write
    /// through a shared mapping); the caller orders it against GPU/other-API access with
    /// semaphores. The memory type is host-coherent: no flush is needed.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let base = self.mapped.ok_or(Error::NotHostVisible)?;
        self.check_range(offset, data.len() as u64)?;
        let offset = usize::try_from(offset).map_err(|_| Error::OutOfRange {
            offset,
            len: data.len() as u64,
            size: self.size,
        })?;
        // SAFETY: the range was checked to lie inside the mapping, which lives as long as
        // `self`; `data` is ordinary host memory and cannot overlap the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), base.as_ptr().add(offset), data.len());
        }
        Ok(())
    }

    /// The whole host mapping as one mutable byte slice ([`VulkanMemory::size`] bytes;
    /// host-visible memory only), for a producer that writes in place (a camera frame, say)
    /// instead of copying through [`VulkanMemory::write`].
    ///
    /// # Safety
    /// The memory is shared with the GPU and with every API that imported it. While the
    /// returned slice lives, nothing outside this process's Rust code may read or write the
    /// memory: the caller must have waited (on a semaphore or fence) for all such access that
    /// was queued before, and must not let new access start (signal the semaphore that releases
    /// it) until the slice is gone. Otherwise the bytes can change under a `&mut [u8]`, or the
    /// other side can read a half-written buffer.
    pub unsafe fn host_bytes_mut(&mut self) -> Result<&mut [u8]> {
        let base = self.mapped.ok_or(Error::NotHostVisible)?;
        let len = usize::try_from(self.size).map_err(|_| Error::OutOfRange {
            offset: 0,
            len: self.size,
            size: self.size,
        })?;
        // SAFETY: `base` is the start of a live mapping of `size` bytes owned by `self`, which
        // `&mut self` keeps alive and unaliased on the Rust side for the slice's lifetime; the
        // caller excludes access by other agents (this function's contract).
        Ok(unsafe { std::slice::from_raw_parts_mut(base.as_ptr(), len) })
    }

    /// Reads `out.len()` bytes at `offset` through the host mapping (host-visible memory only).
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let base = self.mapped.ok_or(Error::NotHostVisible)?;
        self.check_range(offset, out.len() as u64)?;
        let offset = usize::try_from(offset).map_err(|_| Error::OutOfRange {
            offset,
            len: out.len() as u64,
            size: self.size,
        })?;
        // SAFETY: the range lies inside the live mapping; `out` cannot overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(base.as_ptr().add(offset), out.as_mut_ptr(), out.len());
        }
        Ok(())
    }

    /// Reads the native-endian `u32` at `offset` (host-visible memory only).
    pub fn read_u32(&self, offset: u64) -> Result<u32> {
        let mut b = [0u8; 4];
        self.read(offset, &mut b)?;
        Ok(u32::from_ne_bytes(b))
    }

    /// Writes a native-endian `u32` at `offset` (host-visible memory only).
    pub fn write_u32(&self, offset: u64, value: u32) -> Result<()> {
        self.write(offset, &value.to_ne_bytes())
    }
}

impl Drop for VulkanMemory {
    fn drop(&mut self) {
        if !self.shared.wait_progress(self.last_use.get(), DROP_WAIT) {
            return; // still in use by the GPU: leak rather than free memory in use
        }
        let d = self.shared.device();
        // SAFETY: no pending submission uses the buffer or memory any more; null handles
        // (from a half-built object) are ignored; freeing mapped memory unmaps it.
        unsafe {
            d.destroy_buffer(self.buffer, None);
            d.free_memory(self.memory, None);
        }
    }
}
