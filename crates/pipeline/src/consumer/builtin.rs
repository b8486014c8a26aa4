//! The project's own [`FrameWork`]s: [`CheckInvert`] (the check-and-invert
//! kernel of [`KERNEL_SOURCE`](super::KERNEL_SOURCE), with its mismatch counters: what the
//! `pipeline` program and the tests verify with) and [`Invert`] (every byte
//! inverted, no pattern: for frames whose content the ring does not know,
//! read back and re-inverted by whoever does).
//!
//! Both launch through the driver's seam (`Nvrtc`, `Module`,
//! `Function::launch`), so they run on a GPU and on the simulator, where
//! the kernels are their Rust twins: [`super::twin::register`] for
//! `CheckInvert`, [`Invert::register_twin`] for `Invert`.

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
/// ([`super::twin::register`]).
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
/// ([`Invert::register_twin`]).
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
    /// does what the CUDA code does for the launch's grid: the vectors of
    /// the grid-stride loop (all of them, with any thread at all), and of
    /// the tail only the bytes a thread of the grid covers.
    pub fn register_twin(sim: &tegra_interop_sim::Sim) {
        use tegra_interop_sim::kernels::{KernelFault, KernelSpec};
        sim.register_kernel(KernelSpec::new(INVERT_KERNEL, &[8, 8]), |k| {
            let (buf, len) = (k.arg_u64(0)?, k.arg_u64(1)?);
            let len = usize::try_from(len)
                .map_err(|_| KernelFault::new("invert: len exceeds the host's address space"))?;
            let threads = usize::try_from(k.threads()).unwrap_or(usize::MAX);
            let vectors = len / 16;
            let covered = match threads {
                0 => 0,
                _ => vectors * 16 + (len - vectors * 16).min(threads),
            };
            let mut bytes = vec![0u8; covered];
            k.read(buf, &mut bytes)?;
            bytes.iter_mut().for_each(|b| *b = !*b);
            k.write(buf, &bytes)
        });
    }
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
}
