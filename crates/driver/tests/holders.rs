//! Handles hold their context (and mappings their memory) by `Arc`: they
//! can be stored together and returned from functions, the context is
//! released only after the last of them, and destroying or resetting a
//! context (or destroying memory) that others still hold is refused at run
//! time with `Error::InUse`, before the driver sees it.
#![allow(clippy::unwrap_used)] // tests may unwrap

use tegra_interop_core::{BufferMapping, SignalParams};
use tegra_interop_driver::{
    Context, Error, ExternalMemory, ExternalSemaphore, MappedBuffer, Stream,
};
use tegra_interop_sim::export::{self, ExportedMemory, ExportedTimelineSemaphore};
use tegra_interop_sim::Sim;

/// Everything a program keeps, in one struct, built by a function.
struct Pipeline {
    // Field order is irrelevant: each handle keeps what it needs alive.
    ctx: Context,
    stream: Stream,
    memory: ExternalMemory,
    buffer: MappedBuffer,
    semaphore: ExternalSemaphore,
}

fn open(sim: &Sim) -> (Pipeline, ExportedMemory, ExportedTimelineSemaphore) {
    let (mem_fd, exported) = export::memory(256).unwrap();
    let (sem_fd, exported_sem) = export::timeline_semaphore(0).unwrap();
    let ctx = Context::primary(sim.backend(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let memory = ExternalMemory::opaque_fd(&ctx, mem_fd, 256).unwrap();
    let buffer = memory.map_buffer(BufferMapping::new(0, 256)).unwrap();
    let semaphore = ExternalSemaphore::timeline_fd(&ctx, sem_fd).unwrap();
    (
        Pipeline {
            ctx,
            stream,
            memory,
            buffer,
            semaphore,
        },
        exported,
        exported_sem,
    )
}

#[test]
fn a_stored_pipeline_works_after_being_returned() {
    let sim = Sim::new().unwrap();
    let (mut p, exported, exported_sem) = open(&sim);
    p.buffer.copy_from_host(0, &[9; 8]).unwrap();
    let value = p
        .stream
        .signal(&mut p.semaphore, SignalParams::timeline(3))
        .unwrap();
    assert_eq!(value, Some(3));
    p.stream.synchronize().unwrap();
    assert_eq!(exported_sem.value(), 3);
    let mut seen = [0u8; 8];
    exported.read(0, &mut seen).unwrap();
    assert_eq!(seen, [9; 8]);
    assert_eq!(p.memory.holders(), 1, "the mapping holds the memory");
    // context clones: stream, memory, semaphore (the mapping holds the memory)
    assert_eq!(p.ctx.holders(), 3);
    drop(p);
    assert!(sim.backend().take_drop_errors().is_empty());
}

#[test]
fn destroying_or_resetting_a_held_context_is_refused_before_the_driver() {
    let sim = Sim::new().unwrap();
    let (p, _exported, _sem) = open(&sim);
    let Pipeline {
        mut ctx,
        stream,
        memory,
        buffer,
        semaphore,
    } = p;
    let calls = sim.calls();
    match ctx.reset() {
        Err(Error::InUse {
            operation: "Context::reset",
            holders: 3,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    match ctx.clone().destroy() {
        Err(Error::InUse {
            operation: "Context::destroy",
            holders: 4, // the three handles and `ctx` itself
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.calls(), calls, "refused before any driver call");
    // Memory with a live mapping is refused the same way; dropping the
    // refused handle destroys nothing while the mapping holds it.
    let memory2 = ExternalMemory::opaque_fd(&ctx, export::memory(64).unwrap().0, 64).unwrap();
    let mapping = memory2.map_whole().unwrap();
    match memory2.destroy() {
        Err(Error::InUse {
            operation: "ExternalMemory::destroy",
            holders: 1,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    mapping.copy_from_host(0, &[1; 4]).unwrap();
    mapping.destroy().unwrap();
    // Once every holder is gone, both succeed.
    buffer.destroy().unwrap();
    memory.destroy().unwrap();
    semaphore.destroy().unwrap();
    stream.destroy().unwrap();
    assert_eq!(ctx.holders(), 0);
    ctx.reset().unwrap();
    ctx.destroy().unwrap();
    assert!(sim.backend().take_drop_errors().is_empty());
}

#[test]
fn the_context_goes_after_its_last_handle() {
    let sim = Sim::new().unwrap();
    let (mem_fd, _exported) = export::memory(64).unwrap();
    let buffer = {
        let ctx = Context::primary(sim.backend(), 0).unwrap();
        let memory = ExternalMemory::opaque_fd(&ctx, mem_fd, 64).unwrap();
        memory.map_whole().unwrap()
        // `ctx` and `memory` dropped here: both stay alive in `buffer`.
    };
    buffer.copy_from_host(0, &[5; 64]).unwrap();
    let mut back = [0u8; 64];
    buffer.copy_to_host(0, &mut back).unwrap();
    assert_eq!(back, [5; 64]);
    drop(buffer); // frees the mapping, then the memory, then the context
    assert!(sim.backend().take_drop_errors().is_empty());
}

/// The caller's memory page-locked in place: the registration holds its
/// context, refuses a second registration of the range (the raw code
/// kept), copies both ways, and is undone when dropped, leaving the memory
/// to the caller unchanged.
#[test]
fn registered_memory_holds_its_context_and_unregisters_on_drop() {
    use std::ptr::NonNull;
    use tegra_interop_driver::{DeviceBuffer, HostRegistration, RegisteredHostMemory};
    const N: usize = 8192;
    // The second registration is misuse on purpose: recorded, not echoed.
    let sim = Sim::with_config(tegra_interop_sim::SimConfig::default().with_diagnostic_echo(false))
        .unwrap();
    let layout = std::alloc::Layout::from_size_align(N, 4096).unwrap();
    // SAFETY: a non-zero size; freed at the end, after the registration is gone.
    let mem = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).unwrap();
    // SAFETY: `mem` is written only while no copy is queued.
    unsafe { std::ptr::write_bytes(mem.as_ptr(), 3, N) };
    let ctx = Context::primary(sim.backend(), 0).unwrap();
    // Every registration below: `mem` outlives it (freed last) and is
    // touched by the host only while no copy runs.
    // SAFETY: as said.
    let zero = unsafe { RegisteredHostMemory::register(&ctx, mem, 0, HostRegistration::Memory) };
    assert!(matches!(zero, Err(Error::Unsupported { .. })), "{zero:?}");
    // SAFETY: as said.
    let reg =
        unsafe { RegisteredHostMemory::register(&ctx, mem, N, HostRegistration::Memory) }.unwrap();
    assert_eq!(sim.ledger().live_host_allocations, 1);
    assert_eq!((reg.len(), reg.host_ptr()), (N, mem.as_ptr()));
    // SAFETY: as said (and it is refused).
    let again = unsafe { RegisteredHostMemory::register(&ctx, mem, N, HostRegistration::Memory) };
    assert!(
        matches!(&again, Err(Error::Driver { call: "cuMemHostRegister", code }) if code.0 == 712),
        "{again:?}"
    );
    drop(ctx); // the registration holds its own clone
    let stream = Stream::new(reg.context()).unwrap();
    let device = DeviceBuffer::new(reg.context(), N).unwrap();
    // SAFETY: both live until the stream is synchronised; the host does not
    // touch `mem` meanwhile.
    unsafe { device.copy_from_pinned_async(0, &reg, 0, N, &stream) }.unwrap();
    stream.synchronize().unwrap();
    let mut seen = vec![0u8; N];
    device.copy_to_host(0, &mut seen).unwrap();
    assert!(seen.iter().all(|b| *b == 3));
    device.copy_from_host(0, &[8; 64]).unwrap();
    // SAFETY: as above.
    unsafe { device.copy_to_pinned_async(0, &reg, 100, 64, &stream) }.unwrap();
    stream.synchronize().unwrap();
    drop(reg);
    assert_eq!(sim.ledger().live_host_allocations, 0);
    let diagnostics = sim.diagnostics();
    assert_eq!(diagnostics.len(), 1, "{diagnostics:?}");
    assert!(diagnostics[0]
        .message
        .contains("overlaps the range registered"));
    // SAFETY: unregistered; no copy pending.
    let bytes = unsafe { std::slice::from_raw_parts(mem.as_ptr(), N) };
    assert!(bytes[..100].iter().all(|b| *b == 3));
    assert!(bytes[100..164].iter().all(|b| *b == 8));
    assert!(bytes[164..].iter().all(|b| *b == 3));
    drop((device, stream));
    // SAFETY: allocated above with this layout; nothing uses it any more.
    unsafe { std::alloc::dealloc(mem.as_ptr(), layout) };
    assert!(sim.ledger().is_clean(), "{}", sim.ledger());
}
