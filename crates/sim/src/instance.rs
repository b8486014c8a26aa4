//! One simulated driver: its objects, counters, failure injection and
//! diagnostics. The C entry points reach it through its slot (see
//! `slots`), the Rust API through [`crate::Sim`].

#![deny(unsafe_code)]

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tegra_interop_sys::cuda::CUresult;

use crate::fds::{SharedFdLedger, TrackedFd};
use crate::shm::{Region, SharedSemaphore};
use crate::stream::Worker;
use crate::{codes, Diagnostic, DiagnosticKind, Ledger, SimConfig};

/// Kind tags in the upper bits of simulated handle values. The values are
/// never dereferenced; they are unique for the whole process (never reused),
/// so a stale or foreign handle is always recognised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tag {
    Context = 0x7c01,
    Stream = 0x7c02,
    Memory = 0x7c03,
    Semaphore = 0x7c04,
    Mipmap = 0x7c05,
    Array = 0x7c06,
    SyncObject = 0x7c10,
    BufObject = 0x7c11,
    GraphicsResource = 0x7c20,
    EglConnection = 0x7c21,
}

static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);

/// A new process-unique handle value with `tag` in bits 48..64.
pub(crate) fn new_handle(tag: Tag) -> u64 {
    let n = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) & 0x0000_0fff_ffff_ffff;
    ((tag as u64) << 48) | (n << 4)
}

static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// Current context per simulator instance on this thread.
    static CURRENT: RefCell<HashMap<u64, u64>> = RefCell::new(HashMap::new());
}

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
pub(crate) enum AllocKind {
    /// cuMemAlloc.
    Alloc,
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

/// Everything a simulator owns, behind one lock.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) initialized: bool,
    pub(crate) contexts: HashMap<u64, Ctx>,
    pub(crate) primaries: Vec<Primary>,
    pub(crate) streams: HashMap<u64, StreamObj>,
    /// The NULL stream of each context, made on first use.
    pub(crate) null_streams: HashMap<u64, Worker>,
    /// Destroyed streams still finishing their work.
    /// Workers of destroyed streams, with their context: their queued work
    /// still runs (as on the real driver) and context synchronisation waits for it.
    pub(crate) retired: Vec<(u64, Worker)>,
    pub(crate) memories: HashMap<u64, MemObj>,
    pub(crate) allocations: BTreeMap<u64, AllocObj>,
    pub(crate) mipmaps: HashMap<u64, MipObj>,
    pub(crate) arrays: HashMap<u64, ArrayObj>,
    pub(crate) semaphores: HashMap<u64, SemObj>,
    /// Handles (and device addresses) that were live once, and why they
    /// are not any more.
    pub(crate) gone: HashMap<u64, GoneWhy>,
    pub(crate) sync_objects: HashMap<usize, SyncObjectEntry>,
    pub(crate) buf_objects: HashMap<usize, BufObjectEntry>,
    /// The NvSci part (modules, attribute lists, objects, endpoints).
    pub(crate) nvsci: crate::nvsci::NvSciState,
    /// EGL images made by `Sim::create_egl_image`, by handle.
    pub(crate) egl_images: HashMap<usize, crate::cuda::EglImageObj>,
    /// Registered EGL images (`CUgraphicsResource`).
    pub(crate) egl_resources: HashMap<u64, crate::cuda::EglResObj>,
    /// EGLStreams made by `Sim::create_egl_stream` and CUDA's connections.
    pub(crate) egl_streams: crate::cuda::EglStreams,
}

impl State {
    /// Enters a live device-address range (an allocation, or a mapping of an
    /// import or of a registered graphics resource) at device address `at`,
    /// backed by `region`; the address stops being "gone" if an earlier range
    /// had it. Returns the address as a device pointer.
    pub(crate) fn add_allocation(
        &mut self,
        at: *mut u8,
        ctx: u64,
        len: usize,
        kind: AllocKind,
        region: Region,
    ) -> u64 {
        let p = at as usize as u64;
        self.gone.remove(&p);
        self.allocations.insert(
            p,
            AllocObj {
                ctx,
                len,
                kind,
                _region: region,
            },
        );
        p
    }

    /// The simulator's own mapping that holds the device range
    /// `[addr, addr + n)`: a live allocation or mapped buffer, or the memory
    /// of a mapped mipmapped array.
    pub(crate) fn device_region(&self, addr: u64, n: usize) -> Option<&Region> {
        let a = usize::try_from(addr).ok()?;
        if let Some((_, obj)) = self.allocations.range(..=addr).next_back() {
            if obj._region.contains(a, n) {
                return Some(&obj._region);
            }
        }
        self.mipmaps
            .values()
            .map(|m| &m._region)
            .find(|r| r.contains(a, n))
    }

    /// Copies device memory at `addr` into `out`; `false` when the range
    /// is not simulator memory.
    pub(crate) fn device_read(&self, addr: u64, out: &mut [u8]) -> bool {
        self.device_region(addr, out.len())
            .is_some_and(|r| r.read_at(addr as usize, out))
    }

    /// Copies `data` to device memory at `addr`; `false` when the range is
    /// not simulator memory.
    pub(crate) fn device_write(&self, addr: u64, data: &[u8]) -> bool {
        self.device_region(addr, data.len())
            .is_some_and(|r| r.write_at(addr as usize, data))
    }

    /// Sets `n` bytes of device memory at `addr` to `v`; `false` when the
    /// range is not simulator memory.
    pub(crate) fn device_fill(&self, addr: u64, v: u8, n: usize) -> bool {
        self.device_region(addr, n)
            .is_some_and(|r| r.fill_at(addr as usize, v, n))
    }

    /// Removes every object of context `ctx` as the real driver frees them
    /// when the context goes; later use is reported with `why`.
    pub(crate) fn drop_context_objects(&mut self, ctx: u64, why: GoneWhy) {
        let streams: Vec<u64> = self
            .streams
            .iter()
            .filter(|(_, s)| s.ctx == ctx)
            .map(|(h, _)| *h)
            .collect();
        for h in streams {
            self.streams.remove(&h);
            self.gone.insert(h, why);
        }
        self.null_streams.remove(&ctx);
        let mems: Vec<u64> = self
            .memories
            .iter()
            .filter(|(_, m)| m.ctx == ctx)
            .map(|(h, _)| *h)
            .collect();
        for h in mems {
            self.memories.remove(&h);
            self.gone.insert(h, why);
        }
        let allocs: Vec<u64> = self
            .allocations
            .iter()
            .filter(|(_, a)| a.ctx == ctx)
            .map(|(h, _)| *h)
            .collect();
        for h in allocs {
            self.allocations.remove(&h);
            self.gone.insert(h, why);
        }
        let mips: Vec<u64> = self
            .mipmaps
            .iter()
            .filter(|(_, m)| m.ctx == ctx)
            .map(|(h, _)| *h)
            .collect();
        for h in mips {
            if let Some(m) = self.mipmaps.remove(&h) {
                for l in m.levels {
                    self.arrays.remove(&l);
                    self.gone.insert(l, why);
                }
            }
            self.gone.insert(h, why);
        }
        let sems: Vec<u64> = self
            .semaphores
            .iter()
            .filter(|(_, s)| s.ctx == ctx)
            .map(|(h, _)| *h)
            .collect();
        for h in sems {
            self.semaphores.remove(&h);
            self.gone.insert(h, why);
        }
    }

    /// Drops finished retired workers.
    pub(crate) fn reap(&mut self) {
        self.retired
            .retain(|(_, w)| !(w.finished() && w.core.pending() == 0));
    }

    pub(crate) fn ledger(&self) -> Ledger {
        let pending = self
            .streams
            .values()
            .map(|s| s.worker.core.pending())
            .sum::<usize>()
            + self
                .null_streams
                .values()
                .map(|w| w.core.pending())
                .sum::<usize>()
            + self
                .retired
                .iter()
                .map(|(_, w)| w.core.pending())
                .sum::<usize>();
        let fds =
            self.memories.len() + self.semaphores.values().filter(|s| s._fd.is_some()).count();
        Ledger {
            live_contexts: self.contexts.values().filter(|c| !c.primary).count(),
            primary_context_refs: self.primaries.iter().map(|p| p.refcount as usize).sum(),
            live_streams: self.streams.len(),
            live_memories: self.memories.len(),
            live_mappings: self
                .allocations
                .values()
                .filter(|a| matches!(a.kind, AllocKind::Mapped))
                .count()
                + self.mipmaps.len(),
            live_allocations: self
                .allocations
                .values()
                .filter(|a| matches!(a.kind, AllocKind::Alloc))
                .count(),
            live_semaphores: self.semaphores.len(),
            live_graphics_resources: self.egl_resources.len() + self.egl_streams.held_frames(),
            live_egl_connections: self.egl_streams.live_connections(),
            open_fds: fds,
            pending_work: pending,
        }
    }
}

/// A failure to inject.
#[derive(Clone, Debug)]
pub(crate) enum Injection {
    /// Fail the call with this 0-based index (counting every counted call).
    At { index: u64, code: u32 },
    /// Fail the `nth` (0-based) call of `symbol`.
    Symbol { symbol: String, nth: u64, code: u32 },
}

#[derive(Default)]
pub(crate) struct Control {
    pub(crate) injections: Vec<Injection>,
    pub(crate) per_symbol: HashMap<&'static str, u64>,
    pub(crate) log: Vec<&'static str>,
    pub(crate) diagnostics: Vec<Diagnostic>,
    pub(crate) injected: u64,
    /// Injected failures of entry points that apply them themselves (so
    /// that the fd effects of the real driver's failure happen too), by
    /// call index.
    pub(crate) deferred: HashMap<u64, CUresult>,
}

/// Entry points whose injected failures are handed to the implementation
/// (see [`Instance::take_injected`]) instead of returning at once: an
/// `OPAQUE_FD` memory import that fails past its parameter checks closes the
/// fd on the real driver, so an injected failure with a code of that stage
/// closes it too.
const DEFERRED_INJECTION: &[&str] = &["cuImportExternalMemory"];

/// One simulator.
pub(crate) struct Instance {
    pub(crate) id: u64,
    pub(crate) config: SimConfig,
    calls: AtomicU64,
    shut: AtomicBool,
    pub(crate) state: Mutex<State>,
    pub(crate) control: Mutex<Control>,
    /// Every descriptor the simulator opened or closed.
    pub(crate) fds: SharedFdLedger,
}

/// The call being served, for diagnostics.
pub(crate) struct Call<'a> {
    pub(crate) inst: &'a Instance,
    pub(crate) index: Option<u64>,
    pub(crate) symbol: &'static str,
}

impl Call<'_> {
    /// Records a diagnostic (and prints it to stderr).
    pub(crate) fn diag(&self, kind: DiagnosticKind, message: String) {
        self.inst.diag(self.index, self.symbol, kind, message);
    }

    /// Locks the simulator state.
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.inst.lock_state()
    }
}

impl Instance {
    pub(crate) fn new(config: SimConfig) -> Instance {
        let mut state = State::default();
        for _ in 0..config.devices {
            state.primaries.push(Primary {
                handle: new_handle(Tag::Context),
                refcount: 0,
            });
        }
        Instance {
            id: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            config,
            calls: AtomicU64::new(0),
            shut: AtomicBool::new(false),
            state: Mutex::new(state),
            control: Mutex::new(Control::default()),
            fds: SharedFdLedger::default(),
        }
    }

    pub(crate) fn lock_state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn lock_control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Acquire)
    }

    pub(crate) fn is_shut(&self) -> bool {
        self.shut.load(Ordering::Acquire)
    }

    /// The driver's exit handlers ran: free everything, refuse all calls.
    pub(crate) fn shutdown(&self) {
        self.shut.store(true, Ordering::Release);
        let old = std::mem::take(&mut *self.lock_state());
        drop(old);
    }

    pub(crate) fn diag(
        &self,
        index: Option<u64>,
        symbol: &'static str,
        kind: DiagnosticKind,
        message: String,
    ) {
        let d = Diagnostic {
            call_index: index,
            symbol,
            kind,
            message,
        };
        // Written with `let _ =` so a closed stderr cannot panic here.
        let _ = writeln!(std::io::stderr(), "tegra-interop-sim[{}]: {}", self.id, d);
        self.lock_control().diagnostics.push(d);
    }

    /// Counts a call, logs it, and applies shutdown and failure injection.
    /// `Err(code)` means: return `code` without doing anything.
    pub(crate) fn enter(&self, symbol: &'static str) -> Result<u64, CUresult> {
        let index = {
            let mut c = self.lock_control();
            let index = self.calls.fetch_add(1, Ordering::AcqRel);
            c.log.push(symbol);
            let nth = {
                let n = c.per_symbol.entry(symbol).or_insert(0);
                let nth = *n;
                *n += 1;
                nth
            };
            if self.is_shut() {
                return Err(codes::DEINITIALIZED);
            }
            let hit = c.injections.iter().position(|inj| match inj {
                Injection::At { index: i, .. } => *i == index,
                Injection::Symbol {
                    symbol: s, nth: n, ..
                } => s == symbol && *n == nth,
            });
            if let Some(pos) = hit {
                let inj = c.injections.remove(pos);
                c.injected += 1;
                let code = match inj {
                    Injection::At { code, .. } | Injection::Symbol { code, .. } => code,
                };
                if DEFERRED_INJECTION.contains(&symbol) {
                    c.deferred.insert(index, CUresult(code));
                    return Ok(index);
                }
                return Err(CUresult(code));
            }
            index
        };
        Ok(index)
    }

    /// The injected failure of call `index`, for the entry points in
    /// `DEFERRED_INJECTION` (they apply it themselves).
    pub(crate) fn take_injected(&self, index: Option<u64>) -> Option<CUresult> {
        let index = index?;
        self.lock_control().deferred.remove(&index)
    }

    /// Moves diagnostics found while dropping held descriptors into the
    /// diagnostics list.
    pub(crate) fn flush_fd_issues(&self) {
        let pending = {
            let mut l = self.fds.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::take(&mut l.pending)
        };
        if !pending.is_empty() {
            self.lock_control().diagnostics.extend(pending);
        }
    }

    /// This thread's current context for this simulator (0 = none).
    pub(crate) fn current(&self) -> u64 {
        CURRENT.with(|c| c.borrow().get(&self.id).copied().unwrap_or(0))
    }

    pub(crate) fn set_current(&self, ctx: u64) {
        CURRENT.with(|c| {
            let mut m = c.borrow_mut();
            if ctx == 0 {
                m.remove(&self.id);
            } else {
                m.insert(self.id, ctx);
            }
        });
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // Stop every worker before the memory their jobs point at goes.
        let st = std::mem::take(&mut *self.lock_state());
        drop(st);
    }
}
