//! A small EGL exporter for the GPU machine: the EGL device platform, a
//! surfaceless OpenGL ES 2 context, GL textures turned into `EGLImageKHR`s
//! (the recipe measured on the H200, cuda-facts.md). Everything is loaded at
//! run time (`libEGL.so.1`, `libGLESv2.so.2`); on a machine without them
//! [`EglExporter::new`] says why.

use std::ffi::{c_char, c_void, CString};

use libloading::Library;

type EglInt = i32;
type EglBoolean = u32;
type Ptr = *mut c_void;

const EGL_NONE: EglInt = 0x3038;
const EGL_SURFACE_TYPE: EglInt = 0x3033;
const EGL_PBUFFER_BIT: EglInt = 0x1;
const EGL_RENDERABLE_TYPE: EglInt = 0x3040;
const EGL_OPENGL_ES2_BIT: EglInt = 0x4;
const EGL_CONTEXT_CLIENT_VERSION: EglInt = 0x3098;
const EGL_PLATFORM_DEVICE_EXT: u32 = 0x313F;
const EGL_OPENGL_ES_API: u32 = 0x30A0;
const EGL_GL_TEXTURE_2D_KHR: u32 = 0x30B1;
const GL_TEXTURE_2D: u32 = 0x0DE1;
const GL_RGBA: u32 = 0x1908;
const GL_UNSIGNED_BYTE: u32 = 0x1401;
const GL_TEXTURE_MIN_FILTER: u32 = 0x2801;
const GL_TEXTURE_MAG_FILTER: u32 = 0x2800;
const GL_NEAREST: i32 = 0x2600;
const GL_FRAMEBUFFER: u32 = 0x8D40;
const GL_COLOR_ATTACHMENT0: u32 = 0x8CE0;
// EGL_KHR_stream / EGL_KHR_stream_fifo (Khronos registry values).
const EGL_STREAM_FIFO_LENGTH_KHR: EglInt = 0x31FC;
const EGL_STREAM_STATE_KHR: u32 = 0x3214;

/// The states of an EGLStream (`EGL_STREAM_STATE_KHR`).
pub mod stream_state {
    /// Made, no consumer yet.
    pub const CREATED: i32 = 0x3215;
    /// A consumer connected, no producer yet.
    pub const CONNECTING: i32 = 0x3216;
    /// Both connected, no frame yet.
    pub const EMPTY: i32 = 0x3217;
    /// A frame the consumer has not acquired.
    pub const NEW_FRAME_AVAILABLE: i32 = 0x3218;
    /// Only frames the consumer already acquired.
    pub const OLD_FRAME_AVAILABLE: i32 = 0x3219;
    /// An end disconnected.
    pub const DISCONNECTED: i32 = 0x321A;
}

/// An `EGLStreamKHR` made by [`EglExporter::create_stream`].
pub struct EglStream {
    raw: Ptr,
}

impl EglStream {
    /// The `EGLStreamKHR` to connect CUDA to.
    pub fn as_raw(&self) -> *mut c_void {
        self.raw
    }
}

/// The EGL_KHR_stream entry points (from `eglGetProcAddress`).
#[derive(Clone, Copy)]
struct StreamFns {
    create: unsafe extern "C" fn(Ptr, *const EglInt) -> Ptr,
    destroy: unsafe extern "C" fn(Ptr, Ptr) -> EglBoolean,
    query: unsafe extern "C" fn(Ptr, Ptr, u32, *mut EglInt) -> EglBoolean,
}

/// An EGL display with a current surfaceless GLES2 context.
pub struct EglExporter {
    /// Never unloaded (see Drop).
    _egl: std::mem::ManuallyDrop<Library>,
    _gles: std::mem::ManuallyDrop<Library>,
    dpy: Ptr,
    make_current: unsafe extern "C" fn(Ptr, Ptr, Ptr, Ptr) -> EglBoolean,
    ctx: Ptr,
    get_error: unsafe extern "C" fn() -> EglInt,
    create_image: unsafe extern "C" fn(Ptr, Ptr, u32, Ptr, *const EglInt) -> Ptr,
    destroy_image: unsafe extern "C" fn(Ptr, Ptr) -> EglBoolean,
    destroy_context: unsafe extern "C" fn(Ptr, Ptr) -> EglBoolean,
    gen_textures: unsafe extern "C" fn(i32, *mut u32),
    bind_texture: unsafe extern "C" fn(u32, u32),
    tex_parameter_i: unsafe extern "C" fn(u32, u32, i32),
    #[allow(clippy::type_complexity)]
    tex_image_2d: unsafe extern "C" fn(u32, i32, i32, i32, i32, i32, u32, u32, *const c_void),
    delete_textures: unsafe extern "C" fn(i32, *const u32),
    gen_framebuffers: unsafe extern "C" fn(i32, *mut u32),
    bind_framebuffer: unsafe extern "C" fn(u32, u32),
    framebuffer_texture_2d: unsafe extern "C" fn(u32, u32, u32, u32, i32),
    delete_framebuffers: unsafe extern "C" fn(i32, *const u32),
    #[allow(clippy::type_complexity)]
    tex_sub_image_2d: unsafe extern "C" fn(u32, i32, i32, i32, i32, i32, u32, u32, *const c_void),
    #[allow(clippy::type_complexity)]
    read_pixels: unsafe extern "C" fn(i32, i32, i32, i32, u32, u32, *mut c_void),
    finish: unsafe extern "C" fn(),
    streams: Result<StreamFns, String>,
    /// `eglCreateSyncKHR` / `eglDestroySyncKHR` (EGL_KHR_fence_sync).
    #[allow(clippy::type_complexity)]
    syncs: Result<
        (
            unsafe extern "C" fn(Ptr, u32, *const EglInt) -> Ptr,
            unsafe extern "C" fn(Ptr, Ptr) -> EglBoolean,
        ),
        String,
    >,
}

/// A GL texture and the `EGLImageKHR` made from it.
pub struct TextureImage {
    texture: u32,
    image: Ptr,
}

impl TextureImage {
    /// The `EGLImageKHR` to register with CUDA.
    pub fn as_raw(&self) -> *mut c_void {
        self.image
    }
}

fn sym<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
    let c = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: the caller names the symbol with the C type `T` the EGL/GLES
    // headers give it.
    unsafe { lib.get::<T>(c.as_bytes_with_nul()) }
        .map(|s| *s)
        .map_err(|e| format!("{name}: {e}"))
}

impl EglExporter {
    /// Opens the first EGL device, initialises it and makes a surfaceless
    /// GLES2 context current on this thread.
    pub fn new() -> Result<EglExporter, String> {
        // SAFETY: loading the system's EGL / GLES libraries (their
        // initialisers are the vendor's).
        let egl =
            unsafe { Library::new("libEGL.so.1") }.map_err(|e| format!("libEGL.so.1: {e}"))?;
        // SAFETY: as above.
        let gles = unsafe { Library::new("libGLESv2.so.2") }
            .map_err(|e| format!("libGLESv2.so.2: {e}"))?;
        let get_proc: unsafe extern "C" fn(*const c_char) -> Ptr = sym(&egl, "eglGetProcAddress")?;
        let ext = |name: &str| -> Result<Ptr, String> {
            let c = CString::new(name).map_err(|e| e.to_string())?;
            // SAFETY: a NUL-terminated name.
            let p = unsafe { get_proc(c.as_ptr()) };
            if p.is_null() {
                return Err(format!("eglGetProcAddress({name}) = NULL"));
            }
            Ok(p)
        };
        // SAFETY: each pointer comes from eglGetProcAddress for the named
        // extension function and has the signature the extension defines.
        let (query_devices, platform_display, create_image, destroy_image) = unsafe {
            (
                std::mem::transmute::<
                    Ptr,
                    unsafe extern "C" fn(EglInt, *mut Ptr, *mut EglInt) -> EglBoolean,
                >(ext("eglQueryDevicesEXT")?),
                std::mem::transmute::<Ptr, unsafe extern "C" fn(u32, Ptr, *const EglInt) -> Ptr>(
                    ext("eglGetPlatformDisplayEXT")?,
                ),
                std::mem::transmute::<
                    Ptr,
                    unsafe extern "C" fn(Ptr, Ptr, u32, Ptr, *const EglInt) -> Ptr,
                >(ext("eglCreateImageKHR")?),
                std::mem::transmute::<Ptr, unsafe extern "C" fn(Ptr, Ptr) -> EglBoolean>(ext(
                    "eglDestroyImageKHR",
                )?),
            )
        };
        let streams = (|| {
            let (create, destroy, query) = (
                ext("eglCreateStreamKHR")?,
                ext("eglDestroyStreamKHR")?,
                ext("eglQueryStreamKHR")?,
            );
            // SAFETY: pointers from eglGetProcAddress for these EGL_KHR_stream
            // functions, with the signatures the extension defines.
            Ok::<_, String>(unsafe {
                StreamFns {
                    create: std::mem::transmute::<
                        Ptr,
                        unsafe extern "C" fn(Ptr, *const EglInt) -> Ptr,
                    >(create),
                    destroy: std::mem::transmute::<Ptr, unsafe extern "C" fn(Ptr, Ptr) -> EglBoolean>(
                        destroy,
                    ),
                    query: std::mem::transmute::<
                        Ptr,
                        unsafe extern "C" fn(Ptr, Ptr, u32, *mut EglInt) -> EglBoolean,
                    >(query),
                }
            })
        })();
        let syncs = (|| {
            let (create, destroy) = (ext("eglCreateSyncKHR")?, ext("eglDestroySyncKHR")?);
            // SAFETY: pointers from eglGetProcAddress for these
            // EGL_KHR_fence_sync functions, with the signatures it defines.
            Ok::<_, String>(unsafe {
                (
                    std::mem::transmute::<Ptr, unsafe extern "C" fn(Ptr, u32, *const EglInt) -> Ptr>(
                        create,
                    ),
                    std::mem::transmute::<Ptr, unsafe extern "C" fn(Ptr, Ptr) -> EglBoolean>(
                        destroy,
                    ),
                )
            })
        })();
        let initialize: unsafe extern "C" fn(Ptr, *mut EglInt, *mut EglInt) -> EglBoolean =
            sym(&egl, "eglInitialize")?;
        let bind_api: unsafe extern "C" fn(u32) -> EglBoolean = sym(&egl, "eglBindAPI")?;
        let choose: unsafe extern "C" fn(
            Ptr,
            *const EglInt,
            *mut Ptr,
            EglInt,
            *mut EglInt,
        ) -> EglBoolean = sym(&egl, "eglChooseConfig")?;
        let create_context: unsafe extern "C" fn(Ptr, Ptr, Ptr, *const EglInt) -> Ptr =
            sym(&egl, "eglCreateContext")?;
        let make_current: unsafe extern "C" fn(Ptr, Ptr, Ptr, Ptr) -> EglBoolean =
            sym(&egl, "eglMakeCurrent")?;
        let get_error: unsafe extern "C" fn() -> EglInt = sym(&egl, "eglGetError")?;
        let mut devices = [std::ptr::null_mut::<c_void>(); 8];
        let mut n = 0;
        // SAFETY: room for 8 devices and a count.
        if unsafe { query_devices(8, devices.as_mut_ptr(), &mut n) } == 0 || n < 1 {
            return Err("eglQueryDevicesEXT found no device".into());
        }
        // SAFETY: a device from eglQueryDevicesEXT, no attributes.
        let dpy =
            unsafe { platform_display(EGL_PLATFORM_DEVICE_EXT, devices[0], std::ptr::null()) };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: a display handle (checked by the call) and two out-pointers.
        if dpy.is_null() || unsafe { initialize(dpy, &mut major, &mut minor) } == 0 {
            // SAFETY: no arguments.
            return Err(format!("eglInitialize failed: {:#x}", unsafe {
                get_error()
            }));
        }
        let attribs = [
            EGL_SURFACE_TYPE,
            EGL_PBUFFER_BIT,
            EGL_RENDERABLE_TYPE,
            EGL_OPENGL_ES2_BIT,
            EGL_NONE,
        ];
        let mut config = std::ptr::null_mut();
        let mut count = 0;
        // SAFETY: an initialised display, a NONE-terminated list, one config slot.
        let chose = unsafe {
            bind_api(EGL_OPENGL_ES_API) != 0
                && choose(dpy, attribs.as_ptr(), &mut config, 1, &mut count) != 0
        };
        if !chose || count < 1 {
            return Err("no EGL config for a GLES2 context".into());
        }
        let ctx_attribs = [EGL_CONTEXT_CLIENT_VERSION, 2, EGL_NONE];
        // SAFETY: display, config from it, no share context, a NONE-terminated list.
        let ctx =
            unsafe { create_context(dpy, config, std::ptr::null_mut(), ctx_attribs.as_ptr()) };
        let current = !ctx.is_null() && {
            // SAFETY: a surfaceless make-current (EGL_KHR_surfaceless_context).
            let made =
                unsafe { make_current(dpy, std::ptr::null_mut(), std::ptr::null_mut(), ctx) };
            made != 0
        };
        if !current {
            // SAFETY: no arguments.
            return Err(format!("surfaceless GLES2 context failed: {:#x}", unsafe {
                get_error()
            }));
        }
        Ok(EglExporter {
            dpy,
            ctx,
            get_error,
            create_image,
            destroy_image,
            destroy_context: sym(&egl, "eglDestroyContext")?,
            gen_textures: sym(&gles, "glGenTextures")?,
            bind_texture: sym(&gles, "glBindTexture")?,
            tex_parameter_i: sym(&gles, "glTexParameteri")?,
            tex_image_2d: sym(&gles, "glTexImage2D")?,
            delete_textures: sym(&gles, "glDeleteTextures")?,
            gen_framebuffers: sym(&gles, "glGenFramebuffers")?,
            bind_framebuffer: sym(&gles, "glBindFramebuffer")?,
            framebuffer_texture_2d: sym(&gles, "glFramebufferTexture2D")?,
            delete_framebuffers: sym(&gles, "glDeleteFramebuffers")?,
            read_pixels: sym(&gles, "glReadPixels")?,
            tex_sub_image_2d: sym(&gles, "glTexSubImage2D")?,
            finish: sym(&gles, "glFinish")?,
            streams,
            syncs,
            _egl: std::mem::ManuallyDrop::new(egl),
            _gles: std::mem::ManuallyDrop::new(gles),
            make_current,
        })
    }

    /// An RGBA8 texture of `width` x `height` filled with `pixels` (tightly
    /// packed rows), as an `EGLImageKHR`.
    pub fn rgba_texture_image(
        &self,
        width: u32,
        height: u32,
        pixels: &[u8],
    ) -> Result<TextureImage, String> {
        if pixels.len() != width as usize * height as usize * 4 {
            return Err("pixels must be width * height * 4 bytes".into());
        }
        let mut texture = 0u32;
        // SAFETY: the context is current on this thread; `pixels` holds the
        // whole image; GL copies it before glTexImage2D returns.
        unsafe {
            (self.gen_textures)(1, &mut texture);
            (self.bind_texture)(GL_TEXTURE_2D, texture);
            // One level only: without mipmaps the default minifying filter
            // would leave the texture incomplete.
            (self.tex_parameter_i)(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_NEAREST);
            (self.tex_parameter_i)(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_NEAREST);
            (self.tex_image_2d)(
                GL_TEXTURE_2D,
                0,
                GL_RGBA as i32,
                width as i32,
                height as i32,
                0,
                GL_RGBA,
                GL_UNSIGNED_BYTE,
                pixels.as_ptr().cast(),
            );
            (self.finish)();
        }
        let attribs = [EGL_NONE];
        // SAFETY: our display and context; the texture name as the client
        // buffer, as EGL_KHR_gl_texture_2D_image defines.
        let image = unsafe {
            (self.create_image)(
                self.dpy,
                self.ctx,
                EGL_GL_TEXTURE_2D_KHR,
                texture as usize as Ptr,
                attribs.as_ptr(),
            )
        };
        if image.is_null() {
            // SAFETY: the texture was made above; no arguments for the error.
            let e = unsafe {
                (self.delete_textures)(1, &texture);
                (self.get_error)()
            };
            return Err(format!("eglCreateImageKHR failed: {e:#x}"));
        }
        Ok(TextureImage { texture, image })
    }

    /// Reads the texture behind `image` back through GL (a framebuffer with
    /// the texture attached, `glReadPixels`), `width * height * 4` bytes.
    pub fn read_texture(&self, image: &TextureImage, width: u32, height: u32) -> Vec<u8> {
        let mut out = vec![0u8; width as usize * height as usize * 4];
        let mut fb = 0u32;
        // SAFETY: the context is current; `out` holds the whole read.
        unsafe {
            (self.finish)();
            (self.gen_framebuffers)(1, &mut fb);
            (self.bind_framebuffer)(GL_FRAMEBUFFER, fb);
            (self.framebuffer_texture_2d)(
                GL_FRAMEBUFFER,
                GL_COLOR_ATTACHMENT0,
                GL_TEXTURE_2D,
                image.texture,
                0,
            );
            (self.read_pixels)(
                0,
                0,
                width as i32,
                height as i32,
                GL_RGBA,
                GL_UNSIGNED_BYTE,
                out.as_mut_ptr().cast(),
            );
            (self.bind_framebuffer)(GL_FRAMEBUFFER, 0);
            (self.delete_framebuffers)(1, &fb);
        }
        out
    }

    /// Overwrites the whole texture behind `image` through GL
    /// (`glTexSubImage2D`, then `glFinish`).
    pub fn write_texture(&self, image: &TextureImage, width: u32, height: u32, pixels: &[u8]) {
        if pixels.len() != width as usize * height as usize * 4 {
            return;
        }
        // SAFETY: the context is current; `pixels` holds the whole image.
        unsafe {
            (self.bind_texture)(GL_TEXTURE_2D, image.texture);
            (self.tex_sub_image_2d)(
                GL_TEXTURE_2D,
                0,
                0,
                0,
                width as i32,
                height as i32,
                GL_RGBA,
                GL_UNSIGNED_BYTE,
                pixels.as_ptr().cast(),
            );
            (self.finish)();
        }
    }

    /// A new EGLStream on this display (`eglCreateStreamKHR`): FIFO of
    /// `fifo_length` frames, or mailbox mode for 0.
    pub fn create_stream(&self, fifo_length: i32) -> Result<EglStream, String> {
        let f = self.streams.as_ref().map_err(Clone::clone)?;
        let attribs = [EGL_STREAM_FIFO_LENGTH_KHR, fifo_length, EGL_NONE];
        // SAFETY: our initialised display and a NONE-terminated list.
        let raw = unsafe { (f.create)(self.dpy, attribs.as_ptr()) };
        if raw.is_null() {
            // SAFETY: no arguments.
            return Err(format!("eglCreateStreamKHR failed: {:#x}", unsafe {
                (self.get_error)()
            }));
        }
        Ok(EglStream { raw })
    }

    /// The stream's `EGL_STREAM_STATE_KHR` (see [`stream_state`]).
    pub fn stream_state(&self, stream: &EglStream) -> Result<i32, String> {
        let f = self.streams.as_ref().map_err(Clone::clone)?;
        let mut v = 0;
        // SAFETY: a live stream of our display and an out-pointer.
        if unsafe { (f.query)(self.dpy, stream.raw, EGL_STREAM_STATE_KHR, &mut v) } == 0 {
            // SAFETY: no arguments.
            return Err(format!("eglQueryStreamKHR failed: {:#x}", unsafe {
                (self.get_error)()
            }));
        }
        Ok(v)
    }

    /// A fence sync (`eglCreateSyncKHR(EGL_SYNC_FENCE_KHR)`) after the GL
    /// commands issued so far on this thread's context; the `EGLSyncKHR`.
    pub fn fence_sync(&self) -> Result<*mut c_void, String> {
        const EGL_SYNC_FENCE_KHR: u32 = 0x30F9;
        let (create, _) = self.syncs.as_ref().map_err(Clone::clone)?;
        let none = [EGL_NONE];
        // SAFETY: our initialised display with a current context, and a
        // NONE-terminated (empty) attribute list.
        let s = unsafe { create(self.dpy, EGL_SYNC_FENCE_KHR, none.as_ptr()) };
        if s.is_null() {
            // SAFETY: no arguments.
            return Err(format!("eglCreateSyncKHR failed: {:#x}", unsafe {
                (self.get_error)()
            }));
        }
        Ok(s)
    }

    /// Destroys a sync made by [`fence_sync`](Self::fence_sync).
    pub fn destroy_sync(&self, sync: *mut c_void) {
        if let Ok((_, destroy)) = &self.syncs {
            // SAFETY: a sync of our display, destroyed once by the caller's
            // contract.
            unsafe { destroy(self.dpy, sync) };
        }
    }

    /// Destroys a stream (after CUDA disconnected from it).
    pub fn destroy_stream(&self, stream: EglStream) {
        if let Ok(f) = &self.streams {
            // SAFETY: made by this exporter, destroyed once (consumed).
            unsafe { (f.destroy)(self.dpy, stream.raw) };
        }
    }

    /// Destroys an image and its texture (after CUDA unregistered it).
    pub fn destroy(&self, image: TextureImage) {
        // SAFETY: made by this exporter, destroyed once (consumed).
        unsafe {
            (self.destroy_image)(self.dpy, image.image);
            (self.delete_textures)(1, &image.texture);
        }
    }
}

impl Drop for EglExporter {
    fn drop(&mut self) {
        // Measured on the GPU machine (H100, driver 580.159): a second
        // exporter made in a process after the first had terminated its
        // display and unloaded libEGL/libGLESv2 crashed (SIGSEGV) once CUDA
        // had used an EGLStream of the first. So only the context goes: the
        // display stays initialised (EGL gives the same display to the next
        // exporter) and the libraries stay loaded until the process ends.
        // SAFETY: our context and display; the context is made not current
        // and destroyed once.
        unsafe {
            (self.make_current)(
                self.dpy,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
            (self.destroy_context)(self.dpy, self.ctx);
        }
    }
}
