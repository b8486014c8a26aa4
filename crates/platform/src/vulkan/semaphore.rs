//! Vulkan semaphores: creation, export, host signal / wait / value.

use super::*;

/// An exportable binary or timeline semaphore.
pub struct VulkanSemaphore {
    pub(super) shared: Arc<Shared>,
    pub(super) sem: vk::Semaphore,
    pub(super) kind: SemaphoreKind,
    pub(super) last_use: LastUse,
}

impl fmt::Debug for VulkanSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VulkanSemaphore")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl VulkanSemaphore {
    pub(super) fn create(shared: &Arc<Shared>, kind: SemaphoreKind, initial: u64) -> Result<Self> {
        let handle = vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD;
        let vk_type = match kind {
            SemaphoreKind::Binary => vk::SemaphoreType::BINARY,
            SemaphoreKind::Timeline => vk::SemaphoreType::TIMELINE,
        };
        let initial = if kind == SemaphoreKind::Timeline {
            initial
        } else {
            0
        };
        {
            let mut type_query = vk::SemaphoreTypeCreateInfo::default()
                .semaphore_type(vk_type)
                .initial_value(initial);
            let query = vk::PhysicalDeviceExternalSemaphoreInfo::default()
                .handle_type(handle)
                .push_next(&mut type_query);
            let mut out = vk::ExternalSemaphoreProperties::default();
            // SAFETY: 1.1 core query on our physical device; structs outlive the call.
            unsafe {
                shared
                    .inst
                    .instance
                    .get_physical_device_external_semaphore_properties(
                        shared.physical,
                        &query,
                        &mut out,
                    )
            };
            if !out
                .external_semaphore_features
                .contains(vk::ExternalSemaphoreFeatureFlags::EXPORTABLE)
            {
                return Err(Error::NotExportable {
                    what: match kind {
                        SemaphoreKind::Binary => "a binary semaphore",
                        SemaphoreKind::Timeline => "a timeline semaphore",
                    },
                });
            }
        }
        let mut type_info = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk_type)
            .initial_value(initial);
        let mut export = vk::ExportSemaphoreCreateInfo::default().handle_types(handle);
        let info = vk::SemaphoreCreateInfo::default()
            .push_next(&mut type_info)
            .push_next(&mut export);
        // SAFETY: valid create info for a live device; the chain outlives the call.
        let sem = unsafe { shared.device().create_semaphore(&info, None) }
            .map_err(vk_err("vkCreateSemaphore"))?;
        Ok(Self {
            shared: Arc::clone(shared),
            sem,
            kind,
            last_use: LastUse::default(),
        })
    }

    /// Binary or timeline.
    pub fn kind(&self) -> SemaphoreKind {
        self.kind
    }

    /// Exports the semaphore as a new opaque fd (each call gives a fresh fd).
    pub fn export_fd(&self) -> Result<OwnedFd> {
        let info = vk::SemaphoreGetFdInfoKHR::default()
            .semaphore(self.sem)
            .handle_type(vk::ExternalSemaphoreHandleTypeFlags::OPAQUE_FD);
        // SAFETY: the semaphore was created exportable as OPAQUE_FD.
        let fd = unsafe { self.shared.sem_fd.get_semaphore_fd(&info) }
            .map_err(vk_err("vkGetSemaphoreFdKHR"))?;
        if fd < 0 {
            return Err(Error::Vulkan {
                call: "vkGetSemaphoreFdKHR",
                result: vk::Result::ERROR_INVALID_EXTERNAL_HANDLE,
            });
        }
        // SAFETY: a successful vkGetSemaphoreFdKHR gives a new fd owned by the caller.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub(super) fn timeline(&self) -> Result<vk::Semaphore> {
        match self.kind {
            SemaphoreKind::Timeline => Ok(self.sem),
            SemaphoreKind::Binary => Err(Error::NotTimeline),
        }
    }

    /// Host signal (`vkSignalSemaphore`): sets the timeline to `value`, which must be larger
    /// than the current value and than any pending signal.
    pub fn signal(&self, value: u64) -> Result<()> {
        let s = self.timeline()?;
        self.shared.signal_semaphore(s, value)
    }

    /// Host wait (`vkWaitSemaphores`) until the timeline reaches `value`; `Ok(false)` when
    /// `timeout` passed first.
    pub fn wait(&self, value: u64, timeout: Duration) -> Result<bool> {
        let s = self.timeline()?;
        self.shared.wait_semaphore(s, value, timeout)
    }

    /// The current timeline value (`vkGetSemaphoreCounterValue`).
    pub fn value(&self) -> Result<u64> {
        let s = self.timeline()?;
        self.shared.semaphore_value(s)
    }
}

impl Drop for VulkanSemaphore {
    fn drop(&mut self) {
        if !self.shared.wait_progress(self.last_use.get(), DROP_WAIT) {
            return; // a pending batch still uses it: leak
        }
        // SAFETY: no pending submission uses the semaphore any more.
        unsafe { self.shared.device().destroy_semaphore(self.sem, None) };
    }
}
