//! An EGL display for CUDA's EGL interop: the producing side of an
//! `EGLStreamKHR` and of `EGLImageKHR`s.
//!
//! [`EglExporter`] opens the first device of the EGL device platform
//! (`EGL_EXT_platform_device`: headless, no window system), initialises its
//! display and makes a surfaceless OpenGL ES 2 context
//! (`EGL_KHR_surfaceless_context`). With it a program makes
//!
//! - [`EglStream`]s (`EGL_KHR_stream`, FIFO of a given length or mailbox)
//!   that CUDA connects to as consumer and producer
//!   (`tegra_interop::driver::egl::{EglStreamConsumer, EglStreamProducer}`),
//!   and reads their state ([`EglExporter::stream_state`]);
//! - [`TextureImage`]s: an RGBA8 GL texture as an `EGLImageKHR`
//!   (`EGL_KHR_gl_texture_2D_image`) that CUDA registers
//!   (`tegra_interop::driver::egl::EglImage`), with GL-side reads and writes
//!   of the texture;
//! - [`EglSync`] fences (`EGL_KHR_fence_sync`) after the GL work issued so
//!   far.
//!
//! # Loading
//! Nothing is linked at build time: `libEGL.so.1` and `libGLESv2.so.2` are
//! opened when [`EglExporter::new`] runs, and a machine without them (or
//! without an EGL device, or without an extension) gets an [`EglError`]
//! that says which, never a panic. The stream and fence-sync extensions are
//! looked up once; a display without them still makes images, and only the
//! calls that need them fail ([`EglError::ExtensionUnavailable`]).
//!
//! # Threads and lifetimes
//! The exporter and every object it makes hold raw EGL handles and share the
//! exporter's state through an `Rc`, so none of them is `Send`: all GL work
//! happens on the thread that made the exporter, and each GL operation makes
//! the exporter's context current first (another exporter on the same
//! thread may have made its own current in between). An object can outlive
//! the [`EglExporter`] value: the context is destroyed after the last object
//! is gone. Objects are destroyed when dropped; the `destroy*` methods say
//! so explicitly at the call site.
//!
//! CUDA's use of a stream or an image is the user's contract with the driver
//! (the connect and register calls are `unsafe`): a stream or an image must
//! stay alive until CUDA disconnected from it or unregistered it.
//!
//! # Teardown
//! Measured on the GPU machine (H100, driver 580.159): a second display set
//! up in a process after the first had been terminated and its libraries
//! unloaded crashed (SIGSEGV) once CUDA had used an EGLStream of the first.
//! So dropping the last reference destroys only the context: the display
//! stays initialised (EGL hands the same display to the next exporter) and
//! the libraries stay loaded until the process ends.

use std::ffi::{c_char, c_void, CString};
use std::fmt;
use std::mem::ManuallyDrop;
use std::rc::Rc;

use libloading::Library;

type EglInt = i32;
type EglBoolean = u32;
type Ptr = *mut c_void;

/// The EGL library [`EglExporter::new`] opens.
pub const EGL_LIBRARY: &str = "libEGL.so.1";
/// The OpenGL ES 2 library [`EglExporter::new`] opens.
pub const GLES_LIBRARY: &str = "libGLESv2.so.2";

const EGL_NONE: EglInt = 0x3038;
const EGL_SURFACE_TYPE: EglInt = 0x3033;
const EGL_PBUFFER_BIT: EglInt = 0x1;
const EGL_RENDERABLE_TYPE: EglInt = 0x3040;
const EGL_OPENGL_ES2_BIT: EglInt = 0x4;
const EGL_CONTEXT_CLIENT_VERSION: EglInt = 0x3098;
const EGL_PLATFORM_DEVICE_EXT: u32 = 0x313F;
const EGL_OPENGL_ES_API: u32 = 0x30A0;
const EGL_GL_TEXTURE_2D_KHR: u32 = 0x30B1;
const EGL_SYNC_FENCE_KHR: u32 = 0x30F9;
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
/// How many EGL devices are asked for; the first is used.
const MAX_DEVICES: usize = 8;

/// The states of an EGLStream (`EGL_STREAM_STATE_KHR`), as
/// [`EglExporter::stream_state`] returns them.
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

/// Errors of the EGL display.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EglError {
    /// A library could not be opened.
    LibraryNotFound {
        /// The library ([`EGL_LIBRARY`] or [`GLES_LIBRARY`]).
        library: &'static str,
        /// What the dynamic loader said.
        reason: String,
    },
    /// A library lacks a function it must export.
    MissingSymbol {
        /// The function.
        symbol: &'static str,
        /// What the dynamic loader said.
        reason: String,
    },
    /// `eglGetProcAddress` has no such extension function (the extension is
    /// not available on this system).
    ExtensionUnavailable {
        /// The function.
        function: &'static str,
    },
    /// `eglQueryDevicesEXT` found no EGL device.
    NoDevice,
    /// No EGL config fits a pbuffer-capable OpenGL ES 2 context.
    NoConfig,
    /// An EGL call failed.
    Failed {
        /// The call.
        call: &'static str,
        /// `eglGetError()` after it (0 where the call sets none).
        code: i32,
    },
    /// An image size of zero, or one too large for GL (`i32`) or for memory.
    BadSize {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
    },
    /// A pixel buffer whose length is not `width * height * 4`.
    PixelsLength {
        /// The length the size asks for.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// A negative FIFO length (0 is mailbox mode).
    BadFifoLength {
        /// The length given.
        fifo_length: i32,
    },
    /// An object of another [`EglExporter`] was passed in.
    ForeignObject,
}

impl fmt::Display for EglError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EglError::LibraryNotFound { library, reason } => {
                write!(f, "{library} could not be loaded: {reason}")
            }
            EglError::MissingSymbol { symbol, reason } => {
                write!(f, "the EGL/GLES library lacks {symbol}: {reason}")
            }
            EglError::ExtensionUnavailable { function } => write!(
                f,
                "eglGetProcAddress({function}) = NULL: the extension is not available"
            ),
            EglError::NoDevice => write!(f, "eglQueryDevicesEXT found no EGL device"),
            EglError::NoConfig => write!(f, "no EGL config for a GLES2 context"),
            EglError::Failed { call, code } => write!(f, "{call} failed: EGL error {code:#x}"),
            EglError::BadSize { width, height } => write!(
                f,
                "an image of {width} x {height} pixels: both must be 1..={}, the bytes must fit in memory",
                i32::MAX
            ),
            EglError::PixelsLength { expected, got } => write!(
                f,
                "{got} bytes of pixels given, width * height * 4 = {expected} expected"
            ),
            EglError::BadFifoLength { fifo_length } => write!(
                f,
                "FIFO length {fifo_length}: expected 0 (mailbox) or more"
            ),
            EglError::ForeignObject => {
                write!(f, "the object belongs to a different EglExporter")
            }
        }
    }
}

impl std::error::Error for EglError {}

/// The bytes of a tightly packed RGBA8 image of `width` x `height`, and the
/// sizes as GL takes them; [`EglError::BadSize`] for 0, sizes above
/// `i32::MAX` and byte counts that overflow `usize`.
fn rgba_len(width: u32, height: u32) -> Result<(usize, i32, i32), EglError> {
    let bad = EglError::BadSize { width, height };
    let (w, h) = (
        i32::try_from(width).map_err(|_| bad.clone())?,
        i32::try_from(height).map_err(|_| bad.clone())?,
    );
    if w == 0 || h == 0 {
        return Err(bad);
    }
    let len = usize::try_from(width)
        .ok()
        .zip(usize::try_from(height).ok())
        .and_then(|(w, h)| w.checked_mul(h)?.checked_mul(4))
        .filter(|&n| isize::try_from(n).is_ok())
        .ok_or(bad)?;
    Ok((len, w, h))
}

/// The EGL_KHR_stream entry points (from `eglGetProcAddress`).
#[derive(Clone, Copy)]
struct StreamFns {
    create: unsafe extern "C" fn(Ptr, *const EglInt) -> Ptr,
    destroy: unsafe extern "C" fn(Ptr, Ptr) -> EglBoolean,
    query: unsafe extern "C" fn(Ptr, Ptr, u32, *mut EglInt) -> EglBoolean,
}

/// The EGL_KHR_fence_sync entry points (from `eglGetProcAddress`).
#[derive(Clone, Copy)]
struct SyncFns {
    create: unsafe extern "C" fn(Ptr, u32, *const EglInt) -> Ptr,
    destroy: unsafe extern "C" fn(Ptr, Ptr) -> EglBoolean,
}

/// The core EGL entry points, from `libEGL.so.1`.
#[allow(clippy::type_complexity)]
struct EglCore {
    initialize: unsafe extern "C" fn(Ptr, *mut EglInt, *mut EglInt) -> EglBoolean,
    bind_api: unsafe extern "C" fn(u32) -> EglBoolean,
    choose_config:
        unsafe extern "C" fn(Ptr, *const EglInt, *mut Ptr, EglInt, *mut EglInt) -> EglBoolean,
    create_context: unsafe extern "C" fn(Ptr, Ptr, Ptr, *const EglInt) -> Ptr,
    make_current: unsafe extern "C" fn(Ptr, Ptr, Ptr, Ptr) -> EglBoolean,
    get_error: unsafe extern "C" fn() -> EglInt,
    destroy_context: unsafe extern "C" fn(Ptr, Ptr) -> EglBoolean,
}

/// The GL entry points, from `libGLESv2.so.2`.
struct GlFns {
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
}

/// The display, the context and the entry points, shared by the exporter
/// and every object it made; the context goes when the last of them does.
struct Inner {
    dpy: Ptr,
    ctx: Ptr,
    make_current: unsafe extern "C" fn(Ptr, Ptr, Ptr, Ptr) -> EglBoolean,
    get_error: unsafe extern "C" fn() -> EglInt,
    destroy_context: unsafe extern "C" fn(Ptr, Ptr) -> EglBoolean,
    create_image: unsafe extern "C" fn(Ptr, Ptr, u32, Ptr, *const EglInt) -> Ptr,
    destroy_image: unsafe extern "C" fn(Ptr, Ptr) -> EglBoolean,
    gl: GlFns,
    streams: Result<StreamFns, EglError>,
    syncs: Result<SyncFns, EglError>,
    /// Never unloaded (see "Teardown" in the module docs).
    _egl: ManuallyDrop<Library>,
    _gles: ManuallyDrop<Library>,
}

impl Inner {
    /// `Failed` for `call` with the thread's EGL error.
    fn failed(&self, call: &'static str) -> EglError {
        // SAFETY: eglGetError takes no arguments and reads thread state.
        let code = unsafe { (self.get_error)() };
        EglError::Failed { call, code }
    }

    /// Makes this display's context current on this thread (surfaceless).
    fn make_current(&self) -> Result<(), EglError> {
        // SAFETY: our initialised display and our live context, no surfaces
        // (EGL_KHR_surfaceless_context, checked when the context was made).
        let made = unsafe {
            (self.make_current)(
                self.dpy,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                self.ctx,
            )
        };
        if made == 0 {
            return Err(self.failed("eglMakeCurrent"));
        }
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: our display and context; the context is released from
        // this thread and destroyed once (the last reference is going). The
        // results are not needed: nothing else uses the context after this.
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

/// An EGL display (the first EGL device, headless) with a surfaceless
/// OpenGL ES 2 context: makes streams, texture images and fence syncs.
///
/// Not `Send`: use it, and what it makes, on the thread that made it.
pub struct EglExporter {
    inner: Rc<Inner>,
}

impl fmt::Debug for EglExporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EglExporter")
            .field("display", &self.inner.dpy)
            .field("context", &self.inner.ctx)
            .finish_non_exhaustive()
    }
}

/// An `EGLStreamKHR` made by [`EglExporter::create_stream`]; destroyed when
/// dropped (keep it until CUDA disconnected both ends).
pub struct EglStream {
    raw: Ptr,
    owner: Rc<Inner>,
}

impl EglStream {
    /// The `EGLStreamKHR` to connect CUDA to.
    pub fn as_raw(&self) -> *mut c_void {
        self.raw
    }
}

impl fmt::Debug for EglStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("EglStream").field(&self.raw).finish()
    }
}

impl Drop for EglStream {
    fn drop(&mut self) {
        if let Ok(f) = &self.owner.streams {
            // SAFETY: a stream made on this display, destroyed once (this
            // is its drop); CUDA's connections to it ended before, by the
            // contract of the unsafe connect calls.
            unsafe { (f.destroy)(self.owner.dpy, self.raw) };
        }
    }
}

/// An RGBA8 GL texture and the `EGLImageKHR` made from it
/// ([`EglExporter::rgba_texture_image`]); both destroyed when dropped (keep
/// it until CUDA unregistered the image).
pub struct TextureImage {
    texture: u32,
    image: Ptr,
    width: u32,
    height: u32,
    owner: Rc<Inner>,
}

impl TextureImage {
    /// The `EGLImageKHR` to register with CUDA.
    pub fn as_raw(&self) -> *mut c_void {
        self.image
    }

    /// Width and height in pixels.
    pub fn size(&self) -> (u32, u32) {
        (self.width, self.height)
    }
}

impl fmt::Debug for TextureImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TextureImage")
            .field("image", &self.image)
            .field("texture", &self.texture)
            .field("size", &(self.width, self.height))
            .finish()
    }
}

impl Drop for TextureImage {
    fn drop(&mut self) {
        let o = &self.owner;
        // SAFETY: an image of our display, destroyed once (this is its
        // drop); CUDA unregistered it before, by the contract of the unsafe
        // register call.
        unsafe { (o.destroy_image)(o.dpy, self.image) };
        // The texture name is our context's: delete it only there (if the
        // context cannot be made current, the texture stays until the
        // context goes).
        if o.make_current().is_ok() {
            // SAFETY: our context is current; one texture name of it.
            unsafe { (o.gl.delete_textures)(1, &self.texture) };
        }
    }
}

/// An `EGLSyncKHR` fence made by [`EglExporter::fence_sync`]; destroyed
/// when dropped.
pub struct EglSync {
    raw: Ptr,
    destroy: unsafe extern "C" fn(Ptr, Ptr) -> EglBoolean,
    owner: Rc<Inner>,
}

impl EglSync {
    /// The `EGLSyncKHR` (e.g. for `cuEventCreateFromEGLSync`).
    pub fn as_raw(&self) -> *mut c_void {
        self.raw
    }
}

impl fmt::Debug for EglSync {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("EglSync").field(&self.raw).finish()
    }
}

impl Drop for EglSync {
    fn drop(&mut self) {
        // SAFETY: a sync of our display, destroyed once (this is its drop).
        unsafe { (self.destroy)(self.owner.dpy, self.raw) };
    }
}

/// Looks up `name` in `lib` as a `T`.
///
/// # Safety
/// `T` must be the C type the EGL/GLES headers give `name`.
unsafe fn sym<T: Copy>(lib: &Library, name: &'static str) -> Result<T, EglError> {
    let missing = |reason: String| EglError::MissingSymbol {
        symbol: name,
        reason,
    };
    let c = CString::new(name).map_err(|e| missing(e.to_string()))?;
    // SAFETY: the caller names the symbol with its C type `T`.
    unsafe { lib.get::<T>(c.as_bytes_with_nul()) }
        .map(|s| *s)
        .map_err(|e| missing(e.to_string()))
}

/// Opens a library by name (or path) for the dynamic linker.
fn open_library(library: &'static str) -> Result<Library, EglError> {
    // SAFETY: opening the system's EGL / GLES library runs its initialisers,
    // which are the vendor's and are made to be loaded this way; the names
    // are this module's constants (tests pass names that do not exist).
    unsafe { Library::new(library) }.map_err(|e| EglError::LibraryNotFound {
        library,
        reason: e.to_string(),
    })
}

impl EglExporter {
    /// Opens [`EGL_LIBRARY`] and [`GLES_LIBRARY`], initialises the display
    /// of the first EGL device, and makes a surfaceless OpenGL ES 2 context
    /// on it, current on this thread.
    pub fn new() -> Result<EglExporter, EglError> {
        Self::open(EGL_LIBRARY, GLES_LIBRARY)
    }

    fn open(egl_name: &'static str, gles_name: &'static str) -> Result<EglExporter, EglError> {
        let egl = open_library(egl_name)?;
        let gles = open_library(gles_name)?;
        // SAFETY: eglGetProcAddress's C type.
        let get_proc: unsafe extern "C" fn(*const c_char) -> Ptr =
            unsafe { sym(&egl, "eglGetProcAddress")? };
        let ext = |function: &'static str| -> Result<Ptr, EglError> {
            let c =
                CString::new(function).map_err(|_| EglError::ExtensionUnavailable { function })?;
            // SAFETY: a NUL-terminated name.
            let p = unsafe { get_proc(c.as_ptr()) };
            if p.is_null() {
                return Err(EglError::ExtensionUnavailable { function });
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
            Ok(unsafe {
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
            Ok(unsafe {
                SyncFns {
                    create: std::mem::transmute::<
                        Ptr,
                        unsafe extern "C" fn(Ptr, u32, *const EglInt) -> Ptr,
                    >(create),
                    destroy: std::mem::transmute::<Ptr, unsafe extern "C" fn(Ptr, Ptr) -> EglBoolean>(
                        destroy,
                    ),
                }
            })
        })();
        // SAFETY: each symbol is named with the C type the EGL 1.4 header
        // gives it.
        let core = unsafe {
            EglCore {
                initialize: sym(&egl, "eglInitialize")?,
                bind_api: sym(&egl, "eglBindAPI")?,
                choose_config: sym(&egl, "eglChooseConfig")?,
                create_context: sym(&egl, "eglCreateContext")?,
                make_current: sym(&egl, "eglMakeCurrent")?,
                get_error: sym(&egl, "eglGetError")?,
                destroy_context: sym(&egl, "eglDestroyContext")?,
            }
        };
        let EglCore {
            initialize,
            bind_api,
            choose_config: choose,
            create_context,
            make_current,
            get_error,
            destroy_context,
        } = core;
        // SAFETY: each symbol is named with the C type the GLES 2.0 header
        // gives it.
        let gl = unsafe {
            GlFns {
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
            }
        };
        let failed = |call: &'static str| {
            // SAFETY: no arguments; reads this thread's EGL error.
            let code = unsafe { get_error() };
            EglError::Failed { call, code }
        };

        let mut devices = [std::ptr::null_mut::<c_void>(); MAX_DEVICES];
        let mut n = 0;
        // SAFETY: room for MAX_DEVICES devices and a count.
        if unsafe { query_devices(MAX_DEVICES as EglInt, devices.as_mut_ptr(), &mut n) } == 0 {
            return Err(failed("eglQueryDevicesEXT"));
        }
        if n < 1 {
            return Err(EglError::NoDevice);
        }
        // SAFETY: a device from eglQueryDevicesEXT, no attributes.
        let dpy =
            unsafe { platform_display(EGL_PLATFORM_DEVICE_EXT, devices[0], std::ptr::null()) };
        if dpy.is_null() {
            return Err(failed("eglGetPlatformDisplayEXT"));
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: a display handle and two out-pointers.
        if unsafe { initialize(dpy, &mut major, &mut minor) } == 0 {
            return Err(failed("eglInitialize"));
        }
        // SAFETY: a plain enum argument.
        if unsafe { bind_api(EGL_OPENGL_ES_API) } == 0 {
            return Err(failed("eglBindAPI"));
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
        if unsafe { choose(dpy, attribs.as_ptr(), &mut config, 1, &mut count) } == 0 {
            return Err(failed("eglChooseConfig"));
        }
        if count < 1 {
            return Err(EglError::NoConfig);
        }
        let ctx_attribs = [EGL_CONTEXT_CLIENT_VERSION, 2, EGL_NONE];
        // SAFETY: display, config from it, no share context, a NONE-terminated list.
        let ctx =
            unsafe { create_context(dpy, config, std::ptr::null_mut(), ctx_attribs.as_ptr()) };
        if ctx.is_null() {
            return Err(failed("eglCreateContext"));
        }
        // From here the context belongs to `inner`, whose drop destroys it.
        let inner = Inner {
            dpy,
            ctx,
            make_current,
            get_error,
            destroy_context,
            create_image,
            destroy_image,
            gl,
            streams,
            syncs,
            _egl: ManuallyDrop::new(egl),
            _gles: ManuallyDrop::new(gles),
        };
        inner.make_current()?;
        Ok(EglExporter {
            inner: Rc::new(inner),
        })
    }

    fn owns(&self, owner: &Rc<Inner>) -> Result<(), EglError> {
        if Rc::ptr_eq(&self.inner, owner) {
            Ok(())
        } else {
            Err(EglError::ForeignObject)
        }
    }

    /// An RGBA8 texture of `width` x `height` filled with `pixels` (tightly
    /// packed rows, `width * height * 4` bytes), as an `EGLImageKHR`.
    pub fn rgba_texture_image(
        &self,
        width: u32,
        height: u32,
        pixels: &[u8],
    ) -> Result<TextureImage, EglError> {
        let (len, w, h) = rgba_len(width, height)?;
        if pixels.len() != len {
            return Err(EglError::PixelsLength {
                expected: len,
                got: pixels.len(),
            });
        }
        let inner = &self.inner;
        inner.make_current()?;
        let gl = &inner.gl;
        let mut texture = 0u32;
        // SAFETY: our context is current on this thread; `pixels` holds the
        // whole w x h RGBA8 image (checked above); GL copies it before
        // glTexImage2D returns.
        unsafe {
            (gl.gen_textures)(1, &mut texture);
            (gl.bind_texture)(GL_TEXTURE_2D, texture);
            // One level only: without mipmaps the default minifying filter
            // would leave the texture incomplete.
            (gl.tex_parameter_i)(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_NEAREST);
            (gl.tex_parameter_i)(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_NEAREST);
            (gl.tex_image_2d)(
                GL_TEXTURE_2D,
                0,
                GL_RGBA as i32,
                w,
                h,
                0,
                GL_RGBA,
                GL_UNSIGNED_BYTE,
                pixels.as_ptr().cast(),
            );
            (gl.finish)();
        }
        let attribs = [EGL_NONE];
        // SAFETY: our display and context; the texture name as the client
        // buffer, as EGL_KHR_gl_texture_2D_image defines.
        let image = unsafe {
            (inner.create_image)(
                inner.dpy,
                inner.ctx,
                EGL_GL_TEXTURE_2D_KHR,
                texture as usize as Ptr,
                attribs.as_ptr(),
            )
        };
        if image.is_null() {
            let e = inner.failed("eglCreateImageKHR");
            // SAFETY: the texture made above, in our current context.
            unsafe { (gl.delete_textures)(1, &texture) };
            return Err(e);
        }
        Ok(TextureImage {
            texture,
            image,
            width,
            height,
            owner: Rc::clone(inner),
        })
    }

    /// Reads the whole texture behind `image` back through GL (a
    /// framebuffer with the texture attached, `glReadPixels`): `width *
    /// height * 4` bytes of the image's size, tightly packed.
    pub fn read_texture(&self, image: &TextureImage) -> Result<Vec<u8>, EglError> {
        self.owns(&image.owner)?;
        let (len, w, h) = rgba_len(image.width, image.height)?;
        let inner = &self.inner;
        inner.make_current()?;
        let gl = &inner.gl;
        let mut out = vec![0u8; len];
        let mut fb = 0u32;
        // SAFETY: our context is current; the texture is ours and w x h;
        // `out` holds w * h * 4 bytes, what an RGBA8 read of w x h writes
        // (default pack alignment 4 divides the row length).
        unsafe {
            (gl.finish)();
            (gl.gen_framebuffers)(1, &mut fb);
            (gl.bind_framebuffer)(GL_FRAMEBUFFER, fb);
            (gl.framebuffer_texture_2d)(
                GL_FRAMEBUFFER,
                GL_COLOR_ATTACHMENT0,
                GL_TEXTURE_2D,
                image.texture,
                0,
            );
            (gl.read_pixels)(
                0,
                0,
                w,
                h,
                GL_RGBA,
                GL_UNSIGNED_BYTE,
                out.as_mut_ptr().cast(),
            );
            (gl.bind_framebuffer)(GL_FRAMEBUFFER, 0);
            (gl.delete_framebuffers)(1, &fb);
        }
        Ok(out)
    }

    /// Overwrites the whole texture behind `image` through GL
    /// (`glTexSubImage2D`, then `glFinish`); `pixels` is `width * height *
    /// 4` bytes of the image's size.
    pub fn write_texture(&self, image: &TextureImage, pixels: &[u8]) -> Result<(), EglError> {
        self.owns(&image.owner)?;
        let (len, w, h) = rgba_len(image.width, image.height)?;
        if pixels.len() != len {
            return Err(EglError::PixelsLength {
                expected: len,
                got: pixels.len(),
            });
        }
        let inner = &self.inner;
        inner.make_current()?;
        let gl = &inner.gl;
        // SAFETY: our context is current; the texture is ours and w x h;
        // `pixels` holds the whole image (checked above).
        unsafe {
            (gl.bind_texture)(GL_TEXTURE_2D, image.texture);
            (gl.tex_sub_image_2d)(
                GL_TEXTURE_2D,
                0,
                0,
                0,
                w,
                h,
                GL_RGBA,
                GL_UNSIGNED_BYTE,
                pixels.as_ptr().cast(),
            );
            (gl.finish)();
        }
        Ok(())
    }

    /// A new EGLStream on this display (`eglCreateStreamKHR`): a FIFO of
    /// `fifo_length` frames, or mailbox mode for 0 (a new frame replaces one
    /// the consumer has not acquired).
    pub fn create_stream(&self, fifo_length: i32) -> Result<EglStream, EglError> {
        if fifo_length < 0 {
            return Err(EglError::BadFifoLength { fifo_length });
        }
        let inner = &self.inner;
        let f = inner.streams.as_ref().map_err(Clone::clone)?;
        let attribs = [EGL_STREAM_FIFO_LENGTH_KHR, fifo_length, EGL_NONE];
        // SAFETY: our initialised display and a NONE-terminated list.
        let raw = unsafe { (f.create)(inner.dpy, attribs.as_ptr()) };
        if raw.is_null() {
            return Err(inner.failed("eglCreateStreamKHR"));
        }
        Ok(EglStream {
            raw,
            owner: Rc::clone(inner),
        })
    }

    /// The stream's `EGL_STREAM_STATE_KHR` (one of [`stream_state`]).
    pub fn stream_state(&self, stream: &EglStream) -> Result<i32, EglError> {
        self.owns(&stream.owner)?;
        let inner = &self.inner;
        let f = inner.streams.as_ref().map_err(Clone::clone)?;
        let mut v = 0;
        // SAFETY: a live stream of our display and an out-pointer.
        if unsafe { (f.query)(inner.dpy, stream.raw, EGL_STREAM_STATE_KHR, &mut v) } == 0 {
            return Err(inner.failed("eglQueryStreamKHR"));
        }
        Ok(v)
    }

    /// A fence sync (`eglCreateSyncKHR(EGL_SYNC_FENCE_KHR)`) after the GL
    /// commands issued so far in this exporter's context.
    pub fn fence_sync(&self) -> Result<EglSync, EglError> {
        let inner = &self.inner;
        let f = *inner.syncs.as_ref().map_err(Clone::clone)?;
        inner.make_current()?;
        let none = [EGL_NONE];
        // SAFETY: our initialised display with our context current, and a
        // NONE-terminated (empty) attribute list.
        let raw = unsafe { (f.create)(inner.dpy, EGL_SYNC_FENCE_KHR, none.as_ptr()) };
        if raw.is_null() {
            return Err(inner.failed("eglCreateSyncKHR"));
        }
        Ok(EglSync {
            raw,
            destroy: f.destroy,
            owner: Rc::clone(inner),
        })
    }

    /// Destroys a sync made by [`fence_sync`](Self::fence_sync) (the same as
    /// dropping it).
    pub fn destroy_sync(&self, sync: EglSync) {
        drop(sync);
    }

    /// Destroys a stream after CUDA disconnected from it (the same as
    /// dropping it).
    pub fn destroy_stream(&self, stream: EglStream) {
        drop(stream);
    }

    /// Destroys an image and its texture after CUDA unregistered it (the
    /// same as dropping it).
    pub fn destroy(&self, image: TextureImage) {
        drop(image);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_typed_error_naming_it() {
        let e = EglExporter::open("libEGL-tegra-interop-absent.so.1", GLES_LIBRARY).unwrap_err();
        match &e {
            EglError::LibraryNotFound { library, reason } => {
                assert_eq!(*library, "libEGL-tegra-interop-absent.so.1");
                assert!(!reason.is_empty());
            }
            other => panic!("{other:?}"),
        }
        assert!(e
            .to_string()
            .starts_with("libEGL-tegra-interop-absent.so.1 could not be loaded"));
    }

    #[test]
    fn image_sizes_are_checked_before_gl_sees_them() {
        assert_eq!(rgba_len(2, 3).unwrap(), (24, 2, 3));
        let max = i32::MAX as u32;
        for (w, h) in [(0, 4), (4, 0), (max + 1, 1), (1, u32::MAX)] {
            assert_eq!(
                rgba_len(w, h),
                Err(EglError::BadSize {
                    width: w,
                    height: h
                }),
                "{w} x {h}"
            );
        }
        // Each side fits GL's i32, their byte count (about 2^64) exceeds
        // isize::MAX: refused, never wrapped into a short buffer.
        if usize::BITS == 64 {
            assert!(matches!(rgba_len(max, max), Err(EglError::BadSize { .. })));
        }
    }

    #[test]
    fn errors_say_what_failed() {
        let e = EglError::Failed {
            call: "eglCreateStreamKHR",
            code: 0x3004,
        };
        assert_eq!(e.to_string(), "eglCreateStreamKHR failed: EGL error 0x3004");
        assert!(EglError::BadFifoLength { fifo_length: -1 }
            .to_string()
            .contains("-1"));
        assert!(EglError::PixelsLength {
            expected: 16,
            got: 15
        }
        .to_string()
        .contains("15 bytes"));
    }
}
