//! Your own CUDA kernel on every frame of the ring, loaded as PTX through
//! the driver's module API (`Ptx`, `Module`, `Function::launch`).
//!
//! The kernel `brighten` adds a value to the R, G and B bytes of every
//! RGBA8 pixel (saturating) and leaves A alone; one thread per pixel on a
//! 16x16-thread block grid. The program writes a known picture into each
//! slot, the ring's consumer runs the kernel on the frame (between the
//! slot's *ready* wait and its *free* signal, on the ring's stream), and
//! the program reads every processed frame back when its slot comes round
//! and checks it against the same arithmetic on the host.
//!
//! Where the PTX comes from: `--ptx FILE` loads a PTX file (made with
//! `nvcc --ptx`, say); without it the embedded CUDA C source is compiled
//! with NVRTC, which gives the same `Ptx` value.
//!
//! Backends, chosen at run time: with `--features vulkan` and a discrete
//! GPU that the GPU transport accepts, the real driver (Vulkan frames
//! imported into CUDA); otherwise the bundled simulator, where the kernel
//! runs as its Rust twin, registered by name below (`--sim` forces it). The
//! twin runs once per block of the launch (`Sim::register_block_kernel`)
//! and touches the pixels that block's threads touch, so a grid that misses
//! part of the frame leaves that part untouched, as on a GPU, and the
//! check fails (the tests show it).
//! `--copy` runs the kernel on a device-local copy of each frame instead of
//! the frame itself (both placements are tested on the simulator).
//!
//! ```text
//! cargo run -p tegra-interop-pipeline --example user_ptx                     # simulator
//! cargo run -p tegra-interop-pipeline --example user_ptx -- --copy
//! cargo run --release -p tegra-interop-pipeline --features vulkan --example user_ptx   # GPU
//! ```

use std::process::ExitCode;

use tegra_interop::driver::{Context, Function, Module, Nvrtc, Ptx, Stream};
use tegra_interop_pipeline::consumer::work::{
    DeviceFrame, FrameWork, Placement, WorkError, WorkResultExt,
};
use tegra_interop_pipeline::consumer::CopyWith;
use tegra_interop_pipeline::frame::{FrameLayout, PixelFormat};
use tegra_interop_pipeline::ring::{Finished, Ring};
use tegra_interop_pipeline::transport::nvsci::NvSciTransport;
use tegra_interop_pipeline::transport::{FrameGeometry, FrameTransport};
use tegra_interop_sim::kernels::{Block, KernelFault, KernelSpec};
use tegra_interop_sim::{Sim, SimConfig};

const WIDTH: u32 = 320;
const HEIGHT: u32 = 240;
const SLOTS: usize = 3;
const FRAMES: u64 = 12;
const ADD: u32 = 40;

/// The kernel, in CUDA C.
const SOURCE: &str = r#"
extern "C" __global__ void brighten(unsigned char *frame, unsigned int width,
                                    unsigned int height, unsigned long long pitch,
                                    unsigned int add) {
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= width || y >= height) return;
    unsigned char *p = frame + y * pitch + 4ull * x;
    for (int c = 0; c < 3; c++) {
        unsigned int v = p[c] + add;
        p[c] = v > 255u ? 255u : v;
    }
}
"#;

/// `(unsigned char *, unsigned int, unsigned int, unsigned long long, unsigned int)`.
const PARAMS: &[usize] = &[8, 4, 4, 8, 4];
const BLOCK: (u32, u32) = (16, 16);

/// What the host expects of one channel byte after the kernel.
fn brightened(byte: u8, channel: usize) -> u8 {
    match channel {
        3 => byte,
        _ => (u32::from(byte) + ADD).min(255) as u8,
    }
}

/// The Rust twin of `brighten` for the simulator, run once per block of
/// the launch (`Sim::register_block_kernel`). The block's threads are
/// `x = blockIdx.x * blockDim.x + threadIdx.x` and
/// `y = blockIdx.y * blockDim.y + threadIdx.y`, cut at the frame by the
/// kernel's `if`; the block reads, brightens and writes back its span of
/// each of its lines in one piece. So a grid too small for the frame leaves
/// the pixels no thread reaches untouched, as on a GPU.
fn brighten_twin(b: &Block<'_>) -> Result<(), KernelFault> {
    let (frame, width, height) = (b.arg_u64(0)?, b.arg_u32(1)?, b.arg_u32(2)?);
    let (pitch, add) = (b.arg_u64(3)?, b.arg_u32(4)?);
    let (idx, dim) = (b.block_idx(), b.block_dim());
    if dim.z != 1 {
        // Threads differing only in threadIdx.z would race on one pixel.
        return Err(KernelFault::new("brighten: written for 2-D blocks"));
    }
    let xs = thread_span(idx.x, dim.x, width)?;
    let ys = thread_span(idx.y, dim.y, height)?;
    let mut line = vec![0u8; 4 * (xs.end - xs.start) as usize];
    if line.is_empty() {
        return Ok(());
    }
    for y in ys {
        let at = frame + y * pitch + 4 * xs.start;
        b.read(at, &mut line)?;
        for px in line.chunks_exact_mut(4) {
            for c in &mut px[..3] {
                *c = (u32::from(*c) + add).min(255) as u8;
            }
        }
        b.write(at, &line)?;
    }
    Ok(())
}

/// The values `block * dim + thread` (`thread < dim`) of one axis that pass
/// the kernel's `< limit`. The kernel computes them in 32 bits; a grid
/// where they would wrap is a fault here rather than a guess.
fn thread_span(block: u32, dim: u32, limit: u32) -> Result<std::ops::Range<u64>, KernelFault> {
    let first = u64::from(block) * u64::from(dim);
    let end = first + u64::from(dim);
    if end > 1 << 32 {
        return Err(KernelFault::new(format!(
            "brighten: block {block} of {dim} threads: the 32-bit index wraps"
        )));
    }
    let limit = u64::from(limit);
    Ok(first.min(limit)..end.min(limit))
}

/// The user's work: the `brighten` kernel from a PTX module.
struct Brighten {
    /// A PTX file to load instead of compiling [`SOURCE`].
    ptx_file: Option<String>,
    /// Launch one block row fewer than the frame needs (to show that the
    /// check catches a grid that does not cover the frame).
    short_grid: bool,
    kernel: Option<Function>,
}

impl FrameWork for Brighten {
    fn name(&self) -> &str {
        "brighten"
    }

    fn pixel_format(&self) -> PixelFormat {
        PixelFormat::Rgba8
    }

    fn prepare(
        &mut self,
        ctx: &Context,
        _layout: FrameLayout,
        _slots: usize,
        _placement: Placement,
    ) -> Result<(), WorkError> {
        let ptx = match &self.ptx_file {
            Some(path) => {
                let text = std::fs::read(path)
                    .map_err(|e| WorkError::refused(format!("reading {path}: {e}")))?;
                Ptx::from_text(text).during("reading the PTX file")?
            }
            None => Nvrtc::new(ctx.backend())
                .during("loading NVRTC")?
                .compile(SOURCE, "brighten.cu", &[])
                .during("compiling brighten.cu")?,
        };
        let module = Module::load(ctx, &ptx).during("loading the PTX module")?;
        self.kernel = Some(module.function("brighten").during("finding `brighten`")?);
        Ok(())
    }

    fn queue(&mut self, frame: &DeviceFrame<'_>, stream: &Stream) -> Result<(), WorkError> {
        let kernel = self
            .kernel
            .as_ref()
            .ok_or_else(|| WorkError::failed("not prepared"))?;
        let rows = frame.height().div_ceil(BLOCK.1) - u32::from(self.short_grid);
        let grid = (frame.width().div_ceil(BLOCK.0), rows);
        let launch = kernel
            .launch(grid, BLOCK)
            .arg(frame.ptr())
            .arg(frame.width())
            .arg(frame.height())
            .arg(frame.pitch() as u64)
            .arg(ADD);
        // SAFETY: the arguments match `brighten`'s parameters; it writes
        // only the frame's `height` lines of `width` RGBA pixels within the
        // pitch, which the consumer keeps valid and to itself for work
        // queued on `stream` (the `DeviceFrame` contract), and the launch
        // goes on that stream.
        unsafe { launch.launch(stream) }.during("launching `brighten`")
    }
}

/// The picture the program writes as frame `frame`.
fn write_frame(frame: u64, bytes: &mut [u8]) {
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i as u64).wrapping_mul(7).wrapping_add(frame * 13) as u8;
    }
}

/// Checks that `bytes` are frame `frame` after `brighten`. A failure names
/// the first wrong byte and the lines with wrong bytes, and says how many
/// of those are still as the program wrote them (untouched by the kernel).
fn check_frame(frame: u64, bytes: &[u8]) -> Result<(), String> {
    let mut written = vec![0u8; bytes.len()];
    write_frame(frame, &mut written);
    let want: Vec<u8> = written
        .iter()
        .enumerate()
        .map(|(i, w)| brightened(*w, i % 4))
        .collect();
    let wrong: Vec<usize> = (0..bytes.len()).filter(|&i| bytes[i] != want[i]).collect();
    let (Some(&first), Some(&last)) = (wrong.first(), wrong.last()) else {
        return Ok(());
    };
    let line = |i: usize| i / (WIDTH as usize * 4);
    let untouched = wrong.iter().filter(|&&i| bytes[i] == written[i]).count();
    let untouched = match untouched == wrong.len() {
        true => "all untouched".to_string(),
        false => format!("{untouched} untouched"),
    };
    Err(format!(
        "frame {frame}: byte {first} (line {}) is {}, the host computed {}; {} wrong byte(s) \
         in lines {}..={}, {untouched}",
        line(first),
        bytes[first],
        want[first],
        wrong.len(),
        line(first),
        line(last),
    ))
}

/// How to run.
#[derive(Clone, Debug, Default)]
struct Options {
    sim: bool,
    copy: bool,
    ptx_file: Option<String>,
    short_grid: bool,
}

/// A ring's transport and, on the simulator, the simulator (dropped after
/// the transport).
struct Opened {
    transport: Box<dyn FrameTransport>,
    _sim: Option<Sim>,
    backend: String,
}

/// Opens the ring with `work`: the GPU transport where it runs (feature
/// `vulkan`), else an NvSci ring on the simulator with the twin registered.
fn open(opts: &Options, work: Box<dyn FrameWork>) -> Result<Opened, String> {
    let geometry = FrameGeometry {
        stride: WIDTH as usize * 4,
        rows: HEIGHT as usize,
    };
    #[cfg(feature = "vulkan")]
    if !opts.sim {
        use tegra_interop_pipeline::transport::gpu::{self, GpuOptions, GpuTransport, Mode};
        if let Ok(why) = gpu::probe() {
            let mode = Mode::from_copy_flag(opts.copy);
            let t = GpuTransport::open_with_work(geometry, SLOTS, GpuOptions::new(mode), work)?;
            return Ok(Opened {
                transport: Box::new(t),
                _sim: None,
                backend: format!("GPU ({why})"),
            });
        }
    }
    let sim = Sim::with_config(SimConfig::tegra()).map_err(|e| e.to_string())?;
    sim.register_block_kernel(KernelSpec::new("brighten", PARAMS), brighten_twin);
    let ctx = Context::new(sim.backend(), 0).map_err(|e| e.to_string())?;
    let placement = match opts.copy {
        true => Placement::DeviceCopy(CopyWith::Engines),
        false => Placement::InPlace,
    };
    let t = NvSciTransport::with_work(&ctx, "user_ptx", work, placement, geometry, SLOTS)?;
    Ok(Opened {
        transport: Box::new(t),
        _sim: Some(sim),
        backend: "simulator".into(),
    })
}

/// Runs [`FRAMES`] checked frames; returns how many were verified and the
/// backend's name.
fn run(opts: &Options) -> Result<(u64, String), String> {
    let work = Brighten {
        ptx_file: opts.ptx_file.clone(),
        short_grid: opts.short_grid,
        kernel: None,
    };
    let Opened {
        transport,
        _sim,
        backend,
    } = open(opts, Box::new(work))?;
    let mut ring = Ring::from_box(transport).map_err(|e| e.to_string())?;
    let mut verified = 0;
    // Each finished frame is read back through a read lease (dropping it
    // gives the slot back) and checked.
    let mut check = |ring: &mut Ring, done: Finished| -> Result<(), String> {
        if done.completion.mismatches != 0 {
            return Err(format!(
                "frame {}: {} problem(s)",
                done.frame(),
                done.completion.mismatches
            ));
        }
        if let Some(read) = ring.read(&done).map_err(|e| e.to_string())? {
            check_frame(done.frame(), read.bytes())?;
            verified += 1;
        }
        Ok(())
    };
    for _ in 0..FRAMES {
        // What finished is read before its slot is written again.
        ring.make_room().map_err(|e| e.to_string())?;
        while let Some(done) = ring.collect().map_err(|e| e.to_string())? {
            check(&mut ring, done)?;
        }
        let mut lease = ring.acquire().map_err(|e| e.to_string())?;
        let frame = lease.frame();
        write_frame(frame, lease.bytes_mut().map_err(|e| e.to_string())?);
        ring.hand_over(lease).map_err(|e| e.to_string())?;
    }
    while ring.pending() > 0 {
        let done = ring.wait_collect().map_err(|e| e.to_string())?;
        check(&mut ring, done)?;
    }
    ring.close().map_err(|e| e.to_string())?;
    Ok((verified, backend))
}

fn options(args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut opts = Options::default();
    let mut args = args.peekable();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--sim" => opts.sim = true,
            "--copy" => opts.copy = true,
            "--ptx" => opts.ptx_file = Some(args.next().ok_or("--ptx needs a file")?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(opts)
}

fn main() -> ExitCode {
    let result = options(std::env::args().skip(1)).and_then(|o| run(&o));
    match result {
        Ok((n, backend)) if n == FRAMES => {
            println!("user_ptx: {n} of {FRAMES} frames brightened and verified on the {backend}");
            ExitCode::SUCCESS
        }
        Ok((n, backend)) => {
            eprintln!("user_ptx: only {n} of {FRAMES} frames verified on the {backend}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("user_ptx: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_frame_is_brightened_in_both_placements_on_the_simulator() {
        for copy in [false, true] {
            let opts = Options {
                sim: true,
                copy,
                ..Options::default()
            };
            assert_eq!(run(&opts).map(|r| r.0), Ok(FRAMES), "copy: {copy}");
        }
    }

    #[test]
    fn a_grid_that_misses_the_last_lines_is_caught() {
        let opts = Options {
            sim: true,
            short_grid: true,
            ..Options::default()
        };
        let e = run(&opts).unwrap_err();
        assert!(e.starts_with("frame 0: byte "), "{e}");
        // 240 lines in blocks of 16: 14 block rows reach lines 0..224; the
        // last 16 lines' R, G and B bytes are wrong because no thread
        // touched them (every wrong byte is as the program wrote it).
        assert!(e.contains("(line 224)"), "{e}");
        let mut written = vec![0u8; WIDTH as usize * 4 * HEIGHT as usize];
        write_frame(0, &mut written);
        let missed = written[224 * WIDTH as usize * 4..]
            .iter()
            .enumerate()
            .filter(|&(i, w)| i % 4 != 3 && *w != 255) // 255 stays 255
            .count();
        let tail = format!("{missed} wrong byte(s) in lines 224..=239, all untouched");
        assert!(e.ends_with(&tail), "{e}");
    }

    #[test]
    fn a_ptx_file_is_loaded_through_the_module_api() {
        // The simulator's NVRTC output stands in for a file made by `nvcc
        // --ptx` (the simulator loads what its NVRTC made, or PTX text whose
        // entries have twins).
        let sim = Sim::new().unwrap();
        sim.register_block_kernel(KernelSpec::new("brighten", PARAMS), brighten_twin);
        let ptx = Nvrtc::new(&sim.backend())
            .unwrap()
            .compile(SOURCE, "brighten.cu", &[])
            .unwrap();
        let path = std::env::temp_dir().join(format!("user_ptx_{}.ptx", std::process::id()));
        std::fs::write(&path, ptx.text().as_bytes()).unwrap();
        let opts = Options {
            sim: true,
            ptx_file: Some(path.display().to_string()),
            ..Options::default()
        };
        let verified = run(&opts);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(verified.map(|r| r.0), Ok(FRAMES));
        let missing = Options {
            sim: true,
            ptx_file: Some("/nonexistent/brighten.ptx".into()),
            ..Options::default()
        };
        let e = run(&missing).unwrap_err();
        assert!(e.contains("reading /nonexistent/brighten.ptx"), "{e}");
    }
}
