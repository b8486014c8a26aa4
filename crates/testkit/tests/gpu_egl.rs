//! EGL images on a real GPU (the H200 machine): a GL texture made into an
//! `EGLImageKHR` with the testkit's EGL exporter, registered with CUDA
//! through the driver's `egl` module (array planes copied with `EglFrame`'s copies): registration, the frame's type, size,
//! planes and colour format; data both ways (CUDA -> GL, and GL -> CUDA for
//! writes made after the registration; earlier writes are not seen, as
//! measured); unregistration.
//! Ignored by default; needs libEGL/libGLESv2 and an NVIDIA EGL vendor.
#![allow(clippy::unwrap_used)] // tests may unwrap

use tegra_interop_driver::egl::{EglAccess, EglColorFormat, EglFrameType, EglImage};
use tegra_interop_driver::{Backend, Context};
use tegra_interop_platform::egl::EglExporter;

#[test]
#[ignore = "needs a GPU with EGL (the GPU machine)"]
fn gl_texture_image_reaches_cuda() {
    let backend = Backend::real().unwrap();
    let ctx = Context::create(backend.clone(), 0, 0).unwrap();
    let egl = EglExporter::new().unwrap();
    let (w, h) = (256u32, 64u32);
    let pixels: Vec<u8> = (0..w * h * 4).map(|i| (i * 7 % 253) as u8).collect();
    let image = egl.rgba_texture_image(w, h, &pixels).unwrap();
    // SAFETY: the image lives until `egl.destroy` below, after unregister.
    let reg = unsafe { EglImage::register(&ctx, image.as_raw(), EglAccess::ReadOnly) }.unwrap();
    {
        let f = reg.frame().unwrap();
        println!("frame: {f:?}");
        assert_eq!(
            f.frame_type(),
            EglFrameType::Array,
            "measured: a GL texture is an array frame"
        );
        assert_eq!((f.width(), f.height(), f.plane_count()), (w, h, 1));
        assert!(!f.plane_array(0).unwrap().is_null());
        println!(
            "colour format {:?}, channels {}",
            f.color_format(),
            f.channels()
        );
        let mut back = vec![0u8; pixels.len()];
        f.copy_plane_to_host(0, &mut back).unwrap();
        let same = back.iter().zip(&pixels).filter(|(a, b)| a == b).count();
        println!(
            "read back: {same}/{} bytes equal; first bytes {:?} (texture {:?})",
            back.len(),
            &back[..8],
            &pixels[..8]
        );
        // Measured on the H200 (2026-11-23): the copy succeeds but reads
        // zeros, not the texture's bytes (cuGraphicsMapResources on the
        // resource answers UNKNOWN, so mapping is not the missing step). The
        // cause is not found yet (GL upload visibility?); until it is, the
        // data path through a GL-texture EGLImage is reported here, not
        // claimed.
        // Measured (2026-11-23): what GL wrote before the registration is
        // not what CUDA sees (zeros); the simulator models this. If this
        // fails, the driver changed: update crates/sim/src/cuda/egl.rs.
        assert_ne!(back, pixels, "content from before the registration");
        // GL's own view of the texture, and CUDA -> array -> GL.
        let gl_view = egl.read_texture(&image).unwrap();
        println!("GL reads its texture back: {}", gl_view == pixels);
        let written: Vec<u8> = (0..w * h * 4).map(|i| (i % 241) as u8 ^ 0x5a).collect();
        f.copy_plane_from_host(0, &written).unwrap();
        let mut cuda_view = vec![0u8; written.len()];
        f.copy_plane_to_host(0, &mut cuda_view).unwrap();
        println!(
            "CUDA reads back what it wrote into the array: {}",
            cuda_view == written
        );
        assert_eq!(cuda_view, written, "CUDA -> the EGLImage's array -> CUDA");
        let gl_after = egl.read_texture(&image).unwrap();
        println!(
            "GL sees CUDA's write through the EGLImage: {}",
            gl_after == written
        );
        assert_eq!(gl_after, written, "CUDA -> the EGLImage -> GL");
        // GL writes after the registration: does CUDA see them?
        egl.write_texture(&image, &pixels).unwrap();
        let mut after_gl = vec![0u8; pixels.len()];
        f.copy_plane_to_host(0, &mut after_gl).unwrap();
        assert_eq!(
            after_gl, pixels,
            "GL -> the EGLImage -> CUDA (written after registration)"
        );
        let _ = EglColorFormat::RGBA;
    }
    reg.unregister().unwrap();
    egl.destroy(image);
}

/// The shared EGL image checks (the same functions the simulator runs in
/// `egl_sim_checks.rs`) against the real driver and GL textures.
#[test]
#[ignore = "needs a GPU with EGL (the GPU machine)"]
fn shared_image_checks_on_a_real_gpu() {
    use tegra_interop_testkit::egl_image_checks::{run_all, RealImages};
    let backend = tegra_interop_driver::Backend::real().unwrap();
    let ctx = tegra_interop_driver::Context::new(backend.clone(), 0).unwrap();
    let egl = tegra_interop_platform::egl::EglExporter::new().unwrap();
    run_all(&ctx, &mut RealImages(&egl));
    let errors = backend.take_drop_errors();
    assert!(errors.is_empty(), "{errors:?}");
}

/// Which conditions make CUDA's writes into a GL texture's EGLImage
/// visible to GL (and GL's to CUDA): prints a `MEASURED:` line per variant.
#[test]
#[ignore = "needs a GPU with EGL (the GPU machine)"]
fn probe_image_visibility() {
    let backend = Backend::real().unwrap();
    let egl = EglExporter::new().unwrap();
    for (name, created, access, initial, (w, h), gl_first, cuda_back) in [
        (
            "as gpu_egl",
            true,
            EglAccess::ReadOnly,
            true,
            (256u32, 64u32),
            true,
            true,
        ),
        (
            "primary ctx",
            false,
            EglAccess::ReadOnly,
            true,
            (256, 64),
            true,
            true,
        ),
        (
            "read-write",
            true,
            EglAccess::ReadWrite,
            true,
            (256, 64),
            true,
            true,
        ),
        (
            "zeros",
            true,
            EglAccess::ReadOnly,
            false,
            (256, 64),
            true,
            true,
        ),
        (
            "128x32",
            true,
            EglAccess::ReadOnly,
            true,
            (128, 32),
            true,
            true,
        ),
        (
            "no GL read first",
            true,
            EglAccess::ReadOnly,
            true,
            (256, 64),
            false,
            true,
        ),
        (
            "no CUDA read-back",
            true,
            EglAccess::ReadOnly,
            true,
            (256, 64),
            true,
            false,
        ),
        (
            "check's way",
            false,
            EglAccess::ReadWrite,
            false,
            (128, 32),
            false,
            false,
        ),
    ] {
        let ctx = if created {
            Context::create(backend.clone(), 0, 0).unwrap()
        } else {
            Context::new(backend.clone(), 0).unwrap()
        };
        ctx.bind().unwrap();
        let n = (w * h * 4) as usize;
        let first: Vec<u8> = if initial {
            (0..n).map(|i| (i * 7 % 253) as u8).collect()
        } else {
            vec![0; n]
        };
        let image = egl.rgba_texture_image(w, h, &first).unwrap();
        // SAFETY: the image lives until after unregister.
        let reg = unsafe { EglImage::register(&ctx, image.as_raw(), access) }.unwrap();
        let written: Vec<u8> = (0..n).map(|i| (i % 241) as u8 ^ 0x5a).collect();
        let (gl_sees, cuda_sees) = {
            let f = reg.frame().unwrap();
            if gl_first {
                let _ = egl.read_texture(&image).unwrap();
            }
            f.copy_plane_from_host(0, &written).unwrap();
            if cuda_back {
                let mut v = vec![0u8; n];
                f.copy_plane_to_host(0, &mut v).unwrap();
            }
            let gl_sees = egl.read_texture(&image).unwrap() == written;
            let later: Vec<u8> = (0..n).map(|i| (i % 239) as u8 ^ 0x33).collect();
            egl.write_texture(&image, &later).unwrap();
            let mut v = vec![0u8; n];
            f.copy_plane_to_host(0, &mut v).unwrap();
            (gl_sees, v == later)
        };
        println!("MEASURED: image {name}: GL sees CUDA's write {gl_sees}, CUDA sees GL's later write {cuda_sees}");
        reg.unregister().unwrap();
        egl.destroy(image);
    }
}

/// What each side sees right after the registration, before and after the
/// other side's first access: prints `MEASURED:` lines naming the content
/// seen (the texture's initial pixels P, CUDA's write W, zeros).
#[test]
#[ignore = "needs a GPU with EGL (the GPU machine)"]
fn probe_first_access_after_registration() {
    let backend = Backend::real().unwrap();
    let egl = EglExporter::new().unwrap();
    let ctx = Context::new(backend.clone(), 0).unwrap();
    ctx.bind().unwrap();
    let (w, h) = (128u32, 32u32);
    let n = (w * h * 4) as usize;
    let p: Vec<u8> = (0..n).map(|i| (i * 7 % 253) as u8).collect();
    let wr: Vec<u8> = (0..n).map(|i| (i % 241) as u8 ^ 0x5a).collect();
    let name = |v: &[u8]| {
        if v == p.as_slice() {
            "P (GL's initial pixels)"
        } else if v == wr.as_slice() {
            "W (CUDA's write)"
        } else if v.iter().all(|b| *b == 0) {
            "zeros"
        } else {
            "other"
        }
    };
    for order in [
        "cuda-write, gl-read, cuda-read",
        "gl-read, cuda-read",
        "cuda-read, gl-read, cuda-read",
        "sub-image P, cuda-read, gl-read, cuda-read",
        "sub-image P, cuda-write, gl-read, cuda-read",
    ] {
        // Made with P, or (for "sub-image P") made with zeros and then
        // given P with glTexSubImage2D before the registration.
        let sub = order.starts_with("sub-image");
        let zeros = vec![0u8; n];
        let image = egl
            .rgba_texture_image(w, h, if sub { &zeros } else { &p })
            .unwrap();
        if sub {
            egl.write_texture(&image, &p).unwrap();
        }
        // SAFETY: the image lives until after unregister.
        let reg =
            unsafe { EglImage::register(&ctx, image.as_raw(), EglAccess::ReadWrite) }.unwrap();
        let mut seen = Vec::new();
        {
            let f = reg.frame().unwrap();
            for step in order.split(", ") {
                match step {
                    "sub-image P" => {}
                    "cuda-write" => f.copy_plane_from_host(0, &wr).unwrap(),
                    "gl-read" => seen.push(format!(
                        "gl-read {}",
                        name(&egl.read_texture(&image).unwrap())
                    )),
                    _ => {
                        let mut v = vec![0u8; n];
                        f.copy_plane_to_host(0, &mut v).unwrap();
                        seen.push(format!("cuda-read {}", name(&v)));
                    }
                }
            }
        }
        println!(
            "MEASURED: image after registration, {order}: {}",
            seen.join("; ")
        );
        reg.unregister().unwrap();
        egl.destroy(image);
    }
}

/// `cuEventCreateFromEGLSync` on a GL fence sync, where the driver has it
/// (the x86_64 driver 580.159 does not export it: measured): prints `MEASURED:` lines
/// (the create answer for a fence, NULL and a flag; what the event then
/// answers to query, synchronize, a stream wait and destroy). Not wrapped
/// by the driver yet; this records what the real driver does.
#[test]
#[ignore = "needs a GPU with EGL (the GPU machine)"]
fn probe_event_from_egl_sync() {
    use cudarc::driver::sys as cu;
    let backend = Backend::real().unwrap();
    let ctx = Context::new(backend.clone(), 0).unwrap();
    ctx.bind().unwrap();
    let egl = EglExporter::new().unwrap();
    // Measured (H100, driver 580.159, x86_64): libcuda.so.1 does not export
    // the symbol at all; the loader leaves the table entry `None`.
    let Some(create) = backend.table().cuda.cuEventCreateFromEGLSync else {
        println!("MEASURED: cuEventCreateFromEGLSync: not exported by this libcuda.so.1");
        return;
    };
    let code = |r: tegra_interop_sys::cuda::CUresult| tegra_interop_core::CuResult(r.0).to_string();
    let raw = |r: cu::CUresult| format!("{r:?}");
    // A texture upload, then a fence after it.
    let (w, h) = (64u32, 64u32);
    let image = egl
        .rgba_texture_image(w, h, &vec![7u8; (w * h * 4) as usize])
        .unwrap();
    for (name, flags, null) in [
        ("fence", 0u32, false),
        ("fence, flags 1", 1, false),
        ("NULL sync", 0, true),
    ] {
        let sync = if null {
            None
        } else {
            Some(egl.fence_sync().unwrap())
        };
        let raw_sync = sync.as_ref().map_or(std::ptr::null_mut(), |s| s.as_raw());
        let mut ev: tegra_interop_sys::cuda::CUevent = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; `sync` is a live EGLSyncKHR of a
        // display the driver reaches, or NULL (the probed refusal).
        let r = unsafe { create(&mut ev, raw_sync.cast(), flags) };
        println!("MEASURED: cuEventCreateFromEGLSync({name}): {}", code(r));
        if r.0 == 0 {
            let e = ev as cu::CUevent;
            // SAFETY: the event just created, in the current context.
            unsafe {
                println!("MEASURED:   cuEventQuery: {}", raw(cu::cuEventQuery(e)));
                println!(
                    "MEASURED:   cuStreamWaitEvent(NULL stream): {}",
                    raw(cu::cuStreamWaitEvent(std::ptr::null_mut(), e, 0))
                );
                println!(
                    "MEASURED:   cuEventSynchronize: {}",
                    raw(cu::cuEventSynchronize(e))
                );
                println!(
                    "MEASURED:   cuEventQuery after: {}",
                    raw(cu::cuEventQuery(e))
                );
                println!(
                    "MEASURED:   cuEventRecord on it: {}",
                    raw(cu::cuEventRecord(e, std::ptr::null_mut()))
                );
                println!(
                    "MEASURED:   cuEventDestroy: {}",
                    raw(cu::cuEventDestroy_v2(e))
                );
            }
        }
        if let Some(sync) = sync {
            egl.destroy_sync(sync);
        }
    }
    egl.destroy(image);
}
