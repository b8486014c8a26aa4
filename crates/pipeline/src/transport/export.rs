//! The producer side of fd-based sharing: an [`Exporter`] allocates frame
//! memory and timeline semaphores that another API (CUDA, in this process
//! or in another one) imports from opaque file descriptors.
//!
//! - [`ExportedFrame`]: frame memory exported as an `OPAQUE_FD`, with a
//!   host mapping the producer writes ([`ExportedFrame::write`]) and reads
//!   back ([`ExportedFrame::read`]). [`ExportedFrame::size`] is the size to
//!   import (an exporter may allocate more than asked for) and
//!   [`ExportedFrame::dedicated`] whether the import must say it is a
//!   dedicated allocation.
//! - [`ExportedTimeline`]: a timeline semaphore exported as an `OPAQUE_FD`
//!   (CUDA imports it as `TIMELINE_SEMAPHORE_FD`), which the host signals,
//!   queries and waits on with a limit.
//!
//! Every object hands out any number of fresh descriptors
//! (`export_fd()`): each is owned by the caller, and a successful CUDA
//! import consumes it (the helpers [`import_frame`], [`import_frame_fd`]
//! and [`import_timeline`] take it by value; on a failed import they close
//! it). That is also what the two-process mode sends over a Unix socket
//! (`SCM_RIGHTS`).
//!
//! The host's writes reach the importer only through
//! [`Exporter::publish`], which also signals the frame's *ready* value:
//! Vulkan makes host writes through a mapping visible to the device only
//! through a queue submission (see the `transport::gpu` module docs, "Why
//! the handover goes through the Vulkan queue"), so the Vulkan exporter
//! submits its recorded handover batch there; the simulator's memory is
//! plain shared memory and the signal is a host signal. Before the host
//! writes a published frame again it calls [`Exporter::reclaim`] (after
//! every importer released it): the Vulkan exporter takes the buffer back
//! from the external owner with the other recorded batch.
//!
//! Two exporters: [`SimExporter`] (feature `sim`: the simulator's memfds,
//! which the simulated driver accepts as GPU allocations, in other
//! processes too) and `VulkanFdExporter` (feature `vulkan`: the Vulkan
//! device whose UUID is the CUDA device's, through
//! `tegra_interop_platform::vulkan`). Verified where: the simulator's
//! exporter by this crate's tests in CI; the Vulkan exporter builds in CI
//! and its test (`tests/gpu_multicast.rs`) is for the GPU machine and has
//! not run yet.
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use tegra_interop_pipeline::transport::export::{
//!     ExportedFrame, ExportedTimeline, Exporter, SimExporter,
//! };
//!
//! let mut exporter = SimExporter;
//! let mut frame = exporter.export_frame(4096)?;
//! let ready = exporter.export_timeline(0)?;
//! frame.write(0, b"a frame")?;
//! exporter.publish(&mut frame, &ready, 1)?; // the host's writes, then ready = 1
//! assert_eq!(ready.value()?, 1);
//! let fd = frame.export_fd()?; // send it, or import it: `import_frame`
//! assert_eq!(frame.size(), 4096);
//! # drop(fd);
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt::Display;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use tegra_interop::core::MemoryImport;
use tegra_interop::driver::{Context, ExternalMemory, ExternalSemaphore, MappedBuffer};

use crate::transport::{DriverResultExt, TransportError};

/// An error of the exporter's API while `what` was done, as one line.
fn failed(what: &'static str) -> impl Fn(&dyn Display) -> TransportError {
    move |e| TransportError::new(format!("{what}: {}", e.to_string().replace('\n', " ")))
}

/// Frame memory made by an [`Exporter`]: exportable as an opaque fd, with
/// the producer's host mapping.
pub trait ExportedFrame: Send {
    /// Bytes to import (at least the size asked for).
    fn size(&self) -> u64;
    /// Whether the import must say it is a dedicated allocation.
    fn dedicated(&self) -> bool;
    /// A fresh descriptor of the memory (owned by the caller).
    fn export_fd(&self) -> Result<OwnedFd, TransportError>;
    /// Copies `data` into the memory at `offset` through the host mapping.
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), TransportError>;
    /// Copies the bytes at `offset` into `out` through the host mapping.
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), TransportError>;
}

/// A timeline semaphore made by an [`Exporter`]: exportable as an opaque
/// fd; the host signals, queries and waits on it.
pub trait ExportedTimeline: Send {
    /// A fresh descriptor of the semaphore (owned by the caller; CUDA
    /// imports it as `TIMELINE_SEMAPHORE_FD`).
    fn export_fd(&self) -> Result<OwnedFd, TransportError>;
    /// Host signal: sets the counter to `value`, which must be greater
    /// than the counter (refused otherwise, the counter unchanged).
    fn signal(&self, value: u64) -> Result<(), TransportError>;
    /// The counter now (no wait).
    fn value(&self) -> Result<u64, TransportError>;
    /// Waits until the counter is at least `value`, at most `limit`;
    /// `Ok(false)` when the limit passed first.
    fn wait(&self, value: u64, limit: Duration) -> Result<bool, TransportError>;
}

/// The producer's API for fd-shared frames and fences (see the module
/// docs).
pub trait Exporter: Send {
    /// The exporter's frame memory.
    type Frame: ExportedFrame;
    /// The exporter's timeline semaphores.
    type Timeline: ExportedTimeline;

    /// A short name for reports (`sim-memfd`, `vulkan`).
    fn name(&self) -> &'static str;
    /// Allocates at least `len` bytes of exportable frame memory, zeroed.
    fn export_frame(&mut self, len: u64) -> Result<Self::Frame, TransportError>;
    /// Makes an exportable timeline semaphore starting at `initial`.
    fn export_timeline(&mut self, initial: u64) -> Result<Self::Timeline, TransportError>;
    /// Hands `frame` to the importers after the host wrote it: its writes
    /// made visible to them, then `ready` signalled to `value` (may return
    /// before the signal happened on the device).
    fn publish(
        &mut self,
        frame: &mut Self::Frame,
        ready: &Self::Timeline,
        value: u64,
    ) -> Result<(), TransportError>;
    /// Takes `frame` back for host writes once every importer released it
    /// (the caller waited for their release fences): `Ok(false)` when that
    /// did not finish within `limit` (the host must not write it then).
    fn reclaim(&mut self, frame: &mut Self::Frame, limit: Duration)
        -> Result<bool, TransportError>;
}

/// Imports `fd`, a descriptor of `frame`'s memory, into CUDA (`ctx`) and
/// maps all of it. The descriptor is consumed either way: by the driver on
/// success, closed here on failure.
pub fn import_frame(
    ctx: &Context,
    fd: OwnedFd,
    frame: &dyn ExportedFrame,
) -> Result<MappedBuffer, TransportError> {
    import_frame_fd(ctx, fd, frame.size(), frame.dedicated())
}

/// Imports `fd`, a descriptor of exported frame memory of `size` bytes
/// (`dedicated`: a dedicated allocation), into CUDA (`ctx`) and maps all of
/// it: the importer's side where only the descriptor and its facts came
/// (another process). A descriptor of a regular file (a memfd: the
/// simulator's memory) is refused when `size` is more than the file holds
/// (the real driver would accept such a size); other descriptors (a
/// driver's opaque handle) tell no size, so check an untrusted peer's size
/// by other means. The descriptor is consumed either way.
pub fn import_frame_fd(
    ctx: &Context,
    fd: OwnedFd,
    size: u64,
    dedicated: bool,
) -> Result<MappedBuffer, TransportError> {
    let file = std::fs::File::from(fd);
    if let Ok(meta) = file.metadata() {
        if meta.is_file() && meta.len() < size {
            return Err(TransportError::refused(format!(
                "a frame import of {size} bytes over a file of {} bytes",
                meta.len()
            )));
        }
    }
    let fd = OwnedFd::from(file);
    let mut import = MemoryImport::opaque_fd(fd.as_raw_fd(), size)
        .map_err(|e| failed("describing a frame import")(&e))?;
    if dedicated {
        import = import.dedicated();
    }
    ExternalMemory::import_fd(ctx, fd, import)
        .map_err(|e| e.into_parts().0)
        .during("importing an exported frame into CUDA")?
        .map_whole()
        .during("mapping an imported frame in CUDA")
}

/// Imports `fd`, a descriptor of an exported timeline semaphore, into CUDA
/// (`ctx`) as `TIMELINE_SEMAPHORE_FD`. The descriptor is consumed either
/// way.
pub fn import_timeline(ctx: &Context, fd: OwnedFd) -> Result<ExternalSemaphore, TransportError> {
    ExternalSemaphore::timeline_fd(ctx, fd)
        .map_err(|e| e.into_parts().0)
        .during("importing an exported timeline semaphore into CUDA")
}

#[cfg(feature = "sim")]
pub use self::sim::{SimExporter, SimFrame, SimTimeline};

#[cfg(feature = "sim")]
mod sim {
    use super::*;
    use tegra_interop_sim::export;

    /// The simulator's exporter: memfds the simulated driver accepts as
    /// `OPAQUE_FD` memory and semaphore imports (named and sealed by
    /// `tegra_interop_sim::export`; in another process too). Frames are
    /// plain shared memory, so [`Exporter::publish`] is a host signal and
    /// [`Exporter::reclaim`] has nothing to do.
    #[derive(Debug, Default)]
    pub struct SimExporter;

    /// A simulator frame (a memfd and the exporter's mapping of it).
    #[derive(Debug)]
    pub struct SimFrame(export::ExportedMemory);

    /// A simulator timeline semaphore (a one-page memfd).
    #[derive(Debug)]
    pub struct SimTimeline(export::ExportedTimelineSemaphore);

    fn offset(offset: u64) -> Result<usize, TransportError> {
        usize::try_from(offset)
            .map_err(|_| TransportError::refused("an offset past the address space"))
    }

    impl ExportedFrame for SimFrame {
        fn size(&self) -> u64 {
            self.0.size() as u64
        }
        fn dedicated(&self) -> bool {
            false
        }
        fn export_fd(&self) -> Result<OwnedFd, TransportError> {
            self.0
                .export_fd()
                .map_err(|e| failed("duplicating a frame's memfd")(&e))
        }
        fn write(&mut self, at: u64, data: &[u8]) -> Result<(), TransportError> {
            self.0
                .write(offset(at)?, data)
                .map_err(|e| TransportError::refused(e.to_string()))
        }
        fn read(&self, at: u64, out: &mut [u8]) -> Result<(), TransportError> {
            self.0
                .read(offset(at)?, out)
                .map_err(|e| TransportError::refused(e.to_string()))
        }
    }

    impl ExportedTimeline for SimTimeline {
        fn export_fd(&self) -> Result<OwnedFd, TransportError> {
            self.0
                .export_fd()
                .map_err(|e| failed("duplicating a semaphore's memfd")(&e))
        }
        fn signal(&self, value: u64) -> Result<(), TransportError> {
            self.0
                .signal(value)
                .map_err(|e| TransportError::misuse(e.to_string()))
        }
        fn value(&self) -> Result<u64, TransportError> {
            Ok(self.0.value())
        }
        fn wait(&self, value: u64, limit: Duration) -> Result<bool, TransportError> {
            Ok(self.0.wait(value, limit))
        }
    }

    impl Exporter for SimExporter {
        type Frame = SimFrame;
        type Timeline = SimTimeline;

        fn name(&self) -> &'static str {
            "sim-memfd"
        }
        fn export_frame(&mut self, len: u64) -> Result<SimFrame, TransportError> {
            let len = offset(len)?;
            // The first descriptor is closed here: `export_fd` makes more.
            let (_fd, memory) =
                export::memory(len).map_err(|e| failed("exporting a simulator frame")(&e))?;
            Ok(SimFrame(memory))
        }
        fn export_timeline(&mut self, initial: u64) -> Result<SimTimeline, TransportError> {
            let (_fd, sem) = export::timeline_semaphore(initial)
                .map_err(|e| failed("exporting a simulator semaphore")(&e))?;
            Ok(SimTimeline(sem))
        }
        fn publish(
            &mut self,
            _frame: &mut SimFrame,
            ready: &SimTimeline,
            value: u64,
        ) -> Result<(), TransportError> {
            ready.signal(value)
        }
        fn reclaim(
            &mut self,
            _frame: &mut SimFrame,
            _limit: Duration,
        ) -> Result<bool, TransportError> {
            Ok(true)
        }
    }
}

#[cfg(feature = "vulkan")]
pub use self::vulkan::{VulkanFdExporter, VulkanFdFrame, VulkanFdTimeline};

#[cfg(feature = "vulkan")]
mod vulkan {
    use super::*;
    use crate::platform::vulkan::{
        Error as VkError, HostHandover, MemoryLocation, QueueChoice, SemaphoreOp, VulkanExporter,
        VulkanMemory, VulkanSemaphore,
    };

    /// The Vulkan exporter: a Vulkan device on the GPU whose UUID is the
    /// CUDA device's, its queue chosen as the discrete-GPU transport
    /// chooses it (a transfer-only family where there is one). Frames are
    /// host-visible allocations (host-cached where the device has them)
    /// with their recorded handover batches.
    pub struct VulkanFdExporter {
        vk: VulkanExporter,
    }

    impl std::fmt::Debug for VulkanFdExporter {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("VulkanFdExporter")
                .field("device", self.vk.device_info())
                .finish()
        }
    }

    impl VulkanFdExporter {
        /// Opens the Vulkan device whose `deviceUUID` is `cuda_uuid`, with
        /// its queue on `queue` (`None`: a transfer-only family where the
        /// device has one, else the first with compute).
        pub fn open(
            cuda_uuid: [u8; 16],
            queue: Option<QueueChoice>,
        ) -> Result<VulkanFdExporter, TransportError> {
            Ok(VulkanFdExporter {
                vk: crate::transport::gpu::open_exporter(cuda_uuid, queue)?,
            })
        }

        /// The exporter it uses.
        pub fn vulkan(&self) -> &VulkanExporter {
            &self.vk
        }
    }

    /// A Vulkan frame: the allocation, its recorded handover batches and
    /// whether it is handed to the importers now.
    pub struct VulkanFdFrame {
        handover: HostHandover,
        memory: VulkanMemory,
        published: bool,
    }

    impl std::fmt::Debug for VulkanFdFrame {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("VulkanFdFrame")
                .field("memory", &self.memory)
                .field("published", &self.published)
                .finish()
        }
    }

    /// A Vulkan timeline semaphore.
    #[derive(Debug)]
    pub struct VulkanFdTimeline(VulkanSemaphore);

    impl ExportedFrame for VulkanFdFrame {
        fn size(&self) -> u64 {
            self.memory.size()
        }
        fn dedicated(&self) -> bool {
            self.memory.dedicated()
        }
        fn export_fd(&self) -> Result<OwnedFd, TransportError> {
            self.memory
                .export_fd()
                .map_err(|e| failed("exporting a Vulkan frame")(&e))
        }
        fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), TransportError> {
            if self.published {
                return Err(TransportError::misuse(
                    "a Vulkan frame written while the importers have it (reclaim it first)",
                ));
            }
            self.memory
                .write(offset, data)
                .map_err(|e| failed("writing a Vulkan frame")(&e))
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), TransportError> {
            self.memory
                .read(offset, out)
                .map_err(|e| failed("reading a Vulkan frame")(&e))
        }
    }

    impl ExportedTimeline for VulkanFdTimeline {
        fn export_fd(&self) -> Result<OwnedFd, TransportError> {
            self.0
                .export_fd()
                .map_err(|e| failed("exporting a Vulkan semaphore")(&e))
        }
        fn signal(&self, value: u64) -> Result<(), TransportError> {
            self.0
                .signal(value)
                .map_err(|e| failed("signalling a Vulkan semaphore")(&e))
        }
        fn value(&self) -> Result<u64, TransportError> {
            self.0
                .value()
                .map_err(|e| failed("reading a Vulkan semaphore")(&e))
        }
        fn wait(&self, value: u64, limit: Duration) -> Result<bool, TransportError> {
            self.0
                .wait(value, limit)
                .map_err(|e| failed("waiting for a Vulkan semaphore")(&e))
        }
    }

    impl Exporter for VulkanFdExporter {
        type Frame = VulkanFdFrame;
        type Timeline = VulkanFdTimeline;

        fn name(&self) -> &'static str {
            "vulkan"
        }
        fn export_frame(&mut self, len: u64) -> Result<VulkanFdFrame, TransportError> {
            let memory = match self.vk.allocate_memory(len, MemoryLocation::HostCached) {
                Err(VkError::NoMemoryType { .. }) => {
                    self.vk.allocate_memory(len, MemoryLocation::HostVisible)
                }
                other => other,
            }
            .map_err(|e| failed("allocating a Vulkan frame")(&e))?;
            memory
                .write(0, &vec![0u8; usize::try_from(len).unwrap_or(0)])
                .map_err(|e| failed("zeroing a Vulkan frame")(&e))?;
            let handover = self
                .vk
                .host_handover(&memory)
                .map_err(|e| failed("recording a frame's handover batches")(&e))?;
            Ok(VulkanFdFrame {
                handover,
                memory,
                published: false,
            })
        }
        fn export_timeline(&mut self, initial: u64) -> Result<VulkanFdTimeline, TransportError> {
            let (fd, sem) = self
                .vk
                .export_timeline_semaphore(initial)
                .map_err(|e| failed("exporting a Vulkan timeline semaphore")(&e))?;
            drop(fd); // `export_fd` makes more
            Ok(VulkanFdTimeline(sem))
        }
        fn publish(
            &mut self,
            frame: &mut VulkanFdFrame,
            ready: &VulkanFdTimeline,
            value: u64,
        ) -> Result<(), TransportError> {
            if frame.published {
                return Err(TransportError::misuse(
                    "a Vulkan frame published twice without a reclaim",
                ));
            }
            let signal = [SemaphoreOp::timeline(&ready.0, value)];
            self.vk
                .release_host_writes(&frame.handover, &frame.memory, &[], &signal)
                .map_err(|e| failed("submitting a frame's release batch")(&e))?;
            frame.published = true;
            Ok(())
        }
        fn reclaim(
            &mut self,
            frame: &mut VulkanFdFrame,
            limit: Duration,
        ) -> Result<bool, TransportError> {
            if !frame.published {
                return Ok(true);
            }
            let done = self
                .vk
                .acquire_for_host(&frame.handover, &frame.memory, &[], limit)
                .map_err(|e| failed("submitting a frame's acquire batch")(&e))?;
            frame.published = !done;
            Ok(done)
        }
    }
}

#[cfg(all(test, feature = "sim"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// Each `export_fd` is a fresh descriptor of the same memory, of the
    /// frame's size; CUDA (the simulator) reads what the host wrote and the
    /// host sees the timeline CUDA's import shares.
    #[test]
    #[cfg_attr(miri, ignore = "runs the simulator")]
    fn sim_frames_and_timelines_export_fresh_fds_and_share_state() {
        let sim = tegra_interop_sim::Sim::new().unwrap();
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let mut ex = SimExporter;
        let mut frame = ex.export_frame(4096).unwrap();
        assert_eq!(frame.size(), 4096);
        let (a, b) = (frame.export_fd().unwrap(), frame.export_fd().unwrap());
        assert_ne!(a.as_fd().as_raw_fd(), b.as_fd().as_raw_fd());
        drop(b);
        frame.write(10, b"hello").unwrap();
        assert!(frame.write(4094, b"abc").is_err(), "a write past the end");
        let mapped = import_frame(&ctx, a, &frame).unwrap();
        assert_eq!(mapped.size(), 4096);
        let ready = ex.export_timeline(0).unwrap();
        let imported = import_timeline(&ctx, ready.export_fd().unwrap()).unwrap();
        ex.publish(&mut frame, &ready, 1).unwrap();
        assert_eq!(ready.value().unwrap(), 1);
        assert!(ready.signal(1).is_err(), "a signal that does not move on");
        assert!(!ready.wait(2, Duration::from_millis(20)).unwrap());
        assert!(ex.reclaim(&mut frame, Duration::ZERO).unwrap());
        let mut back = [0u8; 5];
        frame.read(10, &mut back).unwrap();
        assert_eq!(&back, b"hello");
        drop((imported, mapped));
    }

    /// A descriptor that is not an exported simulator object, or a size
    /// over the memory's, is refused by the import, and the descriptor is
    /// closed (consumed) all the same.
    #[test]
    #[cfg_attr(miri, ignore = "runs the simulator")]
    fn an_import_of_a_foreign_fd_is_refused() {
        let sim = tegra_interop_sim::Sim::new().unwrap();
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let frame = SimExporter.export_frame(64).unwrap();
        let foreign: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        assert!(import_frame(&ctx, foreign, &frame).is_err());
        assert!(import_timeline(&ctx, frame.export_fd().unwrap()).is_err());
        // A size over what the memfd holds (a forged size) is refused too.
        let forged = import_frame_fd(&ctx, frame.export_fd().unwrap(), 1 << 20, false);
        assert!(forged.is_err());
        assert!(import_frame_fd(&ctx, frame.export_fd().unwrap(), 64, false).is_ok());
    }
}
