//! A software implementation of the tegra-interop function table: a
//! simulated CUDA driver for tests without a GPU.
//!
//! [`Sim::new`] makes an isolated simulated driver; [`Sim::table`] (or
//! `Sim::backend`, feature `driver`) gives its C entry points. They behave like the real
//! driver did in the project's measurements (same codes, and the same fd
//! effects: an `OPAQUE_FD` memory import that fails after its parameters
//! were accepted closes the fd it was given; other failures keep it),
//! with four differences made for testing:
//!
//! * where the real driver crashes (double destroy, destroy after a context
//!   reset, use after free) the simulator returns an error code and records a
//!   [`Diagnostic`] (also written to stderr unless
//!   [`Sim::set_diagnostic_echo`] turned that off), so a test sees the bug;
//! * it keeps a [`Ledger`] of live objects, descriptors it holds and pending
//!   stream work, which must be clean after a correct teardown;
//! * it can fail the N-th call ([`Sim::fail_at`]) or the N-th call of one
//!   entry point ([`Sim::fail_symbol`]) with a chosen code;
//! * it keeps an fd ledger ([`Sim::fd_events`]) and checks every close it
//!   makes: a number already closed by someone else (a double close) or now
//!   naming another file (a foreign fd) is reported and left alone.
//!
//! Memory and semaphores are real shared memory (memfd): the [`export`]
//! module is the producer side (standing in for Vulkan), and data written on
//! either side is visible on the other.
//!
//! ```
//! use tegra_interop_sim::Sim;
//!
//! let sim = Sim::new()?;
//! let table = sim.table();
//! let cu_init = table.cuda.cuInit.unwrap();
//! // SAFETY: cuInit takes a flags word and nothing else.
//! assert_eq!(unsafe { cu_init(0) }.0, 0);
//! assert!(sim.ledger().is_clean());
//! # Ok::<(), tegra_interop_sim::SimError>(())
//! ```
//!
//! See the crate README for the list of behaviours and the codes chosen
//! where the real driver's answer is unknown.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(unsafe_code)]

mod abi;
mod cmem;
pub mod codes;
mod config;
mod cuda;

/// EGL images made by the simulator (the EGL side of `cuGraphicsEGLRegisterImage`):
/// see [`Sim::create_egl_image`].
pub mod egl {
    pub use crate::cuda::egl::{EglImageFormat, EglPlaneLayout, SimEglImage};
    pub use crate::cuda::egl_stream::{EglStreamMode, EglStreamState, SimEglStream};
}
pub mod export;
mod fds;
pub mod fence;
mod instance;
mod journal;
pub mod kernels;
mod nvrtc;
pub mod nvsci;
mod objects;
mod report;
mod shm;
mod slots;
mod stream;
mod trampolines;

use std::ffi::c_void;
use std::fmt;
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
#[cfg(feature = "driver")]
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

#[cfg(feature = "driver")]
use tegra_interop_driver::Backend;
use tegra_interop_sys::nvsci::NvSciSyncFence;
pub use tegra_interop_sys::table::FunctionTable;

pub use config::*;
pub use fds::{FdAction, FdEvent};
pub use journal::{KeptRecords, LOG_LIMIT};
pub use nvsci::NvSciRelease;
pub use objects::*;
pub use report::*;
pub use shm::SemaphoreKind;
pub use slots::SLOTS;

use instance::{BufObjectEntry, Injection, Instance, SyncObjectEntry, Tag};
use shm::{SharedSemaphore, WaitEnd};

/// Slots whose `Sim` was dropped while a backend made from it was still
/// alive: they stay taken (answering DEINITIALIZED) until that backend goes.
#[cfg(feature = "driver")]
static ZOMBIES: Mutex<Vec<(usize, Arc<Backend>)>> = Mutex::new(Vec::new());

#[cfg(feature = "driver")]
fn reap_zombies() {
    let mut z = ZOMBIES.lock().unwrap_or_else(|e| e.into_inner());
    z.retain(|(slot, b)| {
        if Arc::strong_count(b) == 1 {
            slots::release(*slot);
            false
        } else {
            true
        }
    });
}

/// One simulated CUDA driver. Dropping it frees everything it holds and its
/// slot.
pub struct Sim {
    inner: Arc<Instance>,
    slot: usize,
    #[cfg(feature = "driver")]
    backend: OnceLock<Arc<Backend>>,
}

impl fmt::Debug for Sim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sim")
            .field("slot", &self.slot)
            .field("calls", &self.calls())
            .field("ledger", &self.ledger())
            .finish()
    }
}

impl Sim {
    /// A simulator of the default machine ([`SimConfig::default`]).
    ///
    /// # Errors
    /// [`SimError::NoFreeSlot`] when all slots stay taken for
    /// [`SimConfig::slot_wait`].
    pub fn new() -> Result<Sim, SimError> {
        Sim::with_config(SimConfig::default())
    }

    /// A simulator of the given machine.
    ///
    /// # Errors
    /// [`SimError::NoFreeSlot`] when all slots stay taken for
    /// [`SimConfig::slot_wait`]; [`SimError::IpcConfig`] when NvSci is on
    /// and the NvSciIpc configuration named by
    /// [`SimConfig::nvsciipc_config`] cannot be used (the file and the
    /// reason).
    pub fn with_config(config: SimConfig) -> Result<Sim, SimError> {
        if let Some(path) = config.nvsciipc_config.as_deref().filter(|_| config.nvsci) {
            nvsci::ipc::IpcTable::load(path).map_err(SimError::IpcConfig)?;
        }
        let deadline = Instant::now().checked_add(config.slot_wait);
        let inner = Arc::new_cyclic(|me| Instance::new(config, me.clone()));
        loop {
            #[cfg(feature = "driver")]
            reap_zombies();
            if let Some(slot) = slots::claim(&inner) {
                return Ok(Sim {
                    inner,
                    slot,
                    #[cfg(feature = "driver")]
                    backend: OnceLock::new(),
                });
            }
            if deadline.is_none_or(|d| Instant::now() >= d) {
                return Err(SimError::NoFreeSlot { slots: SLOTS });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.inner.config
    }

    /// The slot this simulator's entry points are bound to.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The function table: the CUDA part is this simulator (without the
    /// entry points introduced after [`SimConfig::driver_version`], as an
    /// older driver lacks them); the NvSci parts
    /// are its simulated NvSci ([`nvsci`]) when [`SimConfig::nvsci`] is set,
    /// else empty (like a machine without the NvSci libraries).
    ///
    /// The pointers stay bound to this simulator's slot: do not call them
    /// after the `Sim` is dropped (they answer DEINITIALIZED while the slot
    /// is free, but a later `Sim` may reuse the slot). `Sim::backend`
    /// does not have this problem.
    pub fn table(&self) -> FunctionTable {
        let mut table = FunctionTable {
            cuda: slots::cuda_table(self.slot),
            ..FunctionTable::empty()
        };
        // An older driver lacks the symbols of later releases.
        trampolines::without_newer(&mut table.cuda, self.inner.config.driver_version);
        if self.inner.config.nvsci {
            table.nvscibuf = nvsci::buf_table(self.slot);
            table.nvscisync = nvsci::sync_table(self.slot, self.inner.config.nvsci_release);
            table.nvsciipc = nvsci::ipc_table(self.slot, self.inner.config.nvsci_release);
        }
        if self.inner.config.nvrtc {
            table.nvrtc = trampolines::nvrtc_table(self.slot);
        }
        table
    }

    /// A driver backend over [`Sim::table`] (the same one on every call).
    ///
    /// Only with the feature `driver`: the simulator itself depends on
    /// `tegra-interop-sys` alone (it is the driver's test double, so it must
    /// not need the crate it tests); the feature is the convenience the
    /// driver's and the facade's tests enable (their dev-dependency on this
    /// crate names it). Without it, `unsafe { Backend::from_table("sim",
    /// sim.table()) }` does the same (sound for the reasons below), minus the
    /// slot keep-alive described below.
    ///
    /// If the `Sim` is dropped while clones of the backend are alive, the
    /// simulator shuts down (every call answers DEINITIALIZED, as the real
    /// driver does after its exit handlers ran) and its slot stays reserved
    /// until the last clone is gone, so stale calls never reach another
    /// simulator.
    ///
    /// # Why this is safe
    ///
    /// [`Backend::from_table`] is `unsafe` because the driver trusts what
    /// the table's entries do. The simulator's table keeps every point of
    /// its `# Safety` list, which is why this function is not `unsafe`:
    ///
    /// 1. its entries are the trampolines generated from the same entry
    ///    point lists as the `PFN_` types (each field is typed by its
    ///    `PFN_`; a mismatch does not compile);
    /// 2. they are Rust: out-pointers are written once, with their pointee
    ///    type, only after the arguments were checked (NULL refused), and
    ///    arrays only within the counts given;
    /// 3. attribute values and export descriptors point into memory the
    ///    simulator keeps for the list's life or until the matching free,
    ///    holding the length reported;
    /// 4. handles are keys into the simulator's tables: an unknown, stale or
    ///    released one is answered with an error code, never dereferenced;
    /// 5. host functions run once from the simulator's stream, or never
    ///    when the launch is refused;
    /// 6. imports of fds follow the measured ownership rules (see the
    ///    crate's README table); exported fds are new descriptors; the event
    ///    fd stays the endpoint's;
    /// 7. all state is behind one lock per simulator, and no entry unwinds
    ///    (every trampoline catches panics and answers an error code).
    ///
    /// The `sim_upholds_the_table_contract` test checks the parts of this
    /// that can be checked from outside: every generated entry is present,
    /// and the conformance suite passes over the backend.
    #[cfg(feature = "driver")]
    pub fn backend(&self) -> Arc<Backend> {
        Arc::clone(self.backend.get_or_init(|| {
            // SAFETY: the simulator's table keeps `from_table`'s contract
            // (the list above).
            #[allow(unsafe_code)]
            unsafe {
                Backend::from_table("sim", self.table())
            }
        }))
    }

    /// What the simulator holds now.
    pub fn ledger(&self) -> Ledger {
        self.inner.lock_state().ledger()
    }

    /// Number of counted calls so far (every CUDA entry point except the
    /// pure lookups `cuGetErrorName` / `cuGetErrorString`). The next call
    /// has this index.
    pub fn calls(&self) -> u64 {
        self.inner.calls()
    }

    /// The entry points called most recently, in order: the last
    /// [`LOG_LIMIT`] calls (all of them while [`Sim::calls`] is at most
    /// that; then entry `i` is call `calls() - len + i`, see
    /// [`Sim::kept_records`]). Bounded so that a long run stays at a
    /// constant size.
    pub fn call_log(&self) -> Vec<&'static str> {
        self.inner.lock_control().log.to_vec()
    }

    /// The sizes of the simulator's bounded logs (call log, memsync log,
    /// destroyed handles) and how many entries each forgot.
    pub fn kept_records(&self) -> KeptRecords {
        let (calls, calls_forgotten) = {
            let c = self.inner.lock_control();
            (c.log.len(), c.log.dropped())
        };
        let st = self.inner.lock_state();
        KeptRecords {
            calls,
            calls_forgotten,
            memsync: st.nvsci.memsync.len(),
            memsync_forgotten: st.nvsci.memsync.dropped(),
            gone: st.gone.len(),
            gone_forgotten: st.gone.forgotten(),
        }
    }

    /// Makes the call with index `call_index` (0-based, see [`Sim::calls`])
    /// return `code` without doing anything else, except for what the
    /// measured driver does with an fd on failure: an injected failure of an
    /// `OPAQUE_FD` memory import closes the fd it was handed unless `code` is
    /// INVALID_VALUE (1), INVALID_CONTEXT (201), NOT_INITIALIZED (3) or
    /// DEINITIALIZED (4). The H200 kept the fd after parameter errors and
    /// INVALID_CONTEXT and closed it after failures of the import itself, so
    /// those codes stand for the first kind and every other code for the
    /// second (a choice derived from the measurement). Every other import
    /// leaves the fd to the caller.
    pub fn fail_at(&self, call_index: u64, code: u32) {
        self.inner.lock_control().injections.push(Injection::At {
            index: call_index,
            code,
        });
    }

    /// Makes the `nth` (0-based) call of entry point `symbol` (C name, as in
    /// the table, e.g. `"cuImportExternalMemory"`) return `code`.
    pub fn fail_symbol(&self, symbol: &str, nth: u64, code: u32) {
        self.inner
            .lock_control()
            .injections
            .push(Injection::Symbol {
                symbol: symbol.to_owned(),
                nth,
                code,
            });
    }

    /// Removes failures that have not fired yet.
    pub fn clear_failures(&self) {
        self.inner.lock_control().injections.clear();
    }

    /// How many injected failures have fired.
    pub fn injected_failures(&self) -> u64 {
        self.inner.lock_control().injected
    }

    /// All diagnostics recorded so far.
    pub fn diagnostics(&self) -> Vec<Diagnostic> {
        self.inner.flush_fd_issues();
        self.inner.lock_control().diagnostics.clone()
    }

    /// Whether each diagnostic is also written to stderr when it is
    /// recorded (`true` by default, see [`SimConfig::echo_diagnostics`]).
    /// Turn it off in a test that provokes misuse on purpose and assert on
    /// [`Sim::take_diagnostics`] instead; every diagnostic is recorded
    /// either way.
    pub fn set_diagnostic_echo(&self, on: bool) {
        self.inner.set_echo(on);
    }

    /// Returns and forgets the diagnostics recorded so far.
    pub fn take_diagnostics(&self) -> Vec<Diagnostic> {
        self.inner.flush_fd_issues();
        std::mem::take(&mut self.inner.lock_control().diagnostics)
    }

    /// The fd ledger: every descriptor the simulator duplicated for an
    /// imported object and every descriptor it closed (its own duplicates,
    /// and the caller's descriptor when an import took it), in order. A
    /// close of a number that was no longer open, or that referred to
    /// another file, shows here ([`FdAction::FoundClosed`],
    /// [`FdAction::FoundForeign`]) and as a diagnostic
    /// ([`DiagnosticKind::DoubleClose`], [`DiagnosticKind::ForeignFd`]).
    pub fn fd_events(&self) -> Vec<FdEvent> {
        self.inner
            .fds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .events
            .clone()
    }

    /// Simulates the driver's exit handlers: everything is freed and every
    /// later call (`cuInit` included) returns `CUDA_ERROR_DEINITIALIZED`.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    /// Whether [`Sim::shutdown`] ran.
    pub fn is_shut_down(&self) -> bool {
        self.inner.is_shut()
    }

    /// Registers `body` as the kernel `spec` names (replacing a kernel of
    /// the same name), in the launch-level form: `cuLaunchKernel` runs
    /// `body` once for the whole launch, in stream order.
    ///
    /// This form is only as strict as `body`: a GPU runs the kernel once
    /// per thread of the grid it is launched with, so `body` must itself
    /// honour [`KernelLaunch::grid`](kernels::KernelLaunch::grid) and
    /// [`block`](kernels::KernelLaunch::block) and touch nothing a thread
    /// of that grid would not (a body that processes the whole buffer
    /// whatever the grid passes where the GPU leaves bytes untouched).
    /// Prefer [`Sim::register_block_kernel`] or
    /// [`Sim::register_thread_kernel`], which give the body the geometry
    /// the way CUDA code sees it (see [`kernels`]).
    ///
    /// With any form, the simulator's NVRTC then compiles sources that
    /// declare the kernel with the same parameter sizes and
    /// `cuModuleLoadData` loads images naming it. Modules loaded before
    /// keep the body they had.
    pub fn register_kernel<F>(&self, spec: kernels::KernelSpec, body: F)
    where
        F: Fn(&mut kernels::KernelLaunch<'_>) -> Result<(), kernels::KernelFault>
            + Send
            + Sync
            + 'static,
    {
        let params = spec.param_sizes().to_vec();
        self.insert_kernel(
            spec,
            kernels::Registered::per_launch(params, Arc::new(body)),
        );
    }

    /// Registers `body` as the kernel `spec` names, run once per block of
    /// each launch's grid (`blockIdx`, `blockDim`, `gridDim` in
    /// [`kernels::Block`]), blocks last to first, in stream order; the
    /// first fault stops the launch. The way to write a twin that touches
    /// exactly what the CUDA kernel touches on the grid it is launched
    /// with, fast enough for frame-sized buffers (see [`kernels`]). A
    /// launch of more than [`kernels::MAX_SIMULATED_BLOCKS`] blocks is
    /// refused (INVALID_VALUE).
    pub fn register_block_kernel<F>(&self, spec: kernels::KernelSpec, body: F)
    where
        F: Fn(&kernels::Block<'_>) -> Result<(), kernels::KernelFault> + Send + Sync + 'static,
    {
        let params = spec.param_sizes().to_vec();
        self.insert_kernel(spec, kernels::Registered::per_block(params, Arc::new(body)));
    }

    /// Registers `body` as the kernel `spec` names, run once per thread of
    /// each launch (`threadIdx` too, in [`kernels::Thread`]), the closest
    /// to the CUDA code; each memory access looks its allocation up, so
    /// prefer [`Sim::register_block_kernel`] for large buffers. A launch of
    /// more than [`kernels::MAX_SIMULATED_THREADS`] threads is refused
    /// (INVALID_VALUE).
    pub fn register_thread_kernel<F>(&self, spec: kernels::KernelSpec, body: F)
    where
        F: Fn(&kernels::Thread<'_>) -> Result<(), kernels::KernelFault> + Send + Sync + 'static,
    {
        let params = spec.param_sizes().to_vec();
        self.insert_kernel(
            spec,
            kernels::Registered::per_thread(params, Arc::new(body)),
        );
    }

    fn insert_kernel(&self, spec: kernels::KernelSpec, kernel: kernels::Registered) {
        self.inner
            .lock_state()
            .kernels
            .kernels
            .insert(spec.name().to_string(), kernel);
    }

    /// Makes a sync object that `cuImportExternalSemaphore` accepts as an
    /// `NVSCISYNC` handle (pass [`SyncObjectHandle::as_ptr`]).
    ///
    /// This is the registry the NvSci part of the simulator builds on
    /// (`NvSciSyncObjAlloc` will create its objects through it); tests can
    /// use it directly to check the CUDA side of NvSciSync semaphores.
    pub fn create_sync_object(&self, spec: SyncObjectSpec) -> io::Result<SyncObjectHandle> {
        let (_fd, sem) = SharedSemaphore::create(
            SemaphoreKind::Deterministic {
                wrap32: spec.wrap32,
            },
            spec.initial,
        )?;
        let sem = Arc::new(sem);
        let ptr = instance::new_handle(Tag::SyncObject) as usize;
        let id = ptr as u64;
        self.inner.lock_state().sync_objects.insert(
            ptr,
            SyncObjectEntry {
                id,
                sem: Arc::clone(&sem),
                can_signal: spec.can_signal,
                can_wait: spec.can_wait,
            },
        );
        Ok(SyncObjectHandle {
            inst: Arc::clone(&self.inner),
            ptr,
            id,
            sem,
        })
    }

    /// Makes a buffer object of `size` bytes that `cuImportExternalMemory`
    /// accepts as an `NVSCIBUF` handle, plus the CPU view of its bytes.
    pub fn create_buf_object(
        &self,
        size: usize,
    ) -> io::Result<(BufObjectHandle, export::ExportedMemory)> {
        let (fd, mem) = export::memory(size)?;
        let ptr = instance::new_handle(Tag::BufObject) as usize;
        let keep = fd.as_fd().try_clone_to_owned()?;
        drop(fd);
        self.inner.lock_state().buf_objects.insert(
            ptr,
            BufObjectEntry {
                fd: keep,
                size: size as u64,
            },
        );
        Ok((
            BufObjectHandle {
                inst: Arc::clone(&self.inner),
                ptr,
            },
            mem,
        ))
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        #[cfg(feature = "driver")]
        if let Some(b) = self.backend.take().filter(|b| Arc::strong_count(b) > 1) {
            self.inner.shutdown();
            ZOMBIES
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((self.slot, b));
            return;
        }
        slots::release(self.slot);
        self.inner.shutdown();
    }
}
