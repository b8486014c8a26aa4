//! The no_std core on a Cortex-M4F: the scenario of `tegra-interop-firmware-scenario`
//! (fence counters across the 32-bit wrap, semaphore batches, descriptor validation, typed
//! refusals), each step logged with defmt over semihosting; then the firmware's own figures
//! (maximum stack use from the painted stack, sizes of the core's types on this target), and
//! an exit status through semihosting: 0 when every check passed, 1 when the scenario met an
//! unexpected outcome, 101 on a panic, 102 on a hard fault.
//!
//! Built for `thumbv7em-none-eabihf` and run under QEMU's `mps2-an386` board model (README.md
//! beside Cargo.toml has the commands). There is no allocator: nothing here or in the core
//! uses `alloc`.
#![no_std]
#![no_main]

use core::mem::size_of;

use cortex_m_rt::{entry, exception, ExceptionFrame};
// The single-core critical section defmt-semihosting takes (cortex-m's feature).
use cortex_m as _;
use defmt_semihosting as _;
use scenario::{Event, Level, Sink};
use tegra_interop_core::{
    DeterministicCounter, MemoryImport, SignalBatch, TimelineTracker, ValidationError, WaitBatch,
};

/// Sends each scenario event to the defmt logger, at the event's level.
struct DefmtSink;

impl Sink for DefmtSink {
    fn event(&mut self, event: Event) {
        match event.level() {
            Level::Info => defmt::info!("{}", event),
            Level::Warn => defmt::warn!("{}", event),
        }
    }

    fn wait_batch(&mut self, batch: &WaitBatch<{ scenario::RING_SLOTS }>) {
        defmt::info!("batch: {}", batch);
    }
}

extern "C" {
    // Bounds of the stack region, from cortex-m-rt's link.x: the stack grows down from
    // `_stack_start` (the end of RAM) towards `_stack_end` (the end of .bss/.uninit). With
    // the `paint-stack` feature the reset handler fills the region with STACK_PAINT_VALUE
    // before `main`.
    static _stack_start: u32;
    static _stack_end: u32;
}

/// (bytes of stack ever used, bytes in the painted region): the painted region is scanned
/// upwards from its lowest word; the first word that lost its paint is the deepest the stack
/// has reached since reset.
fn stack_high_water() -> (usize, usize) {
    let bottom: *const u32 = &raw const _stack_end;
    let top = (&raw const _stack_start) as usize;
    let mut p = bottom;
    while (p as usize) < top {
        // SAFETY: every word in [_stack_end, _stack_start) is RAM of this program, 4-byte
        // aligned (link.x asserts both bounds' alignment) and initialised by the reset
        // handler's painting; nothing else aliases it mutably while we read. Volatile, so the
        // read is not reasoned away.
        let word = unsafe { core::ptr::read_volatile(p) };
        if word != cortex_m_rt::STACK_PAINT_VALUE {
            break;
        }
        p = p.wrapping_add(1);
    }
    (top - p as usize, top - bottom as usize)
}

#[entry]
fn main() -> ! {
    let status = match scenario::run(&mut DefmtSink) {
        Ok(_) => 0,
        Err(mismatch) => {
            defmt::error!("check failed: {}", mismatch);
            1
        }
    };
    let (used, region) = stack_high_water();
    defmt::info!(
        "measure: stack {=usize} bytes used of {=usize} painted",
        used,
        region
    );
    defmt::info!(
        "measure: size_of DeterministicCounter {=usize}, TimelineTracker {=usize}, SignalBatch<4> {=usize}, WaitBatch<4> {=usize}, MemoryImport {=usize}, ValidationError {=usize}",
        size_of::<DeterministicCounter>(),
        size_of::<TimelineTracker>(),
        size_of::<SignalBatch<{ scenario::RING_SLOTS }>>(),
        size_of::<WaitBatch<{ scenario::RING_SLOTS }>>(),
        size_of::<MemoryImport>(),
        size_of::<ValidationError>()
    );
    defmt::info!("exit: {=i32}", status);
    semihosting::process::exit(status)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    match info.location() {
        Some(at) => defmt::error!("panic at {=str}:{=u32}", at.file(), at.line()),
        None => defmt::error!("panic"),
    }
    semihosting::process::exit(101)
}

#[exception]
unsafe fn HardFault(frame: &ExceptionFrame) -> ! {
    defmt::error!("hard fault at pc {=u32:#x}", frame.pc());
    semihosting::process::exit(102)
}
