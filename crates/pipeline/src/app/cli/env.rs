//! The one place the program reads its environment: every
//! `TEGRA_INTEROP_*` variable that changes what `pipeline` (and
//! `pipeline_vs_cuda`, through the same parser) does, parsed and
//! range-checked into an [`Environment`]. The library reads none: the
//! values reach it as plain settings (`camera::set_frame_threads`, the EGL
//! transport's pool, the GPU transport's `GpuOptions`).
//!
//! An unset variable, or one set to nothing (or spaces), leaves the
//! built-in choice. Any other value must be one the variable accepts; a
//! value it does not is refused before anything runs, in one line naming
//! the variable, the value and what it accepts (exit status 2).

use std::ffi::OsString;

use super::MAX_FRAME_THREADS;
use crate::transport::egl::MAX_POOL;

/// `TEGRA_INTEROP_FRAME_THREADS`: threads that write and check a large frame.
pub const FRAME_THREADS: &str = "TEGRA_INTEROP_FRAME_THREADS";
/// `TEGRA_INTEROP_CAMERA_AHEAD`: `--camera-ahead` where it is not given.
pub const CAMERA_AHEAD: &str = "TEGRA_INTEROP_CAMERA_AHEAD";
/// `TEGRA_INTEROP_EGL_POOL`: `--egl-pool` where it is not given.
pub const EGL_POOL: &str = "TEGRA_INTEROP_EGL_POOL";
/// `TEGRA_INTEROP_GPU_HANDOVER`: the GPU transport's handover.
pub const GPU_HANDOVER: &str = "TEGRA_INTEROP_GPU_HANDOVER";
/// `TEGRA_INTEROP_GPU_EARLY`: whether the GPU consumer is queued early.
pub const GPU_EARLY: &str = "TEGRA_INTEROP_GPU_EARLY";
/// `TEGRA_INTEROP_GPU_COPY_WITH`: what moves copy mode's frames.
pub const GPU_COPY_WITH: &str = "TEGRA_INTEROP_GPU_COPY_WITH";
/// `TEGRA_INTEROP_GPU_COPY_FROM`: where copy mode's copies read.
pub const GPU_COPY_FROM: &str = "TEGRA_INTEROP_GPU_COPY_FROM";
/// `TEGRA_INTEROP_GPU_RECLAIM_AFTER`: later releases before a slot's acquire.
pub const GPU_RECLAIM_AFTER: &str = "TEGRA_INTEROP_GPU_RECLAIM_AFTER";
/// `TEGRA_INTEROP_VK_QUEUE`: the Vulkan queue family of the GPU handover.
pub const VK_QUEUE: &str = "TEGRA_INTEROP_VK_QUEUE";

/// Every variable [`Environment::read`] reads.
pub const ALL: [&str; 9] = [
    FRAME_THREADS,
    CAMERA_AHEAD,
    EGL_POOL,
    GPU_HANDOVER,
    GPU_EARLY,
    GPU_COPY_WITH,
    GPU_COPY_FROM,
    GPU_RECLAIM_AFTER,
    VK_QUEUE,
];

/// The largest `TEGRA_INTEROP_GPU_RECLAIM_AFTER` (a ring's most slots).
pub const MAX_RECLAIM_AFTER: usize = crate::ring::MAX_SLOTS;

/// `TEGRA_INTEROP_GPU_HANDOVER`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuHandover {
    /// `queue`: through Vulkan queue batches (the default).
    Queue,
    /// `host-only`: host-side semaphore operations only, a diagnosis
    /// control that is expected to fail verification.
    HostOnly,
}

/// `TEGRA_INTEROP_GPU_COPY_WITH`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuCopyWith {
    /// `engines`: the copy engines (the default).
    Engines,
    /// `kernels`: copy kernels.
    Kernels,
}

/// `TEGRA_INTEROP_GPU_COPY_FROM`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuCopyFrom {
    /// `registered`: the frames' host mapping page-locked for CUDA (the
    /// default).
    Registered,
    /// `import`: the frames' import into CUDA.
    Import,
}

/// `TEGRA_INTEROP_VK_QUEUE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VkQueue {
    /// `first-compute`: the first family with compute.
    FirstCompute,
    /// `compute-only`: a family with compute and without graphics.
    ComputeOnly,
    /// `transfer-only`: a family with transfer only.
    TransferOnly,
}

/// The discrete-GPU transport's settings from the environment (each `None`:
/// the transport's default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuSettings {
    /// `TEGRA_INTEROP_GPU_HANDOVER`.
    pub handover: Option<GpuHandover>,
    /// `TEGRA_INTEROP_GPU_EARLY` (`1`: true, `0`: false).
    pub early: Option<bool>,
    /// `TEGRA_INTEROP_GPU_COPY_WITH`.
    pub copy_with: Option<GpuCopyWith>,
    /// `TEGRA_INTEROP_GPU_COPY_FROM`.
    pub copy_from: Option<GpuCopyFrom>,
    /// `TEGRA_INTEROP_GPU_RECLAIM_AFTER`, 0..=[`MAX_RECLAIM_AFTER`].
    pub reclaim_after: Option<usize>,
    /// `TEGRA_INTEROP_VK_QUEUE`.
    pub queue: Option<VkQueue>,
}

/// What the environment asks for (each `None` where the variable is unset
/// or empty).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    /// `TEGRA_INTEROP_FRAME_THREADS`, 1..=[`MAX_FRAME_THREADS`].
    pub frame_threads: Option<usize>,
    /// `TEGRA_INTEROP_CAMERA_AHEAD` (`on`/`1`: true, `off`/`0`: false).
    pub camera_ahead: Option<bool>,
    /// `TEGRA_INTEROP_EGL_POOL`, ring + 1 ..= [`MAX_POOL`].
    pub egl_pool: Option<usize>,
    /// The `TEGRA_INTEROP_GPU_*` variables and `TEGRA_INTEROP_VK_QUEUE`.
    pub gpu: GpuSettings,
}

impl Environment {
    /// Reads the variables through `var` (the process's environment:
    /// `std::env::var_os`), for a ring of `ring` slots (the EGL pool's
    /// range depends on it). The first bad value is the error.
    pub fn read(var: &dyn Fn(&str) -> Option<OsString>, ring: usize) -> Result<Self, String> {
        let value = |name: &str| -> Result<Option<String>, String> {
            match var(name) {
                None => Ok(None),
                Some(v) => match v.into_string() {
                    Ok(s) if s.trim().is_empty() => Ok(None),
                    Ok(s) => Ok(Some(s.trim().to_owned())),
                    Err(v) => Err(format!(
                        "{name}={:?} is not valid Unicode",
                        v.to_string_lossy()
                    )),
                },
            }
        };
        let number = |name: &str, lo: usize, hi: usize| -> Result<Option<usize>, String> {
            value(name)?
                .map(|v| in_range(&v, lo, hi).ok_or_else(|| refused(name, &v, &range(lo, hi))))
                .transpose()
        };
        let gpu = GpuSettings {
            handover: choice(&value, GPU_HANDOVER, HANDOVERS)?,
            early: choice(&value, GPU_EARLY, &[("0", false), ("1", true)])?,
            copy_with: choice(&value, GPU_COPY_WITH, COPY_WITHS)?,
            copy_from: choice(&value, GPU_COPY_FROM, COPY_FROMS)?,
            reclaim_after: number(GPU_RECLAIM_AFTER, 0, MAX_RECLAIM_AFTER)?,
            queue: choice(&value, VK_QUEUE, QUEUES)?,
        };
        Ok(Environment {
            frame_threads: number(FRAME_THREADS, 1, MAX_FRAME_THREADS)?,
            camera_ahead: choice(
                &value,
                CAMERA_AHEAD,
                &[("on", true), ("1", true), ("off", false), ("0", false)],
            )?,
            egl_pool: number(EGL_POOL, ring.saturating_add(1), MAX_POOL)?,
            gpu,
        })
    }
}

/// The discrete-GPU transport's options for `--copy` (`copy`) and the
/// environment's `gpu` settings: [`GpuOptions::new`]'s defaults where a
/// variable is unset.
///
/// [`GpuOptions::new`]: crate::transport::gpu::GpuOptions::new
#[cfg(feature = "vulkan")]
pub fn gpu_options(copy: bool, gpu: &GpuSettings) -> crate::transport::gpu::GpuOptions {
    use crate::transport::gpu::{CopyFrom, CopyWith, GpuOptions, Handover, Mode};
    use tegra_interop_platform::vulkan::QueueChoice;
    let d = GpuOptions::new(Mode::from_copy_flag(copy));
    GpuOptions {
        handover: gpu.handover.map_or(d.handover, |h| match h {
            GpuHandover::Queue => Handover::Queue,
            GpuHandover::HostOnly => Handover::HostOnly,
        }),
        early: gpu.early.unwrap_or(d.early),
        copy_with: gpu.copy_with.map_or(d.copy_with, |c| match c {
            GpuCopyWith::Engines => CopyWith::Engines,
            GpuCopyWith::Kernels => CopyWith::Kernels,
        }),
        copy_from: gpu.copy_from.map_or(d.copy_from, |c| match c {
            GpuCopyFrom::Registered => CopyFrom::Registered,
            GpuCopyFrom::Import => CopyFrom::Import,
        }),
        reclaim_after: gpu.reclaim_after.unwrap_or(d.reclaim_after),
        queue: gpu.queue.map(|q| match q {
            VkQueue::FirstCompute => QueueChoice::FirstCompute,
            VkQueue::ComputeOnly => QueueChoice::ComputeOnly,
            VkQueue::TransferOnly => QueueChoice::TransferOnly,
        }),
        ..d
    }
}

const HANDOVERS: &[(&str, GpuHandover)] = &[
    ("queue", GpuHandover::Queue),
    ("host-only", GpuHandover::HostOnly),
];
const COPY_WITHS: &[(&str, GpuCopyWith)] = &[
    ("engines", GpuCopyWith::Engines),
    ("kernels", GpuCopyWith::Kernels),
];
const COPY_FROMS: &[(&str, GpuCopyFrom)] = &[
    ("registered", GpuCopyFrom::Registered),
    ("import", GpuCopyFrom::Import),
];
const QUEUES: &[(&str, VkQueue)] = &[
    ("first-compute", VkQueue::FirstCompute),
    ("compute-only", VkQueue::ComputeOnly),
    ("transfer-only", VkQueue::TransferOnly),
];

/// `v` as a whole number in `lo..=hi`.
pub(super) fn in_range(v: &str, lo: usize, hi: usize) -> Option<usize> {
    v.parse::<usize>().ok().filter(|n| (lo..=hi).contains(n))
}

/// `lo..=hi` as the messages say it.
pub(super) fn range(lo: usize, hi: usize) -> String {
    format!("a whole number in {lo}..={hi}")
}

/// The one-line refusal of `name=value`, saying what it `accepts`.
fn refused(name: &str, value: &str, accepts: &str) -> String {
    format!("{name}={value:?} is refused: it accepts {accepts} (or unset it)")
}

/// The variable `name` as one of `choices` (`None` where unset).
fn choice<T: Copy>(
    value: &dyn Fn(&str) -> Result<Option<String>, String>,
    name: &str,
    choices: &[(&str, T)],
) -> Result<Option<T>, String> {
    let Some(v) = value(name)? else {
        return Ok(None);
    };
    match choices.iter().find(|(n, _)| *n == v) {
        Some(&(_, t)) => Ok(Some(t)),
        None => {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            let accepts = match names.split_last() {
                Some((last, [])) => (*last).to_owned(),
                Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                None => String::new(),
            };
            Err(refused(name, &v, &accepts))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn read(pairs: &[(&str, &str)], ring: usize) -> Result<Environment, String> {
        let pairs: Vec<(String, OsString)> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
            .collect();
        Environment::read(
            &|name| {
                pairs
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            },
            ring,
        )
    }

    #[test]
    fn nothing_set_is_every_default() {
        assert_eq!(read(&[], 4).unwrap(), Environment::default());
        let blank: Vec<(&str, &str)> = ALL.iter().map(|n| (*n, " ")).collect();
        assert_eq!(read(&blank, 4).unwrap(), Environment::default());
    }

    #[test]
    fn good_values_are_read() {
        let e = read(
            &[
                (FRAME_THREADS, " 7"),
                (CAMERA_AHEAD, "0"),
                (EGL_POOL, "5"),
                (GPU_HANDOVER, "host-only"),
                (GPU_EARLY, "0"),
                (GPU_COPY_WITH, "kernels"),
                (GPU_COPY_FROM, "import"),
                (GPU_RECLAIM_AFTER, "0"),
                (VK_QUEUE, "compute-only"),
            ],
            4,
        )
        .unwrap();
        assert_eq!(e.frame_threads, Some(7));
        assert_eq!(e.camera_ahead, Some(false));
        assert_eq!(e.egl_pool, Some(5));
        assert_eq!(
            e.gpu,
            GpuSettings {
                handover: Some(GpuHandover::HostOnly),
                early: Some(false),
                copy_with: Some(GpuCopyWith::Kernels),
                copy_from: Some(GpuCopyFrom::Import),
                reclaim_after: Some(0),
                queue: Some(VkQueue::ComputeOnly),
            }
        );
    }

    #[test]
    fn bad_values_are_refused_naming_variable_value_and_range() {
        for (name, value, ring, accepts) in [
            (FRAME_THREADS, "0", 4, "1..=64"),
            (FRAME_THREADS, "65", 4, "1..=64"),
            (FRAME_THREADS, "lots", 4, "1..=64"),
            (EGL_POOL, "4", 4, "5..=64"),
            (EGL_POOL, "100000", 1, "2..=64"),
            (CAMERA_AHEAD, "maybe", 4, "on, 1, off or 0"),
            (GPU_EARLY, "2", 4, "0 or 1"),
            (GPU_RECLAIM_AFTER, "9", 4, "0..=8"),
            (
                VK_QUEUE,
                "graphics",
                4,
                "first-compute, compute-only or transfer-only",
            ),
        ] {
            let e = read(&[(name, value)], ring).unwrap_err();
            for w in [name, value, accepts] {
                assert!(e.contains(w), "{name}={value}: {e} (wanted {w:?})");
            }
        }
    }

    /// The names the program accepts are the library's own.
    #[cfg(feature = "vulkan")]
    #[test]
    fn gpu_settings_map_onto_the_transports_options() {
        use crate::transport::gpu::{CopyFrom, CopyWith, GpuOptions, Handover, Mode};
        use tegra_interop_platform::vulkan::QueueChoice;
        assert_eq!(
            gpu_options(true, &GpuSettings::default()),
            GpuOptions::new(Mode::DeviceCopy)
        );
        let e = read(
            &[
                (GPU_HANDOVER, "host-only"),
                (GPU_EARLY, "0"),
                (GPU_COPY_WITH, "kernels"),
                (GPU_COPY_FROM, "import"),
                (GPU_RECLAIM_AFTER, "3"),
                (VK_QUEUE, "transfer-only"),
            ],
            4,
        )
        .unwrap();
        let o = gpu_options(false, &e.gpu);
        assert_eq!(o.mode, Mode::ZeroCopy);
        assert_eq!(o.handover, Handover::HostOnly);
        assert!(!o.early);
        assert_eq!(
            (o.copy_with, o.copy_from),
            (CopyWith::Kernels, CopyFrom::Import)
        );
        assert_eq!(o.reclaim_after, 3);
        assert_eq!(o.queue, Some(QueueChoice::TransferOnly));
        assert_eq!(MAX_RECLAIM_AFTER, crate::transport::gpu::MAX_RECLAIM_AFTER);
        for (name, q) in QUEUES {
            assert_eq!(name.parse::<QueueChoice>().unwrap().name(), *name, "{q:?}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_value_that_is_not_unicode_is_refused() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0x66, 0xff]);
        let e =
            Environment::read(&|name| (name == FRAME_THREADS).then(|| bad.clone()), 4).unwrap_err();
        assert!(e.contains(FRAME_THREADS) && e.contains("Unicode"), "{e}");
    }
}
