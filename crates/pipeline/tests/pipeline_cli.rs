//! Runs the compiled `pipeline` binary: exit codes, one-line errors, the
//! JSON summary, and that injected defects fail verification.
//!
//! Cargo builds the binary for this test (`CARGO_BIN_EXE_pipeline`).
#![allow(clippy::unwrap_used)]

mod common;
use common::child_command;

use std::path::PathBuf;
use std::process::Output;

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pipeline"))
}

fn run(args: &[&str]) -> Output {
    child_command(example()).args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const SMALL: &[&str] = &[
    "--frames", "40", "--ring", "3", "--width", "64", "--height", "16", "--quiet",
];

fn small(extra: &[&str]) -> Output {
    let mut args = vec!["--backend", "host"];
    args.extend_from_slice(SMALL);
    args.extend_from_slice(extra);
    run(&args)
}

fn small_on(backend: &str, extra: &[&str]) -> Output {
    let mut args = vec!["--backend", backend];
    args.extend_from_slice(SMALL);
    args.extend_from_slice(extra);
    run(&args)
}

#[test]
fn help_exits_zero() {
    let o = run(&["--help"]);
    assert!(o.status.success());
    assert!(stdout(&o).contains("--backend"));
}

#[test]
fn bad_input_is_one_line_and_non_zero() {
    let cases: &[(&[&str], i32, &str)] = &[
        (&["--frames", "0"], 2, "--frames"),
        (&["--ring", "0"], 2, "fixed capacity"),
        (&["--ring", "9"], 2, "fixed capacity"),
        (
            &["--backend", "opencl"],
            2,
            "invalid value 'opencl' for '--backend",
        ),
        (&["--width", "abc"], 2, "not a number"),
        (
            &["--backend", "cuda"],
            2,
            "possible values: auto, sim, gpu, jetson, egl, host",
        ),
        (&["--ring", "1000"], 2, "fixed capacity"),
        (&["--bogus"], 2, "unexpected argument '--bogus'"),
        (&["--fault", "corrupt"], 2, "only applies"),
        (
            &["--backend", "gpu", "--frames", "1"],
            1,
            "backend `gpu` is not available: ",
        ),
        (
            &["--backend", "jetson", "--frames", "1"],
            1,
            "backend `jetson` is not available: ",
        ),
    ];
    for (args, code, want) in cases {
        let o = run(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(*code), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(want),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(stdout(&o).is_empty(), "{args:?}");
    }
}

#[test]
fn host_run_verifies_every_frame() {
    for mode in [&[][..], &["--copy"][..]] {
        let mut extra = vec!["--json"];
        extra.extend_from_slice(mode);
        let o = small(&extra);
        assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
        assert_eq!(stdout(&o).trim().lines().count(), 1, "one JSON object");
        let j = json(&o);
        assert_eq!(j["backend"], "host-reference", "{j}");
        assert_eq!(j["frames"], 40, "{j}");
        assert_eq!(j["verified"], true, "{j}");
        assert_all_checked(&j, 40);
        for key in ["queued_us", "held_us", "overhead_us"] {
            assert_eq!(j[key]["count"], 40, "{key}: {j}");
        }
        let want_mode = if mode.is_empty() { "zero-copy" } else { "copy" };
        assert_eq!(j["mode"], want_mode, "{j}");
    }
}

#[test]
fn human_summary_labels_the_reference_transport() {
    let o = small(&["--format", "raw16"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(out.starts_with("backend: host-reference"), "{out}");
    assert!(out.contains("not the simulator and not CUDA"), "{out}");
    assert!(out.contains("verified: 40/40 frames"), "{out}");
    for word in [
        "latency",
        "p50",
        "p99",
        "max",
        "interop overhead",
        "held before ready",
        "frames/s",
        "MB/s",
    ] {
        assert!(out.contains(word), "{word}: {out}");
    }
}

/// The single-process report times every stage it lists, the producer
/// thread's waits included (collecting frames, lending the frame to check,
/// the checker), on each ring size's path: the report says where the
/// producer's frame time goes.
#[test]
fn the_report_times_where_the_producer_waits() {
    use tegra_interop_pipeline::app::report::STAGES;
    for ring in ["1", "3", "4"] {
        let o = small(&["--json", "--ring", ring]);
        assert!(o.status.success(), "ring {ring}: {}", stderr(&o));
        let j = json(&o);
        let stages = j["stages"].as_object().unwrap();
        let names: Vec<&str> = STAGES.iter().map(|(n, _)| *n).collect();
        assert_eq!(stages.len(), names.len(), "ring {ring}: {stages:?}");
        for name in names {
            let mean = stages[name]["mean"].as_f64();
            assert!(
                mean.is_some_and(|m| m >= 0.0),
                "ring {ring}: stage {name:?} untimed in {stages:?}"
            );
        }
        assert!(
            stages.contains_key("collect wait") && stages.contains_key("checker wait"),
            "{stages:?}"
        );
    }
}

#[test]
fn every_ring_size_checks_every_frame_once() {
    // Rings of 3 and more check a frame while the camera writes a later one;
    // smaller rings check it when its slot comes round: each frame once.
    for ring in ["1", "2", "3", "4", "5", "8"] {
        let o = small(&["--json", "--ring", ring]);
        assert!(o.status.success(), "ring {ring}: {}", stderr(&o));
        assert_all_checked(&json(&o), 40);
    }
}

#[test]
fn broken_pipelines_do_not_report_success() {
    for (backend, ring) in [("host", "4"), ("host", "2"), ("sim", "4"), ("sim", "1")] {
        for fault in ["skip-process", "corrupt"] {
            let o = small_on(backend, &["--json", "--ring", ring, "--fault", fault]);
            let j = json(&o);
            assert_eq!(o.status.code(), Some(1), "{backend} {fault}: {j}");
            assert_eq!(j["verified"], false, "{backend} {fault}: {j}");
            assert!(
                stderr(&o).contains("failed verification"),
                "{backend} {fault}"
            );
            if fault == "skip-process" {
                // Every frame's read-back check ran and failed, those on the
                // checker thread (rings of 3 or more) included.
                let v = &j["verification"];
                assert_eq!(
                    (
                        &v["consumer_ok"],
                        &v["readback_ok"],
                        &v["pulses"],
                        &v["failed"]
                    ),
                    (&40.into(), &0.into(), &40.into(), &40.into()),
                    "{backend} {fault}: {j}"
                );
            }
        }
    }
}

#[test]
fn sim_run_verifies_every_frame_through_nvsci() {
    for mode in [
        &[][..],
        &["--copy"][..],
        &["--ring", "1"][..],
        &["--ring", "2"][..],
        &["--ring", "3"][..],
        &["--ring", "8", "--format", "raw8"][..],
    ] {
        let mut extra = vec!["--json"];
        extra.extend_from_slice(mode);
        let o = small_on("sim", &extra);
        assert!(o.status.success(), "{mode:?}: {}{}", stdout(&o), stderr(&o));
        assert_eq!(stdout(&o).trim().lines().count(), 1, "one JSON object");
        let j = json(&o);
        assert_eq!(j["backend"], "nvsci-sim", "{j}");
        assert_eq!(
            j["processing"],
            "sim: the consumer's NVRTC kernel path (compile, load, launch, events, counters) with the kernel run as its Rust twin; deterministic fences built by each waiter (NvSciSyncFenceUpdateFence)",
            "{j}"
        );
        assert_eq!(j["verified"], true, "{j}");
        assert_all_checked(&j, 40);
    }
}

#[test]
fn egl_run_verifies_every_frame_through_an_egl_stream() {
    for mode in [
        &[][..],
        &["--ring", "1"][..],
        &["--ring", "2", "--readback", "inline"][..],
        &["--ring", "8", "--format", "raw8"][..],
    ] {
        let mut extra = vec!["--json"];
        extra.extend_from_slice(mode);
        let o = small_on("egl", &extra);
        assert!(o.status.success(), "{mode:?}: {}{}", stdout(&o), stderr(&o));
        let j = json(&o);
        // No GPU with EGL here (or no `--features vulkan`): the simulator.
        assert_eq!(j["backend"], "egl-sim", "{j}");
        assert!(
            j["why"]
                .as_str()
                .unwrap()
                .contains("because no real EGLStream opened: "),
            "{j}"
        );
        // The stream copies (measured): reported as copy-based.
        assert_eq!(j["mode"], "copy", "{j}");
        assert_eq!(j["verified"], true, "{j}");
        assert_all_checked(&j, 40);
    }
}

#[test]
fn the_default_command_runs_the_simulator_and_says_why() {
    // `cargo run --release` on a machine without a
    // usable GPU (CI): the NvSci ring on the simulator, default frame size
    // (fewer frames: tests run a debug build).
    let o = run(&["--quiet", "--frames", "12"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(
        out.starts_with("backend: nvsci-sim (auto: the simulator, because jetson: not available: "),
        "{out}"
    );
    assert!(out.contains("; gpu: not available: "), "{out}");
    assert!(
        out.contains(
            "sim: the consumer's NVRTC kernel path (compile, load, launch, events, counters) with the kernel run as its Rust twin; deterministic fences built by each waiter"
        ),
        "{out}"
    );
    assert!(out.contains("verified: 12/12 frames"), "{out}");
    assert!(out.contains("interop overhead"), "{out}");
    assert!(out.contains("frames/s"), "{out}");
}

/// Every frame passed the consumer's check, the read-back and had its pulse.
fn assert_all_checked(j: &serde_json::Value, frames: u64) {
    let v = &j["verification"];
    for key in ["consumer_ok", "readback_ok", "pulses"] {
        assert_eq!(v[key].as_u64(), Some(frames), "{key}: {j}");
    }
    assert_eq!(v["failed"], 0, "{j}");
}

/// The process's output as a JSON value (one object on stdout).
fn json(o: &Output) -> serde_json::Value {
    serde_json::from_str(stdout(o).trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", stdout(o), stderr(o)))
}

/// A usage mistake: exit 2, one `error:` line naming `want`, nothing on stdout.
fn assert_usage_error(args: &[&str], want: &[&str]) {
    let o = run(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    for w in want {
        assert!(err.contains(w), "{args:?} should mention {w:?}: {err}");
    }
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert!(stdout(&o).is_empty(), "{args:?}: {}", stdout(&o));
}

/// Issue 24: `--processes 1`, the documented default, was an unknown argument.
#[test]
fn processes_1_is_the_one_process_run() {
    let o = small(&["--processes", "1", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j = json(&o);
    assert_eq!(j["processes"], 1, "{j}");
    assert_eq!(j["verified"], true, "{j}");
}

/// Issue 24: `--processes=2` (the `=` spelling) was an unknown argument.
#[test]
fn processes_with_equals_sign_runs_two_processes() {
    if !common::can_start_a_camera_process() {
        return;
    }
    let o = small_on("sim", &["--processes=2", "--json"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let j = json(&o);
    assert_eq!(j["processes"], 2, "{j}");
    assert_eq!(j["verified"], true, "{j}");
}

/// Issue 24: `--processes 2 --help` failed instead of printing the help.
#[test]
fn help_with_processes_2_prints_help() {
    let o = run(&["--processes", "2", "--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("--processes"), "{}", stdout(&o));
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
}

/// Issue 24: options the two-process mode does not carry out were silently
/// ignored (`--fault corrupt` passed); now each is refused, naming both
/// (`--fault` is carried out now: tests/two_process.rs).
#[test]
fn two_process_mode_refuses_options_it_does_not_carry_out() {
    for extra in [
        &["--copy"][..],
        &["--readback", "inline"][..],
        &["--frame-threads", "2"][..],
    ] {
        let mut args = vec!["--backend", "sim", "--processes", "2"];
        args.extend_from_slice(SMALL);
        args.extend_from_slice(extra);
        assert_usage_error(&args, &[extra[0], "--processes"]);
    }
}

/// Issue 24: `--ring abc` said "is outside 1..=8"; a non-number is not a
/// number, and an out-of-range one names the range.
#[test]
fn ring_that_is_not_a_number_says_so() {
    assert_usage_error(&["--ring", "abc"], &["--ring", "abc", "not a number"]);
    assert_usage_error(&["--ring", "9"], &["--ring", "1..=8"]);
}

/// Issue 24: `--width 99999` said "expects a number" (parsed as 16 bits).
#[test]
fn width_out_of_range_names_the_range() {
    assert_usage_error(&["--width", "99999"], &["--width", "1..=4096"]);
    assert_usage_error(&["--height", "70000"], &["--height", "1..=4096"]);
    assert_usage_error(&["--frames", "1000001"], &["--frames", "1..=1000000"]);
}

/// Issue 24: `--endpoints`, listed in `--help`, was an unknown argument in
/// every mode. It names a Jetson's endpoint pair for the two-process mode:
/// without `--processes 2` it is refused naming that, and on the simulator
/// (no BSP configuration file) it is refused with the reason.
#[test]
fn endpoints_is_an_option_with_reasons() {
    let o = run(&["--endpoints", "a,b", "--quiet"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(!err.contains("unknown argument"), "{err}");
    assert!(
        err.contains("--endpoints") && err.contains("--processes"),
        "{err}"
    );
    assert_usage_error(&["--endpoints", "nocomma"], &["--endpoints", "CAMERA,CUDA"]);
    // The two-process mode in one command runs over a pair it makes on the
    // simulator: another pair without a configuration file is refused with
    // the reason.
    assert_usage_error(
        &["--backend", "sim", "--processes", "2", "--endpoints", "a,b"],
        &["--endpoints", "--processes 2", "--nvsciipc-config"],
    );
    // Where it applies (one side run alone over a given configuration
    // file), it names the pair that side opens: a pair the file lacks is
    // refused by the simulator's NvSciIpc, naming the endpoint.
    let dir = std::env::temp_dir().join(format!("pipeline-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("nvsciipc.cfg");
    std::fs::write(&cfg, "INTER_PROCESS   cam-x   cuda-x   16   4096\n").unwrap();
    let o = run(&[
        "--backend",
        "sim",
        "--role",
        "cuda",
        "--frames",
        "2",
        "--quiet",
        "--nvsciipc-config",
        cfg.to_str().unwrap(),
        "--endpoints",
        "cam-y,cuda-y",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("cuda-y"), "{err}");
    // A pair the file has: both sides open it and every frame verifies.
    let side = |role: &str| {
        let mut c = child_command(example());
        c.args([
            "--backend",
            "sim",
            "--frames",
            "6",
            "--ring",
            "2",
            "--width",
            "64",
        ])
        .args(["--height", "16", "--quiet", "--json", "--role", role])
        .args([
            "--nvsciipc-config",
            cfg.to_str().unwrap(),
            "--endpoints",
            "cam-x,cuda-x",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        c.spawn().unwrap()
    };
    let camera = side("camera");
    let cuda = side("cuda").wait_with_output().unwrap();
    let camera = camera.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(camera.status.success(), "{}", stderr(&camera));
    assert!(cuda.status.success(), "{}", stderr(&cuda));
    let j = json(&cuda);
    assert_eq!(
        (&j["processes"], &j["verified"]),
        (&2.into(), &true.into()),
        "{j}"
    );
}

/// Issue 24: `--processes 2 --backend host` exited 1; a bad argument is 2.
#[test]
fn two_process_mode_with_a_host_backend_is_a_usage_error() {
    assert_usage_error(
        &["--processes", "2", "--backend", "host"],
        &["--processes", "--backend", "host"],
    );
}

/// Issue 24: `--json` had other field names with `--processes 2`; both
/// modes print the same schema, with its version.
#[test]
fn json_has_the_same_fields_in_both_modes() {
    if !common::can_start_a_camera_process() {
        return;
    }
    let one = json(&small_on("sim", &["--json"]));
    let two = json(&small_on("sim", &["--json", "--processes", "2"]));
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&one), keys(&two), "{one}\n{two}");
    assert_eq!(one["schema_version"], two["schema_version"]);
    assert!(one["schema_version"].is_u64(), "{one}");
    assert_eq!(
        (one["processes"].as_u64(), two["processes"].as_u64()),
        (Some(1), Some(2))
    );
    for j in [&one, &two] {
        assert_eq!(j["frames"], 40, "{j}");
        assert_eq!(j["verified"], true, "{j}");
        assert_eq!(j["verification"]["failed"], 0, "{j}");
        assert!(j["frames_per_s"].as_f64().unwrap() > 0.0, "{j}");
    }
    assert_eq!(one["verification"]["consumer_ok"], 40, "{one}");
    assert!(
        one["latency_us"]["p99"].as_f64().unwrap() >= one["latency_us"]["p50"].as_f64().unwrap()
    );
}

/// The test-only `--die-at` flag is gone from the shipped binary.
#[test]
fn no_hidden_test_flag() {
    assert_usage_error(&["--processes", "2", "--die-at", "3"], &["--die-at"]);
}

/// The progress display is drawn only on a terminal: a run of more than the
/// half second after which it would appear, without `--quiet`, leaves the
/// captured stderr empty.
#[test]
fn no_progress_display_in_captured_output() {
    let o = run(&["--backend", "host", "--frames", "20"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).is_empty(), "{:?}", stderr(&o));
    assert!(!stdout(&o).contains('\r'), "{}", stdout(&o));
}

/// `--camera-ahead` (and `TEGRA_INTEROP_CAMERA_AHEAD`): with the camera on
/// its own thread and with the serial loop, every frame is verified on
/// rings of 1 to 4, on every backend here; the report says which loop ran
/// (every transport hands its slots out as leases; rings of 1 run
/// serially).
#[test]
fn camera_ahead_on_and_off_verify_every_frame_on_small_rings() {
    for backend in ["host", "sim", "egl"] {
        for ring in ["1", "2", "3", "4"] {
            for (switch, readback) in [("on", "overlap"), ("off", "overlap"), ("on", "inline")] {
                let o = small_on(
                    backend,
                    &[
                        "--json",
                        "--ring",
                        ring,
                        "--camera-ahead",
                        switch,
                        "--readback",
                        readback,
                    ],
                );
                let what = format!("{backend} ring {ring} --camera-ahead {switch} {readback}");
                assert!(o.status.success(), "{what}: {}", stderr(&o));
                let j = json(&o);
                assert_all_checked(&j, 40);
                // Every transport leases its slots (the EGL one too).
                let ahead = switch == "on" && ring != "1";
                assert_eq!(j["camera_ahead"], ahead, "{what}: {j}");
            }
        }
    }
    // The copy variant through the camera's staging buffer, on its thread.
    let o = small(&["--json", "--copy", "--camera-ahead", "on"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_all_checked(&json(&o), 40);
    assert_eq!(json(&o)["camera_ahead"], true);
}

/// A broken pipeline still fails with the camera on its own thread.
#[test]
fn camera_ahead_does_not_hide_broken_frames() {
    for fault in ["corrupt", "skip-process"] {
        let o = small(&["--json", "--fault", fault, "--camera-ahead", "on"]);
        assert_eq!(o.status.code(), Some(1), "{fault}: {}", stderr(&o));
        assert_eq!(json(&o)["camera_ahead"], true);
    }
}

/// The environment variable sets the default; the option wins; a bad value
/// and the two-process mode are refused.
#[test]
fn camera_ahead_from_the_environment_and_its_refusals() {
    let with_env = |value: &str, extra: &[&str]| {
        let mut args = vec!["--backend", "host", "--json"];
        args.extend_from_slice(SMALL);
        args.extend_from_slice(extra);
        child_command(example())
            .env("TEGRA_INTEROP_CAMERA_AHEAD", value)
            .args(&args)
            .output()
            .unwrap()
    };
    for (value, extra, want) in [
        ("0", &[][..], false),
        ("off", &[][..], false),
        ("1", &[][..], true),
        ("", &[][..], true),
        ("0", &["--camera-ahead", "on"][..], true),
    ] {
        let o = with_env(value, extra);
        assert!(o.status.success(), "{value:?} {extra:?}: {}", stderr(&o));
        assert_eq!(json(&o)["camera_ahead"], want, "{value:?} {extra:?}");
    }
    let o = with_env("sideways", &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("TEGRA_INTEROP_CAMERA_AHEAD"),
        "{}",
        stderr(&o)
    );
    assert_usage_error(
        &["--processes", "2", "--camera-ahead", "off"],
        &["--camera-ahead", "--processes 2"],
    );
    assert_usage_error(&["--camera-ahead", "maybe"], &["--camera-ahead"]);
}
