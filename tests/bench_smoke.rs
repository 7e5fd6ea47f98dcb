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
    for op in [
        "batch_memcpy",
        "zero_blocks",
        "causal_conv1d_fwd",
        "causal_conv1d_update",
        "short_conv",
        "LFM2 layer step",
        "gated_delta_rule prefill",
        "gated_delta_rule decode",
        "Qwen3-Next GDN layer step",
    ] {
        assert!(
            text.contains(&format!("\"op\": \"{op}\"")),
            "{op} missing from {text}"
        );
    }
    assert!(text.contains("\"memcpy_gbps_at_start\""));
    // Every row compared with memcpy carries the bandwidth of the copies timed beside it.
    let memcpy_rows: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("\"baseline\": \"memcpy\""))
        .collect();
    assert!(memcpy_rows.len() >= 8, "{text}");
    for line in memcpy_rows {
        let rate: f64 = line
            .split("\"baseline_rate\": ")
            .nth(1)
            .and_then(|r| r.split(',').next())
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("no baseline_rate in {line}"));
        assert!(rate > 0.0 && rate.is_finite(), "{line}");
    }
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
