//! One simulated driver: its objects, counters, failure injection and
//! diagnostics. The C entry points reach it through its slot (see
//! `slots`), the Rust API through [`crate::Sim`].
//!
//! The per-object records are in `records`, the lock-protected [`State`]
//! and its queries in `state`; this file holds handle values, failure
//! injection, the call being served ([`Call`]) and [`Instance`] itself.

#![deny(unsafe_code)]

mod records;
mod state;

pub(crate) use records::{
    AllocKind, AllocObj, ArrayObj, BufObjectEntry, Ctx, EventCore, EventObj, FuncObj, GoneWhy,
    MemObj, MipObj, ModuleObj, Primary, ProgramObj, SemObj, SemSource, StreamObj, SyncObjectEntry,
};
pub(crate) use state::State;

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use tegra_interop_sys::cuda::CUresult;

use crate::fds::SharedFdLedger;
use crate::{codes, Diagnostic, DiagnosticKind, SimConfig};

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
    Event = 0x7c07,
    Module = 0x7c08,
    Function = 0x7c09,
    GraphicsResource = 0x7c20,
    EglConnection = 0x7c21,
    Program = 0x7c30,
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
    /// The most recent calls (bounded: see `journal`).
    pub(crate) log: crate::journal::Journal<&'static str>,
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
    /// Diagnostics are also written to stderr (see `SimConfig::echo_diagnostics`).
    echo: AtomicBool,
    pub(crate) state: Mutex<State>,
    pub(crate) control: Mutex<Control>,
    /// Every descriptor the simulator opened or closed.
    pub(crate) fds: SharedFdLedger,
    /// This instance, for stream work that runs later (a weak reference:
    /// queued work does not keep a dropped simulator alive).
    me: std::sync::Weak<Instance>,
}

/// The call being served, for diagnostics.
pub(crate) struct Call<'a> {
    pub(crate) inst: &'a Instance,
    pub(crate) index: Option<u64>,
    pub(crate) symbol: &'static str,
}

impl Call<'_> {
    /// Records a diagnostic (and writes it to stderr unless the
    /// simulator's diagnostic echo is off).
    pub(crate) fn diag(&self, kind: DiagnosticKind, message: String) {
        self.inst.diag(self.index, self.symbol, kind, message);
    }

    /// Locks the simulator state.
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.inst.lock_state()
    }
}

impl Instance {
    pub(crate) fn new(config: SimConfig, me: std::sync::Weak<Instance>) -> Instance {
        let mut state = State::default();
        for _ in 0..config.devices {
            state.primaries.push(Primary {
                handle: new_handle(Tag::Context),
                refcount: 0,
            });
        }
        let echo = config.echo_diagnostics;
        let inst = Instance {
            id: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            config,
            calls: AtomicU64::new(0),
            shut: AtomicBool::new(false),
            echo: AtomicBool::new(echo),
            state: Mutex::new(state),
            control: Mutex::new(Control::default()),
            fds: SharedFdLedger::default(),
            me,
        };
        inst.set_echo(echo);
        inst
    }

    /// Whether diagnostics are also written to stderr.
    pub(crate) fn set_echo(&self, on: bool) {
        self.echo.store(on, Ordering::Release);
        self.fds.lock().unwrap_or_else(|e| e.into_inner()).quiet = !on;
    }

    /// A weak reference to this instance, for stream work.
    pub(crate) fn weak(&self) -> std::sync::Weak<Instance> {
        self.me.clone()
    }

    pub(crate) fn lock_state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state lock for stream work: `None` once `cancelled()` says the
    /// stream is being torn down. A worker is joined by whoever removes its
    /// stream, sometimes with the state lock held (a context destroyed with
    /// queued work), so stream work never blocks on the lock: it tries, and
    /// gives up when its stream is cancelled.
    pub(crate) fn lock_state_for_work(
        &self,
        cancelled: impl Fn() -> bool,
    ) -> Option<MutexGuard<'_, State>> {
        loop {
            if cancelled() {
                return None;
            }
            match self.state.try_lock() {
                Ok(g) => return Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
            }
        }
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
        if self.echo.load(Ordering::Acquire) {
            // Written with `let _ =` so a closed stderr cannot panic here.
            let _ = writeln!(std::io::stderr(), "tegra-interop-sim[{}]: {}", self.id, d);
        }
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
