//! A cudarc kernel on every frame of the ring, launched on the ring's own
//! CUDA stream through the driver's cudarc interop.
//!
//! With the `cudarc` feature the driver makes its contexts and streams
//! through cudarc (`Context::cudarc`, `Stream::cudarc`), so the consumer's
//! stream, the one the ring's fences are ordered on, is a
//! `cudarc::driver::CudaStream`. This work compiles its kernel with
//! cudarc's NVRTC, loads it into the consumer's cudarc context, and
//! launches it with cudarc's launch builder on that stream, passing the
//! frame's device address. The kernel inverts R, G and B of every RGBA8
//! pixel; the program reads each processed frame back when its slot comes
//! round and checks it.
//!
//! It runs only on a GPU (the GPU transport: feature `vulkan`, a discrete
//! NVIDIA GPU with Vulkan), because the simulator cannot stand behind
//! cudarc's own loader; without one it says why and fails. CI builds it.
//!
//! ```text
//! cargo run --release -p tegra-interop-pipeline --features vulkan,cudarc --example user_cudarc
//! cargo run --release -p tegra-interop-pipeline --features vulkan,cudarc --example user_cudarc -- --copy
//! ```

use std::process::ExitCode;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use tegra_interop::driver::{Context, Stream};
use tegra_interop_pipeline::consumer::work::{DeviceFrame, FrameWork, Placement, WorkError};
use tegra_interop_pipeline::frame::{FrameLayout, PixelFormat};
use tegra_interop_pipeline::ring::{Finished, Ring};
use tegra_interop_pipeline::transport::gpu::{self, GpuOptions, GpuTransport, Mode};
use tegra_interop_pipeline::transport::FrameGeometry;

const WIDTH: u32 = 1280;
const HEIGHT: u32 = 720;
const SLOTS: usize = 4;
const FRAMES: u64 = 60;

/// The kernel, compiled by cudarc's NVRTC.
const SOURCE: &str = r#"
extern "C" __global__ void invert_rgb(unsigned char *frame, unsigned int width,
                                      unsigned int height, unsigned long long pitch) {
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= width || y >= height) return;
    unsigned int *p = (unsigned int *)(frame + y * pitch + 4ull * x);
    *p ^= 0x00ffffffu;
}
"#;

/// The work: `invert_rgb`, loaded and launched by cudarc.
#[derive(Default)]
struct CudarcInvert {
    kernel: Option<CudaFunction>,
}

/// A cudarc error as a work error.
fn failed(what: &'static str) -> impl Fn(&dyn std::fmt::Debug) -> WorkError {
    move |e| WorkError::failed(format!("{what}: {e:?}"))
}

impl FrameWork for CudarcInvert {
    fn name(&self) -> &str {
        "cudarc invert_rgb"
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
        let cuda: &Arc<cudarc::driver::CudaContext> = ctx.cudarc().ok_or_else(|| {
            WorkError::refused(
                "the consumer's context is not cudarc's (build with feature `cudarc`, real driver)",
            )
        })?;
        let ptx = cudarc::nvrtc::compile_ptx(SOURCE).map_err(|e| failed("cudarc NVRTC")(&e))?;
        let module = cuda
            .load_module(ptx)
            .map_err(|e| failed("loading the module")(&e))?;
        let f = module
            .load_function("invert_rgb")
            .map_err(|e| failed("finding invert_rgb")(&e))?;
        self.kernel = Some(f);
        Ok(())
    }

    fn queue(&mut self, frame: &DeviceFrame<'_>, stream: &Stream) -> Result<(), WorkError> {
        let f = self
            .kernel
            .as_ref()
            .ok_or_else(|| WorkError::failed("not prepared"))?;
        let cuda_stream = stream
            .cudarc()
            .ok_or_else(|| WorkError::failed("the ring's stream is not a cudarc stream"))?;
        let (ptr, width, height) = (frame.ptr().addr(), frame.width(), frame.height());
        let pitch = frame.pitch() as u64;
        let cfg = LaunchConfig {
            grid_dim: (width.div_ceil(16), height.div_ceil(16), 1),
            block_dim: (16, 16, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = cuda_stream.launch_builder(f);
        launch.arg(&ptr).arg(&width).arg(&height).arg(&pitch);
        // SAFETY: the arguments match `invert_rgb`'s parameters (the
        // frame's address as the 8-byte pointer); it writes only the
        // frame's `height` lines of `width` pixels, valid and the
        // consumer's alone for work on this stream (the `DeviceFrame`
        // contract), and the launch goes on that stream.
        unsafe { launch.launch(cfg) }.map_err(|e| failed("launching invert_rgb")(&e))?;
        Ok(())
    }
}

fn write_frame(frame: u64, bytes: &mut [u8]) {
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i as u64 ^ frame.wrapping_mul(31)) as u8;
    }
}

fn check_frame(frame: u64, bytes: &[u8]) -> Result<(), String> {
    let mut want = vec![0u8; bytes.len()];
    write_frame(frame, &mut want);
    for (i, w) in want.iter_mut().enumerate() {
        if i % 4 != 3 {
            *w = !*w;
        }
    }
    match bytes.iter().zip(&want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!(
            "frame {frame}: byte {i} is {}, expected {}",
            bytes[i], want[i]
        )),
    }
}

fn run(copy: bool) -> Result<(u64, String), String> {
    let why = gpu::probe().map_err(|e| format!("needs a GPU, and there is none here: {e}"))?;
    let geometry = FrameGeometry {
        stride: WIDTH as usize * 4,
        rows: HEIGHT as usize,
    };
    let options = GpuOptions::new(Mode::from_copy_flag(copy));
    let work = Box::new(CudarcInvert::default());
    let t = GpuTransport::open_with_work(geometry, SLOTS, options, work)?;
    let mut ring = Ring::new(t).map_err(|e| e.to_string())?;
    let mut verified = 0;
    // Each finished frame is read back through a read lease (dropping it
    // gives the slot back) and checked.
    let mut check = |ring: &mut Ring, done: Finished| -> Result<(), String> {
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
    Ok((verified, why))
}

fn main() -> ExitCode {
    let copy = std::env::args().skip(1).any(|a| a == "--copy");
    match run(copy) {
        Ok((n, why)) if n == FRAMES => {
            println!("user_cudarc: {n} of {FRAMES} frames inverted by a cudarc kernel and verified ({why})");
            ExitCode::SUCCESS
        }
        Ok((n, _)) => {
            eprintln!("user_cudarc: only {n} of {FRAMES} frames verified");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("user_cudarc: {e}");
            ExitCode::FAILURE
        }
    }
}
