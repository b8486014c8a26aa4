//! The records a simulator keeps for its live objects: contexts and
//! primary contexts, streams, imported memory and semaphores, device
//! address ranges, mipmapped arrays and their levels, and the objects the
//! NvSci side registers for import; plus [`GoneWhy`], why a handle stopped
//! being live. No unsafe code.

#![deny(unsafe_code)]

use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use crate::fds::TrackedFd;
use crate::shm::{Region, SharedSemaphore};
use crate::stream::Worker;

/// Why an object is no longer live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GoneWhy {
    /// Destroyed / freed by its own call.
    Destroyed,
    /// Its context was destroyed with cuCtxDestroy.
    ContextDestroyed,
    /// Its (primary) context was reset with cuDevicePrimaryCtxReset.
    ContextReset,
    /// Its primary context was released to zero references.
    ContextReleased,
}

impl GoneWhy {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            GoneWhy::Destroyed => "it was already destroyed",
            GoneWhy::ContextDestroyed => "its context was destroyed (cuCtxDestroy) and took it along",
            GoneWhy::ContextReset => "its primary context was reset (cuDevicePrimaryCtxReset) and took it along",
            GoneWhy::ContextReleased => {
                "its primary context was released to zero references (cuDevicePrimaryCtxRelease) and took it along"
            }
        }
    }
}

/// A simulated context.
pub(crate) struct Ctx {
    pub(crate) device: i32,
    pub(crate) primary: bool,
}

/// A device's primary context.
pub(crate) struct Primary {
    pub(crate) handle: u64,
    pub(crate) refcount: u32,
}

/// A stream created with cuStreamCreate.
pub(crate) struct StreamObj {
    pub(crate) ctx: u64,
    pub(crate) blocking: bool,
    pub(crate) worker: Worker,
}

/// An imported external memory.
pub(crate) struct MemObj {
    pub(crate) ctx: u64,
    /// The simulator's own descriptor for the memory (the caller's one was
    /// closed on import, as the real driver does); its close is checked.
    pub(crate) fd: TrackedFd,
    /// Real size of the file.
    pub(crate) file_len: u64,
    /// Size declared at import.
    pub(crate) size: u64,
    /// Imported from an NvSciBuf object (mipmapped arrays need 1 level).
    pub(crate) nvscibuf: bool,
}

/// What an address range in the "device" address space is.
#[derive(Clone, Copy)]
pub(crate) enum AllocKind {
    /// cuMemAlloc.
    Alloc,
    /// cuMemHostAlloc: pinned host memory (the device address is the host
    /// address, as with unified addressing); `mapped` when allocated with
    /// `CU_MEMHOSTALLOC_DEVICEMAP`, which device access needs.
    Host {
        /// Allocated (or registered) with DEVICEMAP.
        mapped: bool,
        /// The caller's memory page-locked with `cuMemHostRegister` (its
        /// region is borrowed), not an allocation of `cuMemHostAlloc`.
        registered: bool,
    },
    /// cuExternalMemoryGetMappedBuffer of this memory handle.
    Mapped,
}

/// A live device-memory range (allocation or mapped buffer).
pub(crate) struct AllocObj {
    pub(crate) ctx: u64,
    pub(crate) len: usize,
    pub(crate) kind: AllocKind,
    pub(crate) _region: Region,
}

/// A mapped mipmapped array.
pub(crate) struct MipObj {
    pub(crate) ctx: u64,
    pub(crate) levels: Vec<u64>,
    pub(crate) _region: Region,
}

/// One level of a mipmapped array.
#[derive(Clone, Copy)]
pub(crate) struct ArrayObj {
    pub(crate) ptr: usize,
    pub(crate) row_bytes: usize,
    pub(crate) height: usize,
    pub(crate) depth: usize,
}

/// What a semaphore was imported from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SemSource {
    OpaqueFd,
    TimelineFd,
    NvSciSync {
        object_id: u64,
        can_signal: bool,
        can_wait: bool,
    },
}

/// An imported external semaphore.
pub(crate) struct SemObj {
    pub(crate) ctx: u64,
    pub(crate) sem: Arc<SharedSemaphore>,
    pub(crate) _fd: Option<TrackedFd>,
    pub(crate) source: SemSource,
    /// Signals/waits enqueued on a stream and not yet executed.
    pub(crate) outstanding: Arc<AtomicUsize>,
}

/// A sync object registered by the NvSci side (or by
/// [`crate::Sim::create_sync_object`]) so that CUDA can import it.
pub(crate) struct SyncObjectEntry {
    pub(crate) id: u64,
    pub(crate) sem: Arc<SharedSemaphore>,
    pub(crate) can_signal: bool,
    pub(crate) can_wait: bool,
}

/// A buffer object registered for `NVSCIBUF` memory import.
pub(crate) struct BufObjectEntry {
    pub(crate) fd: OwnedFd,
    pub(crate) size: u64,
}

/// The completion state of one event, shared with the stream work that
/// completes it.
#[derive(Default)]
pub(crate) struct EventCore {
    pub(crate) state: std::sync::Mutex<EventState>,
    pub(crate) changed: std::sync::Condvar,
}

/// Records made and completed (a record completes when the stream work
/// queued before it has run).
#[derive(Default, Clone, Copy)]
pub(crate) struct EventState {
    /// Records made so far.
    pub(crate) recorded: u64,
    /// The highest record that completed.
    pub(crate) completed: u64,
    /// When the last completed record completed.
    pub(crate) stamp: Option<std::time::Instant>,
}

impl EventCore {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, EventState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks record `n` complete (records complete in stream order).
    pub(crate) fn complete(&self, n: u64) {
        let mut st = self.lock();
        if n > st.completed {
            st.completed = n;
            st.stamp = Some(std::time::Instant::now());
        }
        drop(st);
        self.changed.notify_all();
    }
}

/// An event made with cuEventCreate.
pub(crate) struct EventObj {
    pub(crate) ctx: u64,
    pub(crate) flags: u32,
    pub(crate) core: Arc<EventCore>,
}

/// A module loaded with cuModuleLoadData: its entries, each a registered kernel.
pub(crate) struct ModuleObj {
    pub(crate) ctx: u64,
    pub(crate) entries: std::collections::HashMap<String, crate::kernels::Registered>,
}

/// A function of a loaded module.
pub(crate) struct FuncObj {
    pub(crate) module: u64,
    pub(crate) name: String,
    pub(crate) kernel: crate::kernels::Registered,
}

/// An NVRTC program.
pub(crate) struct ProgramObj {
    pub(crate) source: String,
    pub(crate) name: String,
    /// The module image after a successful compile.
    pub(crate) image: Option<String>,
    /// The log of the last compile.
    pub(crate) log: String,
}
