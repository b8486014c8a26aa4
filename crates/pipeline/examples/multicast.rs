//! One camera, several consumers: the multicast ring on the host reference
//! transport (host threads as consumers; runs anywhere):
//! `cargo run -p tegra-interop-pipeline --example multicast`.
//!
//! Two FIFO consumers check every frame's test pattern; a mailbox
//! consumer (a preview, five times slower than the camera) takes the
//! newest frame and skips the rest; a recorder attaches late, at frame 40,
//! and a checker detaches at frame 80. At the end every consumer's counts
//! are printed, and the program fails unless every FIFO consumer saw every
//! frame of its time in the ring, verified.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tegra_interop_pipeline::camera::TestPattern;
use tegra_interop_pipeline::frame::FrameGeometry;
use tegra_interop_pipeline::multicast::host::{pattern_mismatches, HostFanout, HostWork};
use tegra_interop_pipeline::multicast::ring::{ConsumerReport, MulticastRing, Polled};
use tegra_interop_pipeline::multicast::{ConsumerEvent, ConsumerId, ConsumerSpec, MulticastError};

const FRAMES: u64 = 120;
const GEOMETRY: FrameGeometry = FrameGeometry {
    stride: 256,
    rows: 64,
};
const PERIOD: Duration = Duration::from_millis(1);
const LIMIT: Duration = Duration::from_secs(5);

/// A consumer's name, id and the frames it saw.
struct Named {
    name: &'static str,
    id: ConsumerId,
    fifo: bool,
    frames: Arc<Mutex<Vec<u64>>>,
}

/// Work that checks each frame's test pattern and records the frame.
fn check(frames: &Arc<Mutex<Vec<u64>>>) -> HostWork {
    let seen = Arc::clone(frames);
    HostWork::new(move |frame, bytes| {
        if let Ok(mut seen) = seen.lock() {
            seen.push(frame);
        }
        pattern_mismatches(frame, GEOMETRY.stride, bytes)
    })
}

fn attach(
    ring: &mut MulticastRing<HostFanout>,
    name: &'static str,
    fifo: bool,
    delay: Duration,
) -> Result<Named, MulticastError> {
    let frames = Arc::default();
    let work = check(&frames);
    work.control().set_delay(delay);
    let spec = match fifo {
        true => ConsumerSpec::fifo(work, LIMIT),
        false => ConsumerSpec::mailbox(work, LIMIT),
    };
    let id = ring.attach(spec)?;
    Ok(Named {
        name,
        id,
        fifo,
        frames,
    })
}

/// The run: returns each consumer with its final counts.
fn run() -> Result<Vec<(Named, ConsumerReport)>, MulticastError> {
    let mut ring = MulticastRing::new(HostFanout::new(GEOMETRY, 6)?)?;
    let mut all = vec![
        attach(&mut ring, "checker-a", true, Duration::ZERO)?,
        attach(&mut ring, "checker-b", true, Duration::ZERO)?,
        attach(&mut ring, "preview", false, PERIOD * 5)?,
    ];
    let mut polled = Vec::new();
    for f in 0..FRAMES {
        if f == 40 {
            all.push(attach(&mut ring, "recorder", true, Duration::ZERO)?);
        }
        if f == 80 {
            ring.detach(all[1].id)?;
        }
        std::thread::sleep(PERIOD);
        let mut lease = ring.acquire()?;
        TestPattern::new(lease.frame(), GEOMETRY.stride).fill(lease.bytes_mut()?);
        ring.hand_over(lease)?;
        polled.extend(ring.poll()?);
    }
    polled.extend(ring.drain(LIMIT)?);
    let ids: Vec<ConsumerId> = ring.consumers().collect();
    for id in ids {
        ring.detach(id)?;
    }
    polled.extend(ring.poll()?);
    ring.close()?;
    for p in &polled {
        if let Polled::Event(e) = p {
            println!("event: {e:?}");
        }
    }
    let mut out = Vec::new();
    for n in all {
        let report = polled.iter().find_map(|p| match p {
            Polled::Event(ConsumerEvent::Forgotten { consumer, report }) if *consumer == n.id => {
                Some(*report)
            }
            _ => None,
        });
        let report = report.ok_or(MulticastError::UnknownConsumer { consumer: n.id })?;
        out.push((n, report));
    }
    Ok(out)
}

/// Whether a FIFO consumer saw every frame of its time in the ring, in
/// order, each verified.
fn complete(n: &Named, r: &ConsumerReport) -> bool {
    let frames = n.frames.lock().map(|f| f.clone()).unwrap_or_default();
    let first = r.stats.first_frame;
    let want: Vec<u64> = (first..first + frames.len() as u64).collect();
    r.mismatches == 0 && frames == want && r.finished == frames.len() as u64
}

fn main() -> ExitCode {
    let all = match run() {
        Ok(all) => all,
        Err(e) => {
            eprintln!("multicast: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut ok = true;
    for (n, r) in &all {
        let mode = if n.fifo { "fifo" } else { "mailbox" };
        println!(
            "{:<10} {mode:<7} from frame {:>3}: {:>3} frames verified, {:>3} skipped, {} dropped at detach, {} mismatches, producer waited {} times",
            n.name, r.stats.first_frame, r.finished, r.stats.skipped, r.stats.dropped, r.mismatches, r.stats.stalls
        );
        ok &= r.mismatches == 0 && (!n.fifo || complete(n, r));
    }
    if ok {
        println!("multicast: {FRAMES} frames, every FIFO consumer's frames verified");
        ExitCode::SUCCESS
    } else {
        eprintln!("multicast: a consumer missed or failed a frame");
        ExitCode::FAILURE
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_fifo_consumer_sees_its_frames_and_the_preview_skips() {
        let all = run().unwrap();
        let get = |name: &str| all.iter().find(|(n, _)| n.name == name).unwrap();
        let (a, ra) = get("checker-a");
        assert_eq!((ra.finished, ra.mismatches), (FRAMES, 0));
        assert!(complete(a, ra));
        let (rec, rr) = get("recorder");
        assert_eq!(rr.stats.first_frame, 40);
        assert_eq!(rr.finished, FRAMES - 40);
        assert!(complete(rec, rr));
        let (b, rb) = get("checker-b");
        assert!(complete(b, rb));
        assert_eq!(
            rb.finished + rb.stats.dropped,
            80,
            "frames 0..80 taken or dropped at detach"
        );
        let (_, rp) = get("preview");
        assert_eq!(rp.finished + rp.stats.skipped + rp.stats.dropped, FRAMES);
        assert_eq!(rp.stats.stalls, 0);
    }
}
