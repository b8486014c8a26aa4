//! The project's own [`FrameWork`]s: [`CheckInvert`] (the check-and-invert
//! kernel of [`KERNEL_SOURCE`](super::KERNEL_SOURCE), with its mismatch counters: what the
//! `pipeline` program and the tests verify with) and [`Invert`] (every byte
//! inverted, no pattern: for frames whose content the ring does not know,
//! read back and re-inverted by whoever does).
//!
//! Both launch through the driver's seam (`Nvrtc`, `Module`,
//! `Function::launch`), so they run on a GPU and on the simulator, where
//! the kernels are their Rust twins: `super::twin::register` for
//! `CheckInvert`, `Invert::register_twin` for `Invert`.

use tegra_interop::driver::{
    Context, DevicePtr, Function, Module, Nvrtc, PinnedHostBuffer, Stream,
};

use super::kernel::{self, grid_for, pattern_seed, Kernels, BLOCK};
use super::work::{DeviceFrame, FrameWork, Placement, WorkError, WorkResultExt};
use crate::error::TransportError;
use crate::frame::FrameLayout;

/// A [`TransportError`] from the kernel helpers as a [`WorkError`] (the
/// consumer maps it back, so the kind survives the round trip).
fn work_error(e: TransportError) -> WorkError {
    match e {
        TransportError::Driver { doing, source } => WorkError::Driver { doing, source },
        TransportError::Refused { reason } => WorkError::Refused(reason),
        other => WorkError::failed(other),
    }
}

/// What [`CheckInvert`] made in `prepare`.
#[derive(Debug)]
struct Prepared {
    kernels: Kernels,
    /// One `u64` mismatch counter per slot, device-mapped pinned memory.
    counters: PinnedHostBuffer,
    grid: u32,
    len: u64,
    stride: u64,
}

/// The project's check-and-invert work: per frame, the kernel of
/// [`KERNEL_SOURCE`](super::KERNEL_SOURCE) counts the bytes that differ
/// from the frame's test pattern (`camera::TestPattern` of the frame's
/// number, lines of the frame's pitch) into the slot's counter and inverts
/// every byte; [`FrameWork::finished`] returns the count. The variant for
/// memory the CPU maps (`_sysmem`) runs where the frame is
/// [`FrameMemory::System`](super::FrameMemory::System).
///
/// On the simulator register the kernels' twins first
/// (`super::twin::register`).
#[derive(Debug, Default)]
pub struct CheckInvert {
    prepared: Option<Prepared>,
}

impl CheckInvert {
    /// The work (nothing is made before [`FrameWork::prepare`]).
    pub fn new() -> CheckInvert {
        CheckInvert::default()
    }

    /// The work, boxed, as the consumer and the transports take it.
    pub fn boxed() -> Box<dyn FrameWork> {
        Box::new(CheckInvert::new())
    }

    fn prepared(&self) -> Result<&Prepared, WorkError> {
        self.prepared
            .as_ref()
            .ok_or_else(|| WorkError::failed("check-and-invert: queued before prepare"))
    }
}

impl FrameWork for CheckInvert {
    fn name(&self) -> &str {
        "check-and-invert"
    }

    fn prepare(
        &mut self,
        ctx: &Context,
        layout: FrameLayout,
        slots: usize,
        _placement: Placement,
    ) -> Result<(), WorkError> {
        let (stride, len) = (layout.pitch(), layout.frame_len());
        kernel::self_check_pattern(stride, layout.height() as usize).map_err(work_error)?;
        let kernels = Kernels::compile(ctx).map_err(work_error)?;
        let counters = PinnedHostBuffer::new(ctx, slots.max(1) * 8)
            .during("allocating the mismatch counters")?;
        self.prepared = Some(Prepared {
            kernels,
            counters,
            grid: grid_for(len),
            len: len as u64,
            stride: stride as u64,
        });
        Ok(())
    }

    fn queue(&mut self, frame: &DeviceFrame<'_>, stream: &Stream) -> Result<(), WorkError> {
        let p = self.prepared()?;
        if frame.len() as u64 != p.len {
            return Err(WorkError::failed(format!(
                "check-and-invert: prepared for {}-byte frames, given {}",
                p.len,
                frame.len()
            )));
        }
        kernel::check_aligned(frame.ptr().addr(), "the frame").map_err(work_error)?;
        let counter = DevicePtr::at(&p.counters, frame.slot() as u64 * 8, 8)
            .during("addressing the slot's counter")?;
        let launch = p
            .kernels
            .check_and_invert(frame.memory())
            .launch(p.grid, BLOCK)
            .arg(frame.ptr())
            .arg(p.len)
            .arg(p.stride)
            .arg(pattern_seed(frame.number()))
            .arg(counter);
        // SAFETY: the arguments are the kernel's `(unsigned char *, u64,
        // u64, u32, u64 *)`; the frame is `len` bytes (checked above),
        // valid and untouched by others for work on `stream` (the
        // `DeviceFrame` contract); the counter is the slot's word of
        // `counters`, which this work owns and which lives until the
        // consumer's streams drained (it drops the work only then); the
        // host reads it only in `finished`, after the frame's work
        // completed, and the slot has no other frame in flight.
        unsafe { launch.launch(stream) }.during("launching the check-and-invert kernel")
    }

    fn finished(&mut self, slot: usize, _frame: u64) -> Result<u64, WorkError> {
        let p = self.prepared()?;
        // The kernel's adds completed before the frame was finished.
        Ok(p.counters
            .atomic_u64(slot)
            .during("reading the slot's counter")?
            .swap(0, std::sync::atomic::Ordering::AcqRel))
    }
}

/// The kernel [`Invert`] launches.
pub const INVERT_KERNEL: &str = "tegra_interop_invert";

/// The CUDA C source of [`Invert`]: 16-byte vectors in a grid-stride loop,
/// the last `len % 16` bytes one per thread.
pub const INVERT_SOURCE: &str = r#"
extern "C" __global__ void tegra_interop_invert(unsigned char *buf, unsigned long long len) {
    const unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long threads = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long vectors = len / 16;
    uint4 *v = (uint4 *)buf;
    for (unsigned long long i = tid; i < vectors; i += threads) {
        uint4 w = v[i];
        v[i] = make_uint4(~w.x, ~w.y, ~w.z, ~w.w);
    }
    const unsigned long long tail = len - vectors * 16;
    if (tid < tail) {
        buf[vectors * 16 + tid] = (unsigned char)~buf[vectors * 16 + tid];
    }
}
"#;

/// Inverts every byte of every frame (no pattern, no count): for frames
/// whose content only their source knows, which checks them by reading the
/// slot back and inverting again. On the simulator register its twin first
/// (`Invert::register_twin`).
#[derive(Debug, Default)]
pub struct Invert {
    prepared: Option<(Function, u32, u64)>,
}

impl Invert {
    /// The work (nothing is made before [`FrameWork::prepare`]).
    pub fn new() -> Invert {
        Invert::default()
    }

    #[cfg(feature = "sim")]
    /// Registers the Rust twin of [`INVERT_SOURCE`] with a simulator. It
    /// runs once per block of the launch (`Sim::register_block_kernel`)
    /// and follows the CUDA code's index arithmetic: the block's threads
    /// `tid = blockIdx.x * blockDim.x + threadIdx.x` invert the 16-byte
    /// vectors `tid`, `tid + gridDim.x * blockDim.x`, ... below `len / 16`,
    /// and threads `tid < len % 16` one byte each of the tail. So a grid
    /// too small for the tail leaves the bytes it misses untouched, as on
    /// a GPU, and a misaligned buffer is a fault where a thread would load
    /// a vector from it.
    pub fn register_twin(sim: &tegra_interop_sim::Sim) {
        use tegra_interop_sim::kernels::KernelSpec;
        sim.register_block_kernel(KernelSpec::new(INVERT_KERNEL, &[8, 8]), invert_block);
    }
}

/// The twin of [`INVERT_KERNEL`], one block: the bytes its threads touch,
/// in the CUDA code's order (the grid-stride loop's vectors, then the
/// tail), each range read, inverted and written back in one piece.
#[cfg(feature = "sim")]
fn invert_block(
    b: &tegra_interop_sim::kernels::Block<'_>,
) -> Result<(), tegra_interop_sim::kernels::KernelFault> {
    use tegra_interop_sim::kernels::KernelFault;
    const VECTOR: u64 = 16;
    let (buf, len) = (b.arg_u64(0)?, b.arg_u64(1)?);
    let vectors = len / VECTOR;
    let tail_at = vectors * VECTOR;
    let mut vector_ranges = b.grid_stride_x(vectors).peekable();
    if vector_ranges.peek().is_some() && buf % VECTOR != 0 {
        // `uint4` loads and stores need 16-byte alignment on the GPU.
        return Err(KernelFault::new(format!(
            "kernel `{}`: misaligned address {buf:#x} for a 16-byte vector",
            b.name()
        )));
    }
    let bytes = vector_ranges
        .map(|r| r.start * VECTOR..r.end * VECTOR)
        .chain(
            b.indices_x(len - tail_at)
                .map(|r| tail_at + r.start..tail_at + r.end),
        );
    for r in bytes {
        // At most `blockDim.x` vectors: a few KiB.
        let n = usize::try_from(r.end - r.start).map_err(|_| {
            KernelFault::new("invert: a block's range exceeds the host's address space")
        })?;
        let mut data = vec![0u8; n];
        let at = buf.wrapping_add(r.start);
        b.read(at, &mut data)?;
        data.iter_mut().for_each(|v| *v = !*v);
        b.write(at, &data)?;
    }
    Ok(())
}

impl FrameWork for Invert {
    fn name(&self) -> &str {
        "invert"
    }

    fn prepare(
        &mut self,
        ctx: &Context,
        layout: FrameLayout,
        _slots: usize,
        _placement: Placement,
    ) -> Result<(), WorkError> {
        let nvrtc = Nvrtc::new(ctx.backend()).during("loading NVRTC for the invert kernel")?;
        let ptx = nvrtc
            .compile(INVERT_SOURCE, "tegra_interop_invert.cu", &[])
            .during("NVRTC compiling the invert kernel")?;
        let module = Module::load(ctx, &ptx).during("loading the invert kernel")?;
        let f = module
            .function(INVERT_KERNEL)
            .during("finding the invert kernel")?;
        let len = layout.frame_len();
        self.prepared = Some((f, grid_for(len), len as u64));
        Ok(())
    }

    fn queue(&mut self, frame: &DeviceFrame<'_>, stream: &Stream) -> Result<(), WorkError> {
        let Some((f, grid, len)) = &self.prepared else {
            return Err(WorkError::failed("invert: queued before prepare"));
        };
        if frame.len() as u64 != *len {
            return Err(WorkError::failed(format!(
                "invert: prepared for {len}-byte frames, given {}",
                frame.len()
            )));
        }
        kernel::check_aligned(frame.ptr().addr(), "the frame").map_err(work_error)?;
        let launch = f.launch(*grid, BLOCK).arg(frame.ptr()).arg(*len);
        // SAFETY: `(unsigned char *, u64)` is the kernel's parameter list;
        // it touches the `len` bytes of the frame (16-byte aligned, checked
        // above), which are valid and untouched by others for work on
        // `stream` (the `DeviceFrame` contract).
        unsafe { launch.launch(stream) }.during("launching the invert kernel")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_invert_source_declares_its_kernel() {
        assert!(INVERT_SOURCE.contains(&format!("extern \"C\" __global__ void {INVERT_KERNEL}(")));
    }

    #[test]
    fn work_queued_before_prepare_is_an_error_not_a_launch() {
        assert!(CheckInvert::new().prepared().is_err());
        assert_eq!(CheckInvert::new().name(), "check-and-invert");
        assert_eq!(Invert::new().name(), "invert");
    }

    /// Runs the invert kernel over `bytes` at byte `offset` of a device
    /// buffer with `grid` x `block`; gives the bytes afterwards.
    #[cfg(feature = "sim")]
    fn invert_on_sim(
        sim: &tegra_interop_sim::Sim,
        bytes: &[u8],
        offset: u64,
        grid: u32,
        block: u32,
    ) -> Vec<u8> {
        use std::time::Duration;
        use tegra_interop::driver::{DeviceBuffer, Event, EventFlags};
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let ptx = Nvrtc::new(ctx.backend())
            .unwrap()
            .compile(INVERT_SOURCE, "invert.cu", &[])
            .unwrap();
        let module = Module::load(&ctx, &ptx).unwrap();
        let f = module.function(INVERT_KERNEL).unwrap();
        let all = offset as usize + bytes.len();
        let buf = DeviceBuffer::new(&ctx, all).unwrap();
        buf.copy_from_host(offset as usize, bytes).unwrap();
        let at = DevicePtr::at(&buf, offset, bytes.len() as u64).unwrap();
        // SAFETY: `(unsigned char *, u64)` is the kernel's parameter list;
        // it touches `bytes.len()` bytes from `at`, inside `buf`, which
        // lives until the event below completed.
        unsafe {
            f.launch(grid, block)
                .arg(at)
                .arg(bytes.len() as u64)
                .launch(&stream)
        }
        .unwrap();
        let done = Event::new(&ctx, EventFlags::NO_TIMING).unwrap();
        done.record(&stream).unwrap();
        done.synchronize(Duration::from_secs(60)).unwrap();
        let mut out = vec![0u8; bytes.len()];
        buf.copy_to_host(offset as usize, &mut out).unwrap();
        out
    }

    /// The per-block twin of the invert kernel touches what the CUDA code
    /// touches: every vector with any grid (grid-stride loop), of the tail
    /// only the bytes of threads `tid < len % 16`, so a grid too small for
    /// the tail leaves the rest untouched.
    #[test]
    #[cfg(feature = "sim")]
    #[cfg_attr(miri, ignore = "runs the simulator's stream threads and NVRTC model")]
    fn the_invert_twin_follows_the_kernels_index_arithmetic() {
        let sim = tegra_interop_sim::Sim::with_config(
            tegra_interop_sim::SimConfig::default().with_diagnostic_echo(false),
        )
        .unwrap();
        Invert::register_twin(&sim);
        // 1000 bytes: 62 vectors and a tail of 8 bytes.
        let bytes: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let inverted: Vec<u8> = bytes.iter().map(|b| !*b).collect();
        for (grid, block) in [(grid_for(bytes.len()), BLOCK), (1, 32), (3, 8), (1, 8)] {
            let out = invert_on_sim(&sim, &bytes, 0, grid, block);
            assert!(out == inverted, "grid {grid} x {block}");
        }
        // Four threads: all the vectors, but only 4 of the 8 tail bytes.
        let out = invert_on_sim(&sim, &bytes, 0, 1, 4);
        assert_eq!(out[..996], inverted[..996]);
        assert_eq!(out[996..], bytes[996..], "the tail the grid misses");
        assert!(sim.diagnostics().is_empty(), "{:?}", sim.diagnostics());
        // A buffer off the 16-byte alignment faults before touching it.
        let out = invert_on_sim(&sim, &bytes, 1, 1, 32);
        assert_eq!(out, bytes);
        let d = sim.take_diagnostics();
        assert!(
            d.iter().any(|d| d.message.contains("misaligned address")),
            "{d:?}"
        );
    }
}
