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
use tegra_interop_testkit::egl::EglExporter;

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
        let gl_view = egl.read_texture(&image, w, h);
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
        let gl_after = egl.read_texture(&image, w, h);
        println!(
            "GL sees CUDA's write through the EGLImage: {}",
            gl_after == written
        );
        assert_eq!(gl_after, written, "CUDA -> the EGLImage -> GL");
        // GL writes after the registration: does CUDA see them?
        egl.write_texture(&image, w, h, &pixels);
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
