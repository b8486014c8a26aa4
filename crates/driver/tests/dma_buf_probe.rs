//! `probe::dma_buf_import` over the simulator: the verdict follows what the
//! import really answers (never device attribute 124), and every path,
//! including a failure injected at each of its calls, leaves no allocation,
//! import or fd behind.
//!
//! One test function: it compares the process's fd table before and after,
//! which parallel tests in the same binary would disturb.
#![allow(clippy::unwrap_used)] // tests may unwrap

use tegra_interop_core::CuResult;
use tegra_interop_driver::probe::{self, DmaBufImport};
use tegra_interop_driver::{Backend, Context, ExternalMemory, FunctionTable};
use tegra_interop_sim::{Sim, SimConfig};

/// The open descriptors of this process, sorted.
fn fd_table() -> Vec<String> {
    let mut fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    fds.sort();
    fds
}

/// What a DMABUF_FD import of an exporter's memfd answers on this
/// simulator, asked directly (without the probe).
fn direct_dma_buf_import_answer(sim: &Sim) -> Option<CuResult> {
    let ctx = Context::primary(sim.backend(), 0).unwrap();
    let (fd, _exported) = tegra_interop_sim::export::memory(probe::DMA_BUF_PROBE_BYTES).unwrap();
    match ExternalMemory::dma_buf_fd(&ctx, fd, probe::DMA_BUF_PROBE_BYTES as u64) {
        Ok(memory) => {
            memory.destroy().unwrap();
            None
        }
        Err(e) => tegra_interop_driver::Error::from(e).code(),
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "compares /proc/self/fd before and after, which under Miri lists the host process's descriptors, not the program's"
)]
fn dma_buf_probe() {
    let before = fd_table();

    // 1. The measured machine's configuration (attribute 124 = 1): the
    //    verdict is what the import answers.
    {
        let sim = Sim::new().unwrap();
        let answer = direct_dma_buf_import_answer(&sim);
        // The default simulator is the measured H200: DMABUF_FD import is
        // NOT_SUPPORTED there (measured on the H200, driver 580.159: even
        // for a dma-buf CUDA exported itself).
        assert_eq!(answer, Some(CuResult::NOT_SUPPORTED));
        let ctx = Context::primary(sim.backend(), 0).unwrap();
        let dev = sim.backend();
        let attr_124 = dev.device(0).unwrap().supports_dma_buf().unwrap();
        assert!(attr_124, "the default simulator exports dma-bufs");
        let verdict = probe::dma_buf_import(&ctx);
        match answer {
            None => assert_eq!(verdict, DmaBufImport::Supported),
            Some(code) if code == CuResult::NOT_SUPPORTED => {
                assert_eq!(verdict, DmaBufImport::NotSupported { code });
                assert_eq!(
                    verdict.to_string(),
                    "not supported (probed: import answered CUDA_ERROR_NOT_SUPPORTED)"
                );
            }
            Some(code) => assert!(
                matches!(&verdict, DmaBufImport::Unknown { reason } if reason.contains(code.name().unwrap_or("?"))),
                "{verdict}"
            ),
        }
        // The probe really exported and imported.
        let log = sim.call_log();
        for call in [
            "cuMemAlloc",
            "cuMemGetHandleForAddressRange",
            "cuImportExternalMemory",
            "cuMemFree",
        ] {
            assert!(log.contains(&call), "{call} not called: {log:?}");
        }
        drop(ctx);
        assert!(sim.ledger().is_clean(), "{}", sim.ledger());
        assert!(sim.diagnostics().is_empty(), "{:?}", sim.diagnostics());
    }
    assert_eq!(
        fd_table(),
        before,
        "the probe left an fd open or closed one"
    );

    // 2. A device that cannot export: no probe possible, and the report
    //    says so instead of guessing.
    {
        let mut config = SimConfig::default();
        config.dmabuf_supported = false;
        let sim = Sim::with_config(config.with_diagnostic_echo(false)).unwrap();
        let ctx = Context::primary(sim.backend(), 0).unwrap();
        let verdict = probe::dma_buf_import(&ctx);
        let shown = verdict.to_string();
        assert_eq!(verdict.supported(), None, "{shown}");
        assert!(
            shown.starts_with("unknown (no probe possible: the export to import back failed: cuMemGetHandleForAddressRange failed: CUDA_ERROR_NOT_SUPPORTED"),
            "{shown}"
        );
        let d = sim.take_diagnostics();
        assert!(
            d.iter().any(
                |d| d.kind == tegra_interop_sim::DiagnosticKind::Unimplemented
                    && d.symbol == "cuMemGetHandleForAddressRange"
            ),
            "{d:?}"
        );
        drop(ctx);
        assert!(sim.ledger().is_clean(), "{}", sim.ledger());
    }
    assert_eq!(fd_table(), before);

    // 3. A driver without the export entry point.
    {
        let sim = Sim::new().unwrap();
        let mut table: FunctionTable = sim.table();
        table.cuda.cuMemGetHandleForAddressRange = None;
        // SAFETY: the simulator's entries uphold `from_table`'s contract (see
        // `Sim::backend`); a removed entry is only reported as missing.
        let backend = unsafe { Backend::from_table("no-export", table) };
        let ctx = Context::primary(backend, 0).unwrap();
        let shown = probe::dma_buf_import(&ctx).to_string();
        assert!(
            shown.starts_with(
                "unknown (no probe possible: cuMemGetHandleForAddressRange is not available"
            ),
            "{shown}"
        );
        drop(ctx);
        assert!(sim.ledger().is_clean(), "{}", sim.ledger());
    }

    // 4. A failure injected at each call the probe makes: no verdict when
    //    the allocation, the export or the import itself failed; nothing
    //    left behind unless the failing call was a release (then the
    //    verdict says so).
    let calls = {
        let sim = Sim::new().unwrap();
        let ctx = Context::primary(sim.backend(), 0).unwrap();
        let start = sim.calls();
        let _ = probe::dma_buf_import(&ctx);
        sim.calls() - start
    };
    assert!(calls >= 4, "{calls}");
    for i in 0..calls {
        let sim = Sim::new().unwrap();
        let ctx = Context::primary(sim.backend(), 0).unwrap();
        let index = sim.calls() + i;
        sim.fail_at(index, 999);
        let verdict = probe::dma_buf_import(&ctx);
        let failed_call = sim.call_log()[index as usize];
        let shown = verdict.to_string();
        if failed_call == "cuImportExternalMemory" {
            // The import's own answer: UNKNOWN says nothing about support.
            assert_eq!(verdict.supported(), None, "{shown}");
        } else if matches!(failed_call, "cuMemAlloc" | "cuMemGetHandleForAddressRange") {
            // Nothing to import: no answer either way.
            assert_eq!(verdict.supported(), None, "{failed_call}: {shown}");
        }
        let leaked_on_purpose = matches!(failed_call, "cuMemFree" | "cuDestroyExternalMemory");
        if leaked_on_purpose {
            assert!(shown.contains(failed_call), "{failed_call}: {shown}");
        }
        drop(ctx);
        if !leaked_on_purpose {
            assert!(sim.ledger().is_clean(), "{failed_call}: {}", sim.ledger());
        }
        drop(sim);
        assert_eq!(fd_table(), before, "failure at {failed_call}");
    }
}
