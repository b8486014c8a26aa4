//! The counter-increment compute dispatch and its SPIR-V words.

use super::*;

/// A recorded compute dispatch that adds 1 to a `u32` in a [`VulkanMemory`]; see
/// [`VulkanExporter::counter_incrementer`].
pub struct CounterIncrement<'m> {
    pub(super) shared: Arc<Shared>,
    pub(super) memory: &'m VulkanMemory,
    pub(super) pool: vk::DescriptorPool,
    pub(super) cmd: vk::CommandBuffer,
    pub(super) last_use: LastUse,
}

impl fmt::Debug for CounterIncrement<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CounterIncrement")
            .field("memory", &self.memory)
            .finish_non_exhaustive()
    }
}

impl Drop for CounterIncrement<'_> {
    fn drop(&mut self) {
        if !self.shared.wait_progress(self.last_use.get(), DROP_WAIT) {
            return; // still pending: leak (the pool is freed with the device)
        }
        let d = self.shared.device();
        let state = self.shared.lock();
        // SAFETY: no pending submission uses the command buffer or the descriptor set; the
        // command pool is used under its lock; null handles are ignored.
        unsafe {
            if self.cmd != vk::CommandBuffer::null() {
                d.free_command_buffers(state.pool, &[self.cmd]);
            }
            d.destroy_descriptor_pool(self.pool, None);
        }
    }
}

/// SPIR-V 1.0 compute shader, written by hand for this crate:
///
/// ```text
/// capability Shader; memory model Logical GLSL450; entry point GLCompute %1 "main";
/// local size 1x1x1; %5 = struct { u32 } (BufferBlock, member 0 at offset 0);
/// %7 = Uniform variable of %5 at set 0, binding 0
/// main: %13 = &%7.member0; %14 = load %13; %15 = %14 + 1; store %13 = %15
/// ```
///
/// Word 0 is the magic number, then version 1.0, generator 0, id bound 16, schema 0; every
/// instruction starts with `(word_count << 16) | opcode`.
#[rustfmt::skip]
pub(super) const INCREMENT_SPIRV: [u32; 99] = [
    0x0723_0203, 0x0001_0000, 0x0000_0000, 0x0000_0010, 0x0000_0000,
    // OpCapability Shader
    0x0002_0011, 0x0000_0001,
    // OpMemoryModel Logical GLSL450
    0x0003_000e, 0x0000_0000, 0x0000_0001,
    // OpEntryPoint GLCompute %1 "main"
    0x0005_000f, 0x0000_0005, 0x0000_0001, 0x6e69_616d, 0x0000_0000,
    // OpExecutionMode %1 LocalSize 1 1 1
    0x0006_0010, 0x0000_0001, 0x0000_0011, 0x0000_0001, 0x0000_0001, 0x0000_0001,
    // OpDecorate %5 BufferBlock
    0x0003_0047, 0x0000_0005, 0x0000_0003,
    // OpMemberDecorate %5 0 Offset 0
    0x0005_0048, 0x0000_0005, 0x0000_0000, 0x0000_0023, 0x0000_0000,
    // OpDecorate %7 DescriptorSet 0
    0x0004_0047, 0x0000_0007, 0x0000_0022, 0x0000_0000,
    // OpDecorate %7 Binding 0
    0x0004_0047, 0x0000_0007, 0x0000_0021, 0x0000_0000,
    // %2 = OpTypeVoid
    0x0002_0013, 0x0000_0002,
    // %3 = OpTypeFunction %2
    0x0003_0021, 0x0000_0003, 0x0000_0002,
    // %4 = OpTypeInt 32 unsigned
    0x0004_0015, 0x0000_0004, 0x0000_0020, 0x0000_0000,
    // %5 = OpTypeStruct %4
    0x0003_001e, 0x0000_0005, 0x0000_0004,
    // %6 = OpTypePointer Uniform %5
    0x0004_0020, 0x0000_0006, 0x0000_0002, 0x0000_0005,
    // %7 = OpVariable %6 Uniform
    0x0004_003b, 0x0000_0006, 0x0000_0007, 0x0000_0002,
    // %8 = OpTypeInt 32 signed
    0x0004_0015, 0x0000_0008, 0x0000_0020, 0x0000_0001,
    // %9 = OpConstant %8 0
    0x0004_002b, 0x0000_0008, 0x0000_0009, 0x0000_0000,
    // %10 = OpConstant %4 1
    0x0004_002b, 0x0000_0004, 0x0000_000a, 0x0000_0001,
    // %11 = OpTypePointer Uniform %4
    0x0004_0020, 0x0000_000b, 0x0000_0002, 0x0000_0004,
    // %1 = OpFunction %2 None %3
    0x0005_0036, 0x0000_0002, 0x0000_0001, 0x0000_0000, 0x0000_0003,
    // %12 = OpLabel
    0x0002_00f8, 0x0000_000c,
    // %13 = OpAccessChain %11 %7 %9
    0x0005_0041, 0x0000_000b, 0x0000_000d, 0x0000_0007, 0x0000_0009,
    // %14 = OpLoad %4 %13
    0x0004_003d, 0x0000_0004, 0x0000_000e, 0x0000_000d,
    // %15 = OpIAdd %4 %14 %10
    0x0005_0080, 0x0000_0004, 0x0000_000f, 0x0000_000e, 0x0000_000a,
    // OpStore %13 %15
    0x0003_003e, 0x0000_000d, 0x0000_000f,
    // OpReturn
    0x0001_00fd,
    // OpFunctionEnd
    0x0001_0038,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn spirv_header_and_bound() {
        assert_eq!(INCREMENT_SPIRV[0], 0x0723_0203);
        // Walk the instruction stream: every word count must land exactly on the end.
        let mut i = 5;
        while i < INCREMENT_SPIRV.len() {
            let count = (INCREMENT_SPIRV[i] >> 16) as usize;
            assert!(count > 0);
            i += count;
        }
        assert_eq!(i, INCREMENT_SPIRV.len());
    }

    #[test]
    pub(super) fn uuid_format() {
        let u = [
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55,
            0x66, 0x77,
        ];
        assert_eq!(format_uuid(&u), "01234567-89ab-cdef-0011-223344556677");
    }

    #[test]
    pub(super) fn memory_type_choice_prefers_plain_types() {
        let mut props = vk::PhysicalDeviceMemoryProperties {
            memory_type_count: 3,
            ..Default::default()
        };
        props.memory_types[0].property_flags = vk::MemoryPropertyFlags::DEVICE_LOCAL
            | vk::MemoryPropertyFlags::HOST_VISIBLE
            | vk::MemoryPropertyFlags::HOST_COHERENT;
        props.memory_types[1].property_flags = vk::MemoryPropertyFlags::DEVICE_LOCAL;
        props.memory_types[2].property_flags =
            vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        assert_eq!(
            pick_memory_type(&props, 0b111, MemoryLocation::DeviceLocal),
            Some(1)
        );
        assert_eq!(
            pick_memory_type(&props, 0b111, MemoryLocation::HostVisible),
            Some(2)
        );
        // Falls back to the combined type when the plain one is not allowed.
        assert_eq!(
            pick_memory_type(&props, 0b001, MemoryLocation::DeviceLocal),
            Some(0)
        );
        assert_eq!(
            pick_memory_type(&props, 0b011, MemoryLocation::HostVisible),
            Some(0)
        );
        assert_eq!(
            pick_memory_type(&props, 0b111, MemoryLocation::DeviceLocalHostVisible),
            Some(0)
        );
        assert_eq!(
            pick_memory_type(&props, 0b110, MemoryLocation::DeviceLocalHostVisible),
            None
        );
        assert_eq!(
            pick_memory_type(&props, 0b010, MemoryLocation::HostVisible),
            None
        );
        // Cached host memory: only a type with HOST_CACHED qualifies.
        assert_eq!(
            pick_memory_type(&props, 0b111, MemoryLocation::HostCached),
            None
        );
        props.memory_type_count = 4;
        props.memory_types[3].property_flags = vk::MemoryPropertyFlags::HOST_VISIBLE
            | vk::MemoryPropertyFlags::HOST_COHERENT
            | vk::MemoryPropertyFlags::HOST_CACHED;
        assert_eq!(
            pick_memory_type(&props, 0b1111, MemoryLocation::HostCached),
            Some(3)
        );
        // The plain host-visible choice still prefers the first fitting non-device-local type.
        assert_eq!(
            pick_memory_type(&props, 0b1111, MemoryLocation::HostVisible),
            Some(2)
        );
    }

    #[test]
    pub(super) fn missing_loader_is_a_typed_error() {
        // SAFETY: the path does not exist, so nothing is loaded.
        let r = unsafe {
            VulkanExporter::with_loader(
                std::path::Path::new("/nonexistent/libvulkan-tegra-interop-test.so.1"),
                [0; 16],
                QueueChoice::FirstCompute,
            )
        };
        assert!(matches!(r, Err(Error::LoaderNotFound { .. })), "{r:?}");
    }
}
