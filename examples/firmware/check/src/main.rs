//! Host side of the firmware run: compares the firmware's defmt log, decoded by
//! `defmt-print --log-format '{L} {s}'`, with the same scenario computed on the host by the
//! same core functions, and reports the firmware's own measurements.
//!
//! ```text
//! tegra-interop-firmware-check DECODED_LOG [--max-stack BYTES]
//! ```
//!
//! Exits 0 when the log is exactly the host's sequence followed by the measurement lines and
//! `exit: 0`; 1 with the first difference otherwise (a missing, extra or different line, a
//! non-zero firmware exit, a stack above `--max-stack`); 2 on a usage or I/O error.

use std::process::ExitCode;
use std::{env, fs};

use scenario::{Event, Sink};
use tegra_interop_core::{
    DeterministicCounter, MemoryImport, SignalBatch, TimelineTracker, ValidationError, WaitBatch,
};

/// Collects the scenario's events as the lines defmt-print writes for them.
#[derive(Default)]
struct Lines(Vec<String>);

impl Sink for Lines {
    fn event(&mut self, event: Event) {
        self.0.push(line(event.level().name(), &event.to_string()));
    }

    fn wait_batch(&mut self, batch: &WaitBatch<{ scenario::RING_SLOTS }>) {
        self.0.push(line("INFO", &format!("batch: {batch:?}")));
    }
}

/// One line as `defmt-print --log-format '{L} {s}'` prints it: the level padded to 5.
fn line(level: &str, text: &str) -> String {
    format!("{level:<5} {text}")
}

/// The log the firmware must print: the scenario's events as computed here, on the host.
fn expected() -> Result<Vec<String>, String> {
    let mut lines = Lines::default();
    scenario::run(&mut lines).map_err(|m| format!("the scenario fails on the host: {m}"))?;
    Ok(lines.0)
}

/// What the firmware measured about itself.
#[derive(Debug, Default, PartialEq, Eq)]
struct Measures {
    /// Bytes of stack used (high-water mark of the painted stack).
    stack_used: Option<usize>,
    /// The `measure:` lines, as printed.
    lines: Vec<String>,
}

const MEASURE: &str = "INFO  measure: ";
const EXIT_OK: &str = "INFO  exit: 0";

/// Compares the decoded log with `expected`: the scenario's lines in order, then only
/// `measure:` lines, then `exit: 0` as the last line.
fn compare(log: &str, expected: &[String]) -> Result<Measures, String> {
    let got: Vec<&str> = log.lines().collect();
    for (i, want) in expected.iter().enumerate() {
        match got.get(i) {
            Some(have) if *have == want.as_str() => {}
            Some(have) => {
                return Err(format!(
                    "log line {} differs from the host's computation\n  host:     {want}\n  firmware: {have}",
                    i + 1
                ))
            }
            None => {
                return Err(format!(
                    "the log ends after {} lines; the host's line {} is missing: {want}",
                    got.len(),
                    i + 1
                ))
            }
        }
    }
    let mut measures = Measures::default();
    let rest = &got[expected.len()..];
    let Some((last, middle)) = rest.split_last() else {
        return Err("the log has no measurements and no exit line after the scenario".into());
    };
    for (j, l) in middle.iter().enumerate() {
        let Some(m) = l.strip_prefix(MEASURE) else {
            return Err(format!(
                "log line {} is neither the host's sequence nor a measurement: {l}",
                expected.len() + j + 1
            ));
        };
        if let Some(s) = m.strip_prefix("stack ") {
            let used = s.split(' ').next().and_then(|n| n.parse().ok());
            measures.stack_used =
                Some(used.ok_or_else(|| format!("unreadable stack measurement: {l}"))?);
        }
        measures.lines.push(m.to_string());
    }
    if *last != EXIT_OK {
        return Err(format!("the last log line is not `{EXIT_OK}`: {last}"));
    }
    if measures.stack_used.is_none() {
        return Err("the log has no stack measurement".into());
    }
    Ok(measures)
}

fn run(args: &[String]) -> Result<(), Failure> {
    let usage = || {
        Failure::Usage("usage: tegra-interop-firmware-check DECODED_LOG [--max-stack BYTES]".into())
    };
    let (path, max_stack) = match args {
        [path] => (path, None),
        [path, flag, n] if flag == "--max-stack" => {
            (path, Some(n.parse::<usize>().map_err(|_| usage())?))
        }
        _ => return Err(usage()),
    };
    let log = fs::read_to_string(path)
        .map_err(|e| Failure::Usage(format!("cannot read the decoded log {path}: {e}")))?;
    let expected = expected().map_err(Failure::Check)?;
    let measures = compare(&log, &expected).map_err(Failure::Check)?;
    println!(
        "firmware log matches the host's computation: {} scenario lines, then exit 0",
        expected.len()
    );
    for m in &measures.lines {
        println!("firmware (thumbv7em-none-eabihf, under QEMU) measure: {m}");
    }
    println!(
        "host ({}) size_of DeterministicCounter {}, TimelineTracker {}, SignalBatch<4> {}, WaitBatch<4> {}, MemoryImport {}, ValidationError {}",
        env::consts::ARCH,
        size_of::<DeterministicCounter>(),
        size_of::<TimelineTracker>(),
        size_of::<SignalBatch<{ scenario::RING_SLOTS }>>(),
        size_of::<WaitBatch<{ scenario::RING_SLOTS }>>(),
        size_of::<MemoryImport>(),
        size_of::<ValidationError>()
    );
    if let (Some(max), Some(used)) = (max_stack, measures.stack_used) {
        if used > max {
            return Err(Failure::Check(format!(
                "the firmware used {used} bytes of stack, above the budget of {max}"
            )));
        }
        println!("stack: {used} bytes used, budget {max}");
    }
    Ok(())
}

enum Failure {
    Usage(String),
    Check(String),
}

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Check(e)) => {
            eprintln!("error: firmware check failed: {e}");
            ExitCode::from(1)
        }
        Err(Failure::Usage(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log as the firmware prints it when all is well, built from the host's lines.
    fn good_log() -> String {
        let mut log = expected()
            .expect("the scenario passes on the host")
            .join("\n");
        log.push_str("\nINFO  measure: stack 1988 bytes used of 65520 painted");
        log.push_str("\nINFO  measure: size_of DeterministicCounter 200\n");
        log.push_str(EXIT_OK);
        log.push('\n');
        log
    }

    #[test]
    fn the_host_sequence_crosses_the_wrap_and_refuses() {
        let lines = expected().expect("the scenario passes on the host");
        assert!(lines.iter().any(|l| l.contains("fence 0xffffffff")));
        assert!(lines.iter().any(|l| l.contains("fence 0x0,")));
        assert!(lines
            .iter()
            .any(|l| l.starts_with("WARN  refused: import fd -1: NegativeFd { fd: -1 }")));
        assert!(lines
            .last()
            .is_some_and(|l| l.contains("done: 11 frames, 14 refusals")));
    }

    #[test]
    fn a_matching_log_passes() {
        let m = compare(&good_log(), &expected().expect("host")).expect("matches");
        assert_eq!(m.stack_used, Some(1988));
        assert_eq!(m.lines.len(), 2);
    }

    #[test]
    fn a_wrong_fence_value_fails() {
        let log = good_log().replace("fence 0x1,", "fence 0x2,");
        let e = compare(&log, &expected().expect("host")).expect_err("diverges");
        assert!(e.contains("differs from the host's computation"), "{e}");
    }

    #[test]
    fn a_wrong_expectation_fails() {
        let mut want = expected().expect("host");
        want[1] = want[1].replace("fd: -1", "fd: -2");
        let e = compare(&good_log(), &want).expect_err("diverges");
        assert!(e.contains("log line 2 differs"), "{e}");
    }

    #[test]
    fn a_missing_refusal_fails() {
        let log = good_log().replace("WARN  refused: import of 0 bytes: ZeroSize\n", "");
        assert!(compare(&log, &expected().expect("host")).is_err());
    }

    #[test]
    fn a_wrong_level_fails() {
        let log = good_log().replace("WARN  refused: import fd -1", "INFO  refused: import fd -1");
        assert!(compare(&log, &expected().expect("host")).is_err());
    }

    #[test]
    fn a_log_cut_short_fails() {
        let want = expected().expect("host");
        let log = want[..want.len() - 3].join("\n");
        let e = compare(&log, &want).expect_err("short");
        assert!(e.contains("is missing"), "{e}");
    }

    #[test]
    fn a_failed_firmware_exit_fails() {
        let log = good_log().replace(EXIT_OK, "INFO  exit: 1");
        let e = compare(&log, &expected().expect("host")).expect_err("exit 1");
        assert!(e.contains("last log line"), "{e}");
    }

    #[test]
    fn an_extra_line_fails() {
        let log = good_log().replace(EXIT_OK, "ERROR panic at src/main.rs:1\nINFO  exit: 0");
        let e = compare(&log, &expected().expect("host")).expect_err("extra");
        assert!(
            e.contains("neither the host's sequence nor a measurement"),
            "{e}"
        );
    }
}
