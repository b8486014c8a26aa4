//! The glibc floor of a Linux ELF executable: the highest `GLIBC_x.y` symbol
//! version it asks the dynamic loader for, read from the file itself.
//!
//! A binary linked against a newer glibc than the target system has refuses
//! to start there ("version `GLIBC_2.34' not found"). The loader decides this
//! from the version-needs section (`SHT_GNU_VERNEED`): every version named
//! there must be provided by the library named beside it. So the floor is the
//! highest `GLIBC_*` version in that section; the symbols that carry it
//! (through `SHT_GNU_VERSYM`) are listed so that a failure says what to fix.
//!
//! Read with the `object` crate, so the check works for any architecture on
//! any host (no aarch64 binutils needed).

use object::elf;
use object::read::elf::{FileHeader, Sym};
use object::{Endianness, FileKind, SymbolIndex};
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// A glibc version such as `2.31` or `2.2.5` (compared numerically).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(Vec<u32>);

impl Version {
    /// Parses `2.31` (as written in a target file or on the command line).
    pub fn parse(text: &str) -> Option<Version> {
        let parts: Option<Vec<u32>> = text.split('.').map(|p| p.parse().ok()).collect();
        match parts {
            Some(p) if p.len() >= 2 => Some(Version(p)),
            _ => None,
        }
    }

    /// Parses a version-needs name: `GLIBC_2.34` gives `2.34`; anything else
    /// (`GLIBC_PRIVATE`, `GCC_3.0`, ...) gives `None`.
    fn from_need(name: &str) -> Option<Version> {
        name.strip_prefix("GLIBC_").and_then(Version::parse)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u32::to_string).collect();
        f.write_str(&parts.join("."))
    }
}

/// What one executable needs from glibc.
#[derive(Debug, Clone, Default)]
pub struct Needs {
    /// Every `GLIBC_*` version the file needs, with the undefined symbols
    /// bound to it (a version may have none: the loader still checks it).
    pub versions: BTreeMap<Version, Vec<String>>,
}

impl Needs {
    /// The highest glibc version needed (the file's floor); `None` when it
    /// needs no glibc version at all (static, or not linked against glibc).
    pub fn highest(&self) -> Option<&Version> {
        self.versions.keys().next_back()
    }

    /// The versions above `floor`, each with its symbols, highest first.
    pub fn above(&self, floor: &Version) -> Vec<(&Version, &[String])> {
        self.versions
            .iter()
            .rev()
            .filter(|(v, _)| *v > floor)
            .map(|(v, s)| (v, s.as_slice()))
            .collect()
    }
}

/// Reads the glibc needs of an ELF file's bytes.
pub fn needs(data: &[u8]) -> Result<Needs, String> {
    match FileKind::parse(data) {
        Ok(FileKind::Elf64) => needs_of::<elf::FileHeader64<Endianness>>(data),
        Ok(FileKind::Elf32) => needs_of::<elf::FileHeader32<Endianness>>(data),
        Ok(other) => Err(format!("not an ELF file ({other:?})")),
        Err(e) => Err(format!("not an ELF file ({e})")),
    }
}

fn needs_of<H: FileHeader<Endian = Endianness>>(data: &[u8]) -> Result<Needs, String> {
    let bad = |what: &str, e: object::Error| format!("malformed ELF: {what}: {e}");
    let header = H::parse(data).map_err(|e| bad("header", e))?;
    let endian = header.endian().map_err(|e| bad("header", e))?;
    let sections = header
        .sections(endian, data)
        .map_err(|e| bad("section table", e))?;

    let mut out = Needs::default();
    // The loader's view: every version in the version-needs section.
    if let Some((mut needs, link)) = sections
        .gnu_verneed(endian, data)
        .map_err(|e| bad("version needs", e))?
    {
        let strings = sections
            .strings(endian, data, link)
            .map_err(|e| bad("version needs strings", e))?;
        while let Some((_need, mut auxes)) = needs.next().map_err(|e| bad("version needs", e))? {
            while let Some(aux) = auxes.next().map_err(|e| bad("version needs", e))? {
                let name = aux
                    .name(endian, strings)
                    .map_err(|e| bad("version name", e))?;
                if let Some(v) = Version::from_need(&String::from_utf8_lossy(name)) {
                    out.versions.entry(v).or_default();
                }
            }
        }
    }
    // Which undefined dynamic symbols carry each version.
    if let Some(table) = sections
        .versions(endian, data)
        .map_err(|e| bad("symbol versions", e))?
    {
        let symbols = sections
            .symbols(endian, data, elf::SHT_DYNSYM)
            .map_err(|e| bad("dynamic symbols", e))?;
        for (index, symbol) in symbols.symbols().iter().enumerate() {
            if !symbol.is_undefined(endian) {
                continue;
            }
            let version = table
                .version(table.version_index(endian, SymbolIndex(index)).index())
                .map_err(|e| bad("symbol version", e))?;
            let Some(v) =
                version.and_then(|v| Version::from_need(&String::from_utf8_lossy(v.name())))
            else {
                continue;
            };
            let name = symbol
                .name(endian, symbols.strings())
                .map_err(|e| bad("symbol name", e))?;
            let list = out.versions.entry(v).or_default();
            list.push(String::from_utf8_lossy(name).into_owned());
            list.sort();
            list.dedup();
        }
    }
    Ok(out)
}

/// Reads the glibc needs of the file at `path`.
pub fn needs_of_file(path: &Path) -> Result<Needs, String> {
    let data = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    needs(&data).map_err(|e| format!("{}: {e}", path.display()))
}

/// Checks one file against `floor`: `Ok(line)` says what it needs, `Err(line)`
/// names the versions above the floor and (up to eight of) their symbols.
pub fn check(path: &Path, floor: &Version) -> Result<String, String> {
    let needs = needs_of_file(path)?;
    let name = path.display();
    let Some(highest) = needs.highest() else {
        return Ok(format!(
            "glibc floor: {name}: needs no GLIBC version (at most {floor}: ok)"
        ));
    };
    let above = needs.above(floor);
    if above.is_empty() {
        return Ok(format!(
            "glibc floor: {name}: needs GLIBC_{highest} (at most {floor}: ok)"
        ));
    }
    let detail: Vec<String> = above
        .iter()
        .map(|(v, symbols)| {
            let mut shown: Vec<&str> = symbols.iter().take(8).map(String::as_str).collect();
            if symbols.len() > shown.len() {
                shown.push("...");
            }
            if shown.is_empty() {
                format!("GLIBC_{v}")
            } else {
                format!("GLIBC_{v} ({})", shown.join(", "))
            }
        })
        .collect();
    Err(format!(
        "glibc floor: {name}: needs GLIBC_{highest}, above the floor {floor}: {}",
        detail.join("; ")
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/glibc")
            .join(name)
    }

    fn v(text: &str) -> Version {
        Version::parse(text).unwrap()
    }

    #[test]
    fn versions_compare_numerically() {
        assert!(v("2.34") > v("2.31"));
        assert!(v("2.31") > v("2.4"));
        assert!(v("2.2.5") < v("2.3"));
        assert_eq!(v("2.31").to_string(), "2.31");
        assert_eq!(Version::from_need("GLIBC_2.2.5"), Some(v("2.2.5")));
        for bad in ["", "2", "2.x", "GLIBC_2.34", "2..3"] {
            assert_eq!(Version::parse(bad), None, "{bad:?}");
        }
        assert_eq!(Version::from_need("GLIBC_PRIVATE"), None);
        assert_eq!(Version::from_need("GCC_3.0"), None);
    }

    /// The old way (Debian 12's aarch64-linux-gnu-gcc): pthread_create and
    /// dlsym carry GLIBC_2.34, so the check against 2.31 fails and says why.
    #[test]
    fn gcc_cross_build_needs_2_34_and_fails_the_2_31_floor() {
        let path = fixture("gcc-cross-2.34.elf");
        let needs = needs_of_file(&path).unwrap();
        assert_eq!(needs.highest(), Some(&v("2.34")));
        let at_2_34 = &needs.versions[&v("2.34")];
        for symbol in [
            "pthread_create",
            "pthread_join",
            "dlsym",
            "__libc_start_main",
        ] {
            assert!(
                at_2_34.iter().any(|s| s == symbol),
                "{symbol} in {at_2_34:?}"
            );
        }
        assert!(needs.versions.contains_key(&v("2.17")));
        let err = check(&path, &v("2.31")).unwrap_err();
        assert!(
            err.contains("needs GLIBC_2.34, above the floor 2.31"),
            "{err}"
        );
        assert!(err.contains("pthread_create"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        // The same file passes a floor it meets.
        let ok = check(&path, &v("2.35")).unwrap();
        assert!(ok.contains("needs GLIBC_2.34 (at most 2.35: ok)"), "{ok}");
    }

    /// Built by zig against glibc 2.31: nothing above 2.31.
    #[test]
    fn zig_build_meets_the_2_31_floor() {
        let path = fixture("zig-2.31.elf");
        let needs = needs_of_file(&path).unwrap();
        let highest = needs.highest().unwrap();
        assert!(*highest <= v("2.31"), "{highest}");
        assert!(needs.above(&v("2.31")).is_empty());
        assert!(check(&path, &v("2.31")).is_ok());
        // ... and a floor below what it needs still fails.
        assert!(check(&path, &v("2.16")).is_err());
    }

    #[test]
    fn non_elf_input_is_a_clear_error() {
        let err = needs(b"#!/bin/sh\necho hi\n").unwrap_err();
        assert!(err.contains("not an ELF file"), "{err}");
        let err = needs(&[0x7f, b'E', b'L', b'F', 2, 1, 1]).unwrap_err();
        assert!(err.contains("ELF"), "{err}");
        let err = check(&fixture("probe.c"), &v("2.31")).unwrap_err();
        assert!(err.contains("probe.c"), "{err}");
        let err = check(&fixture("missing.elf"), &v("2.31")).unwrap_err();
        assert!(err.contains("cannot read"), "{err}");
    }
}
