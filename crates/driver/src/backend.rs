//! [`Backend`]: a function table plus whatever keeps it valid.

use std::sync::{Arc, Mutex, OnceLock};

use crate::logging;
use crate::table::{FunctionTable, LoaderNotes};
use crate::Error;

/// Where a [`Backend`]'s entry points come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendKind {
    /// Resolved from the installed NVIDIA driver with `dlopen`/`dlsym`.
    Real,
    /// Filled by someone else (the simulator, a test double).
    Table,
}

/// One set of C entry points (the seam) and the libraries that keep them valid.
///
/// Every handle of this crate holds (through its [`crate::Context`]) an
/// `Arc<Backend>`, so the libraries stay loaded for as long as anything can
/// still call into them.
///
/// ```
/// use tegra_interop_driver::{Backend, FunctionTable};
///
/// // An empty table: every call reports the missing symbol.
/// // SAFETY: a table without entries calls nothing.
/// let backend = unsafe { Backend::from_table("empty", FunctionTable::empty()) };
/// assert_eq!(backend.name(), "empty");
/// let err = backend.device_count().unwrap_err();
/// assert!(err.to_string().contains("cuDeviceGetCount"));
/// ```
pub struct Backend {
    name: &'static str,
    kind: BackendKind,
    table: FunctionTable,
    // Kept only so the resolved function pointers stay valid; dropped last.
    _libraries: Vec<libloading::Library>,
    init: OnceLock<Result<(), Error>>,
    drop_errors: Mutex<Vec<Error>>,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl Backend {
    /// Loads the installed NVIDIA driver (`libcuda.so.1`) and, where present,
    /// the NvSci libraries (`libnvscibuf.so.1`, `libnvscisync.so.1`,
    /// `libnvsciipc.so`), and initialises CUDA (`cuInit(0)`).
    ///
    /// Each symbol is optional: one the installed driver lacks stays `None`
    /// and calling it gives [`Error::NotSupported`] with `dlsym`'s message.
    /// Missing NvSci libraries (any discrete GPU) leave all of their entries
    /// `None`; the loader's reason is kept (see
    /// [`loader_notes`](Self::loader_notes)) and is part of the
    /// `NotSupported` error of each of their entry points.
    ///
    /// # Errors
    /// [`Error::DriverNotFound`] when `libcuda.so.1` cannot be opened (no
    /// NVIDIA driver installed), with the loader's reason, e.g. `CUDA driver
    /// not found (libcuda.so.1: cannot open shared object file: No such file
    /// or directory)`; [`Error::Driver`] when `cuInit` fails (for example no
    /// device).
    ///
    /// ```no_run
    /// let backend = tegra_interop_driver::Backend::real()?;
    /// println!("{} CUDA device(s)", backend.device_count()?);
    /// # Ok::<(), tegra_interop_driver::Error>(())
    /// ```
    pub fn real() -> Result<Arc<Backend>, Error> {
        let (table, libraries) = crate::table::load()?;
        logging::info!(
            target: logging::BACKEND,
            "backend \"cuda\" (BackendKind::Real): the installed driver, {} libraries loaded",
            libraries.len()
        );
        let backend = Arc::new(Backend {
            name: "cuda",
            kind: BackendKind::Real,
            table,
            _libraries: libraries,
            init: OnceLock::new(),
            drop_errors: Mutex::new(Vec::new()),
        });
        backend.ensure_init()?;
        Ok(backend)
    }

    /// What the run-time loader said about each library of the table (CUDA,
    /// NvSciBuf, NvSciSync, NvSciIpc, NVRTC, in that order): whether it loaded, the
    /// loader's message if not (for example an NvSci library that is present
    /// but fails to load), and `dlsym`'s message for every missing symbol.
    /// Empty for backends over a table filled by someone else.
    pub fn loader_notes(&self) -> Vec<&'static LoaderNotes> {
        let t = &self.table;
        [
            t.cuda.loader,
            t.nvscibuf.loader,
            t.nvscisync.loader,
            t.nvsciipc.loader,
            t.nvrtc.loader,
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// A backend over a table filled by someone else (the simulator, a test
    /// double). Nothing is loaded; `cuInit` is called lazily on first use if
    /// the table has it. `tegra_interop_sim::Sim::backend` is the safe way
    /// to get one over the simulator.
    ///
    /// # Safety
    ///
    /// The driver calls the table's entries with the arguments the C API
    /// documents and trusts what they do and hand back; it cannot check
    /// either. Every `Some` entry of `table` must, for as long as the
    /// backend (or any handle made through it) is alive:
    ///
    /// 1. **Signature.** Be a function with the C signature and calling
    ///    convention of its field's `PFN_` type.
    /// 2. **Writes.** Behave as the documented C function with respect to
    ///    memory: write only through the out-pointers it is given, only
    ///    `size_of` the pointee (or the element count passed next to an
    ///    array), and only during the call; read pointer arguments only
    ///    within the sizes and counts given; keep no pointer to the caller's
    ///    memory after it returns, except the host-function user pointer of
    ///    `cuLaunchHostFunc`.
    /// 3. **Returned pointers.** Pointers it writes out point to as many
    ///    readable, initialised bytes as it reports: an attribute value of
    ///    `Nv*AttrListGetAttrs` to `len` bytes (valid while the list is
    ///    alive and unchanged), an export descriptor of
    ///    `Nv*AttrListIpcExport*` to `len` bytes (valid until the matching
    ///    `Nv*AttrListFreeDesc`, which frees it once), an error name or
    ///    string (`cuGetErrorName`/`cuGetErrorString`) to a NUL-terminated
    ///    string that lives as long as the table. A returned attribute value
    ///    of a key with a fixed C type is a valid value of that type.
    /// 4. **Handles.** Handles it returns (contexts, streams, memory,
    ///    mappings, semaphores, arrays, EGL resources and connections, NvSci
    ///    modules, lists, objects, endpoints) stay valid until their release
    ///    call, accept the calls the C API allows on them, and are released
    ///    by exactly that call; a handle it has not returned (or already
    ///    released) given back to it is answered with an error code, not
    ///    undefined behaviour, or never reaches it (the driver passes only
    ///    handles the table made).
    /// 5. **Host functions.** A function enqueued with `cuLaunchHostFunc`
    ///    that returns success is called exactly once, with the user pointer
    ///    it was given, on a thread that may run Rust code; a launch that
    ///    returns an error never calls it.
    /// 6. **File descriptors.** Follow the documented ownership: a
    ///    successful `cuImportExternalMemory`/`cuImportExternalSemaphore` of
    ///    an fd kind takes the fd it is handed (the driver hands over a
    ///    duplicate it no longer uses), a failed one leaves it open or
    ///    closes it but never closes another descriptor; the fd written out
    ///    by a successful `cuMemGetHandleForAddressRange` (dma-buf) is a new
    ///    descriptor of this process that the caller owns; the one written
    ///    by `NvSciIpcGetLinuxEventFd` stays the endpoint's, open until
    ///    `NvSciIpcCloseEndpoint`; no entry closes a descriptor it does not
    ///    own.
    /// 7. **Threads.** Be callable from any thread, concurrently, as the
    ///    CUDA driver API and the NvSci libraries are (they serialise calls
    ///    on one object), and never unwind into Rust.
    ///
    /// A table whose entries are all `None` (such as
    /// [`FunctionTable::empty`]) trivially satisfies this: every call
    /// reports the missing symbol.
    #[allow(unsafe_code)] // the caller vouches for the table's entries
    pub unsafe fn from_table(name: &'static str, table: FunctionTable) -> Arc<Backend> {
        logging::info!(
            target: logging::BACKEND,
            "backend {name:?} (BackendKind::Table): a table filled by the caller, nothing loaded"
        );
        Arc::new(Backend {
            name,
            kind: BackendKind::Table,
            table,
            _libraries: Vec::new(),
            init: OnceLock::new(),
            drop_errors: Mutex::new(Vec::new()),
        })
    }

    /// The backend's name (`"cuda"` for the real driver).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Where the entry points come from.
    pub fn kind(&self) -> BackendKind {
        self.kind
    }

    /// The function table (the seam).
    pub fn table(&self) -> &FunctionTable {
        &self.table
    }

    /// Calls `cuInit(0)` once per backend (later calls return the first
    /// result). A table without `cuInit` is taken as already initialised.
    pub fn ensure_init(&self) -> Result<(), Error> {
        self.init
            .get_or_init(|| match self.table.cuda.cuInit {
                Some(_) => {
                    let result = crate::ffi::call::cuInit(&self.table.cuda, 0);
                    match &result {
                        Ok(()) => logging::debug!(
                            target: logging::BACKEND,
                            "backend {:?}: cuInit(0) succeeded",
                            self.name
                        ),
                        Err(e) => logging::warn!(
                            target: logging::BACKEND,
                            "backend {:?}: cuInit(0) failed: {e}",
                            self.name
                        ),
                    }
                    result
                }
                None => {
                    logging::debug!(
                        target: logging::BACKEND,
                        "backend {:?}: the table has no cuInit; taken as initialised",
                        self.name
                    );
                    Ok(())
                }
            })
            .clone()
    }

    /// Records an error that a `Drop` implementation could not return.
    pub(crate) fn record_drop_error(&self, error: Error) {
        logging::warn!(
            target: logging::DROP,
            "backend {:?}: a Drop could not release its object: {error}; kept for Backend::take_drop_errors",
            self.name
        );
        if let Ok(mut errors) = self.drop_errors.lock() {
            errors.push(error);
        }
    }

    /// Takes the errors that `Drop` implementations met (other than
    /// `DEINITIALIZED`, which means the resource is already gone). An
    /// explicit `destroy()` returns its error instead of recording it.
    pub fn take_drop_errors(&self) -> Vec<Error> {
        let taken = match self.drop_errors.lock() {
            Ok(mut errors) => std::mem::take(&mut *errors),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        };
        if !taken.is_empty() {
            logging::debug!(
                target: logging::DROP,
                "backend {:?}: {} Drop error(s) taken",
                self.name,
                taken.len()
            );
        }
        taken
    }
}
