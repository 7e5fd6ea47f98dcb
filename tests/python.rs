//! Runs the ctypes binding's tests (standard library only) against the built library.

mod common;

use std::process::Command;

use common::native::{repo, run_ok, staged_lib_dir};

#[test]
fn python_ctypes_binding_tests_pass() {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    if Command::new(&python).arg("--version").output().is_err() {
        eprintln!("{python} not found: skipped (.ci/run installs python3)");
        return;
    }
    let lib = staged_lib_dir().join(format!("libssmk.so.{}", env!("CARGO_PKG_VERSION_MAJOR")));
    for threads in ["1", "2"] {
        run_ok(
            Command::new(&python)
                .arg(repo().join("cbindings/python/test_ssmk.py"))
                .env("SSMK_LIBRARY", &lib)
                .env("SSMK_NUM_THREADS", threads)
                .env("PYTHONDONTWRITEBYTECODE", "1"),
            "python binding tests",
        );
    }
}
