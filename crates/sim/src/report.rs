//! What a simulator reports: its `Ledger` and its `Diagnostic`s.

#![deny(unsafe_code)]

use super::*;

/// What the simulator holds right now. All zero after a correct teardown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Contexts made with `cuCtxCreate` and not destroyed.
    pub live_contexts: usize,
    /// Outstanding `cuDevicePrimaryCtxRetain` references (all devices).
    pub primary_context_refs: usize,
    /// Streams made with `cuStreamCreate` and not destroyed.
    pub live_streams: usize,
    /// Imported external memories not destroyed.
    pub live_memories: usize,
    /// Mapped buffers (not yet `cuMemFree`d) plus mapped mipmapped arrays
    /// (not yet `cuMipmappedArrayDestroy`ed).
    pub live_mappings: usize,
    /// `cuMemAlloc` allocations not freed.
    pub live_allocations: usize,
    /// Imported external semaphores not destroyed.
    pub live_semaphores: usize,
    /// Graphics resources not given back: EGL images not unregistered and
    /// EGLStream frames acquired and not released.
    pub live_graphics_resources: usize,
    /// CUDA connections to EGLStreams (consumers and producers) not
    /// disconnected.
    pub live_egl_connections: usize,
    /// File descriptors the simulator holds for imported objects (it owns
    /// them from a successful import until the destroy).
    pub open_fds: usize,
    /// Stream work enqueued and not finished (destroyed streams included).
    pub pending_work: usize,
    /// `cuMemHostAlloc` allocations not freed with `cuMemFreeHost`, and
    /// host memory registered with `cuMemHostRegister` and not unregistered.
    pub live_host_allocations: usize,
    /// Events made with `cuEventCreate` and not destroyed.
    pub live_events: usize,
    /// Modules loaded with `cuModuleLoadData` and not unloaded.
    pub live_modules: usize,
    /// NVRTC programs created and not destroyed.
    pub live_programs: usize,
}

impl Ledger {
    /// Nothing live, nothing held, nothing pending.
    pub fn is_clean(&self) -> bool {
        *self == Ledger::default()
    }
}

impl fmt::Display for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "contexts {}, primary refs {}, streams {}, memories {}, mappings {}, allocations {}, semaphores {}, graphics resources {}, EGLStream connections {}, fds {}, pending work {}, host allocations {}, events {}, modules {}, NVRTC programs {}",
            self.live_contexts,
            self.primary_context_refs,
            self.live_streams,
            self.live_memories,
            self.live_mappings,
            self.live_allocations,
            self.live_semaphores,
            self.live_graphics_resources,
            self.live_egl_connections,
            self.open_fds,
            self.pending_work,
            self.live_host_allocations,
            self.live_events,
            self.live_modules,
            self.live_programs
        )
    }
}

/// What kind of problem a [`Diagnostic`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DiagnosticKind {
    /// An object destroyed (or freed) a second time. Real driver: crash.
    DoubleDestroy,
    /// An object used after it was destroyed.
    UseAfterDestroy,
    /// An object used (or destroyed) after its context was destroyed, reset
    /// or released. Destroying it crashes the real driver.
    UseAfterContextLoss,
    /// A handle this simulator never made (foreign, corrupt, another Sim's).
    UnknownHandle,
    /// A semaphore used on a stream of another context.
    CrossContext,
    /// An import declares more bytes than the exporter allocated (the real
    /// driver accepts it), or a mapping reaches past the real bytes.
    ImportSizeMismatch,
    /// A semaphore destroyed while signals/waits on it were still queued.
    OutstandingWork,
    /// A copy past the end of an allocation.
    OutOfBounds,
    /// A synchronisation waited longer than [`SimConfig::hang_timeout`].
    Hang,
    /// Other misuse of the API.
    Misuse,
    /// A descriptor the simulator was about to close (its own duplicate, or
    /// the one an import takes) was already closed by someone else: a
    /// double close somewhere (on a real system the second close closes
    /// whatever reused the number). The simulator does not close it again.
    DoubleClose,
    /// A descriptor number the simulator was about to close now refers to
    /// another file than the one it was given (closed by someone else and
    /// reused): a foreign fd. The simulator leaves it alone.
    ForeignFd,
    /// Something the simulator does not model.
    Unimplemented,
    /// A bug or resource failure inside the simulator itself.
    Internal,
}

impl DiagnosticKind {
    /// Whether the real driver would crash (or corrupt memory) here.
    pub fn real_driver_would_crash(self) -> bool {
        matches!(
            self,
            DiagnosticKind::DoubleDestroy | DiagnosticKind::UseAfterContextLoss
        )
    }
}

/// One recorded problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// Index of the call (as counted by [`Sim::calls`]) that hit it.
    pub call_index: Option<u64>,
    /// The entry point.
    pub symbol: &'static str,
    /// What kind of problem.
    pub kind: DiagnosticKind,
    /// Human-readable details.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.call_index {
            Some(i) => write!(
                f,
                "call #{i} {}: {:?}: {}",
                self.symbol, self.kind, self.message
            ),
            None => write!(f, "{}: {:?}: {}", self.symbol, self.kind, self.message),
        }
    }
}
