//! A mapped buffer as a cudarc kernel argument on the real driver (feature
//! `vulkan`): Vulkan exports host-visible memory, the driver imports and maps
//! it, `MappedBuffer::cudarc_slice` lends it to cudarc, an NVRTC kernel
//! launched with cudarc's launch builder rewrites it, and Vulkan reads the
//! result. Ignored without a GPU (CI lists it as ignored).
#![allow(clippy::unwrap_used)]

use cudarc::driver::{LaunchConfig, PushKernelArg};
use tegra_interop::driver::{Backend, Context, ExternalMemory};
use tegra_interop_platform::vulkan::{MemoryLocation, VulkanExporter};
use tegra_interop_testkit::raw_cuda;

const KERNEL: &str = r#"
extern "C" __global__ void add_index(unsigned int *words, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { words[i] = words[i] * 3u + i; }
}
"#;

fn cuda_uuid() -> [u8; 16] {
    let cu = raw_cuda::RawCuda::load().expect("libcuda.so.1 is needed for this test");
    cu.init().unwrap();
    cu.device_uuid(cu.device(0).unwrap()).unwrap()
}

#[test]
#[ignore = "needs an NVIDIA GPU with Vulkan and NVRTC"]
fn cudarc_kernel_rewrites_vulkan_memory_through_a_mapped_buffer() {
    const WORDS: usize = 4096;
    let vk = VulkanExporter::new(cuda_uuid()).unwrap();
    let exp = vk
        .export_memory((WORDS * 4) as u64, MemoryLocation::HostVisible)
        .unwrap();
    let before: Vec<u8> = (0..WORDS as u32)
        .flat_map(|w| (w ^ 0x5a5a).to_le_bytes())
        .collect();
    exp.memory.write(0, &before).unwrap();

    let ctx = Context::new(Backend::real().unwrap(), 0).unwrap();
    let cu = ctx
        .cudarc()
        .expect("Context::new is cudarc's primary context")
        .clone();
    let stream = cu.new_stream().unwrap();
    let memory = ExternalMemory::opaque_fd(&ctx, exp.fd, exp.size)
        .map_err(|e| e.error)
        .unwrap();
    let mut mapped = memory.map_whole().unwrap();

    let module = cu
        .load_module(cudarc::nvrtc::compile_ptx(KERNEL).unwrap())
        .unwrap();
    let f = module.load_function("add_index").unwrap();
    {
        let mut words = mapped.cudarc_slice::<u32>(&stream).unwrap();
        assert_eq!(words.len(), (exp.size / 4) as usize);
        let n = WORDS as u32;
        let mut launch = stream.launch_builder(&f);
        launch.arg(&mut words).arg(&n);
        // SAFETY: the kernel touches words[0..n), inside the slice.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }.unwrap();
        // Read back through cudarc too, ordered after the kernel.
        let through_cudarc: Vec<u32> = stream.clone_dtoh(&*words).unwrap();
        assert_eq!(through_cudarc[7], (7 ^ 0x5a5a) * 3 + 7);
    }
    stream.synchronize().unwrap();

    let mut after = vec![0u8; WORDS * 4];
    exp.memory.read(0, &mut after).unwrap();
    for (i, chunk) in after.chunks_exact(4).enumerate() {
        let got = u32::from_le_bytes(chunk.try_into().unwrap());
        let want = (i as u32 ^ 0x5a5a).wrapping_mul(3).wrapping_add(i as u32);
        assert_eq!(got, want, "word {i}");
    }

    // An element type the mapping's size is not a multiple of is refused.
    assert!(mapped.cudarc_slice::<[u8; 3]>(&stream).is_err());
    mapped.destroy().unwrap();
    memory.destroy().unwrap();
}
