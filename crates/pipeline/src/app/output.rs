//! How the programs write to stdout and stderr without panicking.
//!
//! `print!` and `eprintln!` panic when the write fails (a full disk behind
//! `>/dev/full`, a reader that went away in `pipeline | head -c0`), which
//! ends the program with status 101 and a backtrace. The programs write
//! through these functions instead:
//!
//! - stdout that cannot be written because its reader closed the pipe
//!   (`EPIPE`) is not an error worth a word: nothing is said and the exit
//!   status stays what the run decided (0 verified, 1 failed), the way a
//!   filter ends quietly when the program after it has read enough;
//! - any other failed write to stdout ends the program with one line on
//!   stderr (`error: cannot write ... to stdout: <reason>`) and exit status
//!   1 ([`OUTPUT_FAILED`]);
//! - a failed write to stderr is ignored: there is nowhere left to say so,
//!   and the exit status already tells the outcome.

use std::io::{self, Write};
use std::process::ExitCode;

/// The exit status when stdout cannot be written (other than a closed
/// pipe): the same as a failed run.
pub const OUTPUT_FAILED: u8 = 1;

/// Writes `text` to stdout and flushes it.
pub fn stdout(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Writes `line` and a newline to stderr; a failure is ignored (see the
/// module docs).
pub fn stderr_line(line: &str) {
    let mut err = io::stderr().lock();
    let _ = writeln!(err, "{line}").and_then(|()| err.flush());
}

/// Writes `text` (`what` it is, for the error line) to stdout and gives
/// the exit status: `status` when the write worked or the reader closed
/// the pipe, else [`OUTPUT_FAILED`] after one line on stderr.
pub fn stdout_then(what: &str, text: &str, status: ExitCode) -> ExitCode {
    match stdout(text) {
        Ok(()) => status,
        Err(e) => failed_stdout(what, &e, status),
    }
}

/// The exit status after stdout failed with `e` while writing `what` (see
/// [`stdout_then`]).
pub fn failed_stdout(what: &str, e: &io::Error, status: ExitCode) -> ExitCode {
    if e.kind() == io::ErrorKind::BrokenPipe {
        return status;
    }
    stderr_line(&format!("error: cannot write {what} to stdout: {e}"));
    ExitCode::from(OUTPUT_FAILED)
}

/// Writes `text` to stdout, or with `to_stderr` to stderr (a failure there
/// is ignored), and gives the exit status as [`stdout_then`] does.
pub fn report_then(what: &str, text: &str, to_stderr: bool, status: ExitCode) -> ExitCode {
    if to_stderr {
        let mut err = io::stderr().lock();
        let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
        return status;
    }
    stdout_then(what, text, status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_pipe_keeps_the_status_and_other_errors_give_1() {
        let pipe = io::Error::from(io::ErrorKind::BrokenPipe);
        assert_eq!(
            failed_stdout("x", &pipe, ExitCode::SUCCESS),
            ExitCode::SUCCESS
        );
        assert_eq!(
            failed_stdout("x", &pipe, ExitCode::FAILURE),
            ExitCode::FAILURE
        );
        let full = io::Error::from_raw_os_error(28);
        assert_eq!(
            failed_stdout("x", &full, ExitCode::SUCCESS),
            ExitCode::from(OUTPUT_FAILED)
        );
    }
}
