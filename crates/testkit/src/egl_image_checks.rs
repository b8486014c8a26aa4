//! EGL image checks that run unchanged on the simulator and on a real GPU:
//! an RGBA8 image made by the EGL side, registered with CUDA through the
//! driver's `egl` module, data both ways. The EGL side comes from an
//! [`EglImages`] implementation: the simulator's stand-in ([`SimImages`])
//! or the testkit's EGL exporter ([`RealImages`], GL textures).
//!
//! What the real side showed first (H200, 2026-11-23, `tests/gpu_egl.rs`):
//! a GL texture maps as an *array* frame while the simulator's images are
//! pitch frames, so the checks move packed rows and let the driver pick
//! the copy (pitch plane or `cuMemcpy3D` to the array). Measured on an
//! H100 (driver 580.159, 2026-11-25, `probe_first_access_after_registration`):
//! for a texture made with its pixels (`glTexImage2D`) and not used by GL
//! since, CUDA sees zeros after the registration while GL keeps its pixels;
//! GL's first access after the registration puts GL's pixels into the
//! shared storage, overwriting what CUDA wrote since; from then on each
//! side sees the other's writes. (A texture GL had written and finished
//! with `glTexSubImage2D` + `glFinish` before the registration is shared at
//! once: CUDA sees its pixels, GL sees CUDA's writes. The simulator models
//! the first case for every image, the stricter one.)
//! [`first_access_after_registration`] checks the first case;
//! [`rgba_data_both_ways`] lets the EGL side touch the image first.
//!
//! ```
//! use tegra_interop_driver::Context;
//! use tegra_interop_sim::Sim;
//! use tegra_interop_testkit::egl_image_checks::{run_all, SimImages};
//!
//! let sim = Sim::new()?;
//! {
//!     let ctx = Context::new(sim.backend(), 0)?;
//!     run_all(&ctx, &mut SimImages(&sim));
//! }
//! assert!(sim.ledger().is_clean(), "{}", sim.ledger());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use tegra_interop_driver::egl::{EglAccess, EglFrame, EglFrameType, EglImage};
use tegra_interop_driver::Context;
use tegra_interop_sys::cuda::EGLImageKHR;

/// An EGL side that makes RGBA8 images and reads and writes their pixels as
/// packed rows (`width * 4` bytes each).
pub trait EglImages {
    /// One image.
    type Image;
    /// Makes a `width` x `height` RGBA8 image whose content is `initial`
    /// (packed rows), given when it is made (GL: `glTexImage2D`'s data).
    fn create(&mut self, width: u32, height: u32, initial: &[u8]) -> Self::Image;
    /// Its `EGLImageKHR`.
    fn raw(&self, image: &Self::Image) -> EGLImageKHR;
    /// Its pixels as the EGL side sees them.
    fn read(&self, image: &Self::Image, width: u32, height: u32) -> Vec<u8>;
    /// Writes its pixels from the EGL side (finished before it returns).
    fn write(&self, image: &mut Self::Image, width: u32, height: u32, pixels: &[u8]);
    /// Destroys it (after CUDA unregistered it).
    fn destroy(&mut self, image: Self::Image);
}

/// The simulator's images.
pub struct SimImages<'a>(pub &'a tegra_interop_sim::Sim);

impl EglImages for SimImages<'_> {
    type Image = tegra_interop_sim::egl::SimEglImage;
    fn create(&mut self, width: u32, height: u32, initial: &[u8]) -> Self::Image {
        let mut image = self
            .0
            .create_egl_image(tegra_interop_sim::egl::EglImageFormat::Rgba8, width, height)
            .expect("a simulated image");
        self.write(&mut image, width, height, initial);
        image
    }
    fn raw(&self, image: &Self::Image) -> EGLImageKHR {
        image.as_raw()
    }
    fn read(&self, image: &Self::Image, width: u32, height: u32) -> Vec<u8> {
        let pitch = image.planes()[0].pitch;
        pack_rows(image.plane(0).expect("plane 0"), pitch, width, height)
    }
    fn write(&self, image: &mut Self::Image, width: u32, height: u32, pixels: &[u8]) {
        let pitch = image.planes()[0].pitch;
        unpack_rows(
            pixels,
            image.plane_mut(0).expect("plane 0"),
            pitch,
            width,
            height,
        );
    }
    fn destroy(&mut self, image: Self::Image) {
        drop(image);
    }
}

/// GL textures of a real EGL display (the testkit's exporter).
pub struct RealImages<'a>(pub &'a tegra_interop_platform::egl::EglExporter);

impl EglImages for RealImages<'_> {
    type Image = tegra_interop_platform::egl::TextureImage;
    fn create(&mut self, width: u32, height: u32, initial: &[u8]) -> Self::Image {
        self.0
            .rgba_texture_image(width, height, initial)
            .expect("a GL texture's EGLImage")
    }
    fn raw(&self, image: &Self::Image) -> EGLImageKHR {
        image.as_raw()
    }
    fn read(&self, image: &Self::Image, width: u32, height: u32) -> Vec<u8> {
        assert_eq!(image.size(), (width, height), "the image's own size");
        self.0.read_texture(image).expect("glReadPixels")
    }
    fn write(&self, image: &mut Self::Image, width: u32, height: u32, pixels: &[u8]) {
        assert_eq!(image.size(), (width, height), "the image's own size");
        self.0
            .write_texture(image, pixels)
            .expect("glTexSubImage2D");
    }
    fn destroy(&mut self, image: Self::Image) {
        self.0.destroy(image);
    }
}

/// The frame's pixels as packed rows, whatever its layout.
fn cuda_read(f: &EglFrame<'_>, width: u32, height: u32) -> Vec<u8> {
    let packed = width as usize * height as usize * 4;
    if f.frame_type() == EglFrameType::Array {
        let mut out = vec![0u8; packed];
        f.copy_plane_to_host(0, &mut out).expect("array -> host");
        return out;
    }
    let pitch = f.pitch() as usize;
    let mut all = vec![0u8; pitch * height as usize];
    f.copy_plane_to_host(0, &mut all).expect("plane -> host");
    pack_rows(&all, pitch, width, height)
}

/// Writes packed rows into the frame, whatever its layout.
fn cuda_write(f: &EglFrame<'_>, width: u32, height: u32, pixels: &[u8]) {
    if f.frame_type() == EglFrameType::Array {
        f.copy_plane_from_host(0, pixels).expect("host -> array");
        return;
    }
    let pitch = f.pitch() as usize;
    let mut all = vec![0u8; pitch * height as usize];
    f.copy_plane_to_host(0, &mut all).expect("plane -> host");
    unpack_rows(pixels, &mut all, pitch, width, height);
    f.copy_plane_from_host(0, &all).expect("host -> plane");
}

/// The `height` RGBA8 rows of a plane with lines `pitch` bytes apart, packed.
fn pack_rows(plane: &[u8], pitch: usize, width: u32, height: u32) -> Vec<u8> {
    let row = width as usize * 4;
    (0..height as usize)
        .flat_map(|r| plane[r * pitch..r * pitch + row].iter().copied())
        .collect()
}

/// Writes packed RGBA8 rows into a plane with lines `pitch` bytes apart.
fn unpack_rows(packed: &[u8], plane: &mut [u8], pitch: usize, width: u32, height: u32) {
    let row = width as usize * 4;
    for r in 0..height as usize {
        plane[r * pitch..r * pitch + row].copy_from_slice(&packed[r * row..(r + 1) * row]);
    }
}

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7) ^ salt).collect()
}

/// Data both ways through one registered image: what CUDA writes the EGL
/// side reads, what the EGL side writes (after the registration) CUDA
/// reads; unregistering and destroying leave nothing behind.
pub fn rgba_data_both_ways<E: EglImages>(ctx: &Context, egl: &mut E) {
    let (w, h) = (128u32, 32u32);
    ctx.bind().expect("bind");
    let mut image = egl.create(w, h, &vec![0u8; (w * h * 4) as usize]);
    // SAFETY: the image lives until after the registration ends.
    let reg = unsafe { EglImage::register(ctx, egl.raw(&image), EglAccess::ReadWrite) }
        .expect("cuGraphicsEGLRegisterImage");
    // The EGL side's first access after the registration (see the module
    // docs): before it, CUDA's writes would be overwritten.
    let _ = egl.read(&image, w, h);
    let from_cuda = pattern((w * h * 4) as usize, 0x5a);
    {
        let f = reg.frame().expect("mapped frame");
        assert_eq!((f.width(), f.height(), f.plane_count()), (w, h, 1), "{f:?}");
        cuda_write(&f, w, h, &from_cuda);
    }
    assert!(
        egl.read(&image, w, h) == from_cuda,
        "the EGL side reads what CUDA wrote"
    );
    let from_egl = pattern((w * h * 4) as usize, 0xc3);
    egl.write(&mut image, w, h, &from_egl);
    {
        let f = reg.frame().expect("mapped frame");
        assert!(
            cuda_read(&f, w, h) == from_egl,
            "CUDA reads what the EGL side wrote"
        );
    }
    reg.unregister().expect("cuGraphicsUnregisterResource");
    egl.destroy(image);
}

/// The measured order after a registration: CUDA reads zeros while the
/// EGL side keeps its bytes; a CUDA write made before the EGL side's first
/// access is overwritten by the EGL side's bytes at that access.
pub fn first_access_after_registration<E: EglImages>(ctx: &Context, egl: &mut E) {
    let (w, h) = (64u32, 16u32);
    let n = (w * h * 4) as usize;
    ctx.bind().expect("bind");
    let before = pattern(n, 0x11);
    let image = egl.create(w, h, &before);
    // SAFETY: the image lives until after the registration ends.
    let reg = unsafe { EglImage::register(ctx, egl.raw(&image), EglAccess::ReadWrite) }
        .expect("cuGraphicsEGLRegisterImage");
    {
        let f = reg.frame().expect("mapped frame");
        assert!(
            cuda_read(&f, w, h).iter().all(|b| *b == 0),
            "CUDA sees zeros before the EGL side's first access"
        );
        cuda_write(&f, w, h, &pattern(n, 0x77));
        assert!(
            egl.read(&image, w, h) == before,
            "the EGL side's first access keeps its own bytes"
        );
        assert!(
            cuda_read(&f, w, h) == before,
            "and CUDA's earlier write is overwritten by them"
        );
    }
    reg.unregister().expect("cuGraphicsUnregisterResource");
    egl.destroy(image);
}

/// Every check.
pub fn run_all<E: EglImages>(ctx: &Context, egl: &mut E) {
    first_access_after_registration(ctx, egl);
    rgba_data_both_ways(ctx, egl);
}
