//! `--simulate-threads`: how a call would scale on a socket this machine does not have. The call
//! runs on a recording context ([`ssmk::runtime::Context::recording`]) that splits it exactly as
//! P threads would but runs every task in turn on one thread and times it; the tasks are then
//! replayed on P simulated workers with the pool's policy: each pass (one `for_each`) hands out
//! runs of its tasks in index order to whichever worker is free first (each run a share of what
//! is left, as the pool's guided claims take) and ends when its last task does
//! (the next pass waits for it, as the kernels' passes do; the calling thread is one of the
//! workers). Workers start claiming when the pool's wake-up tree
//! ([`ssmk::runtime::helper_tree`]) reaches them: each wake-up costs the waker one hand-off (the
//! cost of handing a pass to one helper, measured in this run) and the woken helper starts one
//! hand-off later. Work the call does outside its passes (validation, planning, calls small
//! enough to stay on the calling thread) is serial.
//!
//! `SSMK_SIM_VERBOSE=1` also prints each pass's task count, sum, longest task and makespan.
//!
//! What the replay ignores: shared caches and memory bandwidth (a task takes as long on a busy
//! socket as alone on this one; the row prints the bandwidth the predicted speed would need, so
//! a reader sees where memory binds first), NUMA, frequency changes with load, and helpers that
//! wake later than one hand-off (the caller takes their tasks in the real pool).

use std::time::Instant;

use ssmk::ffi::context::ssmk_context;
use ssmk::runtime::{Context, Pass, helper_tree};

use crate::harness::{Config, Ctx, Report, time};

/// The recording of one call split for `threads` workers: its passes, and the time spent outside
/// them.
struct Recording {
    passes: Vec<Pass>,
    serial: f64,
}

impl Recording {
    /// Several recorded calls (after a warm-up call) merged task by task, keeping each task's
    /// shortest time: the split of a call does not change between calls, and on a shared machine
    /// a task the OS preempted would otherwise pose as a long one (and the replay would blame the
    /// split for it). `per_task`: what recording one task costs the call beyond the task
    /// ([`recording_seconds_per_task`]), taken off the serial part (at 256 tasks it was most of
    /// it, and it would have posed as work no worker can share).
    fn of(cfg: &Config, threads: usize, per_task: f64, call: &mut impl FnMut(&Ctx)) -> Recording {
        let ctx = Ctx(ssmk_context::recording(threads));
        let runtime = || unsafe { (*ctx.0).runtime() };
        call(&ctx);
        runtime().take_passes();
        let mut best: Option<Recording> = None;
        for _ in 0..cfg.pick(7, 2) {
            let start = Instant::now();
            call(&ctx);
            let wall = start.elapsed().as_secs_f64();
            let passes = runtime().take_passes();
            let tasks: f64 = passes.iter().flat_map(|p| &p.task_seconds).sum();
            let count = passes.iter().map(|p| p.task_seconds.len()).sum::<usize>() as f64;
            let run = Recording {
                serial: (wall - tasks - count * per_task).max(0.0),
                passes,
            };
            best = Some(match best {
                None => run,
                Some(mut b) => {
                    let same_split = b.passes.len() == run.passes.len()
                        && b.passes
                            .iter()
                            .zip(&run.passes)
                            .all(|(x, y)| x.task_seconds.len() == y.task_seconds.len());
                    assert!(same_split, "{threads}-thread split changed between calls");
                    b.serial = b.serial.min(run.serial);
                    for (x, y) in b.passes.iter_mut().zip(&run.passes) {
                        for (a, &t) in x.task_seconds.iter_mut().zip(&y.task_seconds) {
                            *a = a.min(t);
                        }
                    }
                    b
                }
            });
        }
        best.expect("at least one recorded call")
    }

    fn tasks(&self) -> usize {
        self.passes.iter().map(|p| p.task_seconds.len()).sum()
    }

    /// The call on one thread: every task in turn.
    fn total(&self) -> f64 {
        self.serial
            + self
                .passes
                .iter()
                .flat_map(|p| &p.task_seconds)
                .sum::<f64>()
    }

    /// The longest chain no number of workers shortens: the serial part and each pass's longest
    /// task.
    fn critical_path(&self) -> f64 {
        self.serial
            + self
                .passes
                .iter()
                .map(|p| p.task_seconds.iter().copied().fold(0.0, f64::max))
                .sum::<f64>()
    }

    /// Predicted time on `workers` workers (the caller and `workers - 1` helpers), each
    /// multi-task pass starting its workers as the pool's wake-up tree does.
    fn replay(&self, workers: usize, hand_off: f64) -> f64 {
        self.serial
            + self
                .passes
                .iter()
                .map(|p| {
                    let tasks = &p.task_seconds;
                    match tasks.len() {
                        0 | 1 => tasks.iter().sum(),
                        n => makespan(tasks, &start_times(workers.min(n), hand_off)),
                    }
                })
                .sum::<f64>()
    }
}

/// When each of a pass's `workers` starts claiming tasks, the caller first: a worker wakes its
/// share of helpers ([`helper_tree`]) one hand-off each before it starts, and a woken helper
/// starts one hand-off after its wake-up.
fn start_times(workers: usize, hand_off: f64) -> Vec<f64> {
    fn start(helpers: usize, at: f64, hand_off: f64, starts: &mut Vec<f64>) {
        let mut now = at;
        let mut woken = Vec::new();
        for part in helper_tree(helpers) {
            if part > 0 {
                now += hand_off;
                woken.push((part, now + hand_off));
            }
        }
        starts.push(now);
        for (part, at) in woken {
            start(part - 1, at, hand_off, starts);
        }
    }
    let mut starts = Vec::with_capacity(workers);
    start(workers - 1, 0.0, hand_off, &mut starts);
    starts
}

/// The pool's claiming in task order: the worker free first (each from its start time) takes
/// the next run of `max(1, left / (2 * workers))` tasks (`Context::for_each`'s guided claims).
fn makespan(tasks: &[f64], starts: &[f64]) -> f64 {
    let workers = starts.len();
    let mut free_at = starts.to_vec();
    let (mut next, mut end) = (0, 0.0f64);
    while next < tasks.len() {
        let take = ((tasks.len() - next) / (2 * workers)).max(1);
        let first = (0..workers)
            .min_by(|&a, &b| free_at[a].total_cmp(&free_at[b]))
            .unwrap_or(0);
        free_at[first] += tasks[next..next + take].iter().sum::<f64>();
        end = end.max(free_at[first]);
        next += take;
    }
    // A helper that found no task left is not waited for.
    end
}

/// Seconds a pass of tiny tasks takes on a 2-thread context: handing the pass to its one helper
/// (the caller runs the tasks before the helper wakes).
pub fn hand_off_seconds(cfg: &Config) -> f64 {
    let ctx = Context::new(2);
    time(cfg, || {
        ctx.for_each(4, |i| {
            std::hint::black_box(i);
        })
    })
}

/// What a recording context adds to a call per task beyond the task itself (its two clock
/// reads and the bookkeeping), from passes of empty tasks.
pub fn recording_seconds_per_task(cfg: &Config) -> f64 {
    const TASKS: usize = 1024;
    let ctx = Context::recording(64);
    let pass = time(cfg, || {
        ctx.for_each(TASKS, |i| {
            std::hint::black_box(i);
        });
        std::hint::black_box(ctx.take_passes());
    });
    pass / TASKS as f64
}

/// One simulation row: `call` recorded at 1 thread and at every simulated count, replayed, and
/// checked against the real 1- and 2-thread runs. `bytes`: what the call must move at least
/// (inputs read once, outputs written, states read and written).
pub fn row(
    cfg: &Config,
    report: &mut Report,
    op: &str,
    shape: String,
    bytes: f64,
    mut call: impl FnMut(&Ctx),
) {
    let (hand_off, per_task) = (report.hand_off_seconds, report.recording_seconds_per_task);
    let one = Recording::of(cfg, 1, per_task, &mut call);
    let base = one.total();
    // The real pool, for the check of the 2-thread prediction.
    let (real1, real2) = (Ctx::new(1), Ctx::new(2));
    let measured_1t = time(cfg, || call(&real1));
    let measured_2t = measured_1t / time(cfg, || call(&real2));
    let predicted_2t = base / Recording::of(cfg, 2, per_task, &mut call).replay(2, hand_off);
    let mut cells = Vec::new();
    let mut json = Vec::new();
    for &p in &cfg.simulate {
        let rec = Recording::of(cfg, p, per_task, &mut call);
        let t = rec.replay(p, hand_off);
        if std::env::var_os("SSMK_SIM_VERBOSE").is_some() {
            eprintln!("  P={p} serial {:.3} ms", rec.serial * 1e3);
            for pass in &rec.passes {
                let t = &pass.task_seconds;
                eprintln!(
                    "    {} tasks sum {:.3} ms max {:.3} ms makespan {:.3} ms",
                    t.len(),
                    t.iter().sum::<f64>() * 1e3,
                    t.iter().copied().fold(0.0, f64::max) * 1e3,
                    makespan(t, &start_times(p.min(t.len().max(1)), hand_off)) * 1e3
                );
            }
        }
        let speedup = base / t;
        cells.push(format!(
            "P={p}: {speedup:.1}x ({:.0}%), {} tasks, crit {:.0}%, {:.0} GB/s",
            100.0 * speedup / p as f64,
            rec.tasks(),
            100.0 * rec.critical_path() / t,
            bytes / t / 1e9
        ));
        json.push(format!(
            "{{\"p\": {p}, \"speedup\": {speedup:.3}, \"tasks\": {}, \"critical_path_s\": {:e}, \"bytes_per_task\": {:.0}, \"gbps_needed\": {:.2}}}",
            rec.tasks(),
            rec.critical_path(),
            bytes / rec.tasks().max(1) as f64,
            bytes / t / 1e9
        ));
    }
    println!(
        "{op:<34} {shape:<38} 1t {:>8.3} ms, {:.1} MB moved; 2t predicted {predicted_2t:.2}x measured {measured_2t:.2}x ({:+.0}%)\n    {}",
        base * 1e3,
        bytes / 1e6,
        100.0 * (predicted_2t / measured_2t - 1.0),
        cells.join("\n    ")
    );
    report.simulations.push(format!(
        "{{\"op\": \"{op}\", \"shape\": \"{shape}\", \"seconds_1t\": {base:e}, \"bytes\": {bytes:.0}, \"predicted_2t\": {predicted_2t:.3}, \"measured_2t\": {measured_2t:.3}, \"simulated\": [{}]}}",
        json.join(", ")
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_start_as_the_wake_up_tree_reaches_them() {
        assert_eq!(start_times(1, 1.0), vec![0.0]);
        // The caller wakes one helper (1), which starts one hand-off later (2).
        assert_eq!(start_times(2, 1.0), vec![1.0, 2.0]);
        // Two wake-ups by the caller, one more by the first helper.
        assert_eq!(start_times(4, 1.0), vec![2.0, 3.0, 4.0, 3.0]);
        let wide = start_times(64, 1.0);
        assert_eq!(wide.len(), 64);
        let last = wide.iter().copied().fold(0.0, f64::max);
        assert!(last <= 4.0 * 6.0, "the last of 64 workers starts at {last}");
    }

    #[test]
    fn makespan_follows_guided_claims_from_the_start_times() {
        assert_eq!(makespan(&[1.0; 8], &[0.0; 4]), 2.0);
        assert_eq!(makespan(&[1.0; 8], &[0.0]), 8.0);
        // A helper that starts after the work is gone is not waited for.
        assert_eq!(makespan(&[1.0; 2], &[0.0, 5.0]), 2.0);
        // Claims take a share of what is left: 8 tasks on 2 workers go 2, 1, 1, 1, 1, 1, 1.
        assert_eq!(makespan(&[1.0; 8], &[0.0, 0.0]), 4.0);
    }
}
