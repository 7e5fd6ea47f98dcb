//! Renders `include/ssmk.h` with cbindgen and compares it with the committed copy, so the header
//! can never drift from the exported Rust surface. `SSMK_UPDATE_HEADER=1` rewrites the committed
//! copy; otherwise drift is a build error (a warning only when `SSMK_ALLOW_HEADER_DRIFT=1`).
//! It also gives the cdylib its SONAME and a version script that exports only `ssmk_*`.

use std::{env, fs, path::PathBuf};

fn version_macros() -> String {
    // The C/C++ harness tests compile with the `cc` crate, which needs the target triple.
    println!(
        "cargo::rustc-env=SSMK_TARGET_TRIPLE={}",
        env::var("TARGET").unwrap()
    );
    let major = env::var("CARGO_PKG_VERSION_MAJOR").unwrap();
    let minor = env::var("CARGO_PKG_VERSION_MINOR").unwrap();
    let patch = env::var("CARGO_PKG_VERSION_PATCH").unwrap();
    format!(
        r#"
/** Version of this header; compare with ssmk_version() at run time. */
#define SSMK_VERSION_MAJOR {major}
#define SSMK_VERSION_MINOR {minor}
#define SSMK_VERSION_PATCH {patch}
/** (MAJOR << 16) | (MINOR << 8) | PATCH, for preprocessor comparisons. */
#define SSMK_VERSION_NUMBER ((SSMK_VERSION_MAJOR << 16) | (SSMK_VERSION_MINOR << 8) | SSMK_VERSION_PATCH)

#if defined(__cplusplus) && __cplusplus >= 201703L
#define SSMK_NODISCARD [[nodiscard]]
#elif defined(__GNUC__) || defined(__clang__)
#define SSMK_NODISCARD __attribute__((warn_unused_result))
#else
#define SSMK_NODISCARD
#endif
"#
    )
}

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo::rerun-if-changed=src");
    println!("cargo::rerun-if-changed=cbindgen.toml");
    println!("cargo::rerun-if-changed=include/ssmk.h");
    println!("cargo::rerun-if-changed=ssmk.map");
    println!("cargo::rerun-if-env-changed=SSMK_UPDATE_HEADER");
    println!("cargo::rerun-if-env-changed=SSMK_ALLOW_HEADER_DRIFT");

    // The C/C++ harness tests compile with the `cc` crate, which needs the target triple.
    println!(
        "cargo::rustc-env=SSMK_TARGET_TRIPLE={}",
        env::var("TARGET").unwrap()
    );
    let major = env::var("CARGO_PKG_VERSION_MAJOR").unwrap();
    if env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo::rustc-cdylib-link-arg=-Wl,-soname,libssmk.so.{major}");
        println!(
            "cargo::rustc-cdylib-link-arg=-Wl,--version-script={}",
            root.join("ssmk.map").display()
        );
    }

    let mut config =
        cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml must parse");
    config.after_includes = Some(version_macros());
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/lib.rs"))
        .generate()
        .expect("cbindgen failed to render the header");
    let rendered = out_dir.join("ssmk.h");
    bindings.write_to_file(&rendered);
    let rendered = fs::read_to_string(&rendered).unwrap();

    let committed_path = root.join("include/ssmk.h");
    let committed = fs::read_to_string(&committed_path).unwrap_or_default();
    if rendered == committed {
        return;
    }
    if env::var_os("SSMK_UPDATE_HEADER").is_some_and(|v| v == "1") {
        fs::write(&committed_path, rendered).expect("cannot write include/ssmk.h");
    } else if env::var_os("SSMK_ALLOW_HEADER_DRIFT").is_some_and(|v| v == "1") {
        println!("cargo::warning=include/ssmk.h is stale: rerun with SSMK_UPDATE_HEADER=1");
    } else {
        panic!(
            "include/ssmk.h differs from the header cbindgen renders from src/ \
             (rendered copy: {}). Rerun the build with SSMK_UPDATE_HEADER=1 and commit the result.",
            out_dir.join("ssmk.h").display()
        );
    }
}
