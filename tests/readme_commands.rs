//! The README's commands work as written: every fenced block whose info string is `sh tested` runs
//! in a scratch mirror of the repository. A stand-in `cargo` on the `PATH` serves the artifacts this
//! test run already built (no nested cargo on a shared target directory, no recursion into `cargo
//! test`) and refuses every other cargo command, so a block may only build the library or run the
//! benchmark through cargo.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::native::{built_library, repo, run_ok, scratch};

/// The info string that marks a README block as cheap and safe to run here.
const TESTED: &str = "```sh tested";

/// Stands in for `cargo`: `build --release [--lib]` puts the built library where a release build
/// would, `run --release --bin ssmk-bench [-- ARGS]` runs the built benchmark; anything else fails.
const CARGO_STAND_IN: &str = r#"#!/usr/bin/env bash
set -euo pipefail
case "$*" in
  "build --release" | "build --release --lib")
    mkdir -p "${CARGO_TARGET_DIR:-target}/release"
    cp "$SSMK_BUILT_LIBRARY" "${CARGO_TARGET_DIR:-target}/release/libssmk.so" ;;
  "run --release --bin ssmk-bench" | "run --release --bin ssmk-bench -- "*)
    shift 4
    [ $# -gt 0 ] && shift
    exec "$SSMK_BUILT_BENCH" "$@" ;;
  *)
    echo "cargo stand-in of tests/readme_commands.rs: 'cargo $*' is not served" >&2
    exit 97 ;;
esac
"#;

/// The bodies of the README's blocks marked [`TESTED`].
fn tested_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match current.as_mut() {
            None if line.trim_end() == TESTED => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_end() == "```" => blocks.extend(current.take()),
            Some(body) => {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    assert!(current.is_none(), "a `{TESTED}` block is not closed");
    blocks
}

/// A directory that looks like the repository (its entries linked, `target/` and `.git` left out)
/// with a `bin/` holding the cargo stand-in.
fn mirror(dir: &Path) -> (PathBuf, PathBuf) {
    let root = dir.join("repo");
    std::fs::create_dir_all(&root).unwrap();
    for entry in std::fs::read_dir(repo()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name != "target" && name != ".git" {
            std::os::unix::fs::symlink(entry.path(), root.join(&name)).unwrap();
        }
    }
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let cargo = bin.join("cargo");
    std::fs::write(&cargo, CARGO_STAND_IN).unwrap();
    run_ok(Command::new("chmod").arg("+x").arg(&cargo), "chmod");
    (root, bin)
}

/// `bash` running `script` in the mirror, with the stand-in first on the `PATH`.
fn shell(root: &Path, bin: &Path, script: &str) -> Command {
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", script])
        .current_dir(root)
        .env("PATH", path)
        .env("SSMK_BUILT_LIBRARY", built_library())
        .env("SSMK_BUILT_BENCH", env!("CARGO_BIN_EXE_ssmk-bench"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("SSMK_LIBRARY");
    cmd
}

#[test]
fn readme_tested_blocks_run_as_written() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let blocks = tested_blocks(&readme);
    // The C, dlopen, Python and benchmark ways in are marked; losing a mark loses its check.
    assert!(
        blocks.len() >= 4,
        "expected at least 4 `{TESTED}` blocks in README.md, found {}",
        blocks.len()
    );
    let (root, bin) = mirror(&scratch("readme-commands"));
    for block in &blocks {
        run_ok(
            &mut shell(&root, &bin, block),
            &format!("README block:\n{block}"),
        );
    }
}

#[test]
fn cargo_stand_in_refuses_what_it_does_not_serve() {
    let (root, bin) = mirror(&scratch("readme-stand-in"));
    for refused in ["cargo test", "cargo build", "cargo run --bin ssmk-bench"] {
        let status = shell(&root, &bin, refused).status().unwrap();
        assert_eq!(status.code(), Some(97), "{refused}");
    }
}

#[test]
fn only_closed_marked_blocks_are_extracted() {
    let text = "```sh\nskipped\n```\n```sh tested\na\nb\n```\n```python\nc\n```\n";
    assert_eq!(tested_blocks(text), vec!["a\nb\n".to_owned()]);
}
