//! `cargo xtask codegen --nvsci-include DIR --check` compares the ABI, and
//! fails on a real difference.
//!
//! No NVIDIA text is used: each test builds a stand-in "real" header set
//! from the project's own declaration header (crates/sys/include), edited in
//! a known way, and runs the built xtask on it. Needs libclang (bindgen), a
//! host C compiler and the cached CUDA header, like the codegen tests in
//! cli.rs.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn own_header() -> String {
    std::fs::read_to_string(repo().join("crates/sys/include/tegra_interop_nvsci.h")).unwrap()
}

/// Replaces `from` by `to`, insisting that `from` is there (so a change of
/// the project's header cannot make an edit silently do nothing).
fn edit(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the header no longer contains {from:?}"
    );
    text.replacen(from, to, 1)
}

/// Writes a header set laid out like the BSP's (nvscibuf.h, nvscisync.h,
/// nvsciipc.h) whose whole content is `header`.
fn header_set(name: &str, header: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("abi-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("nvscibuf.h"), header).unwrap();
    for other in ["nvscisync.h", "nvsciipc.h"] {
        std::fs::write(dir.join(other), "#include \"nvscibuf.h\"\n").unwrap();
    }
    dir
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn differences(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix("nvsci ABI difference: "))
            .collect()
    }
}

fn check(dir: &Path) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["codegen", "--check", "--nvsci-include"])
        .arg(dir)
        .output()
        .unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn identical_declarations_have_no_abi_difference() {
    let run = check(&header_set("same", &own_header()));
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(run.differences().is_empty(), "{}", run.stdout);
    assert!(
        run.stdout.contains("nvsci: no ABI difference ("),
        "{}",
        run.stdout
    );
    assert!(run
        .stdout
        .contains("NvSciBuf 2.11, NvSciSync 2.8, NvSciIpc 1.4"));
}

#[test]
fn other_spellings_of_the_same_abi_are_not_differences() {
    let h = own_header();
    // An enum newtype of ours written as a 64-bit typedef plus #defines.
    let h = edit(
        &h,
        "typedef enum {\n    NvSciSyncAccessPerm_WaitOnly = 0x1ULL,\n    NvSciSyncAccessPerm_SignalOnly = 0x2ULL,\n    NvSciSyncAccessPerm_WaitSignal = 0x3ULL,\n    NvSciSyncAccessPerm_Auto = 0x8000000000000000ULL\n} NvSciSyncAccessPerm;",
        "typedef uint64_t NvSciSyncAccessPerm;\n#define NvSciSyncAccessPerm_WaitOnly ((uint64_t)1U << 0U)\n#define NvSciSyncAccessPerm_SignalOnly ((uint64_t)1U << 1U)\n#define NvSciSyncAccessPerm_WaitSignal (NvSciSyncAccessPerm_WaitOnly | NvSciSyncAccessPerm_SignalOnly)\n#define NvSciSyncAccessPerm_Auto ((uint64_t)1U << 63U)",
    );
    // A record under a tag of another name, reached through a typedef.
    let h = edit(
        &h,
        "typedef struct { uint64_t payload[6]; } NvSciSyncFence;",
        "struct SomeOtherFenceTag { uint64_t payload[6]; };\ntypedef struct SomeOtherFenceTag NvSciSyncFence;",
    );
    // An enum reached through `typedef enum Tag Name`.
    let h = edit(
        &h,
        "typedef enum {\n    NvSciBufImage_BlockLinearType = 0,\n    NvSciBufImage_PitchLinearType = 1\n} NvSciBufAttrValImageLayoutType;",
        "enum LayoutTag { NvSciBufImage_BlockLinearType = 0, NvSciBufImage_PitchLinearType = 1 };\ntypedef enum LayoutTag NvSciBufAttrValImageLayoutType;",
    );
    // Pointer const-ness: API, not ABI (reported as a note).
    let h = edit(
        &h,
        "NvSciError NvSciSyncFenceDup(const NvSciSyncFence *srcSyncFence,",
        "NvSciError NvSciSyncFenceDup(NvSciSyncFence *srcSyncFence,",
    );
    let run = check(&header_set("spellings", &h));
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    assert!(run.differences().is_empty(), "{}", run.stdout);
    assert!(
        run.stdout
            .contains("nvsci note: prototype of NvSciSyncFenceDup: pointer const-ness differs"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_wrong_value_layout_or_prototype_fails_and_is_named() {
    let h = own_header();
    let h = edit(&h, "NvSciError_Busy = 0x202,", "NvSciError_Busy = 0x203,");
    // The buffer descriptor without its packing: alignment 8 instead of 1.
    let h = edit(
        &h,
        "typedef struct { uint64_t data[32]; } __attribute__((packed)) NvSciBufObjIpcExportDescriptor;",
        "typedef struct { uint64_t data[32]; } NvSciBufObjIpcExportDescriptor;",
    );
    // A key/value pair whose length is 32 bits wide (same size and offsets
    // thanks to padding, but a different field type).
    let h = edit(
        &h,
        "    NvSciSyncAttrKey attrKey;\n    const void *value;\n    size_t len;",
        "    NvSciSyncAttrKey attrKey;\n    const void *value;\n    uint32_t len;",
    );
    // A timeout parameter of the wrong width.
    let h = edit(
        &h,
        "NvSciSyncCpuWaitContext context,\n                              int64_t timeoutUs);",
        "NvSciSyncCpuWaitContext context,\n                              int32_t timeoutUs);",
    );
    let run = check(&header_set("wrong", &h));
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    let d = run.differences();
    let expected = [
        "constant NvSciError_Busy: ours 514 (0x202), real 515 (0x203)",
        "align of NvSciBufObjIpcExportDescriptor: ours 1 (0x1), real 8 (0x8)",
        "record NvSciBufObjIpcExportDescriptor: ours {[u64; 32]} packed, real {[u64; 32]}",
        "type of NvSciSyncAttrKeyValuePair.len: ours usize, real u32",
        "prototype of NvSciSyncFenceWait: ours fn(*{[u64; 6]}, *opaque, i64) -> u32, real fn(*{[u64; 6]}, *opaque, i32) -> u32",
    ];
    for line in expected {
        assert!(d.contains(&line), "missing {line:?} in:\n{}", run.stdout);
    }
    // Nothing else than what was changed (the descriptor's shape also shows
    // in the two prototypes that take it; the pair's in the record and the
    // prototypes that take pairs).
    for line in &d {
        assert!(
            line.contains("NvSciError_Busy")
                || line.contains("NvSciBufObjIpcExport")
                || line.contains("NvSciBufObjIpcImport")
                || line.contains("NvSciSyncAttrKeyValuePair")
                || line.contains("NvSciSyncAttrListSetAttrs")
                || line.contains("NvSciSyncAttrListGetAttrs")
                || line.contains("NvSciSyncFenceWait"),
            "unexpected difference {line:?}"
        );
    }
    assert!(
        run.stdout
            .contains(&format!("nvsci: {} ABI difference(s) (", d.len())),
        "{}",
        run.stdout
    );
    assert!(
        run.stderr.contains("ABI difference(s) between"),
        "{}",
        run.stderr
    );
}

/// Removes the NvSciSyncAttrKey_GpuId key and NvSciSyncFenceUpdateFence.
fn without_newer_sync_items(h: &str) -> String {
    let h = edit(h, "    NvSciSyncAttrKey_GpuId = 12,\n", "");
    edit(
        &h,
        "NvSciError NvSciSyncFenceUpdateFence(NvSciSyncObj syncObj, uint64_t id, uint64_t value,\n                                     NvSciSyncFence *syncFence);\n",
        "",
    )
}

#[test]
fn items_missing_from_an_older_release_are_listed_not_failed() {
    let h = without_newer_sync_items(&own_header());
    let h = edit(
        &h,
        "static const uint32_t NvSciSyncMinorVersion = 8U;",
        "static const uint32_t NvSciSyncMinorVersion = 3U;",
    );
    let run = check(&header_set("older", &h));
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let absent = run
        .stdout
        .lines()
        .find(|l| {
            l.starts_with("nvsci: absent in this release (NvSciSync 2.3, older than ours (2.8))")
        })
        .unwrap_or_else(|| panic!("no absence line in:\n{}", run.stdout));
    assert!(absent.contains("2 item(s)"), "{absent}");
    assert!(
        absent.contains("constant NvSciSyncAttrKey_GpuId"),
        "{absent}"
    );
    assert!(
        absent.contains("function NvSciSyncFenceUpdateFence"),
        "{absent}"
    );
    assert!(run.stdout.contains("nvsci: no ABI difference ("));
}

#[test]
fn items_missing_from_a_release_as_new_as_ours_are_differences() {
    let h = without_newer_sync_items(&own_header());
    let run = check(&header_set("missing", &h));
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    let d = run.differences();
    assert_eq!(d.len(), 2, "{}", run.stdout);
    assert!(d.iter().any(|l| l.starts_with(
        "constant NvSciSyncAttrKey_GpuId: declared by us, absent from the real headers"
    )));
    assert!(d.iter().any(|l| l.starts_with(
        "function NvSciSyncFenceUpdateFence: declared by us, absent from the real headers"
    )));
}
