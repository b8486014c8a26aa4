//! Owned instance and device, the shared state every object keeps alive, small helpers.

use super::*;

/// The loader and the instance. Destroys the instance on drop unless told to leak it.
pub(super) struct InstanceOwner {
    pub(super) instance: ash::Instance,
    // Kept loaded while the instance lives; dropped (unloaded) after it, never before.
    pub(super) entry: ManuallyDrop<ash::Entry>,
    pub(super) leak: bool,
}

impl InstanceOwner {
    pub(super) fn create(entry: ash::Entry) -> Result<Self> {
        // SAFETY: plain query of the loaded entry point table.
        let version = unsafe { entry.try_enumerate_instance_version() }
            .map_err(vk_err("vkEnumerateInstanceVersion"))?
            .unwrap_or(vk::API_VERSION_1_0);
        if version < vk::API_VERSION_1_1 {
            return Err(Error::ApiVersionTooOld { found: version });
        }
        let app = vk::ApplicationInfo::default()
            .application_name(c"tegra-interop")
            .engine_name(c"tegra-interop")
            .api_version(REQUESTED_API);
        let info = vk::InstanceCreateInfo::default().application_info(&app);
        // SAFETY: `info` and everything it points to live across the call.
        let instance =
            unsafe { entry.create_instance(&info, None) }.map_err(vk_err("vkCreateInstance"))?;
        Ok(Self {
            instance,
            entry: ManuallyDrop::new(entry),
            leak: false,
        })
    }
}

impl Drop for InstanceOwner {
    fn drop(&mut self) {
        if self.leak {
            return;
        }
        // SAFETY: every device made from this instance is destroyed (or leaked together with
        // the instance, in which case `leak` is set) before this owner is dropped.
        unsafe { self.instance.destroy_instance(None) };
        // SAFETY: the instance is gone, nothing uses the loader any more; dropped once.
        unsafe { ManuallyDrop::drop(&mut self.entry) };
    }
}

/// Objects created once per device for the counter-increment compute pipeline.
#[derive(Default)]
pub(super) struct ComputeObjects {
    pub(super) shader: vk::ShaderModule,
    pub(super) set_layout: vk::DescriptorSetLayout,
    pub(super) pipeline_layout: vk::PipelineLayout,
    pub(super) pipeline: vk::Pipeline,
}

/// State guarded by the queue lock: the queue, the command pool and submission counting.
pub(super) struct QueueState {
    pub(super) queue: vk::Queue,
    pub(super) pool: vk::CommandPool,
    /// The value the last submission signals on the progress semaphore.
    pub(super) last_submitted: u64,
    pub(super) compute: Option<ComputeObjects>,
}

/// The logical device and everything created once per device.
/// Destroys its children and the device on drop unless told to leak them.
pub(super) struct DeviceOwner {
    pub(super) device: ash::Device,
    pub(super) progress: vk::Semaphore,
    pub(super) state: Mutex<QueueState>,
    pub(super) leak: bool,
}

impl Drop for DeviceOwner {
    fn drop(&mut self) {
        if self.leak {
            return;
        }
        let state = self
            .state
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let d = &self.device;
        // SAFETY: all submissions have finished (checked by `Shared::drop`) and every object
        // made from the device is gone (they hold the `Arc<Shared>` that owns us). Null
        // handles are allowed by the destroy commands and do nothing.
        unsafe {
            if let Some(c) = state.compute.take() {
                d.destroy_pipeline(c.pipeline, None);
                d.destroy_pipeline_layout(c.pipeline_layout, None);
                d.destroy_descriptor_set_layout(c.set_layout, None);
                d.destroy_shader_module(c.shader, None);
            }
            d.destroy_command_pool(state.pool, None);
            d.destroy_semaphore(self.progress, None);
            d.destroy_device(None);
        }
    }
}

/// Timeline semaphore entry points: Vulkan 1.2 core or `VK_KHR_timeline_semaphore`.
pub(super) enum TimelineFns {
    Core,
    Khr(khr::timeline_semaphore::Device),
}

/// Everything shared by the exporter and the objects it made.
pub(super) struct Shared {
    // Field order matters: the device is dropped before the instance.
    pub(super) dev: DeviceOwner,
    pub(super) inst: InstanceOwner,
    pub(super) info: DeviceInfo,
    pub(super) memory_props: vk::PhysicalDeviceMemoryProperties,
    pub(super) physical: vk::PhysicalDevice,
    pub(super) queue_family: u32,
    pub(super) queue_flags: vk::QueueFlags,
    pub(super) min_storage_align: u64,
    pub(super) mem_fd: khr::external_memory_fd::Device,
    pub(super) sem_fd: khr::external_semaphore_fd::Device,
    pub(super) timeline: TimelineFns,
}

impl Shared {
    pub(super) fn device(&self) -> &ash::Device {
        &self.dev.device
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.dev
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn signal_semaphore(&self, sem: vk::Semaphore, value: u64) -> Result<()> {
        let info = vk::SemaphoreSignalInfo::default()
            .semaphore(sem)
            .value(value);
        // SAFETY: `sem` is a live timeline semaphore of this device; `info` outlives the call.
        let r = unsafe {
            match &self.timeline {
                TimelineFns::Core => self.device().signal_semaphore(&info),
                TimelineFns::Khr(k) => k.signal_semaphore(&info),
            }
        };
        r.map_err(vk_err("vkSignalSemaphore"))
    }

    /// Host wait; `Ok(false)` on timeout.
    pub(super) fn wait_semaphore(
        &self,
        sem: vk::Semaphore,
        value: u64,
        timeout: Duration,
    ) -> Result<bool> {
        let sems = [sem];
        let values = [value];
        let info = vk::SemaphoreWaitInfo::default()
            .semaphores(&sems)
            .values(&values);
        let ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: `sem` is a live timeline semaphore of this device; the arrays outlive the call.
        let r = unsafe {
            match &self.timeline {
                TimelineFns::Core => self.device().wait_semaphores(&info, ns),
                TimelineFns::Khr(k) => k.wait_semaphores(&info, ns),
            }
        };
        match r {
            Ok(()) => Ok(true),
            Err(vk::Result::TIMEOUT) => Ok(false),
            Err(e) => Err(vk_err("vkWaitSemaphores")(e)),
        }
    }

    pub(super) fn semaphore_value(&self, sem: vk::Semaphore) -> Result<u64> {
        // SAFETY: `sem` is a live timeline semaphore of this device.
        let r = unsafe {
            match &self.timeline {
                TimelineFns::Core => self.device().get_semaphore_counter_value(sem),
                TimelineFns::Khr(k) => k.get_semaphore_counter_value(sem),
            }
        };
        r.map_err(vk_err("vkGetSemaphoreCounterValue"))
    }

    /// Waits until submission `value` finished; `false` when it did not within `timeout`.
    pub(super) fn wait_progress(&self, value: u64, timeout: Duration) -> bool {
        value == 0
            || matches!(
                self.wait_semaphore(self.dev.progress, value, timeout),
                Ok(true)
            )
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let last = self.lock().last_submitted;
        if !self.wait_progress(last, DROP_WAIT) {
            // Work is still pending (e.g. waiting for a semaphore nobody signals): destroying
            // the device now would be invalid, so leak it and the instance.
            self.dev.leak = true;
            self.inst.leak = true;
        }
    }
}

/// How many semaphores of one kind a submission passes without a heap allocation.
pub(super) const INLINE_OPS: usize = 16;

/// A short list kept on the stack, moved to the heap only past [`INLINE_OPS`] entries.
pub(super) struct SmallList<T> {
    pub(super) inline: [T; INLINE_OPS],
    pub(super) len: usize,
    pub(super) heap: Vec<T>,
}

impl<T: Copy + Default> SmallList<T> {
    pub(super) fn new() -> Self {
        Self {
            inline: [T::default(); INLINE_OPS],
            len: 0,
            heap: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, item: T) {
        if self.heap.is_empty() && self.len < INLINE_OPS {
            self.inline[self.len] = item;
            self.len += 1;
            return;
        }
        if self.heap.is_empty() {
            self.heap.extend_from_slice(&self.inline[..self.len]);
        }
        self.heap.push(item);
    }

    pub(super) fn as_slice(&self) -> &[T] {
        if self.heap.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }
}

/// Records which submission last used an object.
#[derive(Default)]
pub(super) struct LastUse(AtomicU64);

impl LastUse {
    pub(super) fn mark(&self, value: u64) {
        self.0.fetch_max(value, Ordering::AcqRel);
    }
    pub(super) fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}
