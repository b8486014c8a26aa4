//! A user's own CUDA kernel on memory another API exported, in the order
//! that API's timeline semaphore sets: import, kernel, semaphores, read
//! back and check, all through `tegra-interop-driver`, here on the
//! simulator.
//!
//! ```sh
//! cargo run -p tegra-interop-sim --example user_kernel
//! ```
//!
//! The producer (Vulkan on a GPU; the simulator's `export` module here)
//! owns an RGBA image and one timeline semaphore. For frame `f` it writes
//! the image and signals `2f + 1`; CUDA waits for that value, runs the
//! user's `brighten` kernel on the imported image and signals `2f + 2`; the
//! producer waits for it and reads the result. The CUDA side is queued
//! before the producer writes (a wait may come before its signal).
//!
//! The kernel is compiled from CUDA C with NVRTC. On the simulator it runs
//! as its Rust twin, registered by name with `Sim::register_block_kernel`:
//! one call per block of the launch, touching the pixels that block's
//! threads touch, so a launch whose grid misses part of the image leaves
//! that part untouched, as a GPU would, and the check below fails. On a GPU
//! the same driver calls run the compiled kernel: take the backend from
//! `Backend::real()` and the fds from a real exporter (for example
//! `tegra-interop-platform`'s Vulkan exporter) instead of `Sim` and
//! `export`. This example itself runs only on the simulator; `cargo test
//! -p tegra-interop-sim` runs it (`tests/examples.rs`).

use std::time::Duration;

use tegra_interop_core::{SignalParams, WaitParams};
use tegra_interop_driver::{Context, ExternalMemory, ExternalSemaphore, Module, Nvrtc, Stream};
use tegra_interop_sim::kernels::{Block, KernelFault, KernelSpec};
use tegra_interop_sim::{export, Sim};

/// The user's kernel: adds `add` to the red, green and blue bytes of each
/// pixel (saturating), one thread per pixel, a 2-D grid over the image.
const SOURCE: &str = r#"
extern "C" __global__ void brighten(unsigned char *img, unsigned int width,
                                    unsigned int height, unsigned long long pitch,
                                    unsigned int add) {
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < width && y < height) {
        unsigned char *p = img + y * pitch + 4ull * x;
        for (int c = 0; c < 3; c++) {
            unsigned int v = p[c] + add;
            p[c] = v > 255 ? 255 : (unsigned char)v;
        }
    }
}
"#;

const WIDTH: u32 = 640;
const HEIGHT: u32 = 360;
const PITCH: u64 = WIDTH as u64 * 4;
const ADD: u32 = 40;
const BLOCK: (u32, u32) = (32, 8);
const FRAMES: u64 = 3;
const WAIT: Duration = Duration::from_secs(10);

/// The Rust twin of `brighten`: one block of the launch. The block's
/// threads cover columns `blockIdx.x * blockDim.x ..` and rows
/// `blockIdx.y * blockDim.y ..` (as many as `blockDim`), cut at the
/// image's size by the kernel's `if`; each row's span is read, changed
/// and written back in one piece.
fn brighten(b: &Block<'_>) -> Result<(), KernelFault> {
    let (img, width, height) = (b.arg_u64(0)?, b.arg_u32(1)?, b.arg_u32(2)?);
    let (pitch, add) = (b.arg_u64(3)?, b.arg_u32(4)?);
    let (idx, dim) = (b.block_idx(), b.block_dim());
    if dim.z != 1 {
        // Threads differing only in z would race on the same pixel.
        return Err(KernelFault::new("brighten is written for 2-D blocks"));
    }
    let x0 = u64::from(idx.x) * u64::from(dim.x);
    let x1 = (x0 + u64::from(dim.x)).min(u64::from(width));
    let y0 = u64::from(idx.y) * u64::from(dim.y);
    let y1 = (y0 + u64::from(dim.y)).min(u64::from(height));
    if x0 >= x1 {
        return Ok(());
    }
    let mut row = vec![0u8; ((x1 - x0) * 4) as usize];
    for y in y0..y1 {
        let at = img + y * pitch + 4 * x0;
        b.read(at, &mut row)?;
        for px in row.chunks_exact_mut(4) {
            for c in &mut px[..3] {
                *c = (u32::from(*c) + add).min(255) as u8;
            }
        }
        b.write(at, &row)?;
    }
    Ok(())
}

/// Frame `f`'s pixels as the producer writes them.
fn frame_pixels(f: u64) -> Vec<u8> {
    (0..PITCH * u64::from(HEIGHT))
        .map(|i| (i.wrapping_mul(31) ^ f.wrapping_mul(97)) as u8)
        .collect()
}

/// What `brighten` makes of `before`.
fn expected(before: &[u8]) -> Vec<u8> {
    let mut out = before.to_vec();
    for px in out.chunks_exact_mut(4) {
        for c in &mut px[..3] {
            *c = (u32::from(*c) + ADD).min(255) as u8;
        }
    }
    out
}

/// Runs the frames with `grid`; `Ok(n)` with the number of frames whose
/// read-back was not what the kernel should make.
pub fn run(grid: (u32, u32)) -> Result<u64, Box<dyn std::error::Error>> {
    let sim = Sim::new()?;
    sim.register_block_kernel(KernelSpec::new("brighten", &[8, 4, 4, 8, 4]), brighten);
    let backend = sim.backend(); // on a GPU: Backend::real()?
    let size = PITCH * u64::from(HEIGHT);

    // The producer's side: the image and the timeline semaphore.
    let (mem_fd, image) = export::memory(size as usize)?;
    let (sem_fd, timeline) = export::timeline_semaphore(0)?;

    // CUDA's side: import both, compile and load the kernel.
    let ctx = Context::new(backend.clone(), 0)?;
    let stream = Stream::new(&ctx)?;
    let memory = ExternalMemory::opaque_fd(&ctx, mem_fd, size)?;
    let pixels = memory.map_whole()?;
    let mut semaphore = ExternalSemaphore::timeline_fd(&ctx, sem_fd)?;
    let ptx = Nvrtc::new(&backend)?.compile(SOURCE, "brighten.cu", &[])?;
    let module = Module::load(&ctx, &ptx)?;
    let kernel = module.function("brighten")?;

    let mut wrong = 0;
    for f in 0..FRAMES {
        let (written, processed) = (2 * f + 1, 2 * f + 2);
        // Queued first: the stream waits for the producer's signal.
        stream.wait(&semaphore, WaitParams::timeline(written))?;
        // SAFETY: the arguments are the kernel's (pointer, u32, u32, u64,
        // u32); it touches only the `size` bytes of `pixels`, which stay
        // mapped until the stream is synchronised below, and the producer
        // keeps off them between its signal and the wait for `processed`.
        unsafe {
            kernel
                .launch(grid, BLOCK)
                .arg(&pixels)
                .arg(WIDTH)
                .arg(HEIGHT)
                .arg(PITCH)
                .arg(ADD)
                .launch(&stream)?;
        }
        stream.signal(&mut semaphore, SignalParams::timeline(processed))?;

        // The producer writes the frame and hands it over.
        let before = frame_pixels(f);
        image.write(0, &before)?;
        timeline.signal(written)?;
        if !timeline.wait(processed, WAIT) {
            return Err(
                format!("frame {f}: CUDA did not signal {processed} within {WAIT:?}").into(),
            );
        }
        let mut after = vec![0u8; before.len()];
        image.read(0, &mut after)?;
        if after != expected(&before) {
            wrong += 1;
        }
    }
    stream.synchronize()?;
    drop((
        kernel, module, pixels, semaphore, memory, stream, ctx, backend,
    ));
    if !sim.ledger().is_clean() || !sim.diagnostics().is_empty() {
        return Err(format!(
            "left behind: {}; diagnostics: {:?}",
            sim.ledger(),
            sim.diagnostics()
        )
        .into());
    }
    Ok(wrong)
}

/// The grid that covers the image with [`BLOCK`]-sized blocks.
pub fn covering_grid() -> (u32, u32) {
    (WIDTH.div_ceil(BLOCK.0), HEIGHT.div_ceil(BLOCK.1))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let grid = covering_grid();
    let wrong = run(grid)?;
    println!(
        "{FRAMES} frames of {WIDTH}x{HEIGHT} RGBA, grid {grid:?} of {BLOCK:?}: {} right",
        FRAMES - wrong
    );
    if wrong != 0 {
        return Err(format!("{wrong} frame(s) read back wrong").into());
    }
    Ok(())
}
