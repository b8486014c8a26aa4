//! EGL images on a real GPU (the H200 machine): a GL texture made into an
//! `EGLImageKHR` with the testkit's EGL exporter, registered with CUDA
//! through the driver's `egl` module: registration, the frame's type, size,
//! planes and colour format; data both ways (CUDA -> GL, and GL -> CUDA for
//! writes made after the registration; earlier writes are not seen, as
//! measured); unregistration.
//! Ignored by default; needs libEGL/libGLESv2 and an NVIDIA EGL vendor.
#![allow(clippy::unwrap_used)] // tests may unwrap

use tegra_interop_core::sys::cuda::{CUarray, CUmemorytype, CUDA_MEMCPY3D};
use tegra_interop_driver::egl::{EglAccess, EglColorFormat, EglFrameType, EglImage};
use tegra_interop_driver::{Backend, Context};
use tegra_interop_testkit::egl::EglExporter;

/// Copies `data` (`height` rows of `row_bytes`) into `array`.
fn host_to_array(backend: &Backend, array: CUarray, row_bytes: usize, height: usize, data: &[u8]) {
    let copy = backend.table().cuda.cuMemcpy3D.unwrap();
    // SAFETY: an all-zero CUDA_MEMCPY3D is a valid "nothing" descriptor.
    let mut m: CUDA_MEMCPY3D = unsafe { std::mem::zeroed() };
    m.srcMemoryType = CUmemorytype::CU_MEMORYTYPE_HOST;
    m.srcHost = data.as_ptr().cast();
    m.srcPitch = row_bytes;
    m.dstMemoryType = CUmemorytype::CU_MEMORYTYPE_ARRAY;
    m.dstArray = array;
    m.WidthInBytes = row_bytes;
    m.Height = height;
    m.Depth = 1;
    // SAFETY: as in `array_to_host`, the other way.
    let r = unsafe { copy(&m) };
    assert_eq!(r.0, 0, "cuMemcpy3D to the array");
}

/// Copies `height` rows of `row_bytes` from `array` to the host.
fn array_to_host(backend: &Backend, array: CUarray, row_bytes: usize, height: usize) -> Vec<u8> {
    let copy = backend.table().cuda.cuMemcpy3D.unwrap();
    let mut out = vec![0u8; row_bytes * height];
    // SAFETY: an all-zero CUDA_MEMCPY3D is a valid "nothing" descriptor.
    let mut m: CUDA_MEMCPY3D = unsafe { std::mem::zeroed() };
    m.srcMemoryType = CUmemorytype::CU_MEMORYTYPE_ARRAY;
    m.srcArray = array;
    m.dstMemoryType = CUmemorytype::CU_MEMORYTYPE_HOST;
    m.dstHost = out.as_mut_ptr().cast();
    m.dstPitch = row_bytes;
    m.WidthInBytes = row_bytes;
    m.Height = height;
    m.Depth = 1;
    // SAFETY: the array is the registered image's plane (live); `out` holds
    // the whole copy; the caller made the context current.
    let r = unsafe { copy(&m) };
    assert_eq!(r.0, 0, "cuMemcpy3D");
    out
}

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
        let array = f.plane_array(0).unwrap();
        assert!(!array.is_null());
        println!(
            "colour format {:?}, channels {}",
            f.color_format(),
            f.channels()
        );
        ctx.bind().unwrap();
        let back = array_to_host(&backend, array, w as usize * 4, h as usize);
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
        host_to_array(&backend, array, w as usize * 4, h as usize, &written);
        let cuda_view = array_to_host(&backend, array, w as usize * 4, h as usize);
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
        let after_gl = array_to_host(&backend, array, w as usize * 4, h as usize);
        assert_eq!(
            after_gl, pixels,
            "GL -> the EGLImage -> CUDA (written after registration)"
        );
        let _ = EglColorFormat::RGBA;
    }
    reg.unregister().unwrap();
    egl.destroy(image);
}
