//! Building and running native (C, C++, Python) programs against the real `libssmk.so`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The cdylib cargo built for this test run (it sits beside the test binary's deps).
pub fn built_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let lib = deps.join("libssmk.so");
    assert!(
        lib.exists(),
        "{} not found: cargo builds the cdylib with the tests",
        lib.display()
    );
    lib
}

/// A private directory per test process holding the library under its real file name, its SONAME
/// (`libssmk.so.0`) and the link name (`libssmk.so`), as an install would lay them out.
pub fn staged_lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let name = std::env::current_exe()
            .unwrap()
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        // Per process: nextest runs each test of a binary in its own process, concurrently.
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("stage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let real = format!("libssmk.so.{}", env!("CARGO_PKG_VERSION"));
        std::fs::copy(built_library(), dir.join(&real)).unwrap();
        std::os::unix::fs::symlink(
            &real,
            dir.join(format!("libssmk.so.{}", env!("CARGO_PKG_VERSION_MAJOR"))),
        )
        .unwrap();
        std::os::unix::fs::symlink(&real, dir.join("libssmk.so")).unwrap();
        dir
    })
}

/// A scratch directory for one test's outputs.
pub fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The C or C++ compiler the `cc` crate would use for this target.
pub fn compiler(cpp: bool) -> Command {
    let triple = env!("SSMK_TARGET_TRIPLE");
    cc::Build::new()
        .cpp(cpp)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .opt_level(1)
        .target(triple)
        .host(triple)
        .get_compiler()
        .to_command()
}

/// Runs a command, failing the test with its output if it does not succeed.
pub fn run_ok(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    let text = format!(
        "{what}: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        cmd,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    println!("{text}");
    out
}

/// Compiles `sources` into `exe` linked against the staged library with an rpath.
pub fn build_against_lib(cpp: bool, sources: &[PathBuf], exe: &Path, extra: &[&str]) {
    let lib = staged_lib_dir();
    let mut cmd = compiler(cpp);
    cmd.args(["-Wall", "-Wextra", "-Werror"])
        .arg(if cpp { "-std=c++17" } else { "-std=c11" })
        .arg(format!("-I{}", repo().join("include").display()))
        .arg(format!("-I{}", repo().join("cbindings/tests").display()))
        .args(sources)
        .arg("-o")
        .arg(exe)
        .arg(format!("-L{}", lib.display()))
        .arg("-lssmk")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(extra);
    run_ok(&mut cmd, "compile");
}
