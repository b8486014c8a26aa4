//! `cargo xtask cross`: build (and where possible run) the crates for every
//! target the project supports.
//!
//! The work is data, not code: each `targets/<triple>.toml` names the target,
//! the toolchain and extra cargo flags it needs, the programs it requires on
//! PATH, the environment (linker, runner) and an ordered list of steps, each a
//! `cargo build` or `cargo test` with its arguments. Adding a crate to a
//! target is one `[[steps]]` entry in that file.
//!
//! Every step prints its command before it runs and its time after; the first
//! failing step ends the command with a one-line error naming it (or, with
//! `--keep-going`, all failing steps are named at the end).

use crate::util::{self, Failure, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// What one step asks cargo to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `cargo build`.
    Build,
    /// `cargo test` (with `--no-run` only built).
    Test,
}

/// One cargo invocation for one target.
#[derive(Debug, Clone)]
pub struct Step {
    /// Short name shown in the log and in errors.
    pub name: String,
    /// Build or test.
    pub action: Action,
    /// Arguments after `cargo build|test --target <triple>`.
    pub args: Vec<String>,
}

/// Everything `targets/<triple>.toml` says.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// The target triple (must match the file name).
    pub triple: String,
    /// `None`: the toolchain that runs the xtask; `Some(t)`: `rustup run t cargo`.
    pub toolchain: Option<String>,
    /// Flags placed before the subcommand's own arguments (e.g. `-Z build-std=core`).
    pub cargo_flags: Vec<String>,
    /// Programs that must be on PATH (cross linker, emulator).
    pub requires: Vec<String>,
    /// Environment for every step (linker, runner).
    pub env: Vec<(String, String)>,
    /// The steps, in order.
    pub steps: Vec<Step>,
}

/// The options of `cargo xtask cross`.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Only this target triple (repeatable)
    #[arg(long, value_name = "TARGET")]
    only: Vec<String>,
    /// Build the test steps' tests without running them
    #[arg(long)]
    no_run: bool,
    /// Run every step, report all failures at the end
    #[arg(long)]
    keep_going: bool,
    /// Print the steps and their commands, run nothing
    #[arg(long)]
    list: bool,
}

/// Entry point of `cargo xtask cross`.
pub fn run(options: Options) -> Result<()> {
    let root = util::workspace_root();
    let dir = root.join("targets");
    let mut targets = load_all(&dir)?;
    if !options.only.is_empty() {
        for wanted in &options.only {
            if !targets.iter().any(|t| &t.triple == wanted) {
                let known: Vec<&str> = targets.iter().map(|t| t.triple.as_str()).collect();
                return Err(Failure::usage(format!(
                    "cross: --only {wanted}: no targets/{wanted}.toml (known: {})",
                    known.join(", ")
                )));
            }
        }
        targets.retain(|t| options.only.contains(&t.triple));
    }

    let plan: Vec<(&TargetConfig, &Step)> = targets
        .iter()
        .flat_map(|t| t.steps.iter().map(move |s| (t, s)))
        .collect();
    if options.list {
        for (target, step) in &plan {
            println!(
                "{}: {}\n    {}",
                target.triple,
                step.name,
                display_command(target, step, options.no_run)
            );
        }
        return Ok(());
    }

    // Check the tools of every selected target first: a missing emulator
    // should cost seconds, not a half-finished build.
    for target in &targets {
        for program in &target.requires {
            if find_on_path(program).is_none() {
                return Err(Failure::new(format!(
                    "cross: {} needs `{program}` on PATH (see targets/{}.toml; .ci/run installs it)",
                    target.triple, target.triple
                )));
            }
        }
    }

    let total = Instant::now();
    let mut done: Vec<(String, Duration, bool)> = Vec::new();
    let count = plan.len();
    for (index, (target, step)) in plan.iter().enumerate() {
        let label = format!("{}: {}", target.triple, step.name);
        println!(
            "==> cross [{}/{count}] {label}\n    {}",
            index + 1,
            display_command(target, step, options.no_run)
        );
        let started = Instant::now();
        let status = command(&root, target, step, options.no_run)
            .status()
            .map_err(|e| Failure::new(format!("cross: cannot start cargo for `{label}`: {e}")))?;
        let took = started.elapsed();
        let ok = status.success();
        println!(
            "<== cross [{}/{count}] {label}: {} in {:.1}s",
            index + 1,
            if ok { "ok" } else { "FAILED" },
            took.as_secs_f64()
        );
        done.push((label.clone(), took, ok));
        if !ok && !options.keep_going {
            summary(&done, total.elapsed());
            return Err(Failure::new(format!(
                "cross: step `{label}` failed ({status})"
            )));
        }
    }
    summary(&done, total.elapsed());
    let failed: Vec<&str> = done
        .iter()
        .filter(|(_, _, ok)| !ok)
        .map(|(label, _, _)| label.as_str())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(format!(
            "cross: {} step(s) failed: {}",
            failed.len(),
            failed.join("; ")
        )))
    }
}

fn summary(done: &[(String, Duration, bool)], total: Duration) {
    println!("cross summary:");
    for (label, took, ok) in done {
        println!(
            "  {:>7.1}s  {}  {label}",
            took.as_secs_f64(),
            if *ok { "ok    " } else { "FAILED" }
        );
    }
    println!("  {:>7.1}s  total", total.as_secs_f64());
}

fn subcommand(step: &Step, no_run: bool) -> Vec<String> {
    let mut args = Vec::new();
    match step.action {
        Action::Build => args.push("build".to_string()),
        Action::Test => {
            args.push("test".to_string());
            if no_run {
                args.push("--no-run".to_string());
            }
        }
    }
    args
}

fn cargo_args(target: &TargetConfig, step: &Step, no_run: bool) -> Vec<String> {
    let mut args = subcommand(step, no_run);
    args.push("--target".to_string());
    args.push(target.triple.clone());
    args.extend(target.cargo_flags.iter().cloned());
    args.extend(step.args.iter().cloned());
    args
}

fn display_command(target: &TargetConfig, step: &Step, no_run: bool) -> String {
    let mut words: Vec<String> = target
        .env
        .iter()
        .map(|(k, v)| {
            if v.contains(' ') {
                format!("{k}=\"{v}\"")
            } else {
                format!("{k}={v}")
            }
        })
        .collect();
    words.push("cargo".to_string());
    if let Some(tc) = &target.toolchain {
        words.push(format!("+{tc}"));
    }
    words.extend(cargo_args(target, step, no_run));
    words.join(" ")
}

fn command(root: &Path, target: &TargetConfig, step: &Step, no_run: bool) -> Command {
    let mut cmd = match &target.toolchain {
        // `rustup run` works whether or not `cargo` on PATH is the rustup proxy.
        Some(tc) => {
            let mut c = Command::new("rustup");
            c.args(["run", tc, "cargo"]);
            c
        }
        // The cargo that runs this xtask.
        None => Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())),
    };
    cmd.current_dir(root)
        .args(cargo_args(target, step, no_run))
        .envs(target.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    if target.toolchain.is_some() {
        // Let `rustup run` pick the toolchain, not the one this xtask runs on.
        cmd.env_remove("RUSTUP_TOOLCHAIN").env_remove("RUSTC");
    }
    cmd
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Loads every `*.toml` in `dir`, sorted by file name.
pub fn load_all(dir: &Path) -> Result<Vec<TargetConfig>> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Failure::new(format!("cross: cannot read {}: {e}", dir.display())))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(Failure::new(format!(
            "cross: no target files (*.toml) in {}",
            dir.display()
        )));
    }
    files.iter().map(|f| load(f)).collect()
}

/// Loads one target file.
pub fn load(path: &Path) -> Result<TargetConfig> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::new(format!("cross: cannot read {}: {e}", path.display())))?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    parse_config(&text, &stem).map_err(|e| Failure::new(format!("{}: {e}", path.display())))
}

/// Parses the text of a target file whose name (without `.toml`) is `stem`.
pub fn parse_config(text: &str, stem: &str) -> std::result::Result<TargetConfig, String> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        // toml's messages span several lines; keep the first.
        e.message()
            .lines()
            .next()
            .unwrap_or("invalid TOML")
            .to_string()
    })?;
    for key in table.keys() {
        if ![
            "triple",
            "toolchain",
            "cargo_flags",
            "requires",
            "env",
            "steps",
        ]
        .contains(&key.as_str())
        {
            return Err(format!("unknown key `{key}`"));
        }
    }
    let triple = string(&table, "triple")?.ok_or("missing `triple`")?;
    if triple != stem {
        return Err(format!(
            "`triple = \"{triple}\"` does not match the file name `{stem}.toml`"
        ));
    }
    let toolchain = string(&table, "toolchain")?;
    let cargo_flags = strings(&table, "cargo_flags")?;
    let requires = strings(&table, "requires")?;
    let env = match table.get("env") {
        None => Vec::new(),
        Some(toml::Value::Table(t)) => t
            .iter()
            .map(|(k, v)| match v {
                toml::Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(format!("env.{k} must be a string")),
            })
            .collect::<std::result::Result<_, _>>()?,
        Some(_) => return Err("`env` must be a table".to_string()),
    };
    let steps = match table.get("steps") {
        Some(toml::Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| step(item).map_err(|e| format!("steps[{i}]: {e}")))
            .collect::<std::result::Result<Vec<_>, _>>()?,
        Some(_) => return Err("`steps` must be an array of tables ([[steps]])".to_string()),
        None => return Err("no [[steps]]".to_string()),
    };
    if steps.is_empty() {
        return Err("no [[steps]]".to_string());
    }
    Ok(TargetConfig {
        triple,
        toolchain,
        cargo_flags,
        requires,
        env,
        steps,
    })
}

fn step(item: &toml::Value) -> std::result::Result<Step, String> {
    let table = item.as_table().ok_or("must be a table")?;
    for key in table.keys() {
        if !["name", "action", "args"].contains(&key.as_str()) {
            return Err(format!("unknown key `{key}`"));
        }
    }
    let name = string(table, "name")?.ok_or("missing `name`")?;
    let action = match string(table, "action")?.as_deref() {
        Some("build") => Action::Build,
        Some("test") => Action::Test,
        Some(other) => return Err(format!("action `{other}`: expected `build` or `test`")),
        None => return Err("missing `action`".to_string()),
    };
    let args = strings(table, "args")?;
    Ok(Step { name, action, args })
}

fn string(table: &toml::Table, key: &str) -> std::result::Result<Option<String>, String> {
    match table.get(key) {
        None => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("`{key}` must be a string")),
    }
}

fn strings(table: &toml::Table, key: &str) -> std::result::Result<Vec<String>, String> {
    match table.get(key) {
        None => Ok(Vec::new()),
        Some(toml::Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("`{key}` must be an array of strings"))
            })
            .collect(),
        Some(_) => Err(format!("`{key}` must be an array of strings")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        triple = "x-y-z"
        toolchain = "nightly"
        cargo_flags = ["-Z", "build-std=core"]
        requires = ["qemu-x"]
        [env]
        RUNNER = "qemu-x -L /usr/x"
        [[steps]]
        name = "core"
        action = "test"
        args = ["-p", "tegra-interop-core"]
        [[steps]]
        name = "sys"
        action = "build"
        args = ["-p", "tegra-interop-sys"]
    "#;

    #[test]
    fn parses_a_complete_file() {
        let t = parse_config(GOOD, "x-y-z").unwrap();
        assert_eq!(t.triple, "x-y-z");
        assert_eq!(t.toolchain.as_deref(), Some("nightly"));
        assert_eq!(t.requires, ["qemu-x"]);
        assert_eq!(
            t.env,
            [("RUNNER".to_string(), "qemu-x -L /usr/x".to_string())]
        );
        assert_eq!(t.steps.len(), 2);
        assert_eq!(t.steps[0].action, Action::Test);
        assert_eq!(
            cargo_args(&t, &t.steps[0], true),
            [
                "test",
                "--no-run",
                "--target",
                "x-y-z",
                "-Z",
                "build-std=core",
                "-p",
                "tegra-interop-core"
            ]
        );
        // --no-run leaves build steps alone.
        assert_eq!(cargo_args(&t, &t.steps[1], true)[0], "build");
        assert_eq!(
            display_command(&t, &t.steps[1], false),
            "RUNNER=\"qemu-x -L /usr/x\" cargo +nightly build --target x-y-z -Z build-std=core -p tegra-interop-sys"
        );
    }

    #[test]
    fn rejects_mistakes_with_a_reason() {
        let cases = [
            (GOOD.replace("x-y-z\"", "other\""), "does not match"),
            (
                GOOD.replace("action = \"test\"", "action = \"run\""),
                "action `run`",
            ),
            (
                GOOD.replace("toolchain", "tool_chain"),
                "unknown key `tool_chain`",
            ),
            (
                GOOD.replace("args = [\"-p\", \"tegra-interop-sys\"]", "args = \"-p\""),
                "array of strings",
            ),
            ("triple = \"x-y-z\"\n".to_string(), "no [[steps]]"),
            ("triple = ".to_string(), ""),
        ];
        for (text, expected) in cases {
            let err = parse_config(&text, "x-y-z").unwrap_err();
            assert!(
                err.contains(expected),
                "{err:?} should mention {expected:?}"
            );
            assert!(!err.contains('\n'), "{err:?} should be one line");
        }
    }

    #[test]
    fn repository_target_files_load() {
        let targets = load_all(&util::workspace_root().join("targets")).unwrap();
        let triples: Vec<&str> = targets.iter().map(|t| t.triple.as_str()).collect();
        for expected in [
            "aarch64-unknown-linux-gnu",
            "aarch64-unknown-none",
            "armv7r-none-eabihf",
            "thumbv7em-none-eabihf",
        ] {
            assert!(
                triples.contains(&expected),
                "targets/{expected}.toml missing"
            );
        }
    }
}
