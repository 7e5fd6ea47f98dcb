//! `ssmk-bench --quick` runs every suite through the C ABI and writes well-formed JSON.

use std::process::Command;

#[test]
fn quick_bench_runs_and_writes_json() {
    let json = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-smoke.json");
    let _ = std::fs::remove_file(&json);
    let out = Command::new(env!("CARGO_BIN_EXE_ssmk-bench"))
        .args(["--quick", "--json"])
        .arg(&json)
        .output()
        .expect("run ssmk-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{stdout}");
    let text = std::fs::read_to_string(&json).unwrap();
    for op in ["batch_memcpy", "zero_blocks"] {
        assert!(
            text.contains(&format!("\"op\": \"{op}\"")),
            "{op} missing from {text}"
        );
    }
    assert!(text.contains("\"memcpy_gbps\""));
    // Every row has a positive rate.
    for line in text.lines().filter(|l| l.contains("\"rate\":")) {
        let rate: f64 = line
            .split("\"rate\": ")
            .nth(1)
            .unwrap()
            .split(',')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(rate > 0.0 && rate.is_finite(), "{line}");
    }
    // Braces and brackets balance (a cheap well-formedness check without a JSON dependency).
    assert_eq!(text.matches('{').count(), text.matches('}').count());
    assert_eq!(text.matches('[').count(), text.matches(']').count());
}
