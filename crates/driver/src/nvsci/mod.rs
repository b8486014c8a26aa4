//! NvSciBuf / NvSciSync: safe modules, attribute lists, objects, fences,
//! CUDA import and IPC, over the same function table as everything else
//! (real libraries via [`Backend::real`](crate::Backend::real), or the
//! simulator).
//!
//! | type | C object | released with |
//! |---|---|---|
//! | [`BufModule`] / [`SyncModule`] | `NvSciBufModule` / `NvSciSyncModule` | `*ModuleClose` (after the last user) |
//! | [`BufAttrList`] / [`SyncAttrList`] | attribute lists | `*AttrListFree` |
//! | [`BufObj`] / [`SyncObj`] | `NvSciBufObj` / `NvSciSyncObj` | `*ObjFree` |
//! | [`Fence`] | `NvSciSyncFence` (zeroed = cleared) | `NvSciSyncFenceClear` |
//! | [`CpuWaitContext`] | `NvSciSyncCpuWaitContext` | `NvSciSyncCpuWaitContextFree` |
//! | [`NvSciMemory`] | `CUexternalMemory` of an `NvSciBufObj` | `cuDestroyExternalMemory` |
//! | [`NvSciSemaphore`] | `CUexternalSemaphore` of an `NvSciSyncObj` | `cuDestroyExternalSemaphore` |
//! | [`NvSciIpc`] | `NvSciIpcEndpoint` (and the process's `NvSciIpcInit`) | `NvSciIpcCloseEndpointSafe` (the last one: `NvSciIpcDeinit`) |
//!
//! Attributes are written with [`BufAttrs`] / [`SyncAttrs`] (idiomatic
//! setters, no capacity parameter); the core's fixed-capacity
//! `BufAttrSet<N>` / `SyncAttrSet<N>` and slices or `Vec`s of attributes
//! are accepted too ([`BufAttrInput`], [`SyncAttrInput`]).
//!
//! Modules are reference counted: every list, object, fence and wait
//! context holds its module, which is closed when the last of them goes.
//!
//! The flow of NVIDIA's CUDA + NvSci sample, with a producer that signals
//! and a consumer that waits on a deterministic fence it built itself:
//!
//! ```
//! use tegra_interop_core::nvsci::GpuId;
//! use tegra_interop_driver::nvsci::{BufAttrs, BufModule, BufPerm, BufType, SyncAttrs, SyncModule};
//! use tegra_interop_driver::{Context, Stream};
//! use tegra_interop_sim::{Sim, SimConfig};
//!
//! let sim = Sim::with_config(SimConfig::tegra())?; // or Backend::real()? on a Jetson
//! let backend = sim.backend();
//! let (producer, consumer) = (Context::create(backend.clone(), 0, 0)?, Context::create(backend.clone(), 0, 0)?);
//! let bufs = BufModule::open(&backend)?;
//! let syncs = SyncModule::open(&backend)?;
//!
//! // Buffer: each participant states its needs; reconcile; allocate.
//! let gpu = GpuId(backend.device(0)?.uuid()?);
//! let mut wants = BufAttrs::new();
//! wants
//!     .types(&[BufType::RawBuffer])?
//!     .raw_size(4096)?
//!     .need_cpu_access(true)?
//!     .required_perm(BufPerm::ReadWrite)?
//!     .gpus(&[gpu])?;
//! let (a, b) = (bufs.attr_list(&wants)?, bufs.attr_list(&wants)?);
//! let buffer = bufs.reconcile_and_alloc(&[&a, &b])?;
//!
//! // Sync: CUDA fills the signaller's and the waiter's lists.
//! let mut deterministic = SyncAttrs::new();
//! deterministic.require_deterministic_fences(true)?;
//! let mut signal = syncs.cuda_signaler_attrs(&producer)?;
//! signal.set(&deterministic)?;
//! let wait = syncs.cuda_waiter_attrs(&consumer)?;
//! let sync = syncs.reconcile_and_alloc(&[&signal, &wait])?;
//!
//! // CUDA imports: the size comes from the object, the permission from the list.
//! let out = buffer.import_cuda(&producer)?;
//! let inp = buffer.import_cuda(&consumer)?;
//! let (out_buf, in_buf) = (out.map_whole()?, inp.map_whole()?);
//! let mut signaler = sync.import_cuda_signaler(&producer)?;
//! let waiter = sync.import_cuda_waiter(&consumer)?;
//! let (ps, cs) = (Stream::new(&producer)?, Stream::new(&consumer)?);
//!
//! // Frame 1: the producer's signal returns its fence, handed to the consumer.
//! out_buf.copy_from_host(0, b"frame 1")?;
//! let fence = ps.signal_nvscisync(&mut signaler)?;
//! cs.wait_nvscisync(&waiter, &fence)?;
//! cs.synchronize()?;
//! let mut seen = [0u8; 7];
//! in_buf.copy_to_host(0, &mut seen)?;
//! assert_eq!(&seen, b"frame 1");
//!
//! // The first signal taught the semaphore its counter (the initial value
//! // is read back, never assumed): the consumer can now build the fence of
//! // signal 2 itself and queue its wait before the producer signals.
//! let counter = signaler.counter().ok_or("no deterministic counter")?;
//! let expected = sync.fence_for_value(counter.value_of_signal(2))?;
//! waiter.wait(&cs, &expected)?;
//! out_buf.copy_from_host(0, b"frame 2")?;
//! let second = signaler.signal(&ps)?;
//! cs.synchronize()?;
//! in_buf.copy_to_host(0, &mut seen)?;
//! assert_eq!(&seen, b"frame 2");
//! assert_eq!(second.extract()?, expected.extract()?);
//! # drop((out_buf, in_buf));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod attrs;
pub(crate) mod buf;
pub(crate) mod common;
mod endpoint;
mod ipc;
pub(crate) mod sync;
mod version;

use std::fmt;
use std::time::Duration;

use crate::Error;

pub use attrs::{BufAttrInput, BufAttrs, BufType, ImageLayout, SyncAttrInput, SyncAttrs};
pub use buf::{BufAttrList, BufModule, BufObj, BufPerm, ImagePlane, NvSciMemory};
pub use common::{AttrList, BufLib, Library, LibraryTypes, Module, Obj, SyncLib};
pub use endpoint::{EndpointInfo, NvSciIpc, MAX_MESSAGE};
pub use ipc::{IpcEndpoint, IpcError};
pub use sync::{
    CanSignal, CanWait, CpuWaitContext, Fence, FenceSource, FenceValue, NvSciSemaphore, Role,
    SignalWait, Signaler, SyncAttrList, SyncModule, SyncObj, SyncPerm, Waiter,
};
pub use version::{LibVersion, NvSciVersion, VersionSource};

/// How long a CPU wait (or an IPC import) may take.
///
/// ```
/// use std::time::Duration;
/// use tegra_interop_driver::nvsci::Timeout;
///
/// assert_eq!(Timeout::from(Duration::from_millis(5)).as_micros(), 5000);
/// assert_eq!(Timeout::Infinite.as_micros(), i64::MAX / 1000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timeout {
    /// Wait as long as it takes (NvSci's maximum timeout, `i64::MAX / 1000` µs).
    Infinite,
    /// Wait at most this long (clamped just below the infinite value).
    After(Duration),
}

impl Timeout {
    /// NvSci's infinite timeout in microseconds.
    pub const INFINITE_MICROS: i64 = i64::MAX / 1000;

    /// The value NvSci takes, in microseconds.
    pub fn as_micros(self) -> i64 {
        match self {
            Timeout::Infinite => Self::INFINITE_MICROS,
            Timeout::After(d) => i64::try_from(d.as_micros())
                .unwrap_or(i64::MAX)
                .min(Self::INFINITE_MICROS - 1),
        }
    }
}

impl From<Duration> for Timeout {
    fn from(value: Duration) -> Self {
        Timeout::After(value)
    }
}

/// A failed reconciliation: the error, and the attribute keys the library
/// reported in conflict (read back from its conflict list; empty when it
/// gave none or the failure was not a conflict).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReconcileError<K> {
    /// The call's error (`NvSciError_ReconciliationFailed` for a conflict).
    pub error: Error,
    /// The keys in conflict.
    pub conflicts: Vec<K>,
}

/// A failed NvSciBuf reconciliation.
pub type BufReconcileError = ReconcileError<tegra_interop_sys::nvsci::NvSciBufAttrKey>;
/// A failed NvSciSync reconciliation.
pub type SyncReconcileError = ReconcileError<tegra_interop_sys::nvsci::NvSciSyncAttrKey>;

impl<K> From<Error> for ReconcileError<K> {
    fn from(error: Error) -> Self {
        ReconcileError {
            error,
            conflicts: Vec::new(),
        }
    }
}

impl<K: fmt::Debug> fmt::Display for ReconcileError<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.error)?;
        if !self.conflicts.is_empty() {
            write!(f, "; keys in conflict: {:?}", self.conflicts)?;
        }
        Ok(())
    }
}

impl<K: fmt::Debug> std::error::Error for ReconcileError<K> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<K> From<ReconcileError<K>> for Error {
    fn from(value: ReconcileError<K>) -> Self {
        value.error
    }
}
