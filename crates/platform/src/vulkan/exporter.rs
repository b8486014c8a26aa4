//! The exporter: construction, device facts, memory and semaphore creation.

use super::*;

/// A Vulkan instance + device on the GPU that CUDA uses, exporting memory and semaphores.
///
/// Cheap to share by reference; objects it makes keep the device alive on their own.
pub struct VulkanExporter {
    pub(super) shared: Arc<Shared>,
}

impl fmt::Debug for VulkanExporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanExporter")
            .field("device", &self.shared.info)
            .finish_non_exhaustive()
    }
}

impl VulkanExporter {
    /// Lists the physical devices of the system's Vulkan loader (for diagnostics).
    pub fn devices() -> Result<Vec<DeviceInfo>> {
        let inst = InstanceOwner::create(load_system_entry()?)?;
        Ok(enumerate(&inst)?.into_iter().map(|(_, i)| i).collect())
    }

    /// Opens the system's Vulkan loader and creates a device on the physical device whose
    /// `deviceUUID` equals `cuda_uuid` (the bytes of `cuDeviceGetUuid_v2`), with its queue on
    /// the first family with compute ([`QueueChoice::FirstCompute`]).
    pub fn new(cuda_uuid: [u8; 16]) -> Result<Self> {
        Self::with_queue(cuda_uuid, QueueChoice::FirstCompute)
    }

    /// Like [`VulkanExporter::new`], with a queue of the family `choice` asks for
    /// ([`Error::NoQueueFamily`] when the device has none).
    pub fn with_queue(cuda_uuid: [u8; 16], choice: QueueChoice) -> Result<Self> {
        Self::build(load_system_entry()?, cuda_uuid, choice)
    }

    /// Like [`VulkanExporter::with_queue`] with the loader library at `loader` (a path, or a
    /// name for the dynamic linker) instead of the system's.
    ///
    /// # Safety
    /// Opening the library runs its initialisers, and its `vkGetInstanceProcAddr` is trusted
    /// from then on: `loader` must be a Vulkan loader (or ICD) that is sound to load into this
    /// process, and it must not be replaced on disk while it is being opened.
    pub unsafe fn with_loader(
        loader: &std::path::Path,
        cuda_uuid: [u8; 16],
        choice: QueueChoice,
    ) -> Result<Self> {
        // SAFETY: the caller vouches for the library at `loader` (this function's contract).
        let entry = unsafe { load_entry_from(loader) }?;
        Self::build(entry, cuda_uuid, choice)
    }

    pub(super) fn build(entry: ash::Entry, uuid: [u8; 16], choice: QueueChoice) -> Result<Self> {
        let inst = InstanceOwner::create(entry)?;
        let devices = enumerate(&inst)?;
        let Some(pos) = devices.iter().position(|(_, i)| i.device_uuid == uuid) else {
            return Err(Error::DeviceNotFound {
                uuid,
                seen: devices.into_iter().map(|(_, i)| i).collect(),
            });
        };
        let (physical, info) = devices.into_iter().nth(pos).ok_or(Error::DeviceNotFound {
            uuid,
            seen: Vec::new(),
        })?;
        if let Some(ext) = info.missing_extensions.first() {
            return Err(Error::MissingExtension { extension: ext });
        }
        if info.api_version < vk::API_VERSION_1_1 {
            return Err(Error::ApiVersionTooOld {
                found: info.api_version,
            });
        }
        let instance = &inst.instance;
        let effective_api = info.api_version.min(REQUESTED_API);

        // Timeline semaphore feature.
        let mut timeline_feat = vk::PhysicalDeviceTimelineSemaphoreFeatures::default();
        {
            let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut timeline_feat);
            // SAFETY: 1.1 core query with a chain that lives across the call.
            unsafe { instance.get_physical_device_features2(physical, &mut f2) };
        }
        if timeline_feat.timeline_semaphore == vk::FALSE {
            return Err(Error::TimelineSemaphoresUnsupported);
        }

        // The queue family: the first that `choice` accepts.
        // SAFETY: `physical` belongs to `instance`.
        let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
        let (queue_family, queue_flags) = families
            .iter()
            .enumerate()
            .find(|(_, q)| q.queue_count > 0 && choice.accepts(q.queue_flags))
            .and_then(|(i, q)| Some((u32::try_from(i).ok()?, q.queue_flags)))
            .ok_or(Error::NoQueueFamily { choice })?;

        // SAFETY: `physical` belongs to `instance`.
        let props = unsafe { instance.get_physical_device_properties(physical) };
        // SAFETY: `physical` belongs to `instance`.
        let memory_props = unsafe { instance.get_physical_device_memory_properties(physical) };

        let priorities = [1.0f32];
        let queue_info = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(queue_family)
            .queue_priorities(&priorities)];
        let ext_names: Vec<*const c_char> = required_extensions(effective_api)
            .iter()
            .map(|n| n.as_ptr())
            .collect();
        let mut enable_timeline =
            vk::PhysicalDeviceTimelineSemaphoreFeatures::default().timeline_semaphore(true);
        let device_info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue_info)
            .enabled_extension_names(&ext_names)
            .push_next(&mut enable_timeline);
        // SAFETY: everything `device_info` points to lives across the call; the extensions
        // were checked to exist and the timeline feature to be supported.
        let device = unsafe { instance.create_device(physical, &device_info, None) }
            .map_err(vk_err("vkCreateDevice"))?;
        // SAFETY: family `queue_family` was created with one queue.
        let queue = unsafe { device.get_device_queue(queue_family, 0) };
        let timeline = if effective_api >= vk::API_VERSION_1_2 {
            TimelineFns::Core
        } else {
            TimelineFns::Khr(khr::timeline_semaphore::Device::new(instance, &device))
        };
        let mem_fd = khr::external_memory_fd::Device::new(instance, &device);
        let sem_fd = khr::external_semaphore_fd::Device::new(instance, &device);
        // From here on `Shared` owns the device; a failure below drops it cleanly.
        let mut shared = Shared {
            dev: DeviceOwner {
                device,
                progress: vk::Semaphore::null(),
                state: Mutex::new(QueueState {
                    queue,
                    pool: vk::CommandPool::null(),
                    last_submitted: 0,
                    compute: None,
                }),
                leak: false,
            },
            inst,
            info,
            memory_props,
            physical,
            queue_family,
            queue_flags,
            min_storage_align: props.limits.min_storage_buffer_offset_alignment.max(1),
            mem_fd,
            sem_fd,
            timeline,
        };
        let pool_info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(queue_family)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: valid create info for a live device.
        let pool = unsafe { shared.device().create_command_pool(&pool_info, None) }
            .map_err(vk_err("vkCreateCommandPool"))?;
        shared.lock().pool = pool;
        let mut type_info = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let sem_info = vk::SemaphoreCreateInfo::default().push_next(&mut type_info);
        // SAFETY: valid create info (timeline feature enabled) for a live device.
        let progress = unsafe { shared.device().create_semaphore(&sem_info, None) }
            .map_err(vk_err("vkCreateSemaphore"))?;
        shared.dev.progress = progress;
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// The selected physical device.
    pub fn device_info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    /// The queue family the exporter submits to and its capabilities.
    pub fn queue_family(&self) -> (u32, vk::QueueFlags) {
        (self.shared.queue_family, self.shared.queue_flags)
    }

    /// The required alignment of [`VulkanExporter::counter_incrementer`] offsets.
    pub fn storage_offset_alignment(&self) -> u64 {
        self.shared.min_storage_align
    }

    pub(super) fn check_own(&self, other: &Arc<Shared>) -> Result<()> {
        if Arc::ptr_eq(&self.shared, other) {
            Ok(())
        } else {
            Err(Error::ForeignObject)
        }
    }

    // ----- memory -----

    /// Allocates at least `size` bytes of exportable memory at `location`, bound to a buffer
    /// usable for transfers and as a storage buffer. The real size is [`VulkanMemory::size`].
    pub fn allocate_memory(&self, size: u64, location: MemoryLocation) -> Result<VulkanMemory> {
        VulkanMemory::create(&self.shared, size, location, true)
    }

    /// Allocates memory and exports it once: the fd, the size to import and the object.
    pub fn export_memory(&self, size: u64, location: MemoryLocation) -> Result<ExportedMemory> {
        let memory = self.allocate_memory(size, location)?;
        let fd = memory.export_fd()?;
        Ok(ExportedMemory {
            fd,
            size: memory.size(),
            dedicated: memory.dedicated(),
            memory,
        })
    }

    // ----- semaphores -----

    /// Creates an exportable semaphore (`initial` is the timeline start value; ignored for
    /// binary semaphores).
    pub fn create_semaphore(&self, kind: SemaphoreKind, initial: u64) -> Result<VulkanSemaphore> {
        VulkanSemaphore::create(&self.shared, kind, initial)
    }

    /// Creates a timeline semaphore starting at `initial` and exports it once.
    pub fn export_timeline_semaphore(&self, initial: u64) -> Result<(OwnedFd, VulkanSemaphore)> {
        let s = self.create_semaphore(SemaphoreKind::Timeline, initial)?;
        Ok((s.export_fd()?, s))
    }

    /// Creates a binary semaphore and exports it once.
    pub fn export_binary_semaphore(&self) -> Result<(OwnedFd, VulkanSemaphore)> {
        let s = self.create_semaphore(SemaphoreKind::Binary, 0)?;
        Ok((s.export_fd()?, s))
    }
}
