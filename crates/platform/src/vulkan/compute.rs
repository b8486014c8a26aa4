//! Compute work of the exporter: the counter-increment pipeline and its submission.

use super::*;

impl VulkanExporter {
    // ----- compute -----

    pub(super) fn compute_objects(
        &self,
        state: &mut QueueState,
    ) -> Result<(vk::DescriptorSetLayout, vk::PipelineLayout, vk::Pipeline)> {
        if let Some(c) = &state.compute {
            return Ok((c.set_layout, c.pipeline_layout, c.pipeline));
        }
        let d = self.shared.device();
        let mut c = ComputeObjects::default();
        let result = (|| -> Result<()> {
            let module_info = vk::ShaderModuleCreateInfo::default().code(&INCREMENT_SPIRV);
            // SAFETY: valid SPIR-V (checked with spirv-val) for a live device.
            c.shader = unsafe { d.create_shader_module(&module_info, None) }
                .map_err(vk_err("vkCreateShaderModule"))?;
            let bindings = [vk::DescriptorSetLayoutBinding::default()
                .binding(0)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)];
            let dsl_info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
            // SAFETY: valid create info for a live device.
            c.set_layout = unsafe { d.create_descriptor_set_layout(&dsl_info, None) }
                .map_err(vk_err("vkCreateDescriptorSetLayout"))?;
            let layouts = [c.set_layout];
            let pl_info = vk::PipelineLayoutCreateInfo::default().set_layouts(&layouts);
            // SAFETY: valid create info for a live device.
            c.pipeline_layout = unsafe { d.create_pipeline_layout(&pl_info, None) }
                .map_err(vk_err("vkCreatePipelineLayout"))?;
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(c.shader)
                .name(c"main");
            let info = [vk::ComputePipelineCreateInfo::default()
                .stage(stage)
                .layout(c.pipeline_layout)];
            // SAFETY: valid create info for a live device.
            let pipelines =
                unsafe { d.create_compute_pipelines(vk::PipelineCache::null(), &info, None) }
                    .map_err(|(_, e)| vk_err("vkCreateComputePipelines")(e))?;
            c.pipeline = pipelines.into_iter().next().unwrap_or_default();
            Ok(())
        })();
        if let Err(e) = result {
            // SAFETY: objects never used by any submission; null handles are ignored.
            unsafe {
                d.destroy_pipeline(c.pipeline, None);
                d.destroy_pipeline_layout(c.pipeline_layout, None);
                d.destroy_descriptor_set_layout(c.set_layout, None);
                d.destroy_shader_module(c.shader, None);
            }
            return Err(e);
        }
        let r = (c.set_layout, c.pipeline_layout, c.pipeline);
        state.compute = Some(c);
        Ok(r)
    }

    /// Records, once, a command buffer that adds 1 to the `u32` at `offset` of `memory` on
    /// the GPU (compute shader, one invocation). Submit it with
    /// [`VulkanExporter::submit_increment`] as often as needed. `offset` must be a multiple
    /// of [`VulkanExporter::storage_offset_alignment`].
    pub fn counter_incrementer<'m>(
        &self,
        memory: &'m VulkanMemory,
        offset: u64,
    ) -> Result<CounterIncrement<'m>> {
        self.check_own(&memory.shared)?;
        if !self.shared.queue_flags.contains(vk::QueueFlags::COMPUTE) {
            return Err(Error::NoComputeQueue);
        }
        memory.check_range(offset, 4)?;
        let align = self.shared.min_storage_align;
        if !offset.is_multiple_of(align) {
            return Err(Error::Misaligned {
                offset,
                alignment: align,
            });
        }
        let d = self.shared.device();
        let (set_layout, pipeline_layout, pipeline) = {
            let mut state = self.shared.lock();
            self.compute_objects(&mut state)?
        };
        // From here `op` owns what is made; an early return destroys it (without the lock
        // being held, since its drop takes the lock).
        let mut op = CounterIncrement {
            shared: Arc::clone(&self.shared),
            memory,
            pool: vk::DescriptorPool::null(),
            cmd: vk::CommandBuffer::null(),
            last_use: LastUse::default(),
        };
        let sizes = [vk::DescriptorPoolSize::default()
            .ty(vk::DescriptorType::STORAGE_BUFFER)
            .descriptor_count(1)];
        let pool_info = vk::DescriptorPoolCreateInfo::default()
            .max_sets(1)
            .pool_sizes(&sizes);
        // SAFETY: valid create info for a live device.
        op.pool = unsafe { d.create_descriptor_pool(&pool_info, None) }
            .map_err(vk_err("vkCreateDescriptorPool"))?;
        let layouts = [set_layout];
        let alloc = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(op.pool)
            .set_layouts(&layouts);
        // SAFETY: the pool has room for exactly this one set.
        let set = unsafe { d.allocate_descriptor_sets(&alloc) }
            .map_err(vk_err("vkAllocateDescriptorSets"))?
            .into_iter()
            .next()
            .ok_or(Error::Vulkan {
                call: "vkAllocateDescriptorSets",
                result: vk::Result::ERROR_UNKNOWN,
            })?;
        let buffer_info = [vk::DescriptorBufferInfo::default()
            .buffer(memory.buffer)
            .offset(offset)
            .range(4)];
        let write = [vk::WriteDescriptorSet::default()
            .dst_set(set)
            .dst_binding(0)
            .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
            .buffer_info(&buffer_info)];
        // SAFETY: the set is not in use by any command buffer yet.
        unsafe { d.update_descriptor_sets(&write, &[]) };

        let family = self.shared.queue_family;
        let (acquire, release) = ownership_barriers(
            memory,
            family,
            vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE,
            vk::AccessFlags::SHADER_WRITE,
        );
        let recorded = {
            let state = self.shared.lock();
            let info = vk::CommandBufferAllocateInfo::default()
                .command_pool(state.pool)
                .level(vk::CommandBufferLevel::PRIMARY)
                .command_buffer_count(1);
            // SAFETY: the pool is used under the queue lock.
            let cmds = unsafe { d.allocate_command_buffers(&info) }
                .map_err(vk_err("vkAllocateCommandBuffers"));
            cmds.and_then(|cmds| {
                op.cmd = cmds.into_iter().next().unwrap_or_default();
                let begin = vk::CommandBufferBeginInfo::default()
                    .flags(vk::CommandBufferUsageFlags::SIMULTANEOUS_USE);
                // SAFETY: recording a fresh command buffer under the pool lock; every handle
                // is live.
                unsafe {
                    d.begin_command_buffer(op.cmd, &begin)
                        .map_err(vk_err("vkBeginCommandBuffer"))?;
                    d.cmd_pipeline_barrier(
                        op.cmd,
                        vk::PipelineStageFlags::TOP_OF_PIPE,
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                        vk::DependencyFlags::empty(),
                        &[],
                        &acquire,
                        &[],
                    );
                    d.cmd_bind_pipeline(op.cmd, vk::PipelineBindPoint::COMPUTE, pipeline);
                    d.cmd_bind_descriptor_sets(
                        op.cmd,
                        vk::PipelineBindPoint::COMPUTE,
                        pipeline_layout,
                        0,
                        &[set],
                        &[],
                    );
                    d.cmd_dispatch(op.cmd, 1, 1, 1);
                    d.cmd_pipeline_barrier(
                        op.cmd,
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                        vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                        vk::DependencyFlags::empty(),
                        &[],
                        &release,
                        &[],
                    );
                    d.end_command_buffer(op.cmd)
                        .map_err(vk_err("vkEndCommandBuffer"))
                }
            })
        };
        recorded?;
        Ok(op)
    }

    /// Submits `op` (add 1 to its counter) in a batch that first waits for `waits` and then
    /// signals `signals`. Asynchronous.
    pub fn submit_increment(
        &self,
        op: &CounterIncrement<'_>,
        waits: &[SemaphoreOp<'_>],
        signals: &[SemaphoreOp<'_>],
    ) -> Result<()> {
        self.check_own(&op.shared)?;
        self.submit_inner(
            Some(op.cmd),
            waits,
            signals,
            &[&op.last_use, &op.memory.last_use],
        )
        .map(|_| ())
    }
}
