//! The scenario on the host: it passes its own checks, and its events are what the
//! firmware's log is compared with.
use tegra_interop_core::WaitBatch;
use tegra_interop_firmware_scenario::{
    self as scenario, Event, Sink, FIRST_FENCE, FRAMES, RING_SLOTS,
};

#[derive(Default)]
struct Collect(Vec<Event>);

impl Sink for Collect {
    fn event(&mut self, event: Event) {
        self.0.push(event);
    }

    fn wait_batch(&mut self, batch: &WaitBatch<RING_SLOTS>) {
        assert_eq!(batch.len(), RING_SLOTS);
    }
}

#[test]
fn the_scenario_passes_on_the_host() {
    let mut events = Collect::default();
    let summary = scenario::run(&mut events).expect("every check passes");
    assert_eq!(
        summary.frames,
        FRAMES - 1,
        "one enqueue fails and is aborted"
    );
    assert_eq!(summary.signals, u64::from(FRAMES - 1));
    // 11 signals from 0xFFFF_FFF9 end at 0x3, after the 32-bit wrap.
    assert_eq!(
        summary.fence,
        (FIRST_FENCE + summary.signals - 1) & 0xFFFF_FFFF
    );
    assert_eq!(summary.fence, 3);
    let refused = events
        .0
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::Refused { .. } | Event::SignalBatchFull { .. } | Event::WaitBatchFull { .. }
            )
        })
        .count();
    assert_eq!(refused as u32, summary.refusals);
    assert!(matches!(events.0.last(), Some(Event::Done { .. })));
}

#[test]
fn fences_wrap_at_32_bits() {
    let mut events = Collect::default();
    scenario::run(&mut events).expect("every check passes");
    let fences: Vec<u64> = events
        .0
        .iter()
        .filter_map(|e| match e {
            Event::Frame { fence, .. } => Some(*fence),
            _ => None,
        })
        .collect();
    assert_eq!(
        fences,
        [
            0xFFFF_FFF9,
            0xFFFF_FFFA,
            0xFFFF_FFFB,
            0xFFFF_FFFC,
            0xFFFF_FFFD,
            0xFFFF_FFFE,
            0xFFFF_FFFF,
            0,
            1,
            2,
            3
        ]
    );
}
