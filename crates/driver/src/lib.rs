//! `tegra-interop-driver`: the std backend of tegra-interop.
//!
//! It turns the validated values of [`tegra_interop_core`] into calls through
//! one function table ([`table::FunctionTable`], the seam), and owns what the
//! calls create:
//!
//! | type | C object | released with |
//! |---|---|---|
//! | [`Backend`] | the table (real: `libcuda.so.1` + NvSci libraries via dlopen) | unload |
//! | [`Context`] | `CUcontext` (primary, created, or cudarc's) | release / destroy |
//! | [`Stream`] | `CUstream` (own, default, or cudarc's) | `cuStreamDestroy` |
//! | [`ExternalMemory`] | `CUexternalMemory` | `cuDestroyExternalMemory` |
//! | [`MappedBuffer`] | `CUdeviceptr` of a mapping | `cuMemFree` |
//! | [`MappedArray`] | `CUmipmappedArray` of a mapping | `cuMipmappedArrayDestroy` |
//! | [`ExternalSemaphore`] | `CUexternalSemaphore` | `cuDestroyExternalSemaphore` |
//! | [`DeviceBuffer`] | `CUdeviceptr` of `cuMemAlloc` | `cuMemFree` |
//! | [`PinnedHostBuffer`] | `cuMemHostAlloc` (device-mapped) | `cuMemFreeHost` |
//! | [`RegisteredHostMemory`] | `cuMemHostRegister` of the caller's memory (device-mapped) | `cuMemHostUnregister` |
//! | [`Event`] | `CUevent` | `cuEventDestroy` |
//! | [`Module`] / [`Function`] | `CUmodule` / its `CUfunction` | `cuModuleUnload` |
//!
//! [`Nvrtc`] compiles CUDA C to [`Ptx`] through the table's optional NVRTC
//! part (on the simulator: its registry of Rust kernels, see
//! `tegra_interop_sim::kernels`).
//!
//! Handles hold what they depend on, cudarc's model: a [`Context`] is a
//! cheap clone of an `Arc`, every handle holds a clone, and a mapping holds
//! its memory. So handles carry no lifetime (store them together, return
//! them from functions) and cannot outlive their context. Every handle has
//! an explicit `destroy(self) -> Result` (consuming it: use after destroy
//! and double destroy, which crash the real driver, do not compile) and a
//! `Drop`; both go through one release-once owner that never panics and
//! treats `CUDA_ERROR_DEINITIALIZED` (driver already shut down) as "already
//! gone"; other `Drop` failures are kept on the backend
//! ([`Backend::take_drop_errors`]). Resetting or destroying a context, or
//! destroying memory, while other handles hold it is refused at run time
//! with [`Error::InUse`] (naming how many holders are alive).
//!
//! The same code runs on the real driver ([`Backend::real`]) and on the
//! simulator (`tegra-interop-sim`, through [`Backend::from_table`]);
//! the conformance suite (`tegra-interop-testkit`, unpublished) holds the checks both must pass.
//!
//! ```
//! use tegra_interop_core::{BufferMapping, SignalParams};
//! use tegra_interop_driver::{Context, ExternalMemory, ExternalSemaphore, Stream};
//! use tegra_interop_sim::{export, Sim};
//!
//! let sim = Sim::new()?; // or: let backend = Backend::real()?;
//! let backend = sim.backend();
//! // The exporter side (Vulkan on a GPU, memfd in the simulator).
//! let (mem_fd, exported) = export::memory(1024)?;
//! let (sem_fd, exported_sem) = export::timeline_semaphore(0)?;
//!
//! let ctx = Context::new(backend, 0)?;
//! let stream = Stream::new(&ctx)?;
//! let memory = ExternalMemory::opaque_fd(&ctx, mem_fd, 1024)?;
//! let buffer = memory.map_buffer(BufferMapping::new(0, 1024))?;
//! let mut semaphore = ExternalSemaphore::timeline_fd(&ctx, sem_fd)?;
//!
//! buffer.copy_from_host(0, &[7; 16])?;
//! stream.signal(&mut semaphore, SignalParams::timeline(1))?;
//! stream.synchronize()?;
//!
//! assert_eq!(exported_sem.value(), 1);
//! let mut seen = [0u8; 16];
//! exported.read(0, &mut seen)?;
//! assert_eq!(seen, [7; 16]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(unsafe_code)]

pub mod backend;
pub mod buffer;
pub mod compat;
pub mod context;
#[cfg(feature = "cudarc")]
pub mod cudarc_slice;
pub mod device;
pub mod egl;
pub mod error;
pub mod event;
mod fd;
mod ffi;
mod import;
mod logging;
pub mod memory;
pub mod module;
pub mod nvrtc;
pub mod nvsci;
mod owner;
pub mod probe;
pub mod semaphore;
pub mod stream;
pub mod table;

pub use backend::{Backend, BackendKind};
pub use buffer::{
    host_page_size, DeviceBuffer, DeviceMemory, HostRegistration, PageLockedMemory,
    PinnedHostBuffer, RegisteredHostMemory,
};
pub use compat::MissingEntry;
pub use context::Context;
pub use device::Device;
pub use error::{ContextId, Error, ImportError};
pub use event::{Event, EventFlags};
pub use memory::{ExternalMemory, MappedArray, MappedBuffer};
pub use module::{DevicePtr, Dim3, Function, KernelArg, Launch, Module};
pub use nvrtc::{Nvrtc, NvrtcResult, Ptx};
pub use semaphore::{ExternalSemaphore, SemaphoreSignal, SemaphoreWait, Tracking};
pub use stream::Stream;
pub use table::FunctionTable;
