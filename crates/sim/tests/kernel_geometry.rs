//! Twins that see the launch geometry (`Sim::register_block_kernel`,
//! `Sim::register_thread_kernel`): a kernel written for the grid it is
//! launched with touches on the simulator exactly what it touches on a GPU,
//! so a grid too small for its buffer leaves the same bytes untouched and
//! the check a user writes fails on both.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use tegra_interop_driver::{
    Backend, Context, DeviceBuffer, Error, Event, EventFlags, Function, Module, Nvrtc, Stream,
};
use tegra_interop_sim::kernels::{KernelFault, KernelSpec, MAX_SIMULATED_BLOCKS};
use tegra_interop_sim::{DiagnosticKind, Sim, SimConfig};

/// One thread per byte, no loop: what a grid covers, it increments.
const ADD_ONE: &str = r#"
extern "C" __global__ void add_one(unsigned char *buf, unsigned long long len) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < len) buf[i] += 1;
}
"#;

/// A grid-stride loop: any grid covers the buffer.
const ADD_ONE_STRIDED: &str = r#"
extern "C" __global__ void add_one_strided(unsigned char *buf, unsigned long long len) {
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < len; i += step) {
        buf[i] += 1;
    }
}
"#;

/// A 2-D kernel over a pitched image.
const FILL_XY: &str = r#"
extern "C" __global__ void fill_xy(unsigned char *img, unsigned int w, unsigned int h,
                                   unsigned int pitch) {
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) img[y * pitch + x] = (unsigned char)(x ^ (y << 4));
}
"#;

#[derive(Clone, Copy, Debug)]
enum Form {
    Block,
    Thread,
}

fn quiet() -> Sim {
    Sim::with_config(SimConfig::default().with_diagnostic_echo(false)).unwrap()
}

/// Adds 1 to `len` bytes in `ranges`, in bulk (the block form's way).
fn add_one_over(
    b: &tegra_interop_sim::kernels::Block<'_>,
    ranges: impl Iterator<Item = std::ops::Range<u64>>,
) -> Result<(), KernelFault> {
    let buf = b.arg_u64(0)?;
    for r in ranges {
        let mut bytes = vec![0u8; (r.end - r.start) as usize];
        b.read(buf + r.start, &mut bytes)?;
        bytes.iter_mut().for_each(|v| *v = v.wrapping_add(1));
        b.write(buf + r.start, &bytes)?;
    }
    Ok(())
}

fn register(sim: &Sim, form: Form) {
    let spec = KernelSpec::new("add_one", &[8, 8]);
    match form {
        Form::Block => sim.register_block_kernel(spec, |b| {
            let len = b.arg_u64(1)?;
            add_one_over(b, b.indices_x(len))
        }),
        Form::Thread => sim.register_thread_kernel(spec, |t| {
            let (buf, len) = (t.arg_u64(0)?, t.arg_u64(1)?);
            let i = t.global_x();
            if i < len {
                let v = t.read_u8(buf + i)?;
                t.write_u8(buf + i, v.wrapping_add(1))?;
            }
            Ok(())
        }),
    }
    sim.register_block_kernel(KernelSpec::new("add_one_strided", &[8, 8]), |b| {
        let len = b.arg_u64(1)?;
        add_one_over(b, b.grid_stride_x(len))
    });
    sim.register_thread_kernel(KernelSpec::new("fill_xy", &[8, 4, 4, 4]), |t| {
        let (img, w, h, pitch) = (t.arg_u64(0)?, t.arg_u32(1)?, t.arg_u32(2)?, t.arg_u32(3)?);
        let (bi, bd, ti) = (t.block_idx(), t.block_dim(), t.thread_idx());
        let x = bi.x * bd.x + ti.x;
        let y = bi.y * bd.y + ti.y;
        if x < w && y < h {
            let at = img + u64::from(y) * u64::from(pitch) + u64::from(x);
            t.write_u8(at, (x ^ (y << 4)) as u8)?;
        }
        Ok(())
    });
}

struct Rig {
    _sim: Sim,
    backend: Arc<Backend>,
    ctx: Context,
    stream: Stream,
    module: Module,
}

fn rig(form: Form) -> Rig {
    let sim = quiet();
    register(&sim, form);
    let backend = sim.backend();
    let source = format!("{ADD_ONE}{ADD_ONE_STRIDED}{FILL_XY}");
    let ptx = Nvrtc::new(&backend)
        .unwrap()
        .compile(&source, "geometry.cu", &[])
        .unwrap();
    let ctx = Context::new(backend.clone(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let module = Module::load(&ctx, &ptx).unwrap();
    Rig {
        _sim: sim,
        backend,
        ctx,
        stream,
        module,
    }
}

impl Rig {
    /// Launches `name` on a buffer of `data` with `(buf, len)` arguments
    /// and gives back the bytes afterwards.
    fn run(&self, name: &str, data: &[u8], len: u64, grid: u32, block: u32) -> Vec<u8> {
        let f: Function = self.module.function(name).unwrap();
        let buf = DeviceBuffer::new(&self.ctx, data.len()).unwrap();
        buf.copy_from_host(0, data).unwrap();
        // SAFETY: (pointer, u64) as both kernels declare; they touch at
        // most `len` <= data.len() bytes of `buf`, which outlives the
        // launch (the stream is synchronised below).
        unsafe {
            f.launch(grid, block)
                .arg(&buf)
                .arg(len)
                .launch(&self.stream)
        }
        .unwrap();
        self.stream.synchronize().unwrap();
        let mut out = vec![0u8; data.len()];
        buf.copy_to_host(0, &mut out).unwrap();
        out
    }
}

/// The check a user writes after the kernel: every byte incremented.
fn all_incremented(before: &[u8], after: &[u8]) -> bool {
    before
        .iter()
        .zip(after)
        .all(|(b, a)| *a == b.wrapping_add(1))
}

#[test]
fn a_grid_too_small_leaves_the_tail_untouched_and_the_users_check_fails() {
    const N: usize = 1000;
    let data: Vec<u8> = (0..N).map(|i| (i * 7) as u8).collect();
    for form in [Form::Block, Form::Thread] {
        let r = rig(form);
        // 2 blocks of 256 threads: bytes 0..512 are covered, 512..1000 not.
        let short = r.run("add_one", &data, N as u64, 2, 256);
        assert!(
            all_incremented(&data[..512], &short[..512]),
            "{form:?}: the covered part"
        );
        assert_eq!(&short[512..], &data[512..], "{form:?}: the tail untouched");
        assert!(
            !all_incremented(&data, &short),
            "{form:?}: the user's check must fail, as on a GPU"
        );
        // The grid the CUDA code needs (ceil(N / 256) = 4 blocks) passes.
        let full = r.run("add_one", &data, N as u64, N.div_ceil(256) as u32, 256);
        assert!(all_incremented(&data, &full), "{form:?}: a covering grid");
        // Threads past `len` do nothing: one block over 100 bytes.
        let part = r.run("add_one", &data, 100, 1, 256);
        assert!(all_incremented(&data[..100], &part[..100]));
        assert_eq!(&part[100..], &data[100..], "{form:?}: i < len honoured");
    }
}

#[test]
fn a_grid_stride_loop_covers_the_buffer_with_any_grid() {
    const N: usize = 10_000;
    let data: Vec<u8> = (0..N).map(|i| (i * 13) as u8).collect();
    let r = rig(Form::Block);
    for (grid, block) in [(1, 64), (3, 64), (7, 32), (40, 256), (1, 1)] {
        let out = r.run("add_one_strided", &data, N as u64, grid, block);
        assert!(all_incremented(&data, &out), "grid {grid} x {block}");
    }
}

#[test]
fn a_2d_kernel_touches_exactly_its_grids_rectangle() {
    const W: u32 = 20;
    const H: u32 = 10;
    const PITCH: u32 = 32;
    let r = rig(Form::Thread);
    let f = r.module.function("fill_xy").unwrap();
    let img = DeviceBuffer::new(&r.ctx, (PITCH * H) as usize).unwrap();
    img.fill(0xee).unwrap();
    // 2 x 2 blocks of 8 x 4 threads cover x < 16, y < 8 of the 20 x 10 image.
    // SAFETY: (pointer, u32, u32, u32) as the kernel declares; it writes
    // inside PITCH * H bytes of `img`, which outlives the launch.
    unsafe {
        f.launch((2, 2), (8, 4))
            .arg(&img)
            .arg(W)
            .arg(H)
            .arg(PITCH)
            .launch(&r.stream)
    }
    .unwrap();
    r.stream.synchronize().unwrap();
    let mut out = vec![0u8; (PITCH * H) as usize];
    img.copy_to_host(0, &mut out).unwrap();
    for y in 0..H {
        for x in 0..PITCH {
            let got = out[(y * PITCH + x) as usize];
            let want = if x < 16 && y < 8 {
                (x ^ (y << 4)) as u8
            } else {
                0xee
            };
            assert_eq!(got, want, "x {x}, y {y}");
        }
    }
}

#[test]
fn a_block_reaching_past_the_allocation_faults_the_launch() {
    let sim = quiet();
    register(&sim, Form::Block);
    let backend = sim.backend();
    let ptx = Nvrtc::new(&backend)
        .unwrap()
        .compile(&format!("{ADD_ONE}{ADD_ONE_STRIDED}{FILL_XY}"), "g.cu", &[])
        .unwrap();
    let ctx = Context::new(backend.clone(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let module = Module::load(&ctx, &ptx).unwrap();
    let f = module.function("add_one").unwrap();
    let buf = DeviceBuffer::new(&ctx, 256).unwrap();
    // One block of 256 over len 257: thread 256 does not exist, no fault.
    // SAFETY: (pointer, u64); the kernel may reach byte 256 only with a
    // second block, where the simulator faults (the test's point) instead
    // of touching memory.
    unsafe { f.launch(1u32, 256u32).arg(&buf).arg(257u64).launch(&stream) }.unwrap();
    stream.synchronize().unwrap();
    assert!(sim.diagnostics().is_empty(), "{:?}", sim.diagnostics());
    // Two blocks: thread 256 reads byte 256, past the allocation.
    // SAFETY: as above.
    unsafe { f.launch(2u32, 256u32).arg(&buf).arg(257u64).launch(&stream) }.unwrap();
    stream.synchronize().unwrap();
    let d = sim.take_diagnostics();
    assert!(
        d.iter()
            .any(|d| d.kind == DiagnosticKind::OutOfBounds && d.message.contains("add_one")),
        "{d:?}"
    );
    drop((f, buf, module, stream, ctx, backend));
}

#[test]
fn a_grid_past_the_simulators_block_limit_is_refused_at_the_launch() {
    let r = rig(Form::Block);
    let f = r.module.function("add_one").unwrap();
    let buf = DeviceBuffer::new(&r.ctx, 16).unwrap();
    let blocks = u32::try_from(MAX_SIMULATED_BLOCKS + 1).unwrap();
    // SAFETY: (pointer, u64); the launch is refused before anything runs.
    let e = unsafe {
        f.launch(blocks, 1u32)
            .arg(&buf)
            .arg(16u64)
            .launch(&r.stream)
    }
    .unwrap_err();
    assert!(
        matches!(e, Error::Driver { call: "cuLaunchKernel", code } if code.0 == 1),
        "{e}"
    );
    let d = r._sim.take_diagnostics();
    assert!(
        d.iter()
            .any(|d| d.kind == DiagnosticKind::Unimplemented
                && d.message.contains("per-block twins")),
        "{d:?}"
    );
    drop(r.backend);
}

/// A whole 1920x1080 RGBA8 frame through a per-block twin, with the grid
/// the CUDA code needs: every byte, once.
#[test]
#[cfg_attr(miri, ignore = "8 MB through the simulator's kernels")]
fn a_frame_sized_launch_runs_per_block() {
    const N: usize = 1920 * 1080 * 4;
    let data: Vec<u8> = (0..N).map(|i| (i % 251) as u8).collect();
    let r = rig(Form::Block);
    let grid = u32::try_from(N.div_ceil(256)).unwrap();
    let out = r.run("add_one", &data, N as u64, grid, 256);
    assert!(all_incremented(&data, &out));
    let done = Event::new(&r.ctx, EventFlags::NO_TIMING).unwrap();
    done.record(&r.stream).unwrap();
    done.synchronize(Duration::from_secs(10)).unwrap();
}
