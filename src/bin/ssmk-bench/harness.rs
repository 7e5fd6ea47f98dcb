//! Timing, same-run baselines (memcpy bandwidth, FMA peak), the result table and its JSON.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use ssmk::ffi::context::{ssmk_context, ssmk_context_create, ssmk_context_destroy};

/// Run-wide settings.
pub struct Config {
    /// Seconds-long smoke run: smaller shapes, fewer samples.
    pub quick: bool,
    pub threads: Vec<u32>,
    /// Simulated worker counts (`--simulate-threads`): the prefill and decode rows are recorded
    /// and replayed on them instead of timed.
    pub simulate: Vec<usize>,
}

impl Config {
    /// Samples per measurement and the minimum time each sample should take.
    fn samples(&self) -> (usize, Duration) {
        if self.quick {
            (3, Duration::from_millis(2))
        } else {
            (9, Duration::from_millis(50))
        }
    }

    pub fn simulating(&self) -> bool {
        !self.simulate.is_empty()
    }

    /// `full` normally, `quick` in a smoke run.
    pub fn pick<T>(&self, full: T, quick: T) -> T {
        if self.quick { quick } else { full }
    }
}

/// An owned ssmk context.
pub struct Ctx(pub *mut ssmk_context);

impl Ctx {
    pub fn new(threads: u32) -> Ctx {
        Ctx(ssmk_context_create(threads))
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        unsafe { ssmk_context_destroy(self.0) }
    }
}

/// Median seconds per call of `f`; each sample repeats `f` until it has run long enough to time.
pub fn time(cfg: &Config, f: impl FnMut()) -> f64 {
    time_between(cfg, f, || 0.0).0
}

/// [`time`], with `between` run after each sample: returns also the median of what it returned.
fn time_between(cfg: &Config, mut f: impl FnMut(), mut between: impl FnMut() -> f64) -> (f64, f64) {
    let (samples, min_sample) = cfg.samples();
    f(); // warm up: page faults, pool start-up, caches
    let start = Instant::now();
    f();
    let once = start.elapsed().max(Duration::from_nanos(50));
    let reps = (min_sample.as_secs_f64() / once.as_secs_f64())
        .ceil()
        .max(1.0) as usize;
    let (times, betweens): (Vec<f64>, Vec<f64>) = (0..samples)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            let time = t.elapsed().as_secs_f64() / reps as f64;
            (time, between())
        })
        .unzip();
    (median(times), median(betweens))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median of three single calls: for slow reference kernels, where `time`'s repetitions would
/// cost minutes.
pub fn time_slow(cfg: &Config, mut f: impl FnMut()) -> f64 {
    let times: Vec<f64> = (0..cfg.pick(3, 1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    median(times)
}

/// Median of single calls, each after writing a buffer larger than the L3 of any CPU this runs
/// on and a pause: the call finds its state in memory and the pool's helpers asleep, as a
/// decode of one layer does between the steps of a model (every other layer's weights pass
/// through the caches in between). [`time`] repeats calls back to back: state in cache, helpers
/// spinning.
pub fn time_cold(cfg: &Config, mut f: impl FnMut()) -> f64 {
    let mut evict = vec![0u8; 256 << 20];
    f();
    let times: Vec<f64> = (0..cfg.pick(41, 5))
        .map(|i| {
            evict.iter_mut().step_by(64).for_each(|b| *b = i as u8);
            std::hint::black_box(&evict);
            std::thread::sleep(Duration::from_millis(5));
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    median(times)
}

/// Panics with the library's message unless `status` is SSMK_OK (the bench only runs valid calls).
pub fn ok(status: i32) {
    if status != 0 {
        let msg = unsafe { std::ffi::CStr::from_ptr(ssmk::ffi::status::ssmk_last_error_message()) };
        panic!(
            "ssmk call failed with status {status}: {}",
            msg.to_string_lossy()
        );
    }
}

/// Same-run memcpy bandwidth (GB/s, counting bytes read + written) over buffers larger than the
/// caches: what "moves memory at memcpy speed" means here. The buffers live for the whole run so
/// that an operation's baseline can be timed between its own samples: on a shared machine the
/// bandwidth drifts by a third within minutes, and a baseline taken at the start of the run would
/// put that drift into the ratio.
pub struct Memcpy {
    src: Vec<u8>,
    dst: Vec<u8>,
}

impl Memcpy {
    pub fn new(bytes: usize) -> Memcpy {
        let mut m = Memcpy {
            src: vec![1u8; bytes],
            dst: vec![0u8; bytes],
        };
        m.copy(); // page faults
        m
    }

    /// One copy of the buffer; its bandwidth.
    fn copy(&mut self) -> f64 {
        let t = Instant::now();
        unsafe {
            libc::memcpy(
                self.dst.as_mut_ptr().cast(),
                self.src.as_ptr().cast(),
                self.src.len(),
            )
        };
        std::hint::black_box(&self.dst);
        2.0 * self.src.len() as f64 / t.elapsed().as_secs_f64() / 1e9
    }

    /// Median bandwidth of a run of copies on its own.
    pub fn gbps(&mut self, cfg: &Config) -> f64 {
        median((0..cfg.samples().0).map(|_| self.copy()).collect())
    }

    /// Median seconds per call of `f` (as [`time`]), and the median memcpy bandwidth of copies
    /// made between its samples.
    pub fn time_beside(&mut self, cfg: &Config, f: impl FnMut()) -> (f64, f64) {
        time_between(cfg, f, || self.copy())
    }

    /// Median seconds per call of `f` (as [`time`]) and the median rates of the memcpy and of an
    /// in-place pass over `rmw`, both timed between its samples.
    pub fn time_beside_rmw(
        &mut self,
        cfg: &Config,
        rmw: &mut Rmw,
        f: impl FnMut(),
    ) -> (f64, f64, f64) {
        let mut copies = Vec::new();
        let (t, rmw_gbps) = time_between(cfg, f, || {
            copies.push(self.copy());
            rmw.pass()
        });
        (t, median(copies), rmw_gbps)
    }
}

/// The same-run bound of an in-place state update: one read-modify-write pass (`x = x * f`, `f`
/// one but opaque to the compiler) over a buffer of the state's size, split over the call's
/// thread count. A decode rewrites its state where it lies, so no line is write-allocated as a
/// memcpy's destination is, and a state that fits in the caches stays there as the decode's does.
pub struct Rmw {
    buf: Vec<f32>,
    pool: Option<rayon::ThreadPool>,
}

impl Rmw {
    pub fn new(bytes: usize, threads: u32) -> Rmw {
        let pool = (threads > 1).then(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads as usize)
                .build()
                .expect("rmw pool")
        });
        let mut rmw = Rmw {
            buf: vec![1.0; bytes.div_ceil(4).max(16)],
            pool,
        };
        rmw.pass(); // page faults
        rmw
    }

    /// One pass; its bandwidth (GB/s, bytes read + written).
    fn pass(&mut self) -> f64 {
        use rayon::prelude::*;
        let factor = std::hint::black_box(1.0f32);
        let threads = self.pool.as_ref().map_or(1, |p| p.current_num_threads());
        let chunk = self.buf.len().div_ceil(threads).next_multiple_of(16);
        let t = Instant::now();
        match &self.pool {
            Some(pool) => {
                let buf = &mut self.buf;
                pool.install(|| {
                    buf.par_chunks_mut(chunk)
                        .for_each(|c| scale_in_place(c, factor))
                })
            }
            None => scale_in_place(&mut self.buf, factor),
        }
        std::hint::black_box(&self.buf);
        2.0 * (self.buf.len() * 4) as f64 / t.elapsed().as_secs_f64() / 1e9
    }
}

/// `x *= f` with the widest vectors this build may use on this CPU.
fn scale_in_place(x: &mut [f32], f: f32) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { scale_in_place_avx2(x, f) };
    }
    x.iter_mut().for_each(|v| *v *= f);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scale_in_place_avx2(x: &mut [f32], f: f32) {
    x.iter_mut().for_each(|v| *v *= f);
}

/// Same-run single-thread f32 FMA peak (GFLOP/s) of the widest vector unit ssmk uses: the
/// median of a run of measurements on their own (the run's header).
pub fn fma_peak_gflops(cfg: &Config) -> f64 {
    median((0..cfg.samples().0).map(|_| fma_peak_once()).collect())
}

/// Median seconds per call of `f` (as [`time`]) and the median FMA peak measured between its
/// samples, so the ratio of the two does not depend on when in the run the row is timed (on the
/// shared development VM the peak read 108-117 GFLOP/s over one run).
pub fn time_beside_peak(cfg: &Config, f: impl FnMut()) -> (f64, f64) {
    time_between(cfg, f, fma_peak_once)
}

/// [`time_beside_peak`] of `f`, with one call of `peer` timed after each sample too: returns
/// `f`'s time, the peak and `peer`'s median time, so a ratio of the two drifts with neither.
pub fn time_beside_peak_and(
    cfg: &Config,
    f: impl FnMut(),
    mut peer: impl FnMut(),
) -> (f64, f64, f64) {
    let mut peer_times = Vec::new();
    let (t, peak) = time_between(cfg, f, || {
        let start = Instant::now();
        peer();
        peer_times.push(start.elapsed().as_secs_f64());
        fma_peak_once()
    });
    (t, peak, median(peer_times))
}

/// An A/B comparison: medians of each side and of the per-pair time ratios `a / b`, with the
/// ratios' quartiles (their spread on this run).
pub struct AbTiming {
    pub a: f64,
    pub b: f64,
    pub ratio: f64,
    pub ratio_quartiles: (f64, f64),
    pub pairs: usize,
}

/// Times `a` against `b` in interleaved pairs, in ABBA order (each side runs first as often as
/// second, so neither inherits the other's caches or frequency state more often), each side's
/// sample long enough to time (`reps` calls). Built for small cost differences on a shared
/// machine: load drifts between pairs cancel in the per-pair ratio.
pub fn time_ab(cfg: &Config, mut a: impl FnMut(), mut b: impl FnMut()) -> AbTiming {
    let (samples, min_sample) = cfg.samples();
    let pairs = 2 * samples + 1;
    a(); // warm up: page faults, pool start-up, caches
    b();
    let start = Instant::now();
    a();
    let once = start.elapsed().max(Duration::from_nanos(50));
    let reps = (min_sample.as_secs_f64() / once.as_secs_f64())
        .ceil()
        .max(1.0) as usize;
    let timed = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..reps {
            f();
        }
        t.elapsed().as_secs_f64() / reps as f64
    };
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for i in 0..pairs {
        let (x, y) = match i % 2 {
            0 => (timed(&mut a), timed(&mut b)),
            _ => {
                let y = timed(&mut b);
                (timed(&mut a), y)
            }
        };
        ta.push(x);
        tb.push(y);
    }
    let mut ratios: Vec<f64> = ta.iter().zip(&tb).map(|(x, y)| x / y).collect();
    ratios.sort_by(f64::total_cmp);
    AbTiming {
        a: median(ta),
        b: median(tb),
        ratio: ratios[pairs / 2],
        ratio_quartiles: (ratios[pairs / 4], ratios[3 * pairs / 4]),
        pairs,
    }
}

/// One timing of the FMA loop (a few ms), as GFLOP/s.
fn fma_peak_once() -> f64 {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        use ssmk::kernels::simd::Simd;
        use ssmk::runtime::Isa;
        const ITERS: usize = 1 << 20;
        let (run, lanes): (unsafe fn(usize) -> f32, usize) = match Isa::active() {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 | Isa::Avx512Bf16 => (fma_loop_avx512, ssmk::kernels::simd::Avx512::LANES),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => (fma_loop_avx2, ssmk::kernels::simd::Avx2::LANES),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => (fma_loop_neon, ssmk::kernels::simd::Neon::LANES),
            _ => return f64::NAN,
        };
        let t = Instant::now();
        std::hint::black_box(unsafe { run(std::hint::black_box(ITERS)) });
        (ITERS * FMA_CHAINS * lanes * 2) as f64 / t.elapsed().as_secs_f64() / 1e9
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        f64::NAN
    }
}

/// Independent FMA chains enough to hide the FMA latency, so the loop runs at the unit's
/// throughput.
const FMA_CHAINS: usize = 10;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
unsafe fn fma_loop<S: ssmk::kernels::simd::Simd>(iters: usize) -> f32 {
    use std::hint::black_box;
    unsafe {
        let m = S::splat(black_box(0.999_999));
        let a = S::splat(black_box(1e-7));
        let mut acc: [S::V; FMA_CHAINS] = std::array::from_fn(|i| S::splat(black_box(i as f32)));
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = S::fma(*v, m, a);
            }
        }
        S::reduce_sum(acc.into_iter().fold(S::zero(), |s, v| S::add(s, v)))
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop_avx2(iters: usize) -> f32 {
    unsafe { fma_loop::<ssmk::kernels::simd::Avx2>(iters) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn fma_loop_avx512(iters: usize) -> f32 {
    unsafe { fma_loop::<ssmk::kernels::simd::Avx512>(iters) }
}

/// Same-run single-thread peak (GFLOP/s) of the bf16 dot product (`vdpbf16ps`: two products and
/// two sums per f32 lane) where the CPU has it (`Isa::Avx512Bf16`), else `None`: the peak of
/// the products the `avx512_bf16` level takes to it, and why a CPU prefers it or not (a median,
/// as [`fma_peak_gflops`]).
pub fn bf16_dot_peak_gflops(cfg: &Config) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if ssmk::runtime::Isa::detected() == ssmk::runtime::Isa::Avx512Bf16 {
        const ITERS: usize = 1 << 20;
        let once = || {
            let t = Instant::now();
            std::hint::black_box(unsafe { bf16_dot_loop(std::hint::black_box(ITERS)) });
            (ITERS * FMA_CHAINS * 16 * 4) as f64 / t.elapsed().as_secs_f64() / 1e9
        };
        return Some(median((0..cfg.samples().0).map(|_| once()).collect()));
    }
    let _ = cfg;
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")]
unsafe fn bf16_dot_loop(iters: usize) -> f32 {
    use ssmk::kernels::simd::{Avx512Bf16, Simd};
    use std::hint::black_box;
    unsafe {
        // Pairs of bf16 1.0 and ~1e-7: the sums grow slowly and stay normal.
        let a = Avx512Bf16::splat(f32::from_bits(black_box(0x3f80_3f80)));
        let b = Avx512Bf16::splat(f32::from_bits(black_box(0x33d6_33d6)));
        let mut acc: [<Avx512Bf16 as Simd>::V; FMA_CHAINS] =
            std::array::from_fn(|i| Avx512Bf16::splat(i as f32));
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = Avx512Bf16::dot_bf16_pairs(*v, a, b);
            }
        }
        Avx512Bf16::reduce_sum(
            acc.into_iter()
                .fold(Avx512Bf16::zero(), |s, v| Avx512Bf16::add(s, v)),
        )
    }
}

#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
unsafe fn fma_loop_neon(iters: usize) -> f32 {
    unsafe { fma_loop::<ssmk::kernels::simd::Neon>(iters) }
}

/// What a row's throughput counts.
#[derive(Clone, Copy)]
pub enum Work {
    /// Bytes moved (read + written).
    Bytes(f64),
    /// Floating-point operations.
    Flops(f64),
}

/// One line of the result table.
#[derive(Clone)]
pub struct Row {
    pub op: String,
    pub shape: String,
    pub dtype: String,
    pub threads: u32,
    pub seconds: f64,
    pub work: Work,
    /// Ratio to the same-run baseline: `(name, ratio)`, >1 = better than the baseline.
    pub baseline: Option<(String, f64)>,
    /// The baseline's own rate, in the row's unit.
    pub baseline_rate: Option<f64>,
    /// Speed-up over the in-tree scalar reference, measured in the same run.
    pub vs_reference: Option<f64>,
    pub note: String,
}

impl Row {
    /// A measured row, before any same-run baseline or reference ratio is attached.
    pub fn new(
        op: &str,
        shape: String,
        dtype: &str,
        threads: u32,
        seconds: f64,
        work: Work,
        note: String,
    ) -> Row {
        Row {
            op: op.into(),
            shape,
            dtype: dtype.into(),
            threads,
            seconds,
            work,
            baseline: None,
            baseline_rate: None,
            vs_reference: None,
            note,
        }
    }

    pub fn rate(&self) -> (f64, &'static str) {
        match self.work {
            Work::Bytes(b) => (b / self.seconds / 1e9, "GB/s"),
            Work::Flops(f) => (f / self.seconds / 1e9, "GFLOP/s"),
        }
    }
}

pub struct Report {
    pub rows: Vec<Row>,
    pub facts: Vec<(String, String)>,
    /// Same-run baselines every suite compares against.
    pub memcpy: Memcpy,
    pub fma_peak_gflops: f64,
    /// `--simulate-threads` rows, as JSON objects.
    pub simulations: Vec<String>,
    /// What the simulation charges a pass per helper it wakes.
    pub hand_off_seconds: f64,
    /// What recording a task costs beyond the task (taken off a recorded call's serial part).
    pub recording_seconds_per_task: f64,
}

impl Report {
    /// Pushes `row` with its rate divided by a same-run baseline rate of the same unit.
    pub fn push_against(&mut self, row: Row, baseline: &str, baseline_rate: f64) {
        let (rate, unit) = row.rate();
        let ratio = rate / baseline_rate;
        let note = match row.note.as_str() {
            "" => format!("{baseline} {baseline_rate:.2} {unit}"),
            note => format!("{note}; {baseline} {baseline_rate:.2} {unit}"),
        };
        self.push(Row {
            baseline: Some((baseline.into(), ratio)),
            baseline_rate: Some(baseline_rate),
            note,
            ..row
        });
    }

    pub fn push(&mut self, row: Row) {
        print_row(&row);
        self.rows.push(row);
    }

    pub fn fact(&mut self, key: &str, value: String) {
        println!("# {key}: {value}");
        self.facts.push((key.to_owned(), value));
    }

    pub fn to_json(&self) -> String {
        let mut s = String::from("{\n  \"facts\": {");
        for (i, (k, v)) in self.facts.iter().enumerate() {
            let _ = write!(
                s,
                "{}\n    {}: {}",
                if i > 0 { "," } else { "" },
                json_str(k),
                json_str(v)
            );
        }
        s.push_str("\n  },\n  \"rows\": [");
        for (i, r) in self.rows.iter().enumerate() {
            let (rate, unit) = r.rate();
            let _ = write!(
                s,
                "{}\n    {{\"op\": {}, \"shape\": {}, \"dtype\": {}, \"threads\": {}, \"median_s\": {:e}, \"rate\": {:.4}, \"unit\": {}, \"baseline\": {}, \"baseline_ratio\": {}, \"baseline_rate\": {}, \"vs_reference\": {}, \"note\": {}}}",
                if i > 0 { "," } else { "" },
                json_str(&r.op),
                json_str(&r.shape),
                json_str(&r.dtype),
                r.threads,
                r.seconds,
                rate,
                json_str(unit),
                r.baseline
                    .as_ref()
                    .map_or("null".into(), |b| json_str(&b.0)),
                r.baseline
                    .as_ref()
                    .map_or("null".into(), |b| format!("{:.4}", b.1)),
                r.baseline_rate.map_or("null".into(), |v| format!("{v:.4}")),
                r.vs_reference.map_or("null".into(), |v| format!("{v:.4}")),
                json_str(&r.note),
            );
        }
        s.push_str("\n  ],\n  \"simulations\": [");
        for (i, sim) in self.simulations.iter().enumerate() {
            let _ = write!(s, "{}\n    {sim}", if i > 0 { "," } else { "" });
        }
        s.push_str("\n  ]\n}\n");
        s
    }
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub fn print_header() {
    println!(
        "{:<26} {:<40} {:<17} {:>3} {:>11} {:>15} {:>24} {:>8}  note",
        "op", "shape", "dtype", "thr", "median", "rate", "vs same-run baseline", "vs ref"
    );
}

fn print_row(r: &Row) {
    let (rate, unit) = r.rate();
    let time = if r.seconds < 1e-3 {
        format!("{:.1} us", r.seconds * 1e6)
    } else {
        format!("{:.3} ms", r.seconds * 1e3)
    };
    let baseline = r
        .baseline
        .as_ref()
        .map_or("-".into(), |(name, x)| format!("{x:.2}x {name}"));
    let reference = r.vs_reference.map_or("-".into(), |x| format!("{x:.1}x"));
    println!(
        "{:<26} {:<40} {:<17} {:>3} {:>11} {:>7.2} {:<7} {:>24} {:>8}  {}",
        r.op, r.shape, r.dtype, r.threads, time, rate, unit, baseline, reference, r.note
    );
}
