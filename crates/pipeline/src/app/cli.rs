//! Command line of the pipeline example (hand-rolled; every error is one line).

use std::ffi::OsString;

use crate::camera::{PixelFormat, SensorConfig};

use crate::ring::MAX_SLOTS;
use crate::transport::host::Fault;

/// Most frames one run may have (the timing buffers are allocated up front).
pub const MAX_FRAMES: u64 = 1_000_000;

/// Usage text for `--help`.
pub const USAGE: &str = "\
camera -> consumer zero-copy frame pipeline

usage: pipeline [options]
  --frames N        frames to run (1..=1000000, default 300)
  --ring K          frame buffers in the ring (1..=8, default 4)
  --width W         frame width in pixels (1..=4096, default 640)
  --height H        frame height in lines (1..=4096, default 480)
  --format F        raw8 | raw16 | rgba8 (default rgba8)
  --backend B       auto | sim | gpu | jetson | egl | host (default auto)
                    auto = jetson, else gpu, else sim (each refusal says why)
                    sim = NvSciBuf/NvSciSync ring on the built-in simulated
                    Tegra driver (not hardware)
                    host = host-reference: host memory + threads, a reference
                    and testing transport, not the simulator and not CUDA
                    gpu = Vulkan frames and semaphores imported into CUDA,
                    an NVRTC kernel consumes them (needs --features vulkan)
                    jetson = the sim backend's NvSci ring on a Jetson's real
                    driver, an NVRTC kernel processes the frames (needs
                    NVRTC; built, never run on a Jetson)
                    egl = frames through an EGLStream (FIFO) from a CUDA
                    producer to the CUDA consumer, the JetPack camera path:
                    a real EGL display and GPU where present (needs
                    --features vulkan), else the simulator (says why)
  --copy            copy each frame into the ring instead of writing in place
                    (gpu: the consumer copies it into device memory and back)
  --readback R      when the producer checks a processed frame: overlap
                    (default; a second thread checks frame f+1-K while the
                    camera writes frame f, rings of 3 or more) | inline (just
                    before the camera overwrites its slot)
  --json            print a machine-readable summary on stdout
  --quiet           no progress bar
  --fault F         (testing; --backend host or sim) none | skip-process | corrupt
  --processes P     1 (default) | 2: the camera in a second process, connected to
                    this CUDA process only by NvSciIpc (--backend auto or sim:
                    the simulator, a pair of a BSP-style config file it writes)
  --nvsciipc-config PATH, --endpoints CAM,CUDA
                    (with --processes 2) another config file / endpoint pair
  -h, --help        this text
exit status: 0 all frames verified, 1 run or verification failure, 2 bad arguments
";

/// Which interop backend to run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// The best available one.
    Auto,
    /// The simulated driver.
    Sim,
    /// A discrete GPU (Vulkan producer, CUDA consumer).
    Gpu,
    /// A Jetson (NvSci).
    Jetson,
    /// An EGLStream from a CUDA producer to the CUDA consumer.
    Egl,
    /// The host-only reference transport.
    Host,
}

impl BackendChoice {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Sim => "sim",
            BackendChoice::Gpu => "gpu",
            BackendChoice::Jetson => "jetson",
            BackendChoice::Egl => "egl",
            BackendChoice::Host => "host",
        }
    }
}

/// A validated run configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Frames to run.
    pub frames: u64,
    /// Ring size.
    pub ring: usize,
    /// Camera configuration.
    pub sensor: SensorConfig,
    /// Backend choice.
    pub backend: BackendChoice,
    /// Copy-based variant.
    pub copy: bool,
    /// JSON summary.
    pub json: bool,
    /// No progress bar.
    pub quiet: bool,
    /// Injected defect (host and sim backends only).
    pub fault: Fault,
    /// When processed frames are read back and checked.
    pub readback: Readback,
}

/// When the producer checks a processed frame (every frame is checked once
/// either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readback {
    /// On a second thread while the camera writes a later frame into another
    /// slot (rings of three or more; smaller rings check inline).
    Overlap,
    /// On the producer thread, just before the camera overwrites the slot.
    Inline,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            frames: 300,
            ring: 4,
            sensor: SensorConfig {
                width: 640,
                height: 480,
                fps: 60,
                format: PixelFormat::Rgba8,
            },
            backend: BackendChoice::Auto,
            copy: false,
            json: false,
            quiet: false,
            fault: Fault::None,
            readback: Readback::Overlap,
        }
    }
}

/// What the command line asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Print usage.
    Help,
    /// Run the pipeline.
    Run(Options),
}

fn number<T>(flag: &str, value: &str, lo: T, hi: T) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    let n: T = value
        .parse()
        .map_err(|_| format!("{flag} expects a number, got `{value}`"))?;
    if n < lo || n > hi {
        return Err(format!("{flag} {value} is outside {lo}..={hi}"));
    }
    Ok(n)
}

/// Parses the arguments after the program name.
pub fn parse<I: IntoIterator<Item = OsString>>(args: I) -> Result<Command, String> {
    let mut o = Options::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let arg = arg
            .into_string()
            .map_err(|a| format!("argument {a:?} is not valid UTF-8"))?;
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg, None),
        };
        let mut value = || -> Result<String, String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => args
                    .next()
                    .and_then(|v| v.into_string().ok())
                    .ok_or_else(|| format!("{flag} needs a value")),
            }
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--frames" => {
                let v = value()?;
                if v == "0" {
                    return Err("--frames must be at least 1".into());
                }
                o.frames = number("--frames", &v, 1, MAX_FRAMES)?;
            }
            "--ring" => {
                let v = value()?;
                o.ring = number("--ring", &v, 1, MAX_SLOTS).map_err(|_| {
                    format!("--ring {v} is outside 1..={MAX_SLOTS} (the ring has a fixed capacity of {MAX_SLOTS} slots)")
                })?;
            }
            "--width" => {
                let v = value()?;
                o.sensor.width = number("--width", &v, 1, SensorConfig::MAX_WIDTH)?;
            }
            "--height" => {
                let v = value()?;
                o.sensor.height = number("--height", &v, 1, SensorConfig::MAX_HEIGHT)?;
            }
            "--format" => {
                o.sensor.format = match value()?.as_str() {
                    "raw8" => PixelFormat::Raw8,
                    "raw16" => PixelFormat::Raw16,
                    "rgba8" => PixelFormat::Rgba8,
                    other => {
                        return Err(format!(
                            "unknown format `{other}` (expected raw8, raw16 or rgba8)"
                        ))
                    }
                }
            }
            "--backend" => {
                o.backend = match value()?.as_str() {
                    "auto" => BackendChoice::Auto,
                    "sim" => BackendChoice::Sim,
                    "gpu" => BackendChoice::Gpu,
                    "jetson" => BackendChoice::Jetson,
                    "egl" => BackendChoice::Egl,
                    "host" | "host-reference" => BackendChoice::Host,
                    other => {
                        return Err(format!(
                        "unknown backend `{other}` (expected auto, sim, gpu, jetson, egl or host)"
                    ))
                    }
                }
            }
            "--fault" => {
                o.fault = match value()?.as_str() {
                    "none" => Fault::None,
                    "skip-process" => Fault::SkipProcess,
                    "corrupt" => Fault::Corrupt,
                    other => {
                        return Err(format!(
                            "unknown fault `{other}` (expected none, skip-process or corrupt)"
                        ))
                    }
                }
            }
            "--readback" => {
                o.readback = match value()?.as_str() {
                    "overlap" => Readback::Overlap,
                    "inline" => Readback::Inline,
                    other => {
                        return Err(format!(
                            "unknown readback `{other}` (expected overlap or inline)"
                        ))
                    }
                }
            }
            "--copy" | "--json" | "--quiet" if inline.is_some() => {
                return Err(format!("{flag} takes no value"));
            }
            "--copy" => o.copy = true,
            "--json" => o.json = true,
            "--quiet" | "-q" => o.quiet = true,
            other => return Err(format!("unknown argument `{other}` (see --help)")),
        }
    }
    if o.fault != Fault::None && !matches!(o.backend, BackendChoice::Host | BackendChoice::Sim) {
        return Err("--fault only applies to --backend host or --backend sim".into());
    }
    Ok(Command::Run(o))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Options, String> {
        match parse(args.iter().map(OsString::from))? {
            Command::Run(o) => Ok(o),
            Command::Help => Err("help".into()),
        }
    }

    #[test]
    fn defaults() {
        let o = run(&[]).unwrap();
        assert_eq!(o, Options::default());
        assert_eq!((o.frames, o.ring, o.backend), (300, 4, BackendChoice::Auto));
    }

    #[test]
    fn all_options() {
        let o = run(&[
            "--frames",
            "10",
            "--ring=8",
            "--width",
            "32",
            "--height=16",
            "--format",
            "raw16",
            "--backend",
            "host",
            "--copy",
            "--json",
            "--quiet",
            "--fault",
            "corrupt",
        ])
        .unwrap();
        assert_eq!(o.frames, 10);
        assert_eq!(o.ring, 8);
        assert_eq!((o.sensor.width, o.sensor.height), (32, 16));
        assert_eq!(o.sensor.format, PixelFormat::Raw16);
        assert_eq!(o.backend, BackendChoice::Host);
        assert!(o.copy && o.json && o.quiet);
        assert_eq!(o.fault, Fault::Corrupt);
        assert_eq!(parse(["-h"].map(OsString::from)).unwrap(), Command::Help);
    }

    #[test]
    fn bad_input_gives_one_line_errors() {
        let cases: &[(&[&str], &str)] = &[
            (&["--frames", "0"], "at least 1"),
            (&["--frames", "-3"], "expects a number"),
            (&["--frames", "1000001"], "outside"),
            (&["--ring", "0"], "fixed capacity"),
            (&["--ring", "9"], "fixed capacity"),
            (&["--width", "0"], "outside"),
            (&["--height", "5000"], "outside"),
            (&["--format", "yuv"], "unknown format"),
            (&["--backend", "opencl"], "unknown backend"),
            (&["--frames"], "needs a value"),
            (&["--json=yes"], "takes no value"),
            (&["--bogus"], "unknown argument"),
            (&["--fault", "corrupt"], "only applies"),
        ];
        for (args, want) in cases {
            let e = run(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
            assert!(!e.contains('\n'), "{args:?}: {e}");
        }
    }
}
