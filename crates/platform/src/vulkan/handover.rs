//! Host handover of host-visible exported memory through recorded queue batches.

use super::*;

impl VulkanExporter {
    // ----- host handover -----

    /// Records, once, the two queue batches that hand a host-visible, exported allocation
    /// between the host (through its mapping) and the importing API (see [`HostHandover`]).
    pub fn host_handover(&self, memory: &VulkanMemory) -> Result<HostHandover> {
        self.check_own(&memory.shared)?;
        if memory.mapped.is_none() {
            return Err(Error::NotHostVisible);
        }
        let d = self.shared.device();
        let family = self.shared.queue_family;
        let all_memory = vk::AccessFlags::MEMORY_READ | vk::AccessFlags::MEMORY_WRITE;
        let host_access = vk::AccessFlags::HOST_READ | vk::AccessFlags::HOST_WRITE;
        // To the importer: what the host wrote becomes visible to every device-side access,
        // then the buffer is released to the external owner.
        let host_to_device = [vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::HOST_WRITE)
            .dst_access_mask(all_memory)];
        let (acquire, release) = ownership_barriers(memory, family, host_access, all_memory);
        // To the host: the buffer is taken back from the external owner and every device-side
        // write becomes visible to host reads and writes.
        let device_to_host = [vk::MemoryBarrier::default()
            .src_access_mask(all_memory)
            .dst_access_mask(host_access)];
        let mut op = HostHandover {
            shared: Arc::clone(&self.shared),
            buffer: memory.buffer,
            to_external: vk::CommandBuffer::null(),
            to_host: vk::CommandBuffer::null(),
            last_use: LastUse::default(),
        };
        let state = self.shared.lock();
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(state.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(2);
        // SAFETY: the pool is used under the queue lock, held here.
        let cmds = unsafe { d.allocate_command_buffers(&info) }
            .map_err(vk_err("vkAllocateCommandBuffers"))?;
        op.to_external = cmds.first().copied().unwrap_or_default();
        op.to_host = cmds.get(1).copied().unwrap_or_default();
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::SIMULTANEOUS_USE);
        // SAFETY: recording two fresh command buffers of our pool under its lock; the buffer
        // is live and every barrier array outlives the calls.
        let recorded = unsafe {
            (|| -> Result<()> {
                d.begin_command_buffer(op.to_external, &begin)
                    .map_err(vk_err("vkBeginCommandBuffer"))?;
                d.cmd_pipeline_barrier(
                    op.to_external,
                    vk::PipelineStageFlags::HOST,
                    vk::PipelineStageFlags::ALL_COMMANDS,
                    vk::DependencyFlags::empty(),
                    &host_to_device,
                    &[],
                    &[],
                );
                d.cmd_pipeline_barrier(
                    op.to_external,
                    vk::PipelineStageFlags::ALL_COMMANDS,
                    vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                    vk::DependencyFlags::empty(),
                    &[],
                    &release,
                    &[],
                );
                d.end_command_buffer(op.to_external)
                    .map_err(vk_err("vkEndCommandBuffer"))?;
                d.begin_command_buffer(op.to_host, &begin)
                    .map_err(vk_err("vkBeginCommandBuffer"))?;
                d.cmd_pipeline_barrier(
                    op.to_host,
                    vk::PipelineStageFlags::ALL_COMMANDS,
                    vk::PipelineStageFlags::HOST,
                    vk::DependencyFlags::empty(),
                    &device_to_host,
                    &acquire,
                    &[],
                );
                d.end_command_buffer(op.to_host)
                    .map_err(vk_err("vkEndCommandBuffer"))
            })()
        };
        drop(state);
        recorded?;
        Ok(op)
    }

    /// Submits one of `op`'s recorded batches (`cmd`) for `memory`, after checking that both
    /// are this exporter's and that `op` was recorded for `memory`'s buffer; the value the
    /// batch signals on the exporter's progress semaphore.
    fn submit_handover(
        &self,
        op: &HostHandover,
        memory: &VulkanMemory,
        cmd: vk::CommandBuffer,
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
    ) -> Result<u64> {
        self.check_own(&op.shared)?;
        self.check_own(&memory.shared)?;
        if op.buffer != memory.buffer {
            return Err(Error::HandoverMismatch);
        }
        self.submit_inner(Some(cmd), waits, signals, &[&op.last_use, &memory.last_use])
    }

    /// Hands `memory` from the host to the importer after the host wrote it: submits a batch
    /// that waits for `waits`, makes the host's writes visible to device-side access (the
    /// host-to-device memory-domain operation of a queue submission plus a host-write
    /// barrier), releases the buffer to the external owner and then signals `signals`
    /// (asynchronous). Signal the importer's *ready* semaphore here instead of with
    /// [`VulkanSemaphore::signal`]: a host-side signal performs no such operation, and the
    /// device can then read stale cached lines of the allocation.
    pub fn release_host_writes(
        &self,
        op: &HostHandover,
        memory: &VulkanMemory,
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
    ) -> Result<()> {
        self.submit_handover(op, memory, op.to_external, waits, signals)
            .map(|_| ())
    }

    /// The batch of [`acquire_for_host`](Self::acquire_for_host), submitted without a host
    /// wait: it waits for `waits`, takes the buffer back from the external owner, makes
    /// device-side writes visible to the host and then signals `signals`. A host wait that
    /// observes one of `signals` comes after the batch completed (the signal's first
    /// synchronisation scope covers the batch's commands), so the host may then touch the
    /// memory.
    pub fn acquire_for_host_ahead(
        &self,
        op: &HostHandover,
        memory: &VulkanMemory,
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
    ) -> Result<()> {
        self.submit_handover(op, memory, op.to_host, waits, signals)
            .map(|_| ())
    }

    /// Hands `memory` from the importer back to the host: submits a batch that waits for
    /// `waits` (the importer's *free* semaphore), acquires the buffer from the external owner
    /// and makes device-side writes visible to the host, then waits on the host until that
    /// batch finished. `Ok(false)` when it did not within `timeout` (the batch stays queued;
    /// the host must not touch the memory then).
    pub fn acquire_for_host(
        &self,
        op: &HostHandover,
        memory: &VulkanMemory,
        waits: &[SemaphoreOp<'_>],
        timeout: Duration,
    ) -> Result<bool> {
        let value = self.submit_handover(op, memory, op.to_host, waits, &[])?;
        self.shared
            .wait_semaphore(self.shared.dev.progress, value, timeout)
    }
}

/// The recorded queue batches that hand a host-visible, exported [`VulkanMemory`] between
/// the host and the importing API (e.g. CUDA), made by [`VulkanExporter::host_handover`].
///
/// Host writes through a mapping reach the device only through a queue submission (Vulkan's
/// host-to-device memory-domain operation); a host-side semaphore signal does not make them
/// visible, and a GPU may keep stale cached lines of system memory. Likewise the host should
/// read what the device wrote only after a batch that made those writes visible to it. The
/// memory types this module maps are host-coherent, so no explicit flush or invalidate of
/// the mapped range is needed on the host side.
pub struct HostHandover {
    pub(super) shared: Arc<Shared>,
    pub(super) buffer: vk::Buffer,
    pub(super) to_external: vk::CommandBuffer,
    pub(super) to_host: vk::CommandBuffer,
    pub(super) last_use: LastUse,
}

impl fmt::Debug for HostHandover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostHandover").finish_non_exhaustive()
    }
}

impl Drop for HostHandover {
    fn drop(&mut self) {
        if !self.shared.wait_progress(self.last_use.get(), DROP_WAIT) {
            return; // still pending: leak (the command buffers are freed with the pool)
        }
        let d = self.shared.device();
        let state = self.shared.lock();
        for cmd in [self.to_external, self.to_host] {
            if cmd != vk::CommandBuffer::null() {
                // SAFETY: no pending submission uses the command buffer; the pool is used
                // under its lock.
                unsafe { d.free_command_buffers(state.pool, &[cmd]) };
            }
        }
    }
}

/// Queue-family ownership barriers for an exported buffer: (acquire from the external owner
/// before use, release to it after use). Empty for buffers that are not exported.
pub(super) fn ownership_barriers(
    memory: &VulkanMemory,
    family: u32,
    acquire_access: vk::AccessFlags,
    release_access: vk::AccessFlags,
) -> (
    Vec<vk::BufferMemoryBarrier<'static>>,
    Vec<vk::BufferMemoryBarrier<'static>>,
) {
    if !memory.exportable {
        return (Vec::new(), Vec::new());
    }
    let base = vk::BufferMemoryBarrier::default()
        .buffer(memory.buffer)
        .offset(0)
        .size(vk::WHOLE_SIZE);
    (
        vec![base
            .src_queue_family_index(vk::QUEUE_FAMILY_EXTERNAL)
            .dst_queue_family_index(family)
            .dst_access_mask(acquire_access)],
        vec![base
            .src_queue_family_index(family)
            .dst_queue_family_index(vk::QUEUE_FAMILY_EXTERNAL)
            .src_access_mask(release_access)],
    )
}
