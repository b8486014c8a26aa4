//! A two-stage chain of your own kernels on every frame of the ring, with a
//! result read back on the host: RGBA8 -> grey (stage 1, one thread per
//! pixel, into a device buffer of the slot), then a 256-bin histogram and
//! the sum of the grey values (stage 2, atomics into page-locked host
//! memory of the slot). Both stages are queued on the ring's stream, so
//! they run in order between the slot's *ready* wait and its *free*
//! signal; [`FrameWork::finished`] reads the slot's result once the frame's
//! work completed, and the program checks every frame's histogram and sum
//! against the same computation on the host.
//!
//! Backends, chosen at run time: with `--features vulkan` and a discrete
//! GPU the GPU transport accepts, the real driver; otherwise the bundled
//! simulator, where both kernels run as their Rust twins, registered by
//! name below (`--sim` forces it). `--copy` runs the chain on a device-local
//! copy of each frame.
//!
//! ```text
//! cargo run -p tegra-interop-pipeline --example user_chain            # simulator
//! cargo run --release -p tegra-interop-pipeline --features vulkan --example user_chain   # GPU
//! ```

use std::process::ExitCode;
use std::sync::mpsc::{self, Receiver, Sender};

use tegra_interop::driver::{
    Context, DeviceBuffer, DevicePtr, Function, Module, Nvrtc, PinnedHostBuffer, Stream,
};
use tegra_interop_pipeline::consumer::work::{
    DeviceFrame, FrameWork, Placement, WorkError, WorkResultExt,
};
use tegra_interop_pipeline::consumer::CopyWith;
use tegra_interop_pipeline::frame::{FrameLayout, PixelFormat};
use tegra_interop_pipeline::ring::Ring;
use tegra_interop_pipeline::transport::host::Fault;
use tegra_interop_pipeline::transport::nvsci::NvSciTransport;
use tegra_interop_pipeline::transport::{FrameGeometry, FrameTransport};
use tegra_interop_sim::kernels::{KernelFault, KernelLaunch, KernelSpec};
use tegra_interop_sim::{Sim, SimConfig};

const WIDTH: u32 = 256;
const HEIGHT: u32 = 120;
const SLOTS: usize = 3;
const FRAMES: u64 = 10;

/// Both stages, in CUDA C.
const SOURCE: &str = r#"
extern "C" __global__ void rgba_to_grey(const unsigned char *rgba, unsigned int width,
                                        unsigned int height, unsigned long long pitch,
                                        unsigned char *grey) {
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= width || y >= height) return;
    const unsigned char *p = rgba + y * pitch + 4ull * x;
    grey[(unsigned long long)y * width + x] =
        (unsigned char)((77u * p[0] + 150u * p[1] + 29u * p[2] + 128u) >> 8);
}

extern "C" __global__ void grey_histogram(const unsigned char *grey, unsigned long long n,
                                          unsigned int *hist, unsigned long long *sum) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned int g = grey[i];
    atomicAdd(&hist[g], 1u);
    atomicAdd(sum, (unsigned long long)g);
}
"#;

const GREY_PARAMS: &[usize] = &[8, 4, 4, 8, 8];
const HIST_PARAMS: &[usize] = &[8, 8, 8, 8];
/// Bytes of one slot's result: 256 `u32` bins, then the `u64` sum.
const RESULT_LEN: usize = 256 * 4 + 8;

/// The grey value of an RGBA pixel (both sides use this formula).
fn grey_of(p: &[u8]) -> u8 {
    ((77 * u32::from(p[0]) + 150 * u32::from(p[1]) + 29 * u32::from(p[2]) + 128) >> 8) as u8
}

/// The twin of `rgba_to_grey`: the pixels the launched grid covers.
fn grey_twin(k: &mut KernelLaunch<'_>) -> Result<(), KernelFault> {
    let (rgba, width, height) = (k.arg_u64(0)?, k.arg_u32(1)?, k.arg_u32(2)?);
    let (pitch, grey) = (k.arg_u64(3)?, k.arg_u64(4)?);
    let (grid, block) = (k.grid(), k.block());
    let cover_x = u64::from(grid[0]) * u64::from(block[0]);
    let cover_y = u64::from(grid[1]) * u64::from(block[1]);
    let (w, h) = (u64::from(width), u64::from(height));
    let mut line = vec![0u8; 4 * width as usize];
    for y in 0..h.min(cover_y) {
        k.read(rgba + y * pitch, &mut line)?;
        for x in 0..w.min(cover_x) {
            let at = 4 * x as usize;
            k.write(grey + y * w + x, &[grey_of(&line[at..at + 4])])?;
        }
    }
    Ok(())
}

/// The twin of `grey_histogram`: the values the launched threads cover.
fn histogram_twin(k: &mut KernelLaunch<'_>) -> Result<(), KernelFault> {
    let (grey, n, hist, sum) = (k.arg_u64(0)?, k.arg_u64(1)?, k.arg_u64(2)?, k.arg_u64(3)?);
    let n = usize::try_from(n.min(k.threads()))
        .map_err(|_| KernelFault::new("grey_histogram: n too large"))?;
    let mut values = vec![0u8; n];
    k.read(grey, &mut values)?;
    let mut bins = vec![0u8; 256 * 4];
    k.read(hist, &mut bins)?;
    let mut total = k.read_u64(sum)?;
    for g in values {
        let at = 4 * usize::from(g);
        let bin = u32::from_ne_bytes([bins[at], bins[at + 1], bins[at + 2], bins[at + 3]]);
        bins[at..at + 4].copy_from_slice(&(bin + 1).to_ne_bytes());
        total += u64::from(g);
    }
    k.write(hist, &bins)?;
    k.write_u64(sum, total)
}

/// One frame's result, as read back.
#[derive(Debug, PartialEq, Eq)]
struct Stats {
    frame: u64,
    histogram: Vec<u32>,
    sum: u64,
}

/// What [`Chain::prepare`] made.
struct Prepared {
    grey: Function,
    histogram: Function,
    /// Per slot: the grey picture (device memory).
    greys: Vec<DeviceBuffer>,
    /// Per slot: the histogram and sum (page-locked host memory the
    /// kernels write through its device address).
    results: Vec<PinnedHostBuffer>,
}

/// The user's chain: grey, then histogram; results sent to the program.
struct Chain {
    results: Sender<Stats>,
    /// Launch one histogram block fewer than the picture needs (to show
    /// that the host check catches it).
    short_grid: bool,
    prepared: Option<Prepared>,
}

impl FrameWork for Chain {
    fn name(&self) -> &str {
        "grey+histogram"
    }

    fn pixel_format(&self) -> PixelFormat {
        PixelFormat::Rgba8
    }

    fn prepare(
        &mut self,
        ctx: &Context,
        layout: FrameLayout,
        slots: usize,
        _placement: Placement,
    ) -> Result<(), WorkError> {
        let ptx = Nvrtc::new(ctx.backend())
            .during("loading NVRTC")?
            .compile(SOURCE, "chain.cu", &[])
            .during("compiling chain.cu")?;
        let module = Module::load(ctx, &ptx).during("loading the chain's module")?;
        let pixels = layout.width() as usize * layout.height() as usize;
        let mut greys = Vec::with_capacity(slots);
        let mut results = Vec::with_capacity(slots);
        for _ in 0..slots {
            greys.push(DeviceBuffer::new(ctx, pixels).during("allocating a grey picture")?);
            results.push(PinnedHostBuffer::new(ctx, RESULT_LEN).during("allocating a result")?);
        }
        self.prepared = Some(Prepared {
            grey: module
                .function("rgba_to_grey")
                .during("finding rgba_to_grey")?,
            histogram: module
                .function("grey_histogram")
                .during("finding grey_histogram")?,
            greys,
            results,
        });
        Ok(())
    }

    fn queue(&mut self, frame: &DeviceFrame<'_>, stream: &Stream) -> Result<(), WorkError> {
        let p = self
            .prepared
            .as_ref()
            .ok_or_else(|| WorkError::failed("not prepared"))?;
        let (grey, result) = (&p.greys[frame.slot()], &p.results[frame.slot()]);
        let (w, h) = (frame.width(), frame.height());
        let stage1 = p
            .grey
            .launch((w.div_ceil(16), h.div_ceil(16)), (16u32, 16u32))
            .arg(frame.ptr())
            .arg(w)
            .arg(h)
            .arg(frame.pitch() as u64)
            .arg(grey);
        // SAFETY: the arguments match `rgba_to_grey`; it reads the frame's
        // `h` lines of `w` pixels (valid for work on `stream`: the
        // `DeviceFrame` contract) and writes `w * h` bytes of the slot's
        // grey buffer, which this work owns and which outlives the queued
        // work (the consumer drops the work after its streams drained).
        unsafe { stage1.launch(stream) }.during("launching rgba_to_grey")?;
        let n = u64::from(w) * u64::from(h);
        let blocks = u32::try_from(n.div_ceil(256)).map_err(WorkError::failed)?;
        let sum = DevicePtr::at(result, 256 * 4, 8).during("addressing the sum")?;
        let stage2 = p
            .histogram
            .launch(blocks - u32::from(self.short_grid), 256u32)
            .arg(grey)
            .arg(n)
            .arg(DevicePtr::of(result))
            .arg(sum);
        // SAFETY: the arguments match `grey_histogram`; it reads the grey
        // buffer stage 1 wrote (same stream, so after it) and adds into the
        // slot's result, which the host touches only in `finished`, after
        // the frame's work completed; both outlive the work (as above).
        unsafe { stage2.launch(stream) }.during("launching grey_histogram")
    }

    fn finished(&mut self, slot: usize, frame: u64) -> Result<u64, WorkError> {
        let p = self
            .prepared
            .as_mut()
            .ok_or_else(|| WorkError::failed("not prepared"))?;
        let result = &mut p.results[slot];
        let bytes = result.as_slice();
        let word =
            |i: usize| u32::from_ne_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let histogram = (0..256).map(|b| word(4 * b)).collect();
        let mut sum = [0u8; 8];
        sum.copy_from_slice(&bytes[1024..1032]);
        let stats = Stats {
            frame,
            histogram,
            sum: u64::from_ne_bytes(sum),
        };
        // The slot's next frame adds from zero.
        result.as_mut_slice().fill(0);
        self.results
            .send(stats)
            .map_err(|_| WorkError::failed("the program stopped listening"))?;
        Ok(0)
    }
}

/// The picture the program writes as frame `frame`.
fn write_frame(frame: u64, bytes: &mut [u8]) {
    let pitch = WIDTH as usize * 4;
    for (y, line) in bytes.chunks_mut(pitch).enumerate() {
        for (x, px) in line.chunks_mut(4).enumerate() {
            let f = frame as usize;
            px.copy_from_slice(&[
                (x + 3 * f) as u8,
                (y * 2 + f) as u8,
                ((x ^ y) + 5 * f) as u8,
                255,
            ]);
        }
    }
}

/// The host's histogram and sum of frame `frame`.
fn host_stats(frame: u64) -> Stats {
    let mut bytes = vec![0u8; WIDTH as usize * 4 * HEIGHT as usize];
    write_frame(frame, &mut bytes);
    let mut histogram = vec![0u32; 256];
    let mut sum = 0u64;
    for px in bytes.chunks(4) {
        let g = grey_of(px);
        histogram[usize::from(g)] += 1;
        sum += u64::from(g);
    }
    Stats {
        frame,
        histogram,
        sum,
    }
}

/// How to run.
#[derive(Clone, Copy, Debug, Default)]
struct Options {
    sim: bool,
    copy: bool,
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
/// `vulkan`), else an NvSci ring on the simulator with the twins
/// registered.
fn open(opts: Options, work: Box<dyn FrameWork>) -> Result<Opened, String> {
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
    sim.register_kernel(KernelSpec::new("rgba_to_grey", GREY_PARAMS), grey_twin);
    sim.register_kernel(
        KernelSpec::new("grey_histogram", HIST_PARAMS),
        histogram_twin,
    );
    let ctx = Context::new(sim.backend(), 0).map_err(|e| e.to_string())?;
    let placement = match opts.copy {
        true => Placement::DeviceCopy(CopyWith::Engines),
        false => Placement::InPlace,
    };
    let t = NvSciTransport::with_work(
        &ctx,
        "user_chain",
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

/// Runs [`FRAMES`] frames and checks every frame's result; returns how
/// many were verified and the backend's name.
fn run(opts: Options) -> Result<(u64, String), String> {
    let (tx, rx): (Sender<Stats>, Receiver<Stats>) = mpsc::channel();
    let chain = Chain {
        results: tx,
        short_grid: opts.short_grid,
        prepared: None,
    };
    let Opened {
        transport,
        _sim,
        backend,
    } = open(opts, Box::new(chain))?;
    let mut ring = Ring::from_box(transport).map_err(|e| e.to_string())?;
    let mut verified = 0;
    let mut check = |rx: &Receiver<Stats>| -> Result<(), String> {
        while let Ok(got) = rx.try_recv() {
            let want = host_stats(got.frame);
            if got != want {
                return Err(format!(
                    "frame {}: the device's sum {} (histogram {} pixels), the host's {} ({} pixels)",
                    got.frame,
                    got.sum,
                    got.histogram.iter().map(|&b| u64::from(b)).sum::<u64>(),
                    want.sum,
                    want.histogram.iter().map(|&b| u64::from(b)).sum::<u64>(),
                ));
            }
            verified += 1;
        }
        Ok(())
    };
    for _ in 0..FRAMES {
        let mut lease = ring.acquire().map_err(|e| e.to_string())?;
        let frame = lease.frame();
        write_frame(frame, lease.bytes_mut().map_err(|e| e.to_string())?);
        ring.hand_over(lease).map_err(|e| e.to_string())?;
        while ring.collect().map_err(|e| e.to_string())?.is_some() {}
        check(&rx)?;
    }
    while ring.pending() > 0 {
        ring.wait_collect().map_err(|e| e.to_string())?;
    }
    check(&rx)?;
    ring.close().map_err(|e| e.to_string())?;
    Ok((verified, backend))
}

fn options(args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut opts = Options::default();
    for a in args {
        match a.as_str() {
            "--sim" => opts.sim = true,
            "--copy" => opts.copy = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(opts)
}

fn main() -> ExitCode {
    match options(std::env::args().skip(1)).and_then(run) {
        Ok((n, backend)) if n == FRAMES => {
            println!(
                "user_chain: {n} of {FRAMES} frames' histograms and sums verified on the {backend}"
            );
            ExitCode::SUCCESS
        }
        Ok((n, backend)) => {
            eprintln!("user_chain: only {n} of {FRAMES} frames verified on the {backend}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("user_chain: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_frames_histogram_matches_the_host_in_both_placements_on_the_simulator() {
        for copy in [false, true] {
            let opts = Options {
                sim: true,
                copy,
                short_grid: false,
            };
            assert_eq!(run(opts).map(|r| r.0), Ok(FRAMES), "copy: {copy}");
        }
    }

    #[test]
    fn a_histogram_grid_one_block_short_is_caught() {
        let opts = Options {
            sim: true,
            copy: false,
            short_grid: true,
        };
        let e = run(opts).unwrap_err();
        // 256 x 120 pixels: 120 blocks of 256 threads; one fewer misses 256.
        assert!(e.starts_with("frame 0: the device's sum "), "{e}");
        assert!(e.contains("(histogram 30464 pixels)"), "{e}");
        assert!(e.contains("(30720 pixels)"), "{e}");
    }
}
