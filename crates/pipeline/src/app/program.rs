//! The `pipeline` program's entry point: the command line and environment
//! ([`cli`]), the run ([`crate::app::run()`], or the two-process mode), and
//! what it prints.
//!
//! Exit status: 0 all frames verified; 1 the run failed, a frame failed
//! verification, or stdout could not be written (see
//! [`output`]: a closed pipe is not such a failure);
//! 2 bad arguments or environment.
//!
//! Where the output goes: the report on stdout (human-readable, or one JSON
//! object with `--json`); with `--trace -` the trace takes stdout and the
//! human-readable report goes to stderr (`--json` is refused there); errors
//! and the verdict of a failed verification on stderr. With `--json`,
//! stdout always carries exactly one JSON object: the report, or
//! [`report::json_error`]'s `{"ok": false, "stage": ..., "error": ...}`
//! when there is none (bad arguments, a run that cannot start or fails).
//! The camera side of the two-process mode (`--role camera`, or the
//! process `--processes 2` starts) prints nothing on stdout: its figures
//! are in the CUDA side's report.

use std::ffi::OsString;
use std::process::ExitCode;

use crate::app::cli::{self, Command, Options};
use crate::app::{output, report};

/// The `pipeline` binary: parses the command line and the environment,
/// runs, prints the report (see the module docs for the exit status).
pub fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    // Bad arguments with `--json` are answered in JSON too.
    let json = args.iter().any(|a| a == "--json");
    let opts = match cli::parse(args) {
        Ok(Command::Help) => {
            return output::stdout_then("the help", &cli::help(), ExitCode::SUCCESS);
        }
        Ok(Command::Run(o)) => o,
        Err(e) => return failed(json, "arguments", "error", &e, ExitCode::from(2)),
    };
    if let Err(e) = cli::apply_process_settings(&opts) {
        return failed(opts.json, "run", "error", &e, ExitCode::FAILURE);
    }
    if opts.consumer_processes {
        return crate::app::process::fd_multicast::main(&opts);
    }
    #[cfg(feature = "zenoh")]
    if opts.zenoh.publish.is_some() {
        return crate::app::zenoh::main_publish(&opts);
    }
    if !opts.consumers.is_empty() {
        return match crate::app::multicast::run(&opts) {
            Ok(r) => print_multicast(&opts, &r),
            Err(e) => failed(opts.json, "run", "error", &e, ExitCode::FAILURE),
        };
    }
    let (result, who) = if opts.two_process() {
        let who = match opts.role {
            Some(cli::Role::Camera) => "error (camera process)",
            Some(cli::Role::Consumer) => "error (consumer process)",
            _ => "error (cuda process)",
        };
        let r = crate::app::process::run(&opts).map_err(|e| e.to_string());
        (r, who)
    } else {
        (crate::app::run(&opts).map(Some), "error")
    };
    match result {
        Ok(Some(report)) => print_report(&opts, &report),
        // The camera side of the two-process mode: its figures went to the
        // CUDA process, which reports them.
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => failed(opts.json, "run", who, &e, ExitCode::FAILURE),
    }
}

/// Prints the report where the options send it; the exit status.
fn print_report(opts: &Options, report: &report::Report) -> ExitCode {
    let status = if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    };
    let status = if opts.json {
        output::stdout_then("the report", &format!("{}\n", report.json()), status)
    } else {
        output::report_then(
            "the report",
            &report.human(),
            opts.trace_to_stdout(),
            status,
        )
    };
    if !report.passed() {
        output::stderr_line("error: frames failed verification; the pipeline is broken");
    }
    status
}

/// Prints a `--consumers` run's report; the exit status.
fn print_multicast(opts: &Options, r: &crate::app::multicast::MulticastReport) -> ExitCode {
    let status = match r.passed() {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    };
    let text = match opts.json {
        true => format!("{}\n", r.json()),
        false => r.human(),
    };
    let status = output::stdout_then("the report", &text, status);
    if !r.passed() {
        output::stderr_line("error: a consumer missed or failed a frame");
    }
    status
}

/// Says `error` on stderr (after `who`) and, with `--json`, as the JSON
/// error object of `stage` on stdout; gives `status`, unless stdout fails.
fn failed(json: bool, stage: &str, who: &str, error: &str, status: ExitCode) -> ExitCode {
    output::stderr_line(&format!("{who}: {error}"));
    if !json {
        return status;
    }
    let object = format!("{}\n", report::json_error(stage, error));
    output::stdout_then("the JSON error", &object, status)
}
