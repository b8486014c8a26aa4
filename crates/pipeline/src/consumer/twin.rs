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
//!
//! The twins run per block (`Sim::register_block_kernel`) and follow the
//! CUDA code's index arithmetic: each thread
//! `tid = blockIdx.x * blockDim.x + threadIdx.x` handles the
//! [`BYTES_PER_THREAD`]-byte vectors `tid`,
//! `tid + gridDim.x * blockDim.x`, ... below `len / 16`, and threads
//! `tid < len % 16` one byte each of the tail. A block reads and writes the
//! bytes its threads touch in bulk, so a launch touches exactly what it
//! touches on a GPU (with the grid [`super::kernel::grid_for`] gives, or any
//! other), at a few thousand calls per 1920x1080 frame.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tegra_interop_sim::kernels::{Block, KernelFault, KernelSpec};
use tegra_interop_sim::Sim;

use super::kernel::{
    kernel_pattern_byte, BYTES_PER_THREAD, CHECK_DEVICE, CHECK_SYSMEM, COPY_IN, COPY_OUT,
};

/// `(unsigned char *buf, u64 len, u64 stride, u32 seed, u64 *mismatches)`.
const CHECK_PARAMS: &[usize] = &[8, 8, 8, 4, 8];
/// `(unsigned char *dst, const unsigned char *src, u64 len)`.
const COPY_PARAMS: &[usize] = &[8, 8, 8];
/// [`BYTES_PER_THREAD`] as a device offset.
const VECTOR: u64 = BYTES_PER_THREAD as u64;
/// The warp size the check kernel's shuffle reduction assumes.
const WARP: u32 = 32;

/// Registers the twins of the four consumer kernels with `sim` (again:
/// the same functions replace themselves).
pub fn register(sim: &Sim) {
    for name in [CHECK_DEVICE, CHECK_SYSMEM] {
        sim.register_block_kernel(KernelSpec::new(name, CHECK_PARAMS), check_and_invert);
    }
    for name in [COPY_IN, COPY_OUT] {
        sim.register_block_kernel(KernelSpec::new(name, COPY_PARAMS), copy);
    }
}

/// How many launches of the check-and-invert kernel (either variant) the
/// twins registered by [`register_counted`] ran to their end: a count kept
/// by the simulator's side of the launch, so a frame processed any other
/// way (a host function, a skipped kernel) is not in it.
#[derive(Clone, Debug, Default)]
pub struct Launches(Arc<AtomicU64>);

impl Launches {
    /// Launches counted so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// [`register`], with the check-and-invert twins counting their launches:
/// a launch counts once its last block (the simulator runs blocks last to
/// first, so block 0) finished without a fault.
pub fn register_counted(sim: &Sim) -> Launches {
    register(sim);
    let launches = Launches::default();
    for name in [CHECK_DEVICE, CHECK_SYSMEM] {
        let count = launches.clone();
        sim.register_block_kernel(KernelSpec::new(name, CHECK_PARAMS), move |b| {
            check_and_invert(b)?;
            let i = b.block_idx();
            if (i.x, i.y, i.z) == (0, 0, 0) {
                count.0.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        });
    }
    launches
}

/// The byte ranges (offsets from the frame's start) one block touches, in
/// the CUDA code's order: its threads' vectors of the grid-stride loop,
/// then its threads' bytes of the tail.
fn touched(b: &Block<'_>, len: u64) -> Vec<Range<u64>> {
    let vectors = len / VECTOR;
    let tail_at = vectors * VECTOR;
    let mut out: Vec<Range<u64>> = b
        .grid_stride_x(vectors)
        .map(|r| r.start * VECTOR..r.end * VECTOR)
        .collect();
    out.extend(
        b.indices_x(len - tail_at)
            .map(|r| tail_at + r.start..tail_at + r.end),
    );
    out
}

/// A range's length as a host length (at most a block's bytes).
fn host_len(b: &Block<'_>, r: &Range<u64>) -> Result<usize, KernelFault> {
    usize::try_from(r.end - r.start).map_err(|_| {
        KernelFault::new(format!(
            "kernel `{}`: a range of {} bytes exceeds the host's address space",
            b.name(),
            r.end - r.start
        ))
    })
}

/// Counts the bytes of `bytes` (lines of `stride`) that differ from the
/// pattern of `seed` and inverts every byte: the body of `check_and_invert`
/// (both variants: the load and store flavours make no difference here).
pub fn check_and_invert_bytes(bytes: &mut [u8], stride: usize, seed: u32) -> u64 {
    check_and_invert_at(bytes, 0, stride as u64, seed)
}

/// [`check_and_invert_bytes`] for `bytes` found at byte `offset` of the
/// frame (row `offset / stride`, column `offset % stride`).
fn check_and_invert_at(bytes: &mut [u8], offset: u64, stride: u64, seed: u32) -> u64 {
    if stride == 0 {
        return 0;
    }
    let (mut row, mut col) = (offset / stride, offset % stride);
    let mut mismatches = 0u64;
    for b in bytes {
        let want = kernel_pattern_byte(seed, row, col);
        mismatches += u64::from(*b != want);
        *b = !*b;
        col += 1;
        if col == stride {
            col = 0;
            row += 1;
        }
    }
    mismatches
}

/// The twin of `check_and_invert` / `check_and_invert_sysmem`, one block.
fn check_and_invert(b: &Block<'_>) -> Result<(), KernelFault> {
    let buf = b.arg_u64(0)?;
    let len = b.arg_u64(1)?;
    let stride = b.arg_u64(2)?;
    let seed = b.arg_u32(3)?;
    let counter = b.arg_u64(4)?;
    if stride == 0 {
        // The CUDA code divides by the stride: a fault here, not a count.
        return Err(KernelFault::new(format!(
            "kernel `{}`: stride 0 (a division by zero on the GPU)",
            b.name()
        )));
    }
    let dim = b.block_dim();
    if !dim.x.is_multiple_of(WARP) || dim.y != 1 || dim.z != 1 {
        // The CUDA code reduces with full-warp shuffles and indexes by x
        // only: other block shapes are undefined or race there.
        return Err(KernelFault::new(format!(
            "kernel `{}`: block {dim}; the kernel needs 1-D blocks of whole warps",
            b.name()
        )));
    }
    let mut found = 0u64;
    for r in touched(b, len) {
        let mut bytes = vec![0u8; host_len(b, &r)?];
        b.read(buf + r.start, &mut bytes)?;
        found += check_and_invert_at(&mut bytes, r.start, stride, seed);
        b.write(buf + r.start, &bytes)?;
    }
    if found != 0 {
        // The CUDA code adds only when it found something (atomicAdd).
        b.atomic_add_u64(counter, found)?;
    }
    Ok(())
}

/// The twin of `copy_from_sysmem` / `copy_to_sysmem`, one block.
fn copy(b: &Block<'_>) -> Result<(), KernelFault> {
    let dst = b.arg_u64(0)?;
    let src = b.arg_u64(1)?;
    let len = b.arg_u64(2)?;
    for r in touched(b, len) {
        let mut bytes = vec![0u8; host_len(b, &r)?];
        b.read(src + r.start, &mut bytes)?;
        b.write(dst + r.start, &bytes)?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::camera::TestPattern;
    use crate::consumer::kernel::pattern_seed;
    use crate::transport::process_frame;

    use crate::consumer::kernel::{grid_for, Kernels, BLOCK};
    use crate::consumer::FrameMemory;
    use std::time::Duration;
    use tegra_interop::driver::{Context, DeviceBuffer, Event, EventFlags, Function, Stream};

    /// A simulator with the twins, a context, a stream and the kernels.
    struct Rig {
        _sim: Sim,
        ctx: Context,
        stream: Stream,
        kernels: Kernels,
    }

    fn rig() -> Rig {
        let sim =
            Sim::with_config(tegra_interop_sim::SimConfig::default().with_diagnostic_echo(false))
                .unwrap();
        register(&sim);
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let kernels = Kernels::compile(&ctx).unwrap();
        Rig {
            _sim: sim,
            ctx,
            stream,
            kernels,
        }
    }

    impl Rig {
        /// Runs the check kernel `f` over `frame` with `grid` x `block`;
        /// gives the bytes and the counter afterwards.
        fn check(
            &self,
            f: &Function,
            frame: &[u8],
            stride: usize,
            seed: u32,
            grid: u32,
            block: u32,
        ) -> (Vec<u8>, u64) {
            let buf = DeviceBuffer::new(&self.ctx, frame.len()).unwrap();
            buf.copy_from_host(0, frame).unwrap();
            let counter = DeviceBuffer::new(&self.ctx, 8).unwrap();
            counter.fill(0).unwrap();
            // SAFETY: the kernel's parameters (pointer, u64, u64, u32,
            // pointer); it touches `frame.len()` bytes of `buf` and 8 of
            // `counter`, both alive until the event below completed.
            unsafe {
                f.launch(grid, block)
                    .arg(&buf)
                    .arg(frame.len() as u64)
                    .arg(stride as u64)
                    .arg(seed)
                    .arg(&counter)
                    .launch(&self.stream)
            }
            .unwrap();
            let done = Event::new(&self.ctx, EventFlags::NO_TIMING).unwrap();
            done.record(&self.stream).unwrap();
            done.synchronize(Duration::from_secs(60)).unwrap();
            let mut out = vec![0u8; frame.len()];
            buf.copy_to_host(0, &mut out).unwrap();
            let mut n = [0u8; 8];
            counter.copy_to_host(0, &mut n).unwrap();
            (out, u64::from_ne_bytes(n))
        }
    }

    /// The kernels loop over the frame (grid-stride) and give the tail to
    /// the first threads: whatever the grid, the twin checks and inverts
    /// every byte exactly once, as the host reference does, and counts
    /// what differs.
    #[test]
    #[cfg_attr(miri, ignore = "runs the simulator's stream threads and NVRTC model")]
    fn the_per_block_twin_covers_the_frame_with_any_grid() {
        let r = rig();
        // 300 x 5 = 1500 bytes: 93 vectors and a tail of 12 bytes.
        let (stride, rows, frame) = (300usize, 5usize, 9u64);
        let mut bytes = vec![0u8; stride * rows];
        TestPattern::new(frame, stride).fill(&mut bytes);
        bytes[3] ^= 1;
        bytes[700] ^= 4;
        bytes[stride * rows - 1] ^= 0x80; // in the tail
        let mut want = bytes.clone();
        let n = process_frame(frame, stride, &mut want);
        assert_eq!(n, 3);
        for memory in [FrameMemory::Device, FrameMemory::System] {
            let f = r.kernels.check_and_invert(memory);
            for (grid, block) in [(grid_for(bytes.len()), BLOCK), (1, 32), (2, 64), (50, 256)] {
                let (out, count) = r.check(f, &bytes, stride, pattern_seed(frame), grid, block);
                assert_eq!(count, n, "{memory:?}, grid {grid} x {block}");
                assert!(
                    out == want,
                    "{memory:?}, grid {grid} x {block}: bytes differ"
                );
            }
        }
        assert!(
            r._sim.diagnostics().is_empty(),
            "{:?}",
            r._sim.diagnostics()
        );
    }

    /// Blocks the CUDA code cannot run correctly (a partial warp for its
    /// shuffle reduction, 2-D blocks it does not index) fault on the
    /// simulator instead of passing: the frame is left as it was.
    #[test]
    #[cfg_attr(miri, ignore = "runs the simulator's stream threads and NVRTC model")]
    fn blocks_the_kernel_cannot_run_are_a_fault() {
        let r = rig();
        let bytes = vec![7u8; 64 * 4];
        let f = r.kernels.check_and_invert(FrameMemory::Device);
        for block in [48u32, 1] {
            let (out, _) = r.check(f, &bytes, 64, 1, 1, block);
            assert_eq!(out, bytes, "block {block}");
        }
        let d = r._sim.take_diagnostics();
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d.iter().all(|d| d.message.contains("whole warps")), "{d:?}");
    }

    /// A 1920x1080 RGBA8 frame with the consumer's grid: the per-block
    /// twin (about 2,000 calls of bulk reads and writes) checks and inverts
    /// it all.
    #[test]
    #[cfg_attr(miri, ignore = "8 MB through the simulator's kernels")]
    fn a_full_hd_frame_runs_through_the_per_block_twin() {
        let r = rig();
        let (stride, rows, frame) = (1920usize * 4, 1080usize, 5u64);
        let mut bytes = vec![0u8; stride * rows];
        TestPattern::new(frame, stride).fill(&mut bytes);
        bytes[stride * 700 + 33] ^= 0x20;
        let f = r.kernels.check_and_invert(FrameMemory::System);
        let grid = grid_for(bytes.len());
        assert_eq!(grid, 2025);
        let (out, count) = r.check(f, &bytes, stride, pattern_seed(frame), grid, BLOCK);
        assert_eq!(count, 1);
        assert!(out.iter().zip(&bytes).all(|(o, b)| *o == !*b));
    }

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
