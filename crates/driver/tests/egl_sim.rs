//! EGL images registered with CUDA, on the simulator: data both ways, two
//! planes, refusals, teardown.
#![allow(clippy::unwrap_used)] // tests may unwrap

use tegra_interop_core::CuResult;
use tegra_interop_driver::egl::{EglAccess, EglColorFormat, EglFrameType, EglImage};
use tegra_interop_driver::{Context, Error};
use tegra_interop_sim::egl::EglImageFormat;
use tegra_interop_sim::{DiagnosticKind, Sim, SimConfig};

fn setup() -> (Sim, Context) {
    // Quiet: misuse is provoked on purpose; the tests read the diagnostics.
    let sim = Sim::with_config(SimConfig::default().with_diagnostic_echo(false)).unwrap();
    let ctx = Context::create(sim.backend(), 0, 0).unwrap();
    (sim, ctx)
}

#[test]
fn rgba_data_crosses_both_ways() {
    let (sim, ctx) = setup();
    let mut image = sim
        .create_egl_image(EglImageFormat::Rgba8, 100, 20)
        .unwrap();
    let pitch = image.planes()[0].pitch;
    for (i, b) in image.plane_mut(0).unwrap().iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    // SAFETY: the image lives until after the registration ends.
    let reg = unsafe { EglImage::register(&ctx, image.as_raw(), EglAccess::ReadWrite) }.unwrap();
    {
        let f = reg.frame().unwrap();
        assert_eq!(f.frame_type(), EglFrameType::Pitch);
        assert_eq!((f.width(), f.height(), f.depth()), (100, 20, 1));
        assert_eq!((f.plane_count(), f.channels()), (1, 4));
        assert_eq!(f.pitch() as usize, pitch);
        assert!(pitch >= 400);
        assert_eq!(f.color_format(), EglColorFormat::RGBA);
        assert_eq!(f.plane_len(0), Some(pitch * 20));
        assert!(f.plane_ptr(1).is_none() && f.plane_array(0).is_none());
        // Measured (GL texture, driver 580.159): CUDA sees zeros until the
        // EGL side's first access after the registration, which brings the
        // EGL side's earlier bytes into the shared storage.
        let mut seen = vec![0u8; pitch * 20];
        f.copy_plane_to_host(0, &mut seen).unwrap();
        assert!(
            seen.iter().all(|b| *b == 0),
            "CUDA: zeros before the EGL side's access"
        );
        let egl_view = image.plane(0).unwrap().to_vec();
        assert!(
            egl_view
                .iter()
                .enumerate()
                .all(|(i, b)| *b == (i % 251) as u8),
            "the EGL side keeps its bytes"
        );
        f.copy_plane_to_host(0, &mut seen).unwrap();
        assert!(
            seen == egl_view,
            "after the EGL side's access CUDA sees its bytes"
        );
        f.copy_plane_from_host(0, &[0xab; 64]).unwrap();
        let too_long = vec![0u8; pitch * 20 + 1];
        assert!(matches!(
            f.copy_plane_from_host(0, &too_long),
            Err(Error::OutOfBounds { .. })
        ));
    }
    assert_eq!(&image.plane(0).unwrap()[..64], &[0xab; 64]);
    assert_eq!(sim.ledger().live_graphics_resources, 1);
    reg.unregister().unwrap();
    drop(image);
    drop(ctx);
    assert!(sim.ledger().is_clean(), "{}", sim.ledger());
    assert!(sim.diagnostics().is_empty(), "{:?}", sim.diagnostics());
}

#[test]
fn nv12_has_a_half_height_chroma_plane() {
    let (sim, ctx) = setup();
    let mut image = sim.create_egl_image(EglImageFormat::Nv12, 64, 32).unwrap();
    // SAFETY: the image outlives the registration.
    let reg = unsafe { EglImage::register(&ctx, image.as_raw(), EglAccess::ReadOnly) }.unwrap();
    image.plane_mut(1).unwrap().fill(0x80);
    let f = reg.frame().unwrap();
    assert_eq!(f.plane_count(), 2);
    assert_eq!(f.color_format(), EglColorFormat::YUV420_SEMIPLANAR);
    let pitch = f.pitch() as usize;
    assert_eq!(f.plane_len(0), Some(pitch * 32));
    assert_eq!(f.plane_len(1), Some(pitch * 16));
    assert_ne!(f.plane_ptr(0), f.plane_ptr(1));
    let mut uv = vec![0u8; pitch * 16];
    f.copy_plane_to_host(1, &mut uv).unwrap();
    assert!(uv.iter().all(|b| *b == 0x80));
    drop(reg);
    drop(image);
    drop(ctx);
    assert!(sim.ledger().is_clean(), "{}", sim.ledger());
}

#[test]
fn unknown_and_null_images_are_refused() {
    let (sim, ctx) = setup();
    // SAFETY: deliberately invalid handles: the simulator must refuse them.
    let null = unsafe { EglImage::register(&ctx, std::ptr::null_mut(), EglAccess::ReadWrite) };
    assert!(matches!(null, Err(Error::Unsupported { .. })), "{null:?}");
    // SAFETY: as above.
    let bogus = unsafe { EglImage::register(&ctx, 0x1234 as *mut _, EglAccess::ReadWrite) };
    match bogus {
        Err(Error::Driver { code, .. }) => assert_eq!(code, CuResult::INVALID_VALUE),
        other => panic!("{other:?}"),
    }
    assert!(sim
        .take_diagnostics()
        .iter()
        .any(|d| d.kind == DiagnosticKind::UnknownHandle));
}

#[test]
fn destroying_a_registered_image_is_a_misuse() {
    let (sim, ctx) = setup();
    let image = sim.create_egl_image(EglImageFormat::Rgba8, 8, 8).unwrap();
    // SAFETY: the simulator's image (destroyed early on purpose below).
    let reg = unsafe { EglImage::register(&ctx, image.as_raw(), EglAccess::ReadWrite) }.unwrap();
    drop(image);
    assert!(sim
        .take_diagnostics()
        .iter()
        .any(|d| d.kind == DiagnosticKind::Misuse && d.message.contains("still registered")));
    // The frame of a destroyed image is refused.
    assert!(reg.frame().is_err());
    reg.unregister().unwrap();
}
