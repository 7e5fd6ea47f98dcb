//! The shipped artifact as C and C++ users see it: the header compiles as strict C11 and C++17,
//! the C++ harness (raw C API + ssmk.hpp) passes against the real `libssmk.so` (also under
//! AddressSanitizer/UBSan and valgrind), a `dlopen`-only C program runs, the library exports
//! exactly the header's functions under its SONAME, every export goes through the panic guard,
//! and the install step produces a prefix that pkg-config users can build against.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::native::*;
use ssmk::runtime::Isa;

fn header_functions() -> BTreeSet<String> {
    let header = std::fs::read_to_string(repo().join("include/ssmk.h")).unwrap();
    let mut names = BTreeSet::new();
    for line in header.lines().filter(|l| !l.trim_start().starts_with('*')) {
        for (i, _) in line.match_indices("ssmk_") {
            let rest = &line[i..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if rest[end..].starts_with('(') {
                names.insert(rest[..end].to_owned());
            }
        }
    }
    names
}

/// `(name, body)` of every `extern "C" fn ssmk_*` in `src/ffi`.
fn source_exports() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(repo().join("src/ffi")).unwrap() {
        let path = entry.unwrap().path();
        let src = std::fs::read_to_string(&path).unwrap();
        for (i, _) in src.match_indices("extern \"C\" fn ssmk_") {
            let sig = &src[i + "extern \"C\" fn ".len()..];
            let name = sig[..sig.find('(').unwrap()].to_owned();
            let open = i + src[i..].find('{').unwrap();
            let mut depth = 0;
            let mut close = open;
            for (j, c) in src[open..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            close = open + j;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            out.push((name, src[open + 1..close].trim().to_owned()));
        }
    }
    out
}

#[test]
fn every_export_goes_through_the_guard_and_is_in_the_header() {
    let exports = source_exports();
    assert!(exports.len() >= 8, "found only {exports:?}");
    let header = header_functions();
    for (name, body) in &exports {
        assert!(
            body.starts_with("guard(") || body.starts_with("guard_value("),
            "{name} must consist of one guard(..)/guard_value(..) call, found: {body:.80}"
        );
        assert!(
            header.contains(name),
            "{name} is exported but missing from include/ssmk.h"
        );
    }
    let names: BTreeSet<String> = exports.iter().map(|e| e.0.clone()).collect();
    assert_eq!(names, header, "header declarations and Rust exports differ");
}

#[test]
fn shared_library_exports_only_the_header_functions_under_its_soname() {
    let lib = built_library();
    let out = run_ok(
        Command::new("nm").args(["-D", "--defined-only"]).arg(&lib),
        "nm",
    );
    let symbols: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let (_addr, kind, name) = (parts.next()?, parts.next()?, parts.next()?);
            (kind != "A").then(|| name.to_owned())
        })
        .collect();
    assert_eq!(
        symbols,
        header_functions(),
        "the .so must export exactly the header's functions"
    );
    let out = run_ok(Command::new("readelf").arg("-d").arg(&lib), "readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    let soname = format!("[libssmk.so.{}]", env!("CARGO_PKG_VERSION_MAJOR"));
    assert!(
        text.lines()
            .any(|l| l.contains("SONAME") && l.contains(&soname)),
        "{text}"
    );
}

#[test]
fn header_compiles_alone_as_strict_c11_and_cpp17() {
    let dir = scratch("header");
    let src = repo().join("cbindings/tests/header_c11.c");
    let versions = [
        format!("-DEXPECT_MAJOR={}", env!("CARGO_PKG_VERSION_MAJOR")),
        format!("-DEXPECT_MINOR={}", env!("CARGO_PKG_VERSION_MINOR")),
        format!("-DEXPECT_PATCH={}", env!("CARGO_PKG_VERSION_PATCH")),
    ];
    for (cpp, std) in [(false, "-std=c11"), (true, "-std=c++17")] {
        let mut cmd = compiler(cpp);
        cmd.args([std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-c"])
            .args(&versions)
            .arg(format!("-I{}", repo().join("include").display()));
        if cpp {
            cmd.args(["-x", "c++"]);
        }
        cmd.arg(&src)
            .arg("-o")
            .arg(dir.join(if cpp { "h.cpp.o" } else { "h.c.o" }));
        run_ok(&mut cmd, std);
    }
}

fn harness_sources() -> Vec<std::path::PathBuf> {
    vec![repo().join("cbindings/tests/harness.cpp")]
}

#[test]
fn cpp_harness_passes() {
    let exe = scratch("harness").join("harness");
    build_against_lib(true, &harness_sources(), &exe, &[]);
    for threads in ["1", "2"] {
        let out = run_ok(
            Command::new(&exe).env("SSMK_NUM_THREADS", threads),
            "C++ harness",
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains(" passed, 0 failed"));
    }
}

#[test]
fn cpp_harness_passes_under_each_isa_level() {
    let exe = scratch("harness-isa").join("harness");
    build_against_lib(true, &harness_sources(), &exe, &[]);
    for requested in [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon] {
        let out = run_ok(
            Command::new(&exe).env("SSMK_MAX_ISA", requested.name()),
            &format!("C++ harness, SSMK_MAX_ISA={}", requested.name()),
        );
        // The cap lowers the level, never raises it; another architecture's level means scalar.
        let expected = format!("active isa: {}", requested.for_this_cpu().name());
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&expected),
            "expected {expected}"
        );
    }
}

#[test]
fn cpp_harness_passes_under_sanitizers() {
    let exe = scratch("harness-asan").join("harness");
    build_against_lib(
        true,
        &harness_sources(),
        &exe,
        &[
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-g",
        ],
    );
    run_ok(
        Command::new(&exe).env("ASAN_OPTIONS", "detect_leaks=0"),
        "C++ harness under ASan/UBSan",
    );
}

#[test]
fn cpp_harness_is_clean_under_valgrind() {
    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!("valgrind not installed: skipped (.ci/run installs it)");
        return;
    }
    let exe = scratch("harness-valgrind").join("harness");
    build_against_lib(true, &harness_sources(), &exe, &["-g"]);
    run_ok(
        Command::new("valgrind")
            .args(["--error-exitcode=3", "--errors-for-leak-kinds=none", "-q"])
            .arg(&exe)
            .env("SSMK_NUM_THREADS", "2"),
        "C++ harness under valgrind",
    );
}

#[test]
fn dlopen_only_program_runs_a_kernel() {
    let dir = scratch("dlopen");
    let exe = dir.join("dlopen_demo");
    let mut cmd = compiler(false);
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
        .arg(repo().join("cbindings/examples/dlopen_demo.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-ldl");
    run_ok(&mut cmd, "compile dlopen_demo");
    let lib = staged_lib_dir().join(format!("libssmk.so.{}", env!("CARGO_PKG_VERSION_MAJOR")));
    let out = run_ok(Command::new(&exe).arg(lib), "dlopen_demo");
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
}

#[test]
fn install_into_prefix_and_build_with_pkg_config() {
    let dir = scratch("install");
    let prefix = dir.join("prefix");
    run_ok(
        Command::new("bash")
            .arg(repo().join("cbindings/install.sh"))
            .arg("--prefix")
            .arg(&prefix)
            .arg("--lib")
            .arg(built_library()),
        "install.sh",
    );
    let libdir = prefix.join("lib");
    for f in ["libssmk.so", "libssmk.so.0", "pkgconfig/ssmk.pc"] {
        assert!(libdir.join(f).exists(), "{f} not installed");
    }
    assert!(prefix.join("include/ssmk.h").exists() && prefix.join("include/ssmk.hpp").exists());
    let pc = |args: &[&str]| {
        let out = run_ok(
            Command::new("pkg-config")
                .args(args)
                .env("PKG_CONFIG_PATH", libdir.join("pkgconfig")),
            "pkg-config",
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(pc(&["--modversion", "ssmk"]), env!("CARGO_PKG_VERSION"));
    let flags = pc(&["--cflags", "--libs", "ssmk"]);
    let exe = dir.join("consumer");
    let mut cmd = compiler(false);
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
        .arg(repo().join("cbindings/examples/consumer.c"))
        .arg("-o")
        .arg(&exe)
        .args(flags.split_whitespace())
        .arg(format!("-Wl,-rpath,{}", libdir.display()));
    run_ok(&mut cmd, "compile consumer with pkg-config flags");
    run_ok(&mut Command::new(&exe), "consumer");
}
