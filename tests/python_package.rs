//! The Python package end to end, as a user gets it: builds the wheel from `cbindings/python`
//! with its build backend (setuptools-rust runs cargo), installs it into a fresh venv without
//! torch and imports it there with no `SSMK_LIBRARY`, then installs it into a venv with torch and
//! runs the torch-op tests (`cbindings/python/tests_torch`), the `rwkv` package hook
//! (`cbindings/python/tests_rwkv`) and the transformers hook end to end
//! (`cbindings/python/tests_e2e`) on each pinned transformers release.
//!
//! - The torch venv (`target/py-ssmk`, or `$SSMK_PY_VENV`) is created on first use with the
//!   pins of `cbindings/python/tests_e2e/requirements.txt` and reused while they are installed;
//!   each further release of `requirements-transformers-*.txt` is installed without its
//!   dependencies into a directory of its own inside the venv (`transformers-<version>`, put first
//!   on `PYTHONPATH` for its run: one torch for all of them), and the reference implementations of
//!   `tests_torch/requirements-reference.txt` into `tests-torch-references`; the fresh venv
//!   (`target/py-fresh`) is recreated every run. Each step prints what it runs and how long it took.
//! - The wheel's cargo build uses its own target directory (`target/py-cargo`, or
//!   `$SSMK_PY_CARGO_TARGET_DIR`): a nested cargo must not touch the directory of the `cargo test`
//!   that runs it. From scratch this is a release build of the crate and its dependencies.
//! - `PYTHON` picks the interpreter that makes the venvs (default `python3`); without one the
//!   test is skipped, as `tests/python.rs` is. Building and installing need PyPI (the build
//!   backend and torch come from there); `SSMK_SKIP_PYTHON_PACKAGE=1` skips the test offline.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::native::{repo, run_ok};

/// The pins of the torch venv (torch, the oldest tested transformers and their dependencies), one
/// requirement a line.
const TORCH_VENV_REQUIREMENTS: &str = "cbindings/python/tests_e2e/requirements.txt";
/// Further transformers releases the end-to-end tests run on, each a file pinning one
/// `transformers==X` that installs over the torch venv's dependencies.
const TRANSFORMERS_REQUIREMENTS_PREFIX: &str = "requirements-transformers-";
/// Run once each in the torch venv: the torch ops, and the `rwkv` package (RWKV-7) routed by
/// `ssmk.rwkv` on a tiny random-weight model.
const TORCH_TEST_DIRS: [&str; 2] = [
    "cbindings/python/tests_torch",
    "cbindings/python/tests_rwkv",
];
/// Pins of the reference implementations `tests_torch` cross-checks against, installed into a
/// directory of their own (on `PYTHONPATH` for that run only).
const TORCH_TEST_REFERENCES: &str = "cbindings/python/tests_torch/requirements-reference.txt";
/// The transformers hook end to end on tiny random-weight models (no downloads), run once per
/// transformers release.
const E2E_TEST_DIR: &str = "cbindings/python/tests_e2e";

/// The requirements of a pin file (comments and blank lines dropped).
fn requirements(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| l.split('#').next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// `(version, requirement)` of each extra transformers release, from the pin files next to
/// `requirements.txt`, sorted by file name.
fn extra_transformers() -> Vec<(String, String)> {
    let dir = repo().join(E2E_TEST_DIR);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with(TRANSFORMERS_REQUIREMENTS_PREFIX) && n.ends_with(".txt")
            })
        })
        .collect();
    files.sort();
    files
        .iter()
        .map(|file| {
            let pins = requirements(file);
            assert!(
                pins.len() == 1 && pins[0].starts_with("transformers=="),
                "{}: one `transformers==X` pin expected, found {pins:?}",
                file.display()
            );
            (
                pins[0]["transformers==".len()..].to_string(),
                pins[0].clone(),
            )
        })
        .collect()
}

fn target_dir() -> PathBuf {
    // CARGO_TARGET_TMPDIR is <target>/tmp, whatever CARGO_TARGET_DIR says.
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn venv_python(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

/// A command with the environment of a user's shell: no library override, no PYTHONPATH, no
/// venv of the caller and none of the make/cargo jobserver variables of the running cargo.
fn clean(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for var in [
        "SSMK_LIBRARY",
        "PYTHONPATH",
        "PYTHONHOME",
        "VIRTUAL_ENV",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .env("PIP_PROGRESS_BAR", "off");
    cmd
}

fn step<T>(what: &str, f: impl FnOnce() -> T) -> T {
    println!("== python package: {what}");
    let start = Instant::now();
    let out = f();
    println!(
        "== python package: {what}: {:.1} s",
        start.elapsed().as_secs_f64()
    );
    out
}

fn run(mut cmd: Command, what: &str) -> String {
    println!("$ {cmd:?}");
    let out = run_ok(&mut cmd, what);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn python_cmd(python: &Path, args: &[&str]) -> Command {
    let mut cmd = clean(python);
    cmd.args(args);
    cmd
}

/// The torch venv, created or completed when its requirements are not all there.
fn torch_venv(python: &str) -> PathBuf {
    let venv = std::env::var_os("SSMK_PY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("py-ssmk"));
    let py = venv_python(&venv);
    let marker = venv.join("ssmk-requirements.txt");
    let pins = requirements(&repo().join(TORCH_VENV_REQUIREMENTS));
    let wanted = pins.join("\n");
    let usable = python_cmd(&py, &["-c", "import torch, numpy, transformers"])
        .output()
        .is_ok_and(|o| o.status.success());
    if usable && std::fs::read_to_string(&marker).is_ok_and(|m| m == wanted) {
        println!(
            "== python package: reusing {} ({})",
            venv.display(),
            pins.join(" ")
        );
        return venv;
    }
    step(
        &format!(
            "install {} into {}",
            wanted.replace('\n', " "),
            venv.display()
        ),
        || {
            if !py.exists() || !usable {
                let mut cmd = clean(python);
                cmd.args(["-m", "venv", "--clear"]).arg(&venv);
                run(cmd, "create the torch venv");
            }
            let mut cmd = python_cmd(&py, &["-m", "pip", "install", "-q"]);
            cmd.args(&pins);
            run(cmd, "pip install the torch venv's requirements");
        },
    );
    std::fs::write(&marker, wanted).unwrap();
    venv
}

/// The directory `venv/name` holding `requirements` (a transformers release, or the references of
/// `tests_torch`) for the torch venv's python, installed without dependencies on first use and
/// reused while its marker says so.
fn packages_dir(venv: &Path, name: &str, requirements: &[String]) -> PathBuf {
    let dir = venv.join(name);
    let marker = dir.join("ssmk-requirement.txt");
    let wanted = requirements.join(" ");
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == wanted) {
        println!("== python package: reusing {}", dir.display());
        return dir;
    }
    step(&format!("install {wanted} into {}", dir.display()), || {
        let _ = std::fs::remove_dir_all(&dir);
        let mut cmd = python_cmd(
            &venv_python(venv),
            &["-m", "pip", "install", "-q", "--no-deps", "--target"],
        );
        cmd.arg(&dir).args(requirements);
        run(cmd, "pip install into a directory of its own");
    });
    std::fs::write(&marker, wanted).unwrap();
    dir
}

/// Runs `python -m unittest discover` on a test directory in the torch venv; `path` goes first on
/// `PYTHONPATH` (another transformers release, or the references of `tests_torch`).
fn run_tests(torch_py: &Path, dir: &str, path: Option<&Path>, scratch: &Path) {
    let mut cmd = python_cmd(torch_py, &["-m", "unittest", "discover", "-v", "-s"]);
    // The tests build their models from configs: nothing may be fetched.
    cmd.arg(repo().join(dir))
        .current_dir(scratch)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1");
    if let Some(path) = path {
        cmd.env("PYTHONPATH", path);
    }
    run(cmd, dir);
}

fn check_versions_agree() {
    let version = env!("CARGO_PKG_VERSION");
    let pyproject =
        std::fs::read_to_string(repo().join("cbindings/python/pyproject.toml")).unwrap();
    assert!(
        pyproject
            .lines()
            .any(|l| l.trim() == format!("version = \"{version}\"")),
        "cbindings/python/pyproject.toml: [project] version must be Cargo's {version}"
    );
    let init = std::fs::read_to_string(repo().join("cbindings/python/ssmk/__init__.py")).unwrap();
    assert!(
        init.contains(&format!("__version__ = \"{version}\"")),
        "cbindings/python/ssmk/__init__.py: __version__ must be Cargo's {version}"
    );
}

/// In the venv without torch: the package imports, finds its own library and leaves torch alone.
const FRESH_CHECK: &str = r#"
import importlib.util, os, sys
import ssmk
assert "torch" not in sys.modules, "import ssmk imported torch"
here = os.path.dirname(os.path.abspath(ssmk.__file__))
assert os.path.dirname(os.path.abspath(ssmk.library_path)) == here, ssmk.library_path
assert ssmk.__version__ == ssmk.version(), (ssmk.__version__, ssmk.version())
assert importlib.util.find_spec("ssmk.torch") is not None, "ssmk/torch.py missing from the wheel"
try:
    import ssmk.torch
except ModuleNotFoundError as e:
    assert e.name == "torch", e
else:
    raise AssertionError("ssmk.torch imported without torch installed")
print("installed at", here, "library", os.path.basename(ssmk.library_path))
"#;

#[test]
fn python_package_wheel_installs_and_torch_ops_pass() {
    if std::env::var_os("SSMK_SKIP_PYTHON_PACKAGE").is_some_and(|v| v == "1") {
        eprintln!("SSMK_SKIP_PYTHON_PACKAGE=1: skipped");
        return;
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    if Command::new(&python).arg("--version").output().is_err() {
        eprintln!("{python} not found: skipped (.ci/run installs python3)");
        return;
    }
    check_versions_agree();
    let total = Instant::now();
    let target = target_dir();
    let scratch = common::native::scratch("python-package");

    // 1. The venv with torch (the "install whatever the tests need" of CI), reused when present.
    let torch_venv = torch_venv(&python);

    // 2. A fresh venv without torch; the wheel is built with its pip and installed into it.
    let fresh = target.join("py-fresh");
    let fresh_py = venv_python(&fresh);
    step("create a fresh venv", || {
        let mut cmd = clean(&python);
        cmd.args(["-m", "venv", "--clear"]).arg(&fresh);
        run(cmd, "create the fresh venv");
    });
    let wheels = scratch.join("wheels");
    let py_cargo = std::env::var_os("SSMK_PY_CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| target.join("py-cargo"));
    let wheel = step("build the wheel (pip wheel ./cbindings/python)", || {
        let mut cmd = python_cmd(&fresh_py, &["-m", "pip", "wheel", "--no-deps", "-w"]);
        cmd.arg(&wheels)
            .arg(repo().join("cbindings/python"))
            .env("CARGO_TARGET_DIR", &py_cargo)
            .current_dir(&scratch);
        run(cmd, "pip wheel");
        let mut found: Vec<PathBuf> = std::fs::read_dir(&wheels)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "whl"))
            .collect();
        assert_eq!(found.len(), 1, "one wheel expected: {found:?}");
        found.pop().unwrap()
    });
    println!("== python package: wheel {}", wheel.display());
    step(
        "no SIMD intrinsic left out of line in the wheel's library",
        || {
            // The wheel's `cargo rustc --crate-type cdylib` partitions the code differently from
            // `cargo build`: in one such build a closure in the RWKV-7 recurrence was not inlined,
            // so each vector load there was a call to `_mm512_loadu_ps` (the op 4x slower).
            let lib = py_cargo.join("release/libssmk.so");
            let out = Command::new("nm")
                .arg("-C")
                .arg(&lib)
                .output()
                .expect("nm (binutils) lists the library's symbols");
            assert!(out.status.success(), "nm {}", lib.display());
            let text = String::from_utf8_lossy(&out.stdout);
            let outlined: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("core::core_arch::") && !l.contains("::xsave::"))
                .collect();
            assert!(
                outlined.is_empty(),
                "SIMD intrinsics compiled as functions of their own: {outlined:#?}"
            );
        },
    );
    step(
        "install the wheel into the fresh venv and import it",
        || {
            let mut cmd = python_cmd(
                &fresh_py,
                &["-m", "pip", "install", "--no-index", "--no-deps"],
            );
            cmd.arg(&wheel);
            run(cmd, "pip install the wheel (fresh venv)");
            let mut cmd = python_cmd(
                &fresh_py,
                &[
                    "-c",
                    "import ssmk; print(ssmk.version(), ssmk.active_isa())",
                ],
            );
            cmd.current_dir(&scratch);
            let printed = run(cmd, "import ssmk in the fresh venv");
            assert!(
                printed.starts_with(env!("CARGO_PKG_VERSION")),
                "printed {printed:?}"
            );
            let mut cmd = python_cmd(&fresh_py, &["-c", FRESH_CHECK]);
            cmd.current_dir(&scratch);
            run(cmd, "the installed package without torch");
        },
    );

    // 3. The same wheel in the torch venv, then the torch-op tests against the installed package.
    let torch_py = venv_python(&torch_venv);
    step("install the wheel into the torch venv", || {
        let mut cmd = python_cmd(
            &torch_py,
            &[
                "-m",
                "pip",
                "install",
                "--no-index",
                "--no-deps",
                "--force-reinstall",
            ],
        );
        cmd.arg(&wheel);
        run(cmd, "pip install the wheel (torch venv)");
    });
    // The test directories, each in a process of its own, as many at a time as there are cores
    // (each is mostly single-threaded Python on tiny models): the torch ops, RWKV-7, then the
    // end-to-end tests on the venv's transformers and on each further release.
    let mut runs: Vec<Box<dyn FnOnce() + Send + '_>> = Vec::new();
    for dir in TORCH_TEST_DIRS {
        let (torch_venv, torch_py, scratch) = (&torch_venv, &torch_py, &scratch);
        runs.push(Box::new(move || {
            let references = (dir == "cbindings/python/tests_torch").then(|| {
                let pins = requirements(&repo().join(TORCH_TEST_REFERENCES));
                packages_dir(torch_venv, "tests-torch-references", &pins)
            });
            step(&format!("run {dir}"), || {
                run_tests(torch_py, dir, references.as_deref(), scratch)
            })
        }));
    }
    runs.push(Box::new(|| {
        step(
            &format!("run {E2E_TEST_DIR} (the torch venv's transformers)"),
            || run_tests(&torch_py, E2E_TEST_DIR, None, &scratch),
        )
    }));
    for (version, requirement) in extra_transformers() {
        let (torch_venv, torch_py, scratch) = (&torch_venv, &torch_py, &scratch);
        runs.push(Box::new(move || {
            let dir = packages_dir(
                torch_venv,
                &format!("transformers-{version}"),
                std::slice::from_ref(&requirement),
            );
            let mut cmd = python_cmd(
                torch_py,
                &["-c", "import transformers; print(transformers.__version__)"],
            );
            cmd.env("PYTHONPATH", &dir).current_dir(scratch);
            let found = run(cmd, "the transformers release in use");
            assert_eq!(
                found.trim(),
                version,
                "{} does not shadow the venv's transformers",
                dir.display()
            );
            step(
                &format!("run {E2E_TEST_DIR} (transformers {version})"),
                || run_tests(torch_py, E2E_TEST_DIR, Some(&dir), scratch),
            );
        }));
    }
    // Popped from the back: the longest runs (the end-to-end ones) first.
    let queue = std::sync::Mutex::new(runs);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let next = queue.lock().unwrap().pop();
                    let Some(run) = next else { break };
                    run();
                }
            });
        }
    });
    println!(
        "== python package: done in {:.1} s",
        total.elapsed().as_secs_f64()
    );
}
