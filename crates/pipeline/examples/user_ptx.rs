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
//! runs as its Rust twin, registered by name below (`--sim` forces it).
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
use tegra_interop_pipeline::transport::host::Fault;
use tegra_interop_pipeline::transport::nvsci::NvSciTransport;
use tegra_interop_pipeline::transport::{FrameGeometry, FrameTransport};
use tegra_interop_sim::kernels::{KernelFault, KernelLaunch, KernelSpec};
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

/// The Rust twin of `brighten` for the simulator: the same arithmetic over
/// the pixels the launched grid covers (a grid too small leaves the rest
/// untouched, as on a GPU).
fn brighten_twin(k: &mut KernelLaunch<'_>) -> Result<(), KernelFault> {
    let (frame, width, height) = (k.arg_u64(0)?, k.arg_u32(1)?, k.arg_u32(2)?);
    let (pitch, add) = (k.arg_u64(3)?, k.arg_u32(4)?);
    let (grid, block) = (k.grid(), k.block());
    let cover_x = u64::from(grid[0]) * u64::from(block[0]);
    let cover_y = u64::from(grid[1]) * u64::from(block[1]);
    let mut px = [0u8; 4];
    for y in 0..u64::from(height).min(cover_y) {
        for x in 0..u64::from(width).min(cover_x) {
            let at = frame + y * pitch + 4 * x;
            k.read(at, &mut px)?;
            for c in &mut px[..3] {
                *c = (u32::from(*c) + add).min(255) as u8;
            }
            k.write(at, &px)?;
        }
    }
    Ok(())
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

/// Checks that `bytes` are frame `frame` after `brighten`.
fn check_frame(frame: u64, bytes: &[u8]) -> Result<(), String> {
    let mut want = vec![0u8; bytes.len()];
    write_frame(frame, &mut want);
    for (i, w) in want.iter_mut().enumerate() {
        *w = brightened(*w, i % 4);
    }
    match bytes.iter().zip(&want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!(
            "frame {frame}: byte {i} (line {}) is {}, the host computed {}",
            i / (WIDTH as usize * 4),
            bytes[i],
            want[i]
        )),
    }
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
    sim.register_kernel(KernelSpec::new("brighten", PARAMS), brighten_twin);
    let ctx = Context::new(sim.backend(), 0).map_err(|e| e.to_string())?;
    let placement = match opts.copy {
        true => Placement::DeviceCopy(CopyWith::Engines),
        false => Placement::InPlace,
    };
    let t = NvSciTransport::with_work(
        &ctx,
        "user_ptx",
        work,
        placement,
        geometry,
        SLOTS,
        Fault::None,
    )?;
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
        assert!(e.contains("(line 224)"), "{e}");
    }

    #[test]
    fn a_ptx_file_is_loaded_through_the_module_api() {
        // The simulator's NVRTC output stands in for a file made by `nvcc
        // --ptx` (the simulator loads what its NVRTC made, or PTX text whose
        // entries have twins).
        let sim = Sim::new().unwrap();
        sim.register_kernel(KernelSpec::new("brighten", PARAMS), brighten_twin);
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
