//! The backend conformance suite, written once for every backend.
//!
//! Each check takes a [`Backend`] and an [`Exporter`] (the other side of the
//! interop: Vulkan on a GPU machine, the simulator's memfd exporter in CI)
//! and returns `Ok(())` or a [`CheckFailure`] saying what differed. The
//! simulator's tests and the GPU tests run the same functions, so the
//! simulator is held to what the real driver does and vice versa.
//!
//! ```
//! use tegra_interop_testkit::conformance::CHECKS;
//!
//! for (name, _check) in CHECKS {
//!     assert!(!name.is_empty());
//! }
//! assert!(CHECKS.iter().any(|(name, _)| *name == "timeline_backwards_refused"));
//! assert!(CHECKS.iter().any(|(name, _)| *name == "failed_imports_return_the_callers_fd"));
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use tegra_interop_core::{
    BufferMapping, CuResult, MemoryImport, SemaphoreHandleKind, SignalParams, ValidationError,
    WaitParams,
};

use tegra_interop_driver::{
    Backend, Context, DeviceBuffer, DevicePtr, Error, Event, EventFlags, ExternalMemory,
    ExternalSemaphore, HostRegistration, Module, Nvrtc, NvrtcResult, PinnedHostBuffer,
    RegisteredHostMemory, SemaphoreSignal, SemaphoreWait, Stream,
};

/// Errors of an exporter.
pub type ExportError = Box<dyn std::error::Error + Send + Sync>;

/// How long an exporter-side wait may take before a check fails.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(5);

/// Memory exported by the other API, seen from that side.
pub trait ExportedMemory {
    /// The exported size in bytes.
    fn size(&self) -> u64;
    /// Writes `data` at `offset` from the exporter's side (and makes it
    /// visible to the importer, e.g. flush / queue submit + wait).
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), ExportError>;
    /// Reads `out.len()` bytes at `offset` from the exporter's side.
    fn read(&mut self, offset: u64, out: &mut [u8]) -> Result<(), ExportError>;
}

/// A binary semaphore exported by the other API, seen from that side.
pub trait ExportedBinarySemaphore {
    /// Signals it from the exporter's side.
    fn signal(&mut self) -> Result<(), ExportError>;
    /// Waits (and consumes the signal) from the exporter's side; `false` on
    /// timeout.
    fn wait(&mut self, timeout: Duration) -> Result<bool, ExportError>;
}

/// A timeline semaphore exported by the other API, seen from that side.
pub trait ExportedTimelineSemaphore {
    /// Sets the counter to `value` from the exporter's side (a host signal:
    /// `value` must be greater than the counter, as Vulkan requires).
    fn signal(&mut self, value: u64) -> Result<(), ExportError>;
    /// The current counter value.
    fn value(&mut self) -> Result<u64, ExportError>;
    /// Waits until the counter reaches `value`; `false` on timeout.
    fn wait(&mut self, value: u64, timeout: Duration) -> Result<bool, ExportError>;
}

/// The other side of the interop: makes allocations and semaphores and
/// exports them as file descriptors for CUDA to import.
pub trait Exporter {
    /// Exports `size` bytes of memory as an opaque fd.
    fn export_memory(
        &mut self,
        size: u64,
    ) -> Result<(OwnedFd, Box<dyn ExportedMemory>), ExportError>;
    /// Exports a binary semaphore as an opaque fd.
    fn export_binary_semaphore(
        &mut self,
    ) -> Result<(OwnedFd, Box<dyn ExportedBinarySemaphore>), ExportError>;
    /// Exports a timeline semaphore starting at `initial` as an fd.
    fn export_timeline_semaphore(
        &mut self,
        initial: u64,
    ) -> Result<(OwnedFd, Box<dyn ExportedTimelineSemaphore>), ExportError>;
}

/// A check that did not hold.
#[derive(Debug)]
pub struct CheckFailure {
    /// The check's name.
    pub check: &'static str,
    /// What went wrong.
    pub detail: String,
}

impl fmt::Display for CheckFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "conformance check `{}` failed: {}",
            self.check, self.detail
        )
    }
}

impl std::error::Error for CheckFailure {}

/// Result of one check.
pub type CheckResult = Result<(), CheckFailure>;

/// A check of the suite.
pub type Check = fn(&Arc<Backend>, &mut dyn Exporter) -> CheckResult;

/// Every check, by name, in a sensible order.
pub const CHECKS: &[(&str, Check)] = &[
    ("import_and_map", import_and_map),
    ("data_both_ways", data_both_ways),
    ("binary_exporter_to_cuda", binary_exporter_to_cuda),
    ("binary_cuda_to_exporter", binary_cuda_to_exporter),
    ("timeline_both_directions", timeline_both_directions),
    ("timeline_backwards_refused", timeline_backwards_refused),
    ("batched_signal_and_wait", batched_signal_and_wait),
    ("wait_before_signal", wait_before_signal),
    ("teardown", teardown),
    ("memory_validation_refusals", memory_validation_refusals),
    (
        "semaphore_validation_refusals",
        semaphore_validation_refusals,
    ),
    ("cross_context_refused", cross_context_refused),
    (
        "failed_imports_return_the_callers_fd",
        failed_imports_return_the_callers_fd,
    ),
    (
        "copy_from_host_done_on_return",
        copy_from_host_done_on_return,
    ),
    ("device_buffer_round_trip", device_buffer_round_trip),
    (
        "pinned_mapped_visible_both_ways",
        pinned_mapped_visible_both_ways,
    ),
    ("event_ordering", event_ordering),
    ("nvrtc_module_launch", nvrtc_module_launch),
    ("short_grid_leaves_the_tail", short_grid_leaves_the_tail),
    ("launch_and_module_refusals", launch_and_module_refusals),
    (
        "registered_host_memory_round_trip",
        registered_host_memory_round_trip,
    ),
];

/// Checks that compare the process's fd table (`/proc/self/fd`) before and
/// after: the table is process-wide, so run them where no other thread
/// opens or closes descriptors meanwhile (one test binary, one test at a
/// time). Not part of [`CHECKS`] / [`run_all`].
pub const FD_TABLE_CHECKS: &[(&str, Check)] = &[(
    "fd_table_unchanged_by_failed_imports",
    fd_table_unchanged_by_failed_imports,
)];

/// Runs every check of [`FD_TABLE_CHECKS`]; see there for the conditions.
pub fn run_fd_table_checks(
    backend: &Arc<Backend>,
    exporter: &mut dyn Exporter,
) -> Vec<CheckFailure> {
    FD_TABLE_CHECKS
        .iter()
        .filter_map(|(_, check)| check(backend, exporter).err())
        .collect()
}

/// Runs every check; returns the failures (empty when all passed).
pub fn run_all(backend: &Arc<Backend>, exporter: &mut dyn Exporter) -> Vec<CheckFailure> {
    CHECKS
        .iter()
        .filter_map(|(_, check)| check(backend, exporter).err())
        .collect()
}

/// Attaches the check name to errors of the code under test.
trait Ctx<T> {
    fn during(self, check: &'static str, what: &str) -> Result<T, CheckFailure>;
}

impl<T, E: fmt::Display> Ctx<T> for Result<T, E> {
    fn during(self, check: &'static str, what: &str) -> Result<T, CheckFailure> {
        self.map_err(|e| CheckFailure {
            check,
            detail: format!("{what}: {e}"),
        })
    }
}

fn ensure(check: &'static str, condition: bool, detail: impl FnOnce() -> String) -> CheckResult {
    if condition {
        Ok(())
    } else {
        Err(CheckFailure {
            check,
            detail: detail(),
        })
    }
}

fn no_drop_errors(check: &'static str, backend: &Backend) -> CheckResult {
    let errors = backend.take_drop_errors();
    ensure(check, errors.is_empty(), || {
        format!("errors while dropping handles: {errors:?}")
    })
}

const SIZE: u64 = 64 * 1024;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Import an allocation, map the whole of it and a sub-range, unmap, destroy.
pub fn import_and_map(backend: &Arc<Backend>, exporter: &mut dyn Exporter) -> CheckResult {
    const C: &str = "import_and_map";
    let (fd, exported) = exporter.export_memory(SIZE).during(C, "export")?;
    let size = exported.size();
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let memory = ExternalMemory::opaque_fd(&ctx, fd, size).during(C, "import")?;
    ensure(C, memory.size() == size, || {
        format!("size {} != {size}", memory.size())
    })?;
    let whole = memory.map_whole().during(C, "map whole")?;
    ensure(C, whole.size() == size && whole.device_ptr() != 0, || {
        format!("whole mapping {whole:?}")
    })?;
    let part = memory
        .map_buffer(BufferMapping::new(4096, 4096))
        .during(C, "map sub-range")?;
    ensure(C, part.offset() == 4096 && part.size() == 4096, || {
        format!("sub-range mapping {part:?}")
    })?;
    part.destroy().during(C, "unmap sub-range")?;
    whole.destroy().during(C, "unmap whole")?;
    memory.destroy().during(C, "destroy memory")?;
    ctx.destroy().during(C, "destroy context")?;
    no_drop_errors(C, backend)
}

/// Bytes written by the exporter are read by CUDA and the other way round.
pub fn data_both_ways(backend: &Arc<Backend>, exporter: &mut dyn Exporter) -> CheckResult {
    const C: &str = "data_both_ways";
    let (fd, mut exported) = exporter.export_memory(SIZE).during(C, "export")?;
    let size = exported.size();
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let memory = ExternalMemory::opaque_fd(&ctx, fd, size).during(C, "import")?;
    let buffer = memory.map_whole().during(C, "map")?;

    let theirs = pattern(1, 4096);
    exported.write(0, &theirs).during(C, "exporter write")?;
    let mut seen = vec![0u8; theirs.len()];
    buffer
        .copy_to_host(0, &mut seen)
        .during(C, "copy to host")?;
    ensure(C, seen == theirs, || {
        "CUDA does not see the exporter's bytes".into()
    })?;

    let ours = pattern(77, 4096);
    let at = size - ours.len() as u64;
    buffer
        .copy_from_host(at, &ours)
        .during(C, "copy from host")?;
    // A host-to-device copy from pageable memory may return once the source is
    // staged, before the bytes land; the exporter reads only after the
    // context has finished its work (seen on the H200: without this the read
    // was sometimes stale).
    ctx.synchronize().during(C, "synchronize")?;
    let mut back = vec![0u8; ours.len()];
    exported.read(at, &mut back).during(C, "exporter read")?;
    ensure(C, back == ours, || {
        "the exporter does not see CUDA's bytes".into()
    })?;

    let past = buffer.copy_from_host(size - 1, &[0, 0]);
    ensure(C, matches!(past, Err(Error::OutOfBounds { .. })), || {
        format!("a copy past the end was not refused: {past:?}")
    })?;
    drop(buffer);
    drop(memory);
    drop(ctx);
    no_drop_errors(C, backend)
}

/// The exporter signals a binary semaphore, a CUDA stream waits on it.
pub fn binary_exporter_to_cuda(backend: &Arc<Backend>, exporter: &mut dyn Exporter) -> CheckResult {
    const C: &str = "binary_exporter_to_cuda";
    let (fd, mut exported) = exporter.export_binary_semaphore().during(C, "export")?;
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let stream = Stream::new(&ctx).during(C, "stream")?;
    let semaphore = ExternalSemaphore::binary_fd(&ctx, fd).during(C, "import")?;
    ensure(C, semaphore.kind() == SemaphoreHandleKind::OpaqueFd, || {
        format!("kind {:?}", semaphore.kind())
    })?;
    exported.signal().during(C, "exporter signal")?;
    stream
        .wait(&semaphore, WaitParams::binary())
        .during(C, "wait")?;
    stream.synchronize().during(C, "synchronize")?;
    semaphore.destroy().during(C, "destroy semaphore")?;
    stream.destroy().during(C, "destroy stream")?;
    drop(ctx);
    no_drop_errors(C, backend)
}

/// A CUDA stream signals a binary semaphore, the exporter waits on it.
pub fn binary_cuda_to_exporter(backend: &Arc<Backend>, exporter: &mut dyn Exporter) -> CheckResult {
    const C: &str = "binary_cuda_to_exporter";
    let (fd, mut exported) = exporter.export_binary_semaphore().during(C, "export")?;
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let stream = Stream::new(&ctx).during(C, "stream")?;
    let mut semaphore = ExternalSemaphore::binary_fd(&ctx, fd).during(C, "import")?;
    let value = stream
        .signal(&mut semaphore, SignalParams::binary())
        .during(C, "signal")?;
    ensure(C, value.is_none(), || {
        format!("binary signal returned {value:?}")
    })?;
    stream.synchronize().during(C, "synchronize")?;
    let signalled = exported.wait(WAIT_TIMEOUT).during(C, "exporter wait")?;
    ensure(C, signalled, || {
        "the exporter never saw CUDA's signal".into()
    })?;
    drop(semaphore);
    drop(stream);
    drop(ctx);
    no_drop_errors(C, backend)
}

/// Timeline values travel both ways and are tracked.
pub fn timeline_both_directions(
    backend: &Arc<Backend>,
    exporter: &mut dyn Exporter,
) -> CheckResult {
    const C: &str = "timeline_both_directions";
    let (fd, mut exported) = exporter.export_timeline_semaphore(0).during(C, "export")?;
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let stream = Stream::new(&ctx).during(C, "stream")?;
    let mut semaphore = ExternalSemaphore::timeline_fd(&ctx, fd).during(C, "import")?;

    let value = stream
        .signal(&mut semaphore, SignalParams::timeline(1))
        .during(C, "signal 1")?;
    ensure(C, value == Some(1), || format!("signal returned {value:?}"))?;
    let reached = exported
        .wait(1, WAIT_TIMEOUT)
        .during(C, "exporter wait 1")?;
    ensure(C, reached, || "the exporter never saw value 1".into())?;

    exported.signal(2).during(C, "exporter signal 2")?;
    stream
        .wait(&semaphore, WaitParams::timeline(2))
        .during(C, "wait 2")?;
    stream
        .signal(&mut semaphore, SignalParams::timeline(3))
        .during(C, "signal 3")?;
    stream.synchronize().during(C, "synchronize")?;
    let now = exported.value().during(C, "exporter value")?;
    ensure(C, now == 3, || format!("counter is {now}, expected 3"))?;
    ensure(C, semaphore.last_timeline_value() == Some(3), || {
        format!("tracked {:?}", semaphore.last_timeline_value())
    })?;
    drop(semaphore);
    drop(stream);
    drop(ctx);
    no_drop_errors(C, backend)
}

/// A timeline value that does not increase is refused before the call and
/// the counter stays where it was.
pub fn timeline_backwards_refused(
    backend: &Arc<Backend>,
    exporter: &mut dyn Exporter,
) -> CheckResult {
    const C: &str = "timeline_backwards_refused";
    let (fd, mut exported) = exporter.export_timeline_semaphore(0).during(C, "export")?;
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let stream = Stream::new(&ctx).during(C, "stream")?;
    let mut semaphore = ExternalSemaphore::timeline_fd(&ctx, fd).during(C, "import")?;
    stream
        .signal(&mut semaphore, SignalParams::timeline(8))
        .during(C, "signal 8")?;
    for bad in [3, 8] {
        let refused = stream.signal(&mut semaphore, SignalParams::timeline(bad));
        ensure(
            C,
            matches!(
                refused,
                Err(Error::Validation(ValidationError::FenceNotIncreasing {
                    last: 8,
                    ..
                }))
            ),
            || format!("signal {bad} after 8 gave {refused:?}"),
        )?;
    }
    stream.synchronize().during(C, "synchronize")?;
    let now = exported.value().during(C, "exporter value")?;
    ensure(C, now == 8, || format!("counter is {now}, expected 8"))?;
    stream
        .signal(&mut semaphore, SignalParams::timeline(9))
        .during(C, "signal 9")?;
    stream.synchronize().during(C, "synchronize")?;
    let now = exported.value().during(C, "exporter value")?;
    ensure(C, now == 9, || format!("counter is {now}, expected 9"))?;
    drop(semaphore);
    drop(stream);
    drop(ctx);
    no_drop_errors(C, backend)
}

/// Several semaphores signalled and waited with one call each.
pub fn batched_signal_and_wait(backend: &Arc<Backend>, exporter: &mut dyn Exporter) -> CheckResult {
    const C: &str = "batched_signal_and_wait";
    let (fd_a, mut exp_a) = exporter
        .export_timeline_semaphore(0)
        .during(C, "export a")?;
    let (fd_b, mut exp_b) = exporter
        .export_timeline_semaphore(0)
        .during(C, "export b")?;
    let (fd_c, mut exp_c) = exporter.export_binary_semaphore().during(C, "export c")?;
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let stream = Stream::new(&ctx).during(C, "stream")?;
    let mut a = ExternalSemaphore::timeline_fd(&ctx, fd_a).during(C, "import a")?;
    let mut b = ExternalSemaphore::timeline_fd(&ctx, fd_b).during(C, "import b")?;
    let mut c = ExternalSemaphore::binary_fd(&ctx, fd_c).during(C, "import c")?;

    for frame in 1..=3u64 {
        exp_a.signal(frame * 10).during(C, "exporter signal a")?;
        exp_c.signal().during(C, "exporter signal c")?;
        stream
            .wait_batch(&[
                SemaphoreWait::timeline(&a, frame * 10),
                SemaphoreWait::binary(&c),
            ])
            .during(C, "wait batch")?;
        let mut batch = [
            SemaphoreSignal::timeline(&mut b, frame),
            SemaphoreSignal::binary(&mut c),
        ];
        stream.signal_batch(&mut batch).during(C, "signal batch")?;
        let values = batch.each_ref().map(SemaphoreSignal::tracked);
        ensure(C, values == [Some(frame), None], || {
            format!("frame {frame}: batch returned {values:?}")
        })?;
        let reached = exp_b
            .wait(frame, WAIT_TIMEOUT)
            .during(C, "exporter wait b")?;
        ensure(C, reached, || {
            format!("frame {frame}: b never reached {frame}")
        })?;
        let got = exp_c.wait(WAIT_TIMEOUT).during(C, "exporter wait c")?;
        ensure(C, got, || format!("frame {frame}: c never signalled"))?;
    }
    // One bad entry refuses the whole batch; nothing advances.
    let refused = stream.signal_batch(&mut [
        SemaphoreSignal::timeline(&mut a, 100),
        SemaphoreSignal::timeline(&mut b, 1),
    ]);
    ensure(
        C,
        matches!(
            refused,
            Err(Error::Validation(
                ValidationError::FenceNotIncreasing { .. }
            ))
        ),
        || format!("a batch with a backwards value gave {refused:?}"),
    )?;
    ensure(C, a.last_timeline_value() == Some(0), || {
        format!(
            "a advanced to {:?} in a refused batch",
            a.last_timeline_value()
        )
    })?;
    stream.synchronize().during(C, "synchronize")?;
    drop((a, b, c));
    drop(stream);
    drop(ctx);
    no_drop_errors(C, backend)
}

/// A wait may be queued before its signal exists; the stream stays busy
/// until the signal arrives.
pub fn wait_before_signal(backend: &Arc<Backend>, exporter: &mut dyn Exporter) -> CheckResult {
    const C: &str = "wait_before_signal";
    let (fd, mut exported) = exporter.export_timeline_semaphore(0).during(C, "export")?;
    let (out_fd, mut out) = exporter
        .export_timeline_semaphore(0)
        .during(C, "export out")?;
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let stream = Stream::new(&ctx).during(C, "stream")?;
    let semaphore = ExternalSemaphore::timeline_fd(&ctx, fd).during(C, "import")?;
    let mut done = ExternalSemaphore::timeline_fd(&ctx, out_fd).during(C, "import out")?;
    stream
        .wait(&semaphore, WaitParams::timeline(5))
        .during(C, "wait 5")?;
    stream
        .signal(&mut done, SignalParams::timeline(1))
        .during(C, "signal out")?;
    std::thread::sleep(Duration::from_millis(20));
    let idle = stream.is_idle().during(C, "query")?;
    ensure(C, !idle, || {
        "the stream finished a wait nobody signalled".into()
    })?;
    let early = out.value().during(C, "exporter value")?;
    ensure(C, early == 0, || {
        format!("work after the wait ran early ({early})")
    })?;
    exported.signal(5).during(C, "exporter signal 5")?;
    stream.synchronize().during(C, "synchronize")?;
    let reached = out.wait(1, WAIT_TIMEOUT).during(C, "exporter wait out")?;
    ensure(C, reached, || "work after the wait never ran".into())?;
    drop((semaphore, done));
    drop(stream);
    drop(ctx);
    no_drop_errors(C, backend)
}

/// Explicit teardown in every legal order reports success, and dropping
/// leaves no recorded errors.
pub fn teardown(backend: &Arc<Backend>, exporter: &mut dyn Exporter) -> CheckResult {
    const C: &str = "teardown";
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    {
        let (fd, _e) = exporter.export_memory(SIZE).during(C, "export")?;
        let memory = ExternalMemory::opaque_fd(&ctx, fd, SIZE).during(C, "import")?;
        let a = memory.map_whole().during(C, "map a")?;
        let b = memory
            .map_buffer(BufferMapping::new(0, 16))
            .during(C, "map b")?;
        a.destroy().during(C, "unmap a")?;
        b.destroy().during(C, "unmap b")?;
        memory.destroy().during(C, "destroy")?;
    }
    {
        // Drop order: mappings first (they borrow the memory), then memory.
        let (fd, _e) = exporter.export_memory(SIZE).during(C, "export")?;
        let memory = ExternalMemory::opaque_fd(&ctx, fd, SIZE).during(C, "import")?;
        let _a = memory.map_whole().during(C, "map")?;
        let stream = Stream::new(&ctx).during(C, "stream")?;
        let (sfd, _s) = exporter
            .export_timeline_semaphore(0)
            .during(C, "export sem")?;
        let mut sem = ExternalSemaphore::timeline_fd(&ctx, sfd).during(C, "import sem")?;
        stream
            .signal(&mut sem, SignalParams::timeline(1))
            .during(C, "signal")?;
        // Dropped with the signal possibly in flight (semaphore first, then
        // the stream): the semaphore waits for its work before destroying
        // itself.
    }
    {
        // The other order: the stream is destroyed first with the signal
        // possibly still queued; destroying a stream does not cancel its work,
        // and the semaphore's drop still waits for it.
        let (sfd, _s) = exporter
            .export_timeline_semaphore(0)
            .during(C, "export sem")?;
        let mut sem = ExternalSemaphore::timeline_fd(&ctx, sfd).during(C, "import sem")?;
        let stream = Stream::new(&ctx).during(C, "stream")?;
        stream
            .signal(&mut sem, SignalParams::timeline(1))
            .during(C, "signal")?;
        stream.destroy().during(C, "destroy stream")?;
    }
    no_drop_errors(C, backend)?;
    ctx.destroy().during(C, "destroy context")?;
    no_drop_errors(C, backend)
}

/// Memory rules refused before the call, with the fd handed back.
pub fn memory_validation_refusals(
    backend: &Arc<Backend>,
    exporter: &mut dyn Exporter,
) -> CheckResult {
    const C: &str = "memory_validation_refusals";
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let (fd, _exported) = exporter.export_memory(SIZE).during(C, "export")?;
    let raw = fd.as_raw_fd();

    // fd -1 never reaches the driver (it would answer CUDA_ERROR_UNKNOWN).
    let negative = MemoryImport::opaque_fd(-1, SIZE);
    ensure(
        C,
        matches!(negative, Err(ValidationError::NegativeFd { fd: -1 })),
        || format!("fd -1 gave {negative:?}"),
    )?;

    // Size 0: refused, fd returned open.
    let fd = match ExternalMemory::opaque_fd(&ctx, fd, 0) {
        Err(e) => {
            ensure(
                C,
                matches!(e.error, Error::Validation(ValidationError::ZeroSize)),
                || format!("size 0 gave {}", e.error),
            )?;
            e.fd
        }
        Ok(_) => return ensure(C, false, || "a size-0 import was accepted".into()),
    };
    ensure(C, fd.as_raw_fd() == raw, || {
        "a different fd came back".into()
    })?;
    fd.try_clone()
        .during(C, "the returned fd is not open")
        .map(drop)?;

    // An import description naming another fd than the one handed over.
    let other = MemoryImport::opaque_fd(raw + 1000, SIZE).during(C, "build import")?;
    let fd = match ExternalMemory::import_fd(&ctx, fd, other) {
        Err(e) => {
            ensure(
                C,
                matches!(
                    e.error,
                    Error::Validation(ValidationError::HandleKindMismatch)
                ),
                || format!("mismatched fd gave {}", e.error),
            )?;
            e.fd
        }
        Ok(_) => return ensure(C, false, || "a mismatched import was accepted".into()),
    };

    let memory = ExternalMemory::opaque_fd(&ctx, fd, SIZE).during(C, "import")?;
    let past = memory.map_buffer(BufferMapping::new(SIZE - 16, 32));
    ensure(
        C,
        matches!(
            past,
            Err(Error::Validation(ValidationError::MappingOutOfRange { .. }))
        ),
        || format!("a range past the end gave {past:?}"),
    )?;
    let empty = memory.map_buffer(BufferMapping::new(0, 0));
    ensure(
        C,
        matches!(empty, Err(Error::Validation(ValidationError::ZeroSize))),
        || format!("an empty mapping gave {empty:?}"),
    )?;
    let overflow = memory.map_buffer(BufferMapping::new(u64::MAX, 2));
    ensure(
        C,
        matches!(
            overflow,
            Err(Error::Validation(ValidationError::MappingOutOfRange { .. }))
        ),
        || format!("an overflowing range gave {overflow:?}"),
    )?;
    let mut flagged = tegra_interop_sys::cuda::CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
        offset: 0,
        size: 16,
        flags: 1,
        reserved: [0; 16],
    };
    let flags = BufferMapping::from_raw(&flagged, SIZE);
    ensure(
        C,
        matches!(flags, Err(ValidationError::BufferFlagsNonZero { flags: 1 })),
        || format!("buffer flags 1 gave {flags:?}"),
    )?;
    flagged.flags = 0;
    let fine = BufferMapping::from_raw(&flagged, SIZE).during(C, "valid raw mapping")?;
    drop((past, empty, overflow));
    memory
        .map_buffer(fine)
        .during(C, "map valid")?
        .destroy()
        .during(C, "unmap")?;
    drop(memory);
    drop(ctx);
    no_drop_errors(C, backend)
}

/// Semaphore rules refused before the call.
pub fn semaphore_validation_refusals(
    backend: &Arc<Backend>,
    exporter: &mut dyn Exporter,
) -> CheckResult {
    const C: &str = "semaphore_validation_refusals";
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let stream = Stream::new(&ctx).during(C, "stream")?;
    let (bfd, _b) = exporter
        .export_binary_semaphore()
        .during(C, "export binary")?;
    let (tfd, mut t) = exporter
        .export_timeline_semaphore(0)
        .during(C, "export timeline")?;
    let mut binary = ExternalSemaphore::binary_fd(&ctx, bfd).during(C, "import binary")?;
    let mut timeline = ExternalSemaphore::timeline_fd(&ctx, tfd).during(C, "import timeline")?;

    let r = stream.signal(&mut binary, SignalParams::timeline(1));
    ensure(
        C,
        matches!(
            r,
            Err(Error::Validation(
                ValidationError::FenceValueNotSupported { .. }
            ))
        ),
        || format!("a value on a binary semaphore gave {r:?}"),
    )?;
    let r = stream.signal(&mut timeline, SignalParams::binary());
    ensure(
        C,
        matches!(
            r,
            Err(Error::Validation(
                ValidationError::FenceValueRequired { .. }
            ))
        ),
        || format!("no value on a timeline gave {r:?}"),
    )?;
    let r = stream.wait(&timeline, WaitParams::binary());
    ensure(
        C,
        matches!(
            r,
            Err(Error::Validation(
                ValidationError::FenceValueRequired { .. }
            ))
        ),
        || format!("a wait without value on a timeline gave {r:?}"),
    )?;
    // SAFETY: the memsync-skip flag is refused for a timeline semaphore
    // before any call, so nothing is skipped (the driver would answer
    // INVALID_VALUE).
    let skip = unsafe { SignalParams::timeline(1).skip_nvscibuf_memsync() };
    let r = stream.signal(&mut timeline, skip);
    ensure(
        C,
        matches!(
            r,
            Err(Error::Validation(
                ValidationError::SemaphoreFlagsNotAllowed { .. }
            ))
        ),
        || format!("memsync skip on a timeline gave {r:?}"),
    )?;
    let null_fence = SignalParams::nvscisync(std::ptr::null_mut());
    let r = stream.signal(&mut timeline, null_fence);
    ensure(C, matches!(r, Err(Error::Unsupported { .. })), || {
        format!("raw NvSciSync parameters gave {r:?}")
    })?;
    let import = tegra_interop_core::SemaphoreImport::opaque_fd(-1);
    ensure(
        C,
        matches!(import, Err(ValidationError::NegativeFd { fd: -1 })),
        || format!("fd -1 gave {import:?}"),
    )?;
    // None of the refused signals touched the tracker or the counter.
    ensure(C, timeline.last_timeline_value() == Some(0), || {
        format!("tracked {:?}", timeline.last_timeline_value())
    })?;
    stream.synchronize().during(C, "synchronize")?;
    let now = t.value().during(C, "exporter value")?;
    ensure(C, now == 0, || format!("counter moved to {now}"))?;
    drop((binary, timeline));
    drop(stream);
    drop(ctx);
    no_drop_errors(C, backend)
}

/// A semaphore of one context used on a stream of another is refused before
/// the call, naming both contexts.
pub fn cross_context_refused(backend: &Arc<Backend>, exporter: &mut dyn Exporter) -> CheckResult {
    const C: &str = "cross_context_refused";
    let a = Context::new(backend.clone(), 0).during(C, "context a")?;
    let b = Context::create(backend.clone(), 0, 0).during(C, "context b")?;
    let stream_b = Stream::new(&b).during(C, "stream b")?;
    let (fd, mut exported) = exporter.export_timeline_semaphore(0).during(C, "export")?;
    let mut semaphore = ExternalSemaphore::timeline_fd(&a, fd).during(C, "import in a")?;

    let r = stream_b.signal(&mut semaphore, SignalParams::timeline(1));
    match &r {
        Err(
            e @ Error::WrongContext {
                semaphore_ctx,
                stream_ctx,
            },
        ) => {
            ensure(C, *semaphore_ctx == a.id() && *stream_ctx == b.id(), || {
                format!("named {semaphore_ctx} / {stream_ctx}")
            })?;
            let text = e.to_string();
            ensure(
                C,
                text.contains(&a.id().to_string()) && text.contains(&b.id().to_string()),
                || format!("message does not name both contexts: {text}"),
            )?;
        }
        other => return ensure(C, false, || format!("cross-context signal gave {other:?}")),
    }
    let r = stream_b.wait(&semaphore, WaitParams::timeline(1));
    ensure(C, matches!(r, Err(Error::WrongContext { .. })), || {
        format!("cross-context wait gave {r:?}")
    })?;
    ensure(C, semaphore.last_timeline_value() == Some(0), || {
        "a refused signal advanced the tracker".into()
    })?;

    // The same semaphore on a stream of its own context works.
    let stream_a = Stream::new(&a).during(C, "stream a")?;
    stream_a
        .signal(&mut semaphore, SignalParams::timeline(1))
        .during(C, "signal in a")?;
    stream_a.synchronize().during(C, "synchronize")?;
    let now = exported.value().during(C, "exporter value")?;
    ensure(C, now == 1, || format!("counter is {now}, expected 1"))?;
    drop(semaphore);
    drop((stream_a, stream_b));
    drop((a, b));
    no_drop_errors(C, backend)
}

// ------------------------------------------------------------ fd ownership

/// `(st_dev, st_ino)` of the file behind `fd`, `None` if it is not open.
fn file_id(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer; fstat on any number is harmless.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

/// The open descriptor numbers of this process (`/proc/self/fd`), without
/// the listing's own directory descriptor (the one that links to
/// `/proc/<pid>/fd`; an entry closed while listing is skipped).
fn fd_table() -> Result<BTreeSet<RawFd>, String> {
    let dir = std::fs::read_dir("/proc/self/fd").map_err(|e| format!("/proc/self/fd: {e}"))?;
    let mut set = BTreeSet::new();
    for entry in dir {
        let entry = entry.map_err(|e| format!("/proc/self/fd: {e}"))?;
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if target.starts_with("/proc") && target.ends_with("fd") {
            continue;
        }
        if let Some(n) = entry.file_name().to_str().and_then(|n| n.parse().ok()) {
            set.insert(n);
        }
    }
    Ok(set)
}

/// Where the fd handed to a failing import comes from.
#[derive(Clone, Copy, Debug)]
enum Source {
    DevNull,
    Memfd,
    RegularFile,
    Pipe,
    Socket,
    /// Memory from the exporter (a real allocation, imported as the wrong
    /// kind: dma-buf, or a semaphore).
    ExportedMemory,
}

/// What is imported.
#[derive(Clone, Copy, Debug)]
enum Import {
    MemoryOpaque,
    MemoryDmaBuf,
    SemaphoreBinary,
    SemaphoreTimeline,
}

/// Each row of the H200 measurement (driver 580.159, CUDA 13.0; every
/// row answered UNKNOWN or NOT_SUPPORTED, see the sim README): the
/// import kind and the fds it was given. All answered an error there; a
/// backend that accepts one is held to the success rule instead (the
/// simulator, like the H200, refuses them all).
const FD_ROWS: &[(Import, &[Source])] = &[
    (
        Import::MemoryOpaque,
        &[
            Source::DevNull,
            Source::Memfd,
            Source::RegularFile,
            Source::Pipe,
            Source::Socket,
        ],
    ),
    (
        Import::MemoryDmaBuf,
        &[Source::DevNull, Source::Memfd, Source::ExportedMemory],
    ),
    (
        Import::SemaphoreBinary,
        &[Source::DevNull, Source::Memfd, Source::ExportedMemory],
    ),
    (
        Import::SemaphoreTimeline,
        &[Source::DevNull, Source::Memfd, Source::ExportedMemory],
    ),
];

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// The fd of a [`Source`], the other fds that must stay open with it (the
/// other end of a pipe or socket) and the exporter's side of its memory.
type MadeSource = (OwnedFd, Vec<OwnedFd>, Option<Box<dyn ExportedMemory>>);

/// Makes the fd of `source`, plus whatever must stay alive with it.
fn make_source(source: Source, exporter: &mut dyn Exporter) -> Result<MadeSource, String> {
    match source {
        Source::DevNull => std::fs::File::open("/dev/null")
            .map(|f| (f.into(), Vec::new(), None))
            .map_err(|e| format!("/dev/null: {e}")),
        Source::Memfd => {
            // SAFETY: the name is a NUL-terminated literal.
            let fd = unsafe {
                libc::memfd_create(c"tegra-interop-conformance".as_ptr(), libc::MFD_CLOEXEC)
            };
            if fd < 0 {
                return Err(os_err("memfd_create"));
            }
            // SAFETY: a fresh descriptor nobody else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: resizing our own fresh memfd.
            if unsafe { libc::ftruncate(fd.as_raw_fd(), SIZE as libc::off_t) } != 0 {
                return Err(os_err("ftruncate"));
            }
            Ok((fd, Vec::new(), None))
        }
        Source::RegularFile => {
            let path = std::env::temp_dir().join(format!(
                "tegra-interop-conformance-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let _ = std::fs::remove_file(&path);
            file.set_len(SIZE)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            Ok((file.into(), Vec::new(), None))
        }
        Source::Pipe => {
            let mut ends = [-1; 2];
            // SAFETY: `ends` is a valid array of two ints.
            if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                return Err(os_err("pipe2"));
            }
            // SAFETY: two fresh descriptors nobody else owns.
            let (r, w) = unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
            Ok((r, vec![w], None))
        }
        Source::Socket => {
            let (a, b) =
                std::os::unix::net::UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
            Ok((a.into(), vec![b.into()], None))
        }
        Source::ExportedMemory => {
            let (fd, memory) = exporter
                .export_memory(SIZE)
                .map_err(|e| format!("export: {e}"))?;
            Ok((fd, Vec::new(), Some(memory)))
        }
    }
}

/// Imports `fd` as `import`; `Ok(None)` when it succeeded (then the import
/// was destroyed again), `Ok(Some(fd))` with the fd handed back on failure.
fn try_import(
    ctx: &Context,
    import: Import,
    fd: OwnedFd,
) -> Result<Option<(Error, OwnedFd)>, String> {
    let destroyed = |r: Result<(), Error>| r.map_err(|e| format!("destroy after success: {e}"));
    match import {
        Import::MemoryOpaque => match ExternalMemory::opaque_fd(ctx, fd, SIZE) {
            Ok(m) => destroyed(m.destroy()).map(|()| None),
            Err(e) => Ok(Some(e.into_parts())),
        },
        Import::MemoryDmaBuf => match ExternalMemory::dma_buf_fd(ctx, fd, SIZE) {
            Ok(m) => destroyed(m.destroy()).map(|()| None),
            Err(e) => Ok(Some(e.into_parts())),
        },
        Import::SemaphoreBinary => match ExternalSemaphore::binary_fd(ctx, fd) {
            Ok(s) => destroyed(s.destroy()).map(|()| None),
            Err(e) => Ok(Some(e.into_parts())),
        },
        Import::SemaphoreTimeline => match ExternalSemaphore::timeline_fd(ctx, fd) {
            Ok(s) => destroyed(s.destroy()).map(|()| None),
            Err(e) => Ok(Some(e.into_parts())),
        },
    }
}

/// One row: after a failed import the caller's fd comes back with the same
/// number, open, the same file and (where `kcmp` can tell) the same open
/// file description as a reference duplicate taken before the call. With
/// `table`, the process's fd table is the same before the row and after it.
fn fd_row(
    check: &'static str,
    ctx: &Context,
    exporter: &mut dyn Exporter,
    import: Import,
    source: Source,
    table: bool,
) -> CheckResult {
    let row = format!("{import:?} import of {source:?}");
    let before = if table {
        Some(fd_table().map_err(|e| CheckFailure { check, detail: e })?)
    } else {
        None
    };
    let (fd, keep, exported) = make_source(source, exporter).map_err(|e| CheckFailure {
        check,
        detail: format!("{row}: {e}"),
    })?;
    let raw = fd.as_raw_fd();
    let id = file_id(raw);
    let reference = fd.try_clone().during(check, "reference duplicate")?;
    let outcome = try_import(ctx, import, fd).map_err(|e| CheckFailure {
        check,
        detail: format!("{row}: {e}"),
    })?;
    if let Some((error, back)) = outcome {
        ensure(check, back.as_raw_fd() == raw, || {
            format!(
                "{row} ({error}): fd {} came back instead of {raw}",
                back.as_raw_fd()
            )
        })?;
        let now = file_id(raw);
        ensure(check, now.is_some(), || {
            format!("{row} ({error}): the fd handed back ({raw}) is closed")
        })?;
        ensure(check, now == id, || {
            format!("{row} ({error}): fd {raw} now refers to another file")
        })?;
        let same = tegra_interop_driver::error::same_description(back.as_fd(), reference.as_fd());
        ensure(check, same != Some(false), || {
            format!("{row} ({error}): fd {raw} is another open file description than before")
        })?;
        drop(back);
    }
    drop((reference, keep, exported));
    if let Some(before) = before {
        let after = fd_table().map_err(|e| CheckFailure { check, detail: e })?;
        let stray: Vec<_> = after.difference(&before).collect();
        let missing: Vec<_> = before.difference(&after).collect();
        ensure(check, stray.is_empty() && missing.is_empty(), || {
            format!("{row}: fd table changed: stray {stray:?}, missing {missing:?}")
        })?;
    }
    no_drop_errors(check, ctx.backend())
}

fn fd_rows(
    check: &'static str,
    backend: &Arc<Backend>,
    exporter: &mut dyn Exporter,
    table: bool,
) -> CheckResult {
    let ctx = Context::new(backend.clone(), 0).during(check, "context")?;
    if table {
        // The driver may open descriptors of its own on first use: run every
        // row once before comparing tables.
        for (import, sources) in FD_ROWS {
            for source in *sources {
                fd_row(check, &ctx, exporter, *import, *source, false)?;
            }
        }
    }
    for (import, sources) in FD_ROWS {
        for source in *sources {
            fd_row(check, &ctx, exporter, *import, *source, table)?;
        }
    }
    drop(ctx);
    no_drop_errors(check, backend)
}

/// Every import kind with every fd the H200 was measured with: after a
/// failed import through the public API the caller's fd comes back open,
/// with the same number, the same file and the same open file description
/// (the real driver closes the fd it is given when an `OPAQUE_FD` memory
/// import fails).
pub fn failed_imports_return_the_callers_fd(
    backend: &Arc<Backend>,
    exporter: &mut dyn Exporter,
) -> CheckResult {
    fd_rows(
        "failed_imports_return_the_callers_fd",
        backend,
        exporter,
        false,
    )
}

/// [`failed_imports_return_the_callers_fd`], plus: the process's fd table
/// (`/proc/self/fd`) holds no stray and no missing entry after each row.
/// In [`FD_TABLE_CHECKS`]: run it with no other thread touching fds.
pub fn fd_table_unchanged_by_failed_imports(
    backend: &Arc<Backend>,
    exporter: &mut dyn Exporter,
) -> CheckResult {
    fd_rows(
        "fd_table_unchanged_by_failed_imports",
        backend,
        exporter,
        true,
    )
}

/// `MappedBuffer::copy_from_host` promises the bytes are in the buffer when
/// it returns: write with it, read at once from the exporter's side. Large
/// enough (8 MiB) that a pageable host-to-device copy is staged in pieces.
pub fn copy_from_host_done_on_return(
    backend: &Arc<Backend>,
    exporter: &mut dyn Exporter,
) -> CheckResult {
    const C: &str = "copy_from_host_done_on_return";
    const BIG: u64 = 8 << 20;
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let (fd, mut exported) = exporter.export_memory(BIG).during(C, "export")?;
    let size = exported.size();
    let memory = ExternalMemory::opaque_fd(&ctx, fd, size).during(C, "import")?;
    let buffer = memory
        .map_buffer(BufferMapping::new(0, BIG))
        .during(C, "map")?;
    for round in 0..3u8 {
        let data = pattern(round.wrapping_mul(7).wrapping_add(1), BIG as usize);
        buffer
            .copy_from_host(0, &data)
            .during(C, "copy_from_host")?;
        let mut seen = vec![0u8; BIG as usize];
        exported.read(0, &mut seen).during(C, "exporter read")?;
        let first_bad = data.iter().zip(&seen).position(|(a, b)| a != b);
        ensure(C, first_bad.is_none(), || {
            format!(
                "round {round}: the exporter saw old bytes right after copy_from_host returned (first at byte {first_bad:?})"
            )
        })?;
    }
    drop(buffer);
    memory.destroy().during(C, "destroy")?;
    drop(ctx);
    no_drop_errors(C, backend)
}

// --------------------------------------------- device memory, events, kernels

/// The kernel the suite compiles with NVRTC and launches: adds 1 to each of
/// `len` bytes at `buf`.
pub const ADD_ONE_SOURCE: &str = r#"
typedef unsigned long long u64;
extern "C" __global__ void add_one(unsigned char *buf, u64 len) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) {
        buf[i] = (unsigned char)(buf[i] + 1);
    }
}
"#;

/// The kernel name and parameter sizes of [`ADD_ONE_SOURCE`].
pub const ADD_ONE: (&str, &[usize]) = ("add_one", &[8, 8]);

/// Registers the simulator's Rust twins of the suite's kernels
/// ([`ADD_ONE_SOURCE`]); the simulator refuses to compile kernels it
/// cannot run. Call it on a simulator before running the suite there.
pub fn register_sim_kernels(sim: &tegra_interop_sim::Sim) {
    use tegra_interop_sim::kernels::{KernelFault, KernelSpec};
    // Per block, as the CUDA source: the block's threads
    // `i = blockIdx.x * blockDim.x + threadIdx.x` with `i < len` add one;
    // bytes no thread of the grid reaches stay as they were.
    sim.register_block_kernel(KernelSpec::new(ADD_ONE.0, ADD_ONE.1), |b| {
        let (buf, len) = (b.arg_u64(0)?, b.arg_u64(1)?);
        for r in b.indices_x(len) {
            let n = usize::try_from(r.end - r.start)
                .map_err(|_| KernelFault::new("length too large"))?;
            let mut bytes = vec![0u8; n];
            b.read(buf + r.start, &mut bytes)?;
            for v in &mut bytes {
                *v = v.wrapping_add(1);
            }
            b.write(buf + r.start, &bytes)?;
        }
        Ok(())
    });
}

/// A bounded wait for an event, as a check failure.
fn wait_event(check: &'static str, event: &Event, what: &str) -> CheckResult {
    event.synchronize(WAIT_TIMEOUT).during(check, what)
}

/// Device memory: synchronous copies both ways, fill, and asynchronous
/// copies through pinned memory and between device buffers.
pub fn device_buffer_round_trip(
    backend: &Arc<Backend>,
    _exporter: &mut dyn Exporter,
) -> CheckResult {
    const C: &str = "device_buffer_round_trip";
    const N: usize = 256 * 1024 + 3;
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let stream = Stream::new(&ctx).during(C, "stream")?;
    let a = DeviceBuffer::new(&ctx, N).during(C, "alloc a")?;
    let b = DeviceBuffer::new(&ctx, N).during(C, "alloc b")?;
    ensure(C, a.len() == N && a.device_ptr() != 0, || format!("{a:?}"))?;

    let data = pattern(3, N);
    a.copy_from_host(0, &data).during(C, "copy_from_host")?;
    let mut back = vec![0u8; N];
    a.copy_to_host(0, &mut back).during(C, "copy_to_host")?;
    ensure(C, back == data, || "synchronous round trip differs".into())?;

    b.fill(0xa5).during(C, "fill")?;
    let mut filled = vec![0u8; N];
    b.copy_to_host(0, &mut filled)
        .during(C, "copy_to_host after fill")?;
    ensure(C, filled.iter().all(|x| *x == 0xa5), || {
        "fill not seen".into()
    })?;

    let mut src = PinnedHostBuffer::new(&ctx, N).during(C, "pinned src")?;
    let mut dst = PinnedHostBuffer::new(&ctx, N).during(C, "pinned dst")?;
    let data2 = pattern(77, N);
    src.as_mut_slice().copy_from_slice(&data2);
    let done = Event::new(&ctx, EventFlags::NO_TIMING).during(C, "event")?;
    // SAFETY: every buffer outlives the copies (we wait for `done` below)
    // and the host touches none of them until then.
    unsafe {
        b.copy_from_pinned_async(0, &src, 0, N, &stream)
            .during(C, "copy_from_pinned_async")?;
        stream
            .copy_async(&a, 0, &b, 0, N as u64)
            .during(C, "copy_async device to device")?;
        a.copy_to_pinned_async(0, &dst, 0, N, &stream)
            .during(C, "copy_to_pinned_async")?;
    }
    done.record(&stream).during(C, "record")?;
    wait_event(C, &done, "event after the copies")?;
    ensure(C, dst.as_slice() == data2.as_slice(), || {
        let first = dst.as_slice().iter().zip(&data2).position(|(x, y)| x != y);
        format!("asynchronous chain differs, first at {first:?}")
    })?;

    // Out of range: refused before the call.
    let r = a.copy_to_host(N - 1, &mut [0u8; 2]);
    ensure(C, matches!(r, Err(Error::OutOfBounds { .. })), || {
        format!("copy past the end gave {r:?}")
    })?;
    let r = DeviceBuffer::new(&ctx, 0);
    ensure(C, matches!(r, Err(Error::Unsupported { .. })), || {
        format!("zero-byte alloc gave {r:?}")
    })?;
    stream.synchronize().during(C, "synchronize")?;
    done.destroy().during(C, "destroy event")?;
    drop((src, dst));
    a.destroy().during(C, "free a")?;
    b.destroy().during(C, "free b")?;
    drop(stream);
    drop(ctx);
    no_drop_errors(C, backend)
}

/// Pinned memory mapped into the device: a host write is seen through the
/// device pointer, a device write through the host view.
pub fn pinned_mapped_visible_both_ways(
    backend: &Arc<Backend>,
    _exporter: &mut dyn Exporter,
) -> CheckResult {
    const C: &str = "pinned_mapped_visible_both_ways";
    const N: usize = 64 * 1024;
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let stream = Stream::new(&ctx).during(C, "stream")?;
    let mut pinned = PinnedHostBuffer::new(&ctx, N).during(C, "pinned")?;
    ensure(C, pinned.device_ptr() != 0, || "no device pointer".into())?;
    ensure(C, pinned.as_slice().iter().all(|b| *b == 0), || {
        "new pinned memory is not zero".into()
    })?;
    let device = DeviceBuffer::new(&ctx, N).during(C, "device")?;
    let data = pattern(9, N);
    pinned.as_mut_slice().copy_from_slice(&data);
    let done = Event::new(&ctx, EventFlags::NO_TIMING).during(C, "event")?;
    // SAFETY: both live until `done` completes; the host does not touch
    // them meanwhile.
    unsafe { stream.copy_async(&device, 0, &pinned, 0, N as u64) }
        .during(C, "device <- pinned through its device pointer")?;
    done.record(&stream).during(C, "record")?;
    wait_event(C, &done, "copy from the device pointer")?;
    let mut seen = vec![0u8; N];
    device.copy_to_host(0, &mut seen).during(C, "read device")?;
    ensure(C, seen == data, || {
        "the device did not see the host's write through the mapped pointer".into()
    })?;

    let data2 = pattern(200, N);
    device.copy_from_host(0, &data2).during(C, "write device")?;
    // SAFETY: as above.
    unsafe { stream.copy_async(&pinned, 0, &device, 0, N as u64) }
        .during(C, "pinned <- device through its device pointer")?;
    done.record(&stream).during(C, "record 2")?;
    wait_event(C, &done, "copy to the device pointer")?;
    ensure(C, pinned.as_slice() == data2.as_slice(), || {
        "the host view did not see the device's write".into()
    })?;
    // Atomic view of a word the device wrote.
    let word = pinned.atomic_u64(1).during(C, "atomic view")?;
    let want = u64::from_ne_bytes(data2[8..16].try_into().unwrap_or([0; 8]));
    let got = word.load(std::sync::atomic::Ordering::Acquire);
    ensure(C, got == want, || {
        format!("atomic view {got:#x}, bytes {want:#x}")
    })?;
    let r = pinned.atomic_u64(N / 8);
    ensure(C, matches!(r, Err(Error::OutOfBounds { .. })), || {
        format!("atomic view past the end gave {r:?}")
    })?;
    stream.synchronize().during(C, "synchronize")?;
    drop(done);
    pinned.destroy().during(C, "free pinned")?;
    drop(device);
    drop(stream);
    drop(ctx);
    no_drop_errors(C, backend)
}

/// Events complete in stream order; another stream waits on one; timing
/// events measure, timing-less ones refuse; a bounded wait says what it
/// waited for.
pub fn event_ordering(backend: &Arc<Backend>, _exporter: &mut dyn Exporter) -> CheckResult {
    const C: &str = "event_ordering";
    const N: usize = 4 << 20;
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let s1 = Stream::new(&ctx).during(C, "stream 1")?;
    let s2 = Stream::new(&ctx).during(C, "stream 2")?;
    let never = Event::new(&ctx, EventFlags::DEFAULT).during(C, "event")?;
    ensure(C, never.is_complete().during(C, "query")?, || {
        "an event never recorded is not complete".into()
    })?;
    let start = Event::new(&ctx, EventFlags::DEFAULT).during(C, "start")?;
    let end = Event::new(&ctx, EventFlags::DEFAULT).during(C, "end")?;
    let handoff = Event::new(&ctx, EventFlags::NO_TIMING).during(C, "handoff")?;
    let done = Event::new(&ctx, EventFlags::NO_TIMING).during(C, "done")?;

    let mut src = PinnedHostBuffer::new(&ctx, N).during(C, "pinned src")?;
    let mut dst = PinnedHostBuffer::new(&ctx, N).during(C, "pinned dst")?;
    let mid = DeviceBuffer::new(&ctx, N).during(C, "device")?;
    let data = pattern(41, N);
    src.as_mut_slice().copy_from_slice(&data);
    // s1: start, copy in, end, handoff. s2: wait handoff, copy out, done.
    // SAFETY: all buffers live until `done` completed; the host touches
    // none of them meanwhile.
    unsafe {
        start.record(&s1).during(C, "record start")?;
        mid.copy_from_pinned_async(0, &src, 0, N, &s1)
            .during(C, "copy in on s1")?;
        end.record(&s1).during(C, "record end")?;
        handoff.record(&s1).during(C, "record handoff")?;
        s2.wait_event(&handoff).during(C, "s2 waits")?;
        mid.copy_to_pinned_async(0, &dst, 0, N, &s2)
            .during(C, "copy out on s2")?;
    }
    done.record(&s2).during(C, "record done")?;
    wait_event(C, &done, "the copy on the waiting stream")?;
    ensure(C, dst.as_slice() == data.as_slice(), || {
        "the second stream ran before the first one's copy (event wait not honoured)".into()
    })?;
    ensure(C, end.is_complete().during(C, "query end")?, || {
        "end not complete after the waiting stream finished".into()
    })?;
    let elapsed = end.elapsed_since(&start).during(C, "elapsed")?;
    ensure(C, elapsed < Duration::from_secs(5), || {
        format!("elapsed {elapsed:?}")
    })?;
    let r = done.elapsed_since(&handoff);
    ensure(C, matches!(r, Err(Error::Unsupported { .. })), || {
        format!("elapsed of timing-less events gave {r:?}")
    })?;
    // A stream of another context is refused before the call.
    let other = Context::create(backend.clone(), 0, 0).during(C, "context b")?;
    let other_stream = Stream::new(&other).during(C, "stream b")?;
    let r = done.record(&other_stream);
    ensure(C, matches!(r, Err(Error::Unsupported { .. })), || {
        format!("record on another context's stream gave {r:?}")
    })?;
    drop(other_stream);
    other.destroy().during(C, "destroy context b")?;
    // The event completes as the stream's last job runs; the streams are
    // idle only once that job has returned.
    s1.synchronize().during(C, "synchronize s1")?;
    s2.synchronize().during(C, "synchronize s2")?;
    drop((never, start, end, handoff, done));
    drop((src, dst, mid));
    drop((s1, s2));
    drop(ctx);
    no_drop_errors(C, backend)
}

/// NVRTC compiles the suite's kernel, the module loads, the function
/// reports its parameters, and launches over device memory and over
/// mapped pinned memory (zero-copy) change the bytes as the kernel says.
pub fn nvrtc_module_launch(backend: &Arc<Backend>, _exporter: &mut dyn Exporter) -> CheckResult {
    const C: &str = "nvrtc_module_launch";
    const N: usize = 100_000;
    let nvrtc = Nvrtc::new(backend).during(C, "NVRTC")?;
    let (major, _) = nvrtc.version().during(C, "version")?;
    ensure(C, major >= 11, || format!("NVRTC major version {major}"))?;
    let ptx = nvrtc
        .compile(ADD_ONE_SOURCE, "add_one.cu", &[])
        .during(C, "compile")?;
    ensure(C, ptx.entries() == ["add_one"], || {
        format!("PTX entries {:?}", ptx.entries())
    })?;
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let stream = Stream::new(&ctx).during(C, "stream")?;
    let module = Module::load(&ctx, &ptx).during(C, "load")?;
    let add_one = module.function(ADD_ONE.0).during(C, "function")?;
    if let Some(sizes) = add_one.param_sizes() {
        ensure(C, sizes == ADD_ONE.1, || format!("param sizes {sizes:?}"))?;
    }
    let grid = u32::try_from(N.div_ceil(256)).unwrap_or(u32::MAX);

    let device = DeviceBuffer::new(&ctx, N).during(C, "device")?;
    let data = pattern(5, N);
    device.copy_from_host(0, &data).during(C, "upload")?;
    let mut pinned = PinnedHostBuffer::new(&ctx, N).during(C, "pinned")?;
    pinned.as_mut_slice().copy_from_slice(&data);
    let done = Event::new(&ctx, EventFlags::NO_TIMING).during(C, "event")?;
    // SAFETY: (pointer, u64) as the kernel declares; it writes `N` bytes of
    // each buffer, which outlive it (we wait for `done`); the host does not
    // touch them meanwhile.
    unsafe {
        add_one
            .launch(grid, 256u32)
            .arg(&device)
            .arg(N as u64)
            .launch(&stream)
            .during(C, "launch on device memory")?;
        add_one
            .launch(grid, 256u32)
            .arg(DevicePtr::of(&pinned))
            .arg(N as u64)
            .launch(&stream)
            .during(C, "launch on mapped pinned memory")?;
    }
    done.record(&stream).during(C, "record")?;
    wait_event(C, &done, "the kernels")?;
    let want: Vec<u8> = data.iter().map(|b| b.wrapping_add(1)).collect();
    let mut seen = vec![0u8; N];
    device.copy_to_host(0, &mut seen).during(C, "download")?;
    ensure(C, seen == want, || "device memory not incremented".into())?;
    ensure(C, pinned.as_slice() == want.as_slice(), || {
        "mapped pinned memory not incremented".into()
    })?;
    stream.synchronize().during(C, "synchronize")?;
    drop(done);
    drop(add_one);
    module.destroy().during(C, "unload")?;
    drop((device, pinned, stream, ctx));
    no_drop_errors(C, backend)
}

/// A kernel written for the grid it is launched with ([`ADD_ONE_SOURCE`]:
/// one thread per byte, no loop), launched with half the blocks its buffer
/// needs: the bytes the grid covers change, the rest stay as they were, and
/// the check a user would write ("every byte incremented") fails. The
/// simulator's twin must behave as the GPU does here.
pub fn short_grid_leaves_the_tail(
    backend: &Arc<Backend>,
    _exporter: &mut dyn Exporter,
) -> CheckResult {
    const C: &str = "short_grid_leaves_the_tail";
    const N: usize = 100_000;
    const BLOCK: u32 = 256;
    let ptx = Nvrtc::new(backend)
        .during(C, "NVRTC")?
        .compile(ADD_ONE_SOURCE, "add_one.cu", &[])
        .during(C, "compile")?;
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let stream = Stream::new(&ctx).during(C, "stream")?;
    let module = Module::load(&ctx, &ptx).during(C, "load")?;
    let add_one = module.function(ADD_ONE.0).during(C, "function")?;
    let needed = u32::try_from(N.div_ceil(BLOCK as usize)).unwrap_or(u32::MAX);
    let grid = needed / 2;
    let covered = grid as usize * BLOCK as usize;
    let device = DeviceBuffer::new(&ctx, N).during(C, "device")?;
    let data = pattern(9, N);
    device.copy_from_host(0, &data).during(C, "upload")?;
    let done = Event::new(&ctx, EventFlags::NO_TIMING).during(C, "event")?;
    // SAFETY: (pointer, u64) as the kernel declares; it writes at most `N`
    // bytes of `device`, which outlives it (we wait for `done`).
    unsafe {
        add_one
            .launch(grid, BLOCK)
            .arg(&device)
            .arg(N as u64)
            .launch(&stream)
            .during(C, "launch with half the grid")?;
    }
    done.record(&stream).during(C, "record")?;
    wait_event(C, &done, "the kernel")?;
    let mut seen = vec![0u8; N];
    device.copy_to_host(0, &mut seen).during(C, "download")?;
    let first_wrong = (0..covered).find(|&i| seen[i] != data[i].wrapping_add(1));
    ensure(C, first_wrong.is_none(), || {
        format!("byte {first_wrong:?} inside the grid's {covered} bytes not incremented")
    })?;
    let first_touched = (covered..N).find(|&i| seen[i] != data[i]);
    ensure(C, first_touched.is_none(), || {
        format!(
            "byte {first_touched:?} past the grid's {covered} bytes changed: no thread reaches it"
        )
    })?;
    let users_check = seen.iter().zip(&data).all(|(s, d)| *s == d.wrapping_add(1));
    ensure(C, !users_check, || {
        "the check for every byte incremented passed with half the grid".into()
    })?;
    stream.synchronize().during(C, "synchronize")?;
    drop((done, add_one));
    module.destroy().during(C, "unload")?;
    drop((device, stream, ctx));
    no_drop_errors(C, backend)
}

/// Bad inputs get typed errors: a source that does not compile (with the
/// log), a missing kernel name, wrong argument count or size, launch
/// dimensions past the limits; unloading while a function lives.
pub fn launch_and_module_refusals(
    backend: &Arc<Backend>,
    _exporter: &mut dyn Exporter,
) -> CheckResult {
    const C: &str = "launch_and_module_refusals";
    let nvrtc = Nvrtc::new(backend).during(C, "NVRTC")?;
    let bad =
        "extern \"C\" __global__ void conformance_not_a_kernel(int x) { undeclared_name = x; }";
    match nvrtc.compile(bad, "bad.cu", &[]) {
        Err(Error::CompileFailed { code, log, program }) => {
            ensure(
                C,
                code == NvrtcResult::COMPILATION && program == "bad.cu",
                || format!("compile failure {code} for {program}"),
            )?;
            ensure(C, !log.trim().is_empty(), || "empty compile log".into())?;
        }
        other => return ensure(C, false, || format!("bad source gave {other:?}")),
    }
    let r = nvrtc.compile(ADD_ONE_SOURCE, "nul\0name.cu", &[]);
    ensure(C, matches!(r, Err(Error::CompileFailed { .. })), || {
        format!("program name with NUL gave {r:?}")
    })?;
    let r = nvrtc.compile(ADD_ONE_SOURCE, "add_one.cu", &["--no-such-option-at-all"]);
    ensure(
        C,
        matches!(&r, Err(Error::CompileFailed { code, .. }) if *code == NvrtcResult::INVALID_OPTION),
        || format!("unknown option gave {r:?}"),
    )?;

    let ptx = nvrtc
        .compile(ADD_ONE_SOURCE, "add_one.cu", &[])
        .during(C, "compile")?;
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let stream = Stream::new(&ctx).during(C, "stream")?;
    let module = Module::load(&ctx, &ptx).during(C, "load")?;
    let r = module.function("no_such_kernel");
    ensure(
        C,
        matches!(&r, Err(Error::Driver { call: "cuModuleGetFunction", code }) if code.0 == 500),
        || format!("missing kernel gave {r:?}"),
    )?;
    let add_one = module.function(ADD_ONE.0).during(C, "function")?;
    let buf = DeviceBuffer::new(&ctx, 1024).during(C, "device")?;
    // SAFETY: every launch below is refused before the call (checked).
    unsafe {
        let r = add_one
            .launch(1u32, 2048u32)
            .arg(&buf)
            .arg(1024u64)
            .launch(&stream);
        ensure(C, matches!(r, Err(Error::BadLaunch { .. })), || {
            format!("2048 threads per block gave {r:?}")
        })?;
        let r = add_one
            .launch(0u32, 32u32)
            .arg(&buf)
            .arg(1024u64)
            .launch(&stream);
        ensure(C, matches!(r, Err(Error::BadLaunch { .. })), || {
            format!("an empty grid gave {r:?}")
        })?;
        if add_one.param_sizes().is_some() {
            let r = add_one.launch(1u32, 32u32).arg(&buf).launch(&stream);
            ensure(C, matches!(r, Err(Error::BadLaunch { .. })), || {
                format!("a missing argument gave {r:?}")
            })?;
            let r = add_one
                .launch(1u32, 32u32)
                .arg(&buf)
                .arg(1024u32)
                .launch(&stream);
            ensure(C, matches!(r, Err(Error::BadLaunch { .. })), || {
                format!("a 4-byte argument for an 8-byte parameter gave {r:?}")
            })?;
        }
    }
    let r = module.clone().destroy();
    ensure(C, matches!(r, Err(Error::InUse { .. })), || {
        format!("unloading while a function lives gave {r:?}")
    })?;
    stream.synchronize().during(C, "synchronize")?;
    drop(add_one);
    module.destroy().during(C, "unload")?;
    drop((buf, stream, ctx));
    no_drop_errors(C, backend)
}

/// Anonymous private memory of the process (`mmap`), unmapped on drop: the
/// caller-owned memory [`registered_host_memory_round_trip`] registers.
struct AnonymousPages {
    base: std::ptr::NonNull<u8>,
    len: usize,
}

impl AnonymousPages {
    fn new(len: usize) -> Result<Self, String> {
        // SAFETY: a fresh private anonymous mapping; no address hint.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_err("mmap"));
        }
        std::ptr::NonNull::new(p.cast::<u8>())
            .map(|base| AnonymousPages { base, len })
            .ok_or_else(|| "mmap gave NULL".to_string())
    }

    /// The bytes, while no GPU work uses them (the check synchronises
    /// first).
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes of our live mapping; `&mut self` makes this
        // the only view; the check queues no GPU work on them while the
        // view lives.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
    }
}

impl Drop for AnonymousPages {
    fn drop(&mut self) {
        // SAFETY: our mapping, no longer registered nor used.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// The caller's memory page-locked in place (`cuMemHostRegister`):
/// host-to-device and device-to-host copies from and to its host address,
/// a copy through its device address, a second registration of the same
/// range refused with `HOST_MEMORY_ALREADY_REGISTERED` (the header's code),
/// and the memory still the caller's after it was unregistered.
pub fn registered_host_memory_round_trip(
    backend: &Arc<Backend>,
    _exporter: &mut dyn Exporter,
) -> CheckResult {
    const C: &str = "registered_host_memory_round_trip";
    const N: usize = 64 * 1024;
    let ctx = Context::new(backend.clone(), 0).during(C, "context")?;
    let stream = Stream::new(&ctx).during(C, "stream")?;
    let mut pages = AnonymousPages::new(N).during(C, "anonymous memory")?;
    let data = pattern(31, N);
    pages.bytes().copy_from_slice(&data);
    // SAFETY: `pages` stays mapped until after `registered` is gone (it is
    // dropped last); the host views below exist only while no queued copy
    // runs (each copy is waited for first).
    let registered =
        unsafe { RegisteredHostMemory::register(&ctx, pages.base, N, HostRegistration::Memory) }
            .during(C, "register")?;
    ensure(C, registered.device_ptr() != 0, || {
        "no device pointer".into()
    })?;
    let device = DeviceBuffer::new(&ctx, N).during(C, "device")?;
    let done = Event::new(&ctx, EventFlags::NO_TIMING).during(C, "event")?;
    // Host to device from the host address.
    // SAFETY: both live until `done` completes; the host does not touch them meanwhile.
    unsafe { device.copy_from_pinned_async(0, &registered, 0, N, &stream) }
        .during(C, "device <- registered (HtoD)")?;
    done.record(&stream).during(C, "record")?;
    wait_event(C, &done, "copy from registered memory")?;
    let mut seen = vec![0u8; N];
    device.copy_to_host(0, &mut seen).during(C, "read device")?;
    ensure(C, seen == data, || {
        "the device did not get the registered memory's bytes".into()
    })?;
    // Device to host into the host address.
    let data2 = pattern(77, N);
    device.copy_from_host(0, &data2).during(C, "write device")?;
    // SAFETY: as above.
    unsafe { device.copy_to_pinned_async(0, &registered, 0, N, &stream) }
        .during(C, "registered <- device (DtoH)")?;
    done.record(&stream).during(C, "record 2")?;
    wait_event(C, &done, "copy to registered memory")?;
    ensure(C, pages.bytes() == data2.as_slice(), || {
        "the registered memory did not get the device's bytes".into()
    })?;
    // Through the device address (a device-to-device copy).
    let data3 = pattern(140, N);
    device
        .copy_from_host(0, &data3)
        .during(C, "write device 2")?;
    // SAFETY: as above.
    unsafe { stream.copy_async(&registered, 0, &device, 0, N as u64) }
        .during(C, "registered <- device through its device address")?;
    done.record(&stream).during(C, "record 3")?;
    wait_event(C, &done, "copy through the device address")?;
    ensure(C, pages.bytes() == data3.as_slice(), || {
        "a copy through the device address did not land in the registered memory".into()
    })?;
    // A second registration of the same range.
    // SAFETY: as for the first; it is refused (checked), and if it were not,
    // it would be dropped before `pages`.
    let again =
        unsafe { RegisteredHostMemory::register(&ctx, pages.base, N, HostRegistration::Memory) };
    ensure(
        C,
        matches!(&again, Err(Error::Driver { code, .. }) if *code == CuResult::HOST_MEMORY_ALREADY_REGISTERED),
        || format!("a second registration of the range gave {again:?}"),
    )?;
    drop(again);
    // Out-of-range copies are refused before the driver.
    // SAFETY: refused before anything is queued (checked).
    let r = unsafe { device.copy_from_pinned_async(0, &registered, 1, N, &stream) };
    ensure(C, matches!(r, Err(Error::OutOfBounds { .. })), || {
        format!("a copy past the registered range gave {r:?}")
    })?;
    stream.synchronize().during(C, "synchronize")?;
    registered.destroy().during(C, "unregister")?;
    // The memory is the caller's again, unchanged.
    ensure(C, pages.bytes() == data3.as_slice(), || {
        "unregistering changed the memory".into()
    })?;
    drop(done);
    drop(device);
    drop(stream);
    drop(pages);
    drop(ctx);
    no_drop_errors(C, backend)
}
