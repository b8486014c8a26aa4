//! Simulated NvSci objects made directly by a test (`Sim::sync_object`, `Sim::buf_object`).

#![deny(unsafe_code)]

use super::*;

/// Permissions and counter width of a simulated NvSciSync object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncObjectSpec {
    /// CUDA may signal it (attribute list made with `CUDA_NVSCISYNC_ATTR_SIGNAL`).
    pub can_signal: bool,
    /// CUDA may wait on it (`CUDA_NVSCISYNC_ATTR_WAIT`).
    pub can_wait: bool,
    /// The counter is a 32-bit one that wraps (the usual syncpoint).
    pub wrap32: bool,
    /// Starting counter value.
    pub initial: u64,
}

impl Default for SyncObjectSpec {
    /// Signal and wait allowed, 32-bit wrapping counter starting at 0.
    fn default() -> Self {
        SyncObjectSpec {
            can_signal: true,
            can_wait: true,
            wrap32: true,
            initial: 0,
        }
    }
}

/// A simulated NvSciSync object (deterministic fences: +1 per signal).
/// Dropping it unregisters it; semaphores imported from it keep working.
pub struct SyncObjectHandle {
    pub(crate) inst: Arc<Instance>,
    pub(crate) ptr: usize,
    pub(crate) id: u64,
    pub(crate) sem: Arc<SharedSemaphore>,
}

impl fmt::Debug for SyncObjectHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncObjectHandle")
            .field("id", &self.id)
            .field("value", &self.value())
            .finish()
    }
}

impl SyncObjectHandle {
    /// The `NvSciSyncObj` value to put into the import descriptor.
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr as *mut c_void
    }

    /// The id written into this object's fences (see [`fence`]).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The current counter.
    pub fn value(&self) -> u64 {
        self.sem.value()
    }

    /// Signals from the CPU (+1), returning the fence of that signal.
    pub fn cpu_signal(&self) -> NvSciSyncFence {
        let value = self.sem.reserve_next();
        self.sem.increment();
        fence::encode(fence::SimFence {
            object_id: self.id,
            value,
        })
    }

    /// Whether `fence` (of this object) has been reached; a cleared fence
    /// is always reached; a foreign or garbage one never.
    pub fn is_reached(&self, f: &NvSciSyncFence) -> bool {
        match fence::decode(f) {
            fence::FenceContent::Cleared => true,
            fence::FenceContent::Fence(sf) if sf.object_id == self.id => self.sem.reached(sf.value),
            _ => false,
        }
    }

    /// Waits up to `timeout` for `fence`; `false` on timeout or when the
    /// fence is not one of this object.
    pub fn cpu_wait(&self, f: &NvSciSyncFence, timeout: Duration) -> bool {
        match fence::decode(f) {
            fence::FenceContent::Cleared => true,
            fence::FenceContent::Fence(sf) if sf.object_id == self.id => {
                let deadline = Instant::now().checked_add(timeout);
                self.sem.wait(sf.value, deadline, &|| false) == WaitEnd::Reached
            }
            _ => false,
        }
    }
}

impl Drop for SyncObjectHandle {
    fn drop(&mut self) {
        self.inst.lock_state().sync_objects.remove(&self.ptr);
    }
}

/// A simulated NvSciBuf object. Dropping it unregisters it; memory imported
/// from it keeps working.
pub struct BufObjectHandle {
    pub(crate) inst: Arc<Instance>,
    pub(crate) ptr: usize,
}

impl fmt::Debug for BufObjectHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufObjectHandle")
            .field("ptr", &self.ptr)
            .finish()
    }
}

impl BufObjectHandle {
    /// The `NvSciBufObj` value to put into the import descriptor.
    pub fn as_ptr(&self) -> *const c_void {
        self.ptr as *const c_void
    }
}

impl Drop for BufObjectHandle {
    fn drop(&mut self) {
        self.inst.lock_state().buf_objects.remove(&self.ptr);
    }
}
