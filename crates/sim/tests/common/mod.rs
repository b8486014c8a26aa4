//! Raw C-level helpers shared by the simulator tests.
#![allow(dead_code, unused_imports, non_snake_case)]

use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};

pub use tegra_interop_sim::{export, DiagnosticKind, FdAction, Sim, SimConfig};
pub use tegra_interop_sys::cuda::*;
pub use tegra_interop_sys::table::CudaApi;

/// Calls a table entry and gives the raw code as u32.
#[macro_export]
macro_rules! cu {
    ($api:expr, $f:ident ( $($a:expr),* $(,)? )) => {{
        let f = $api.$f.expect(concat!(stringify!($f), " missing from the table"));
        // SAFETY: test code passes arguments that satisfy the C contract (or
        // deliberately violates it in ways the simulator must catch without
        // touching invalid memory).
        #[allow(clippy::macro_metavars_in_unsafe)]
        let r = unsafe { f($($a),*) };
        r.0
    }};
}

pub const SUCCESS: u32 = 0;
pub const INVALID_VALUE: u32 = 1;
pub const NOT_INITIALIZED: u32 = 3;
pub const DEINITIALIZED: u32 = 4;
pub const INVALID_DEVICE: u32 = 101;
pub const INVALID_CONTEXT: u32 = 201;
pub const INVALID_HANDLE: u32 = 400;
pub const NOT_READY: u32 = 600;
pub const CONTEXT_IS_DESTROYED: u32 = 709;
pub const NOT_SUPPORTED: u32 = 801;
pub const UNKNOWN: u32 = 999;

/// A simulator plus its CUDA table.
pub struct Cu {
    pub sim: Sim,
    pub t: CudaApi,
}

impl Cu {
    pub fn new() -> Cu {
        Cu::with(SimConfig::default())
    }

    pub fn with(cfg: SimConfig) -> Cu {
        // Quiet: these tests provoke misuse on purpose and read the
        // diagnostics instead of printing them.
        let sim = Sim::with_config(cfg.with_diagnostic_echo(false)).unwrap();
        let t = sim.table().cuda;
        Cu { sim, t }
    }

    /// A default simulator with a current context on device 0 (for tests
    /// that never need the context's handle).
    pub fn ready() -> Cu {
        let c = Cu::new();
        let _ = c.ctx();
        c
    }

    /// cuInit + cuCtxCreate on device 0; the context is current.
    pub fn ctx(&self) -> CUcontext {
        assert_eq!(cu!(self.t, cuInit(0)), SUCCESS);
        let mut ctx: CUcontext = std::ptr::null_mut();
        assert_eq!(cu!(self.t, cuCtxCreate(&mut ctx, 0, 0)), SUCCESS);
        ctx
    }

    pub fn stream(&self) -> CUstream {
        let mut s: CUstream = std::ptr::null_mut();
        assert_eq!(cu!(self.t, cuStreamCreate(&mut s, 0)), SUCCESS);
        s
    }

    /// Imports an fd as memory of `kind`; returns (code, handle).
    pub fn import_mem_raw(&self, kind: u32, fd: RawFd, size: u64) -> (u32, CUexternalMemory) {
        let mut d = CUDA_EXTERNAL_MEMORY_HANDLE_DESC::default();
        d.type_ = CUexternalMemoryHandleType(kind);
        d.handle.fd = fd;
        d.size = size;
        let mut m: CUexternalMemory = std::ptr::null_mut();
        let r = cu!(self.t, cuImportExternalMemory(&mut m, &d));
        (r, m)
    }

    /// Imports an owned fd as OPAQUE_FD memory (the fd is consumed).
    pub fn import_mem(&self, fd: OwnedFd, size: u64) -> CUexternalMemory {
        let (r, m) = self.import_mem_raw(1, fd.into_raw_fd(), size);
        assert_eq!(r, SUCCESS);
        m
    }

    pub fn map(&self, m: CUexternalMemory, offset: u64, size: u64) -> (u32, CUdeviceptr) {
        let d = CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
            offset,
            size,
            ..Default::default()
        };
        let mut p: CUdeviceptr = 0;
        let r = cu!(self.t, cuExternalMemoryGetMappedBuffer(&mut p, m, &d));
        (r, p)
    }

    pub fn import_sem_raw(&self, kind: u32, fd: RawFd) -> (u32, CUexternalSemaphore) {
        let mut d = CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC::default();
        d.type_ = CUexternalSemaphoreHandleType(kind);
        d.handle.fd = fd;
        let mut s: CUexternalSemaphore = std::ptr::null_mut();
        let r = cu!(self.t, cuImportExternalSemaphore(&mut s, &d));
        (r, s)
    }

    pub fn import_binary(&self, fd: OwnedFd) -> CUexternalSemaphore {
        let (r, s) = self.import_sem_raw(1, fd.into_raw_fd());
        assert_eq!(r, SUCCESS);
        s
    }

    pub fn import_timeline(&self, fd: OwnedFd) -> CUexternalSemaphore {
        let (r, s) = self.import_sem_raw(9, fd.into_raw_fd());
        assert_eq!(r, SUCCESS);
        s
    }

    pub fn signal(&self, s: CUexternalSemaphore, value: u64, flags: u32, stream: CUstream) -> u32 {
        let mut p = CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default();
        p.params.fence.value = value;
        p.flags = flags;
        cu!(self.t, cuSignalExternalSemaphoresAsync(&s, &p, 1, stream))
    }

    pub fn wait(&self, s: CUexternalSemaphore, value: u64, flags: u32, stream: CUstream) -> u32 {
        let mut p = CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default();
        p.params.fence.value = value;
        p.flags = flags;
        cu!(self.t, cuWaitExternalSemaphoresAsync(&s, &p, 1, stream))
    }

    pub fn sync(&self, s: CUstream) -> u32 {
        cu!(self.t, cuStreamSynchronize(s))
    }

    pub fn query(&self, s: CUstream) -> u32 {
        cu!(self.t, cuStreamQuery(s))
    }

    pub fn dtoh(&self, p: CUdeviceptr, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        assert_eq!(
            cu!(self.t, cuMemcpyDtoH(v.as_mut_ptr().cast(), p, n)),
            SUCCESS
        );
        v
    }

    pub fn htod(&self, p: CUdeviceptr, data: &[u8]) {
        assert_eq!(
            cu!(self.t, cuMemcpyHtoD(p, data.as_ptr().cast(), data.len())),
            SUCCESS
        );
    }

    pub fn has_diag(&self, kind: DiagnosticKind) -> bool {
        self.sim.diagnostics().iter().any(|d| d.kind == kind)
    }
}

/// A memfd made by hand (not by the simulator's exporter), `len` bytes long.
pub fn memfd(name: &std::ffi::CStr, len: libc::off_t) -> OwnedFd {
    // SAFETY: `name` is NUL-terminated.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0, "memfd_create failed");
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    // SAFETY: resizing our own memfd.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), len) }, 0);
    fd
}

static FD_NUMBERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One lock for the tests of a binary that leave an fd number free on
/// purpose and expect it still free a moment later (closing the
/// simulator's own duplicate behind its back): fd numbers are process-wide,
/// so every test of that binary holds it, and no sibling test can open a
/// file onto the freed number in between (CI saw exactly that under qemu).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    FD_NUMBERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Identity of an open file (device, inode). Two opens of the same path
/// (say /dev/null) share it, so on its own it cannot tell "still our fd"
/// from "closed, and the number reused by another thread opening the same
/// path"; [`Tracked`] adds a check of the open file description.
pub fn file_id(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: all-zero is a valid `stat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat only writes to `st`; any fd number is acceptable.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev as u64, st.st_ino as u64))
}

/// `kcmp(KCMP_FILE)` on two numbers of this process: `Some(true)` when they
/// are the same open file description, `None` when the kernel cannot say
/// (no kcmp, not permitted, a closed number).
pub fn same_description(a: RawFd, b: RawFd) -> Option<bool> {
    const KCMP_FILE: libc::c_int = 0;
    // SAFETY: kcmp compares kernel objects named by numbers of this process;
    // it reads and writes no memory of ours.
    let pid = unsafe { libc::getpid() };
    // SAFETY: as above.
    let rc = unsafe { libc::syscall(libc::SYS_kcmp, pid, pid, KCMP_FILE, a, b) };
    match rc {
        0 => Some(true),
        1..=3 => Some(false),
        _ => None,
    }
}

/// An fd plus what it refers to, to tell "this fd was closed" from "the
/// number was reused by another thread" (tests run in parallel).
///
/// It keeps a duplicate of the fd (the witness, on another number) so that
/// "still open" can ask whether the number is the same open file
/// description, not only the same file: a sibling test opening /dev/null
/// onto a number the import just closed is the same file but a new
/// description (CI saw exactly that reuse under qemu). Where the kernel
/// cannot compare descriptions, the file identity alone is used.
pub struct Tracked {
    pub raw: RawFd,
    pub id: (u64, u64),
    witness: OwnedFd,
}

impl Tracked {
    /// Releases ownership of `fd` and remembers what it was.
    pub fn new(fd: OwnedFd) -> Tracked {
        let id = file_id(fd.as_raw_fd()).unwrap();
        let witness = fd.try_clone().unwrap();
        Tracked {
            raw: fd.into_raw_fd(),
            id,
            witness,
        }
    }

    /// Whether the number still refers to the same open file description.
    pub fn still_open(&self) -> bool {
        file_id(self.raw) == Some(self.id)
            && same_description(self.raw, self.witness.as_raw_fd()) != Some(false)
    }

    /// Closes it (the caller still owned it).
    pub fn close(self) {
        assert!(self.still_open());
        // SAFETY: the fd is still ours (checked just above).
        unsafe { libc::close(self.raw) };
    }
}

/// The ledger once destroyed streams have finished their queued work
/// (a stream destroyed with work pending finishes it asynchronously).
pub fn settled_ledger(sim: &Sim) -> tegra_interop_sim::Ledger {
    for _ in 0..1000 {
        let l = sim.ledger();
        if l.pending_work == 0 {
            return l;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    sim.ledger()
}
