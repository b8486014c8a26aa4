//! The Rust twins of the consumer's kernels, for the simulator: the same
//! arithmetic as [`super::KERNEL_SOURCE`], run over the simulator's memory
//! when a launch of that name reaches its `cuLaunchKernel`.
//!
//! [`register`] gives a simulator all four, under the names and C
//! parameter lists of the CUDA kernels; the simulator's NVRTC then accepts
//! the consumer's source (it refuses a source declaring a kernel it has no
//! twin for), its `cuModuleLoadData` the image it made, and its launches run
//! these functions in stream order. So the consumer's whole kernel path
//! (compile, load, launch, events, the counters in mapped pinned memory)
//! runs in CI; only the device code itself is replaced, by a function that
//! computes what [`crate::transport::process_frame`] computes (the tests
//! check both against the same frames).

use tegra_interop_sim::kernels::{KernelFault, KernelLaunch, KernelSpec};
use tegra_interop_sim::Sim;

use super::kernel::{kernel_pattern_byte, CHECK_DEVICE, CHECK_SYSMEM, COPY_IN, COPY_OUT};

/// `(unsigned char *buf, u64 len, u64 stride, u32 seed, u64 *mismatches)`.
const CHECK_PARAMS: &[usize] = &[8, 8, 8, 4, 8];
/// `(unsigned char *dst, const unsigned char *src, u64 len)`.
const COPY_PARAMS: &[usize] = &[8, 8, 8];

/// Registers the twins of the four consumer kernels with `sim` (again:
/// the same functions replace themselves).
pub fn register(sim: &Sim) {
    for name in [CHECK_DEVICE, CHECK_SYSMEM] {
        sim.register_kernel(KernelSpec::new(name, CHECK_PARAMS), check_and_invert);
    }
    for name in [COPY_IN, COPY_OUT] {
        sim.register_kernel(KernelSpec::new(name, COPY_PARAMS), copy);
    }
}

/// A launch argument as a host length.
fn host_len(k: &KernelLaunch<'_>, i: usize) -> Result<usize, KernelFault> {
    let v = k.arg_u64(i)?;
    usize::try_from(v).map_err(|_| {
        KernelFault::new(format!(
            "kernel `{}`: argument {i} ({v}) exceeds the host's address space",
            k.name()
        ))
    })
}

/// Counts the bytes of `bytes` (lines of `stride`) that differ from the
/// pattern of `seed` and inverts every byte: the body of `check_and_invert`
/// (both variants: the load and store flavours make no difference here).
pub fn check_and_invert_bytes(bytes: &mut [u8], stride: usize, seed: u32) -> u64 {
    if stride == 0 {
        return 0;
    }
    let mut mismatches = 0u64;
    for (row, line) in bytes.chunks_mut(stride).enumerate() {
        for (col, b) in line.iter_mut().enumerate() {
            let want = kernel_pattern_byte(seed, row as u64, col as u64);
            mismatches += u64::from(*b != want);
            *b = !*b;
        }
    }
    mismatches
}

/// The twin of `check_and_invert` / `check_and_invert_sysmem`.
fn check_and_invert(k: &mut KernelLaunch<'_>) -> Result<(), KernelFault> {
    let buf = k.arg_u64(0)?;
    let len = host_len(k, 1)?;
    let stride = host_len(k, 2)?;
    let seed = k.arg_u32(3)?;
    let counter = k.arg_u64(4)?;
    if stride == 0 {
        // The CUDA code divides by the stride: a fault there, not a count.
        return Err(KernelFault::new(format!(
            "kernel `{}`: stride 0 (a division by zero on the GPU)",
            k.name()
        )));
    }
    let mut bytes = vec![0u8; len];
    k.read(buf, &mut bytes)?;
    let found = check_and_invert_bytes(&mut bytes, stride, seed);
    k.write(buf, &bytes)?;
    if found != 0 {
        // The CUDA code adds only when it found something (atomicAdd).
        let before = k.read_u64(counter)?;
        k.write_u64(counter, before.wrapping_add(found))?;
    }
    Ok(())
}

/// The twin of `copy_from_sysmem` / `copy_to_sysmem`.
fn copy(k: &mut KernelLaunch<'_>) -> Result<(), KernelFault> {
    let dst = k.arg_u64(0)?;
    let src = k.arg_u64(1)?;
    let len = host_len(k, 2)?;
    let mut bytes = vec![0u8; len];
    k.read(src, &mut bytes)?;
    k.write(dst, &bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::camera::TestPattern;
    use crate::consumer::kernel::pattern_seed;
    use crate::transport::process_frame;

    #[test]
    fn the_twin_computes_what_the_host_reference_computes() {
        for (stride, rows) in [(64usize, 8usize), (300, 5), (7680, 3)] {
            for frame in [0u64, 1, 77, u64::MAX] {
                let mut a = vec![0u8; stride * rows];
                TestPattern::new(frame, stride).fill(&mut a);
                a[3] ^= 1;
                a[stride * rows - 1] ^= 0x80;
                let mut b = a.clone();
                let n = check_and_invert_bytes(&mut a, stride, pattern_seed(frame));
                assert_eq!(n, 2, "stride {stride} frame {frame}");
                assert_eq!(n, process_frame(frame, stride, &mut b));
                assert_eq!(a, b);
            }
        }
    }
}
