//! Queue work of the exporter: submissions, idle waits, copies, upload / download.

use super::*;

impl VulkanExporter {
    // ----- queue work -----

    /// Submits a batch without commands that waits for `waits` and then signals `signals`
    /// (GPU side, asynchronous).
    ///
    /// A binary semaphore may only be waited for once a signal for it has been submitted
    /// (by Vulkan or, for an exported one, by the importer).
    pub fn submit(&self, waits: &[SemaphoreOp<'_>], signals: &[SemaphoreOp<'_>]) -> Result<()> {
        self.submit_inner(None, waits, signals, &[]).map(|_| ())
    }

    pub(super) fn submit_inner(
        &self,
        cmd: Option<vk::CommandBuffer>,
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
        also_used: &[&LastUse],
    ) -> Result<u64> {
        for op in waits.iter().chain(signals) {
            self.check_own(&op.semaphore.shared)?;
        }
        let mut state = self.shared.lock();
        self.submit_locked(&mut state, cmd, waits, signals, also_used)
    }

    pub(super) fn submit_locked(
        &self,
        state: &mut QueueState,
        cmd: Option<vk::CommandBuffer>,
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
        also_used: &[&LastUse],
    ) -> Result<u64> {
        let value = state.last_submitted + 1;
        // Kept on the stack for the usual handful of semaphores, so a steady-state submission
        // makes no heap allocation.
        let mut wait_sems = SmallList::new();
        let mut wait_values = SmallList::new();
        let mut stages = SmallList::new();
        for op in waits {
            wait_sems.push(op.semaphore.sem);
            wait_values.push(op.value);
            stages.push(vk::PipelineStageFlags::ALL_COMMANDS);
        }
        let mut signal_sems = SmallList::new();
        let mut signal_values = SmallList::new();
        for op in signals {
            signal_sems.push(op.semaphore.sem);
            signal_values.push(op.value);
        }
        signal_sems.push(self.shared.dev.progress);
        signal_values.push(value);
        let (wait_sems, wait_values, stages) = (
            wait_sems.as_slice(),
            wait_values.as_slice(),
            stages.as_slice(),
        );
        let (signal_sems, signal_values) = (signal_sems.as_slice(), signal_values.as_slice());
        let cmds: &[vk::CommandBuffer] = match &cmd {
            Some(c) => std::slice::from_ref(c),
            None => &[],
        };
        let mut timeline_info = vk::TimelineSemaphoreSubmitInfo::default()
            .wait_semaphore_values(wait_values)
            .signal_semaphore_values(signal_values);
        let submit = vk::SubmitInfo::default()
            .wait_semaphores(wait_sems)
            .wait_dst_stage_mask(stages)
            .command_buffers(cmds)
            .signal_semaphores(signal_sems)
            .push_next(&mut timeline_info);
        // SAFETY: the queue and pool are used under the lock held by the caller; every handle
        // belongs to this device (checked by the caller) and every array outlives the call.
        unsafe {
            self.shared
                .device()
                .queue_submit(state.queue, &[submit], vk::Fence::null())
        }
        .map_err(vk_err("vkQueueSubmit"))?;
        state.last_submitted = value;
        for op in waits.iter().chain(signals) {
            op.semaphore.last_use.mark(value);
        }
        for u in also_used {
            u.mark(value);
        }
        Ok(value)
    }

    /// Waits until all work submitted so far has finished; `Ok(false)` on timeout.
    pub fn wait_idle(&self, timeout: Duration) -> Result<bool> {
        let last = self.shared.lock().last_submitted;
        if last == 0 {
            return Ok(true);
        }
        self.shared
            .wait_semaphore(self.shared.dev.progress, last, timeout)
    }

    pub(super) fn begin_one_time(&self, state: &QueueState) -> Result<vk::CommandBuffer> {
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(state.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool is used under the queue lock (held by the caller).
        let cmd = unsafe { self.shared.device().allocate_command_buffers(&info) }
            .map_err(vk_err("vkAllocateCommandBuffers"))?
            .into_iter()
            .next()
            .ok_or(Error::Vulkan {
                call: "vkAllocateCommandBuffers",
                result: vk::Result::ERROR_UNKNOWN,
            })?;
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: freshly allocated command buffer, pool lock held.
        if let Err(e) = unsafe { self.shared.device().begin_command_buffer(cmd, &begin) } {
            // SAFETY: never submitted; pool lock held.
            unsafe {
                self.shared
                    .device()
                    .free_command_buffers(state.pool, &[cmd])
            };
            return Err(vk_err("vkBeginCommandBuffer")(e));
        }
        Ok(cmd)
    }

    /// Copies `src_range` of `src` to `dst` at `dst_offset` on the queue, then waits.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_sync(
        &self,
        src: &VulkanMemory,
        src_offset: u64,
        dst: &VulkanMemory,
        dst_offset: u64,
        len: u64,
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
    ) -> Result<()> {
        for op in waits.iter().chain(signals) {
            self.check_own(&op.semaphore.shared)?;
        }
        let d = self.shared.device();
        let mut state = self.shared.lock();
        let cmd = self.begin_one_time(&state)?;
        let family = self.shared.queue_family;
        // Exported buffers are taken from the external owner and handed back afterwards;
        // staging buffers only need their transfer writes made visible to host reads.
        let (mut acquire, mut release) = ownership_barriers(
            src,
            family,
            vk::AccessFlags::TRANSFER_READ,
            vk::AccessFlags::empty(),
        );
        let (a, r) = ownership_barriers(
            dst,
            family,
            vk::AccessFlags::TRANSFER_WRITE,
            vk::AccessFlags::TRANSFER_WRITE,
        );
        acquire.extend(a);
        release.extend(r);
        if !dst.exportable {
            release.push(
                vk::BufferMemoryBarrier::default()
                    .buffer(dst.buffer)
                    .offset(0)
                    .size(vk::WHOLE_SIZE)
                    .src_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
                    .dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
                    .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                    .dst_access_mask(vk::AccessFlags::HOST_READ),
            );
        }
        let region = [vk::BufferCopy::default()
            .src_offset(src_offset)
            .dst_offset(dst_offset)
            .size(len)];
        // SAFETY: recording into a command buffer we own, pool lock held; buffers are live
        // and the region was checked against both allocations by the callers.
        let recorded = unsafe {
            d.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::TOP_OF_PIPE,
                vk::PipelineStageFlags::TRANSFER,
                vk::DependencyFlags::empty(),
                &[],
                &acquire,
                &[],
            );
            d.cmd_copy_buffer(cmd, src.buffer, dst.buffer, &region);
            d.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::BOTTOM_OF_PIPE | vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &[],
                &release,
                &[],
            );
            d.end_command_buffer(cmd)
        };
        let submitted = recorded
            .map_err(vk_err("vkEndCommandBuffer"))
            .and_then(|()| {
                self.submit_locked(
                    &mut state,
                    Some(cmd),
                    waits,
                    signals,
                    &[&src.last_use, &dst.last_use],
                )
            });
        let value = match submitted {
            Ok(v) => v,
            Err(e) => {
                // SAFETY: never submitted; pool lock held.
                unsafe { d.free_command_buffers(state.pool, &[cmd]) };
                return Err(e);
            }
        };
        drop(state);
        if !self.shared.wait_progress(value, COPY_WAIT) {
            // The command buffer stays allocated (freed with the pool) since it may still run.
            return Err(Error::Timeout { what: "a copy" });
        }
        let state = self.shared.lock();
        // SAFETY: the submission finished; pool lock held.
        unsafe { d.free_command_buffers(state.pool, &[cmd]) };
        Ok(())
    }

    /// Writes `data` into `dst` at `offset` through a staging buffer and a queue copy, then
    /// waits for the copy. The copy's batch first waits for `waits` and afterwards signals
    /// `signals`. Works for both memory locations.
    pub fn upload(
        &self,
        dst: &VulkanMemory,
        offset: u64,
        data: &[u8],
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
    ) -> Result<()> {
        self.check_own(&dst.shared)?;
        let len = data.len() as u64;
        dst.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let staging = VulkanMemory::create(&self.shared, len, MemoryLocation::HostVisible, false)?;
        staging.write(0, data)?;
        self.copy_sync(&staging, 0, dst, offset, len, waits, signals)
    }

    /// Reads `out.len()` bytes of `src` at `offset` through a queue copy into a staging
    /// buffer, after the batch waited for `waits`; the batch then signals `signals`.
    pub fn download(
        &self,
        src: &VulkanMemory,
        offset: u64,
        out: &mut [u8],
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
    ) -> Result<()> {
        self.check_own(&src.shared)?;
        let len = out.len() as u64;
        src.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let staging = VulkanMemory::create(&self.shared, len, MemoryLocation::HostVisible, false)?;
        self.copy_sync(src, offset, &staging, 0, len, waits, signals)?;
        staging.read(0, out)
    }
}
