//! ssmk-bench: times every kernel through the C ABI on realistic shapes and reports throughput
//! as same-run ratios — to a memcpy (timed between the row's own samples) or memset of the same
//! bytes or the FMA peak measured in this run, and to the in-tree scalar reference — never as
//! absolute targets.
//!
//!     cargo run --release --bin ssmk-bench -- [--quick] [--json PATH] [--threads 1,2] [--only NAME]
//!                                             [--simulate-threads 8,16,32,64]
//!
//! `--simulate-threads` replaces the timed table with a replay of each prefill and decode call's
//! real tasks on that many simulated workers (see `simulate.rs`).

mod buffers;
mod conv;
mod dplr;
mod gdn;
mod harness;
mod layers;
mod mamba2;
mod memory;
mod scan_families;
mod short_conv;
mod simulate;

use harness::{Config, Report};

/// A benchmark suite: runs its cases and pushes rows.
type Suite = fn(&Config, &mut Report);

fn usage() -> ! {
    eprintln!(
        "usage: ssmk-bench [--quick] [--json PATH] [--threads N[,N..]] [--only memory|conv|short_conv|gdn|dplr|mamba2|scan_families|checkpoints] [--simulate-threads P[,P..]]"
    );
    std::process::exit(2)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut cfg = Config {
        quick: false,
        threads: vec![1, 2],
        simulate: Vec::new(),
    };
    let (mut json, mut only) = (None, None);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => cfg.quick = true,
            "--json" => json = Some(args.next().unwrap_or_else(|| usage())),
            "--only" => only = Some(args.next().unwrap_or_else(|| usage())),
            "--threads" => {
                let list = args.next().unwrap_or_else(|| usage());
                cfg.threads = list
                    .split(',')
                    .map(|t| t.trim().parse().unwrap_or_else(|_| usage()))
                    .collect();
            }
            "--simulate-threads" => {
                let list = args.next().unwrap_or_else(|| usage());
                cfg.simulate = list
                    .split(',')
                    .map(|t| t.trim().parse().unwrap_or_else(|_| usage()))
                    .filter(|&p| p > 0)
                    .collect();
            }
            "-h" | "--help" => usage(),
            _ => usage(),
        }
    }
    let suites: [(&str, Suite); 8] = [
        ("memory", memory::run),
        ("conv", conv::run),
        ("short_conv", short_conv::run),
        ("gdn", gdn::run),
        ("dplr", dplr::run),
        ("mamba2", mamba2::run),
        ("scan_families", scan_families::run),
        ("checkpoints", checkpoints),
    ];
    // A misspelt suite would otherwise run nothing and succeed.
    if only
        .as_deref()
        .is_some_and(|o| suites.iter().all(|&(name, _)| name != o))
    {
        usage();
    }
    let mut report = Report {
        rows: Vec::new(),
        facts: Vec::new(),
        memcpy: harness::Memcpy::new(cfg.pick(256 << 20, 16 << 20)),
        fma_peak_gflops: harness::fma_peak_gflops(&cfg),
        simulations: Vec::new(),
        hand_off_seconds: 0.0,
        recording_seconds_per_task: 0.0,
    };
    report.fact(
        "ssmk",
        unsafe { std::ffi::CStr::from_ptr(ssmk::ffi::status::ssmk_version()) }
            .to_string_lossy()
            .into(),
    );
    report.fact("isa", ssmk::runtime::Isa::active().name().into());
    report.fact("mode", if cfg.quick { "quick" } else { "full" }.into());
    let memcpy_gbps = report.memcpy.gbps(&cfg);
    report.fact("memcpy_gbps_at_start", format!("{memcpy_gbps:.2}"));
    report.fact(
        "fma_peak_gflops_1t",
        format!("{:.1}", report.fma_peak_gflops),
    );
    if let Some(peak) = harness::bf16_dot_peak_gflops(&cfg) {
        report.fact("bf16_dot_peak_gflops_1t", format!("{peak:.1}"));
    }
    if cfg.simulating() {
        report.hand_off_seconds = simulate::hand_off_seconds(&cfg);
        report.fact(
            "hand_off_us",
            format!("{:.2}", report.hand_off_seconds * 1e6),
        );
        report.recording_seconds_per_task = simulate::recording_seconds_per_task(&cfg);
        report.fact(
            "recording_ns_per_task",
            format!("{:.1}", report.recording_seconds_per_task * 1e9),
        );
        println!(
            "# simulated workers {:?}: predicted speed-up over 1 thread (and per worker), tasks, \
             critical path share, bandwidth the predicted speed needs",
            cfg.simulate
        );
    } else {
        harness::print_header();
    }
    for (name, run) in suites {
        let wanted = only.as_deref().is_none_or(|o| o == name);
        // Batch copies and block zeroing are neither prefill nor decode, and the checkpoint
        // rows are A/B timings of prefills the other suites simulate: nothing to simulate.
        if wanted && !(cfg.simulating() && matches!(name, "memory" | "checkpoints")) {
            run(&cfg, &mut report);
        }
    }
    if let Some(path) = json {
        std::fs::write(&path, report.to_json())
            .unwrap_or_else(|e| panic!("cannot write {path}: {e}"));
        println!("# wrote {path}");
    }
}

/// The cost of state checkpoints (ABI.md §4.10) in each prefill export that has a row for it:
/// one suite, so that the rows can be repeated on their own (`--only checkpoints`).
fn checkpoints(cfg: &Config, report: &mut Report) {
    conv::fwd_checkpoints(
        cfg,
        report,
        ssmk::dtype::DType::BF16,
        cfg.pick(2048, 256),
        cfg.pick(8192, 2048),
    );
    gdn::checkpoints(cfg, report);
    mamba2::prefill_checkpoints(cfg, report, cfg.pick(2048, 128));
}
