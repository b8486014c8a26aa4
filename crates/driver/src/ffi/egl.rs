//! The plane words of an EGL frame (`CUeglFrame`'s `frame` union).
//!
//! # Safety
//!
//! Both members of the union are three pointer-sized values, so reading
//! either member reads initialised bytes of the right size; which one is
//! meant, `frameType` says, and the callers keep to that.
#![allow(unsafe_code)]

/// The three plane words of an EGL frame: device pointers of a pitch frame
/// or `CUarray`s of an array frame (which one, `frameType` says).
pub(crate) fn egl_plane_words(f: &tegra_interop_sys::cuda::CUeglFrame) -> [usize; 3] {
    // SAFETY: both members of the union are three pointer-sized values, so
    // reading either as pointers reads initialised bytes (the frame was
    // written whole by the driver, or defaulted to zero).
    let p = unsafe { f.frame.pPitch };
    [p[0] as usize, p[1] as usize, p[2] as usize]
}

/// Writes the three plane words of an EGL frame (device pointers of a pitch
/// frame, `CUarray`s of an array frame).
pub(crate) fn set_egl_plane_words(f: &mut tegra_interop_sys::cuda::CUeglFrame, words: [usize; 3]) {
    f.frame.pPitch = words.map(|w| w as *mut core::ffi::c_void);
}
