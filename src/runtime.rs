//! Run-time environment of the kernels: the instruction set chosen once per process, and the
//! context that owns a private, lazily built thread pool (never rayon's global pool).

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Instruction-set levels, ordered: a kernel table picks the best entry `<=` the active level.
/// Levels of different architectures never meet on one CPU (a level above the detected one is
/// capped to it), so their relative order only has to keep each architecture's levels in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable Rust that LLVM may auto-vectorise for the build target.
    Scalar,
    /// AVX2 + FMA + F16C (x86-64).
    Avx2,
    /// AVX-512 F/BW/VL/DQ (plus AVX2/FMA/F16C) (x86-64).
    Avx512,
    /// AVX-512 with AVX512_BF16 (Zen 4/5, Cooper Lake, Sapphire Rapids and later): the AVX-512
    /// kernels, with `vdpbf16ps` for the products of two bf16 inputs of a call (f32 sums).
    Avx512Bf16,
    /// NEON (Advanced SIMD) with f32 FMA (aarch64).
    Neon,
}

/// The levels of the build target's architecture, lowest first.
#[cfg(target_arch = "x86_64")]
const LEVELS: &[Isa] = &[Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16];
#[cfg(target_arch = "aarch64")]
const LEVELS: &[Isa] = &[Isa::Scalar, Isa::Neon];
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const LEVELS: &[Isa] = &[Isa::Scalar];

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Bf16 => "avx512_bf16",
            Isa::Neon => "neon",
        }
    }

    pub fn parse(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2),
            "avx512" => Some(Isa::Avx512),
            "avx512_bf16" => Some(Isa::Avx512Bf16),
            "neon" => Some(Isa::Neon),
            _ => None,
        }
    }

    /// What this CPU supports (cached).
    pub fn detected() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(detect)
    }

    /// The level that runs by default: the detected one, except that a CPU whose bf16 dot
    /// product is not faster than its f32 FMA runs [`Isa::Avx512`] (see `bf16_dot_is_fast`).
    pub fn preferred() -> Isa {
        match Isa::detected() {
            Isa::Avx512Bf16 if !bf16_dot_is_fast() => Isa::Avx512,
            isa => isa,
        }
    }

    /// What the kernels use: [`Isa::preferred`], or the level `SSMK_MAX_ISA` names capped at
    /// what the CPU runs (so `avx512_bf16` selects that level where the CPU has it, and a lower
    /// name lowers it). A level of another architecture lowers it to the portable code. Frozen at
    /// first use, so one process never mixes levels.
    pub fn active() -> Isa {
        static ACTIVE: OnceLock<Isa> = OnceLock::new();
        *ACTIVE.get_or_init(|| {
            let cap = std::env::var("SSMK_MAX_ISA")
                .ok()
                .and_then(|s| Isa::parse(&s));
            match cap {
                Some(Isa::Avx512Bf16) => Isa::Avx512Bf16.for_this_cpu(),
                Some(cap) => cap.for_this_cpu().min(Isa::preferred()),
                None => Isa::preferred(),
            }
        })
    }

    /// `self` capped at what this CPU runs; a level of another architecture is `Scalar`.
    pub fn for_this_cpu(self) -> Isa {
        match LEVELS.contains(&self) {
            true => self.min(Isa::detected()),
            false => Isa::Scalar,
        }
    }

    /// The level this thread's calls dispatch to: the one [`with_isa`] forces, else
    /// [`Isa::active`].
    pub fn dispatch() -> Isa {
        FORCED_ISA.get().unwrap_or_else(Isa::active)
    }

    /// Every level this CPU can run, lowest first (for tests and benchmarks).
    pub fn supported() -> Vec<Isa> {
        LEVELS
            .iter()
            .copied()
            .filter(|&i| i <= Isa::detected())
            .collect()
    }

    /// The levels a test named `every_isa_*` checks against the portable reference: every
    /// supported level, or only the one `SSMK_TEST_ISA` names. The AVX-512 emulation lane sets
    /// it (the lower levels already ran natively, and the emulator is slow); a CPU, real or
    /// emulated, that lacks the named level panics here, so a lane that silently ran AVX2 fails
    /// instead of passing.
    pub fn under_test() -> Vec<Isa> {
        let levels = match std::env::var("SSMK_TEST_ISA") {
            Err(_) => Isa::supported(),
            Ok(name) => {
                let wanted = Isa::parse(&name).unwrap_or_else(|| {
                    panic!("SSMK_TEST_ISA = {name:?}, expected scalar, avx2, avx512, avx512_bf16 or neon")
                });
                assert!(
                    wanted.for_this_cpu() == wanted,
                    "SSMK_TEST_ISA = {name}, but this CPU runs {} (detected {})",
                    Isa::active().name(),
                    Isa::detected().name()
                );
                vec![wanted]
            }
        };
        log_levels_under_test(&levels);
        levels
    }
}

/// Appends `<test binary> <test> <levels>` to the file `SSMK_TEST_ISA_LOG` names (libtest names
/// each test's thread after the test), so CI can check which levels the `every_isa_*` tests of a
/// `cargo test` really ran: their pass alone does not say whether this CPU ran AVX-512.
fn log_levels_under_test(levels: &[Isa]) {
    use std::io::Write;
    let Ok(path) = std::env::var("SSMK_TEST_ISA_LOG") else {
        return;
    };
    let exe = std::env::current_exe().expect("the test binary's path");
    let binary = exe.file_name().unwrap_or_default().to_string_lossy();
    let test = std::thread::current().name().unwrap_or("?").to_owned();
    let names: Vec<&str> = levels.iter().map(|isa| isa.name()).collect();
    let line = format!("{binary} {test} {}\n", names.join(","));
    thread_local! {
        /// The line this thread logged last: a test that asks once per case logs it once.
        static LOGGED: RefCell<String> = const { RefCell::new(String::new()) };
    }
    if LOGGED.with_borrow(|logged| *logged == line) {
        return;
    }
    // One write of one line to a file opened for appending: lines of parallel tests stay whole.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut log| log.write_all(line.as_bytes()))
        .unwrap_or_else(|e| panic!("SSMK_TEST_ISA_LOG = {path}: {e}"));
    LOGGED.set(line);
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    let avx512 = avx2
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512dq");
    if avx512 && is_x86_feature_detected!("avx512bf16") {
        Isa::Avx512Bf16
    } else if avx512 {
        Isa::Avx512
    } else if avx2 {
        Isa::Avx2
    } else {
        Isa::Scalar
    }
}

/// Whether `vdpbf16ps` sums more products per cycle than f32 FMA: on AMD (Zen 4: one 512-bit
/// dot product a cycle, as many as 512-bit FMAs, each with twice the products; Zen 5 alike). On
/// Intel without AMX tiles it is not: a Xeon (family 6 model 167 under KVM) ran 0.5 `vdpbf16ps`
/// a cycle against 2 FMAs (`ssmk-bench`'s `bf16_dot_peak_gflops_1t` 103 against an f32 FMA peak
/// of 208), and the chunked scan's prefill took 4% longer with it. Decided by the vendor, not by
/// timing, so a process's results never depend on the load of the moment.
fn bf16_dot_is_fast() -> bool {
    cpu_vendor() == Vendor::Amd
}

/// The x86 CPU vendor (CPUID leaf 0), for the few choices measured to differ between vendors
/// (`Other` on every other architecture).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum Vendor {
    Amd,
    Intel,
    Other,
}

/// The CPU's vendor, read once (CPUID traps to the hypervisor in a VM).
pub(crate) fn cpu_vendor() -> Vendor {
    static VENDOR: OnceLock<Vendor> = OnceLock::new();
    *VENDOR.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let id = std::arch::x86_64::__cpuid(0);
            let vendor: Vec<u8> = [id.ebx, id.edx, id.ecx]
                .iter()
                .flat_map(|r| r.to_le_bytes())
                .collect();
            match vendor.as_slice() {
                b"AuthenticAMD" => Vendor::Amd,
                b"GenuineIntel" => Vendor::Intel,
                _ => Vendor::Other,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Vendor::Other
    })
}

#[cfg(target_arch = "aarch64")]
fn detect() -> Isa {
    match std::arch::is_aarch64_feature_detected!("neon") {
        true => Isa::Neon,
        false => Isa::Scalar,
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> Isa {
    Isa::Scalar
}

thread_local! {
    /// The level [`with_isa`] forces on this thread, if any.
    static FORCED_ISA: Cell<Option<Isa>> = const { Cell::new(None) };
    /// Set by [`with_every_call_parallel`].
    static EVERY_CALL_PARALLEL: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with `key` set to `value` on this thread, restoring the previous value even if `f`
/// unwinds.
fn with_thread_local<T: Copy + 'static, R>(
    key: &'static std::thread::LocalKey<Cell<T>>,
    value: T,
    f: impl FnOnce() -> R,
) -> R {
    struct Restore<T: Copy + 'static>(&'static std::thread::LocalKey<Cell<T>>, T);
    impl<T: Copy + 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            self.0.set(self.1);
        }
    }
    let _restore = Restore(key, key.replace(value));
    f()
}

/// Runs `f` with every ssmk call it makes on this thread dispatching to the kernels of `isa`
/// (capped at what the CPU runs; `Isa::Scalar` is the portable reference) instead of the active
/// ones. Tests and benchmarks drive every variant through the exported functions this way, with
/// the same validation and dispatch as any caller. The level is chosen on the calling thread
/// before any task starts, so it holds for work spread over a context's pool too.
pub fn with_isa<R>(isa: Isa, f: impl FnOnce() -> R) -> R {
    with_thread_local(&FORCED_ISA, Some(isa.for_this_cpu()), f)
}

/// Runs `f` with every call it makes on this thread spreading its tasks over the context's
/// threads however small the call. Calls otherwise keep small work on the calling thread (the
/// conv and ShortConv below [`crate::kernels::conv`]'s output count, decodes below
/// `MIN_PARALLEL_BYTES`), where waking the pool would cost more than it saves; tests use this
/// to check that results do not depend on the thread count on problems of any size.
pub fn with_every_call_parallel<R>(f: impl FnOnce() -> R) -> R {
    with_thread_local(&EVERY_CALL_PARALLEL, true, f)
}

/// Whether [`with_every_call_parallel`] is in force on this thread.
pub(crate) fn every_call_parallel() -> bool {
    EVERY_CALL_PARALLEL.get()
}

/// Work that moves fewer bytes than this (12 MiB) stays on the calling thread. Measured on the
/// development VM (Zen 5, 2 vCPUs; `ssmk-bench` decode rows, 1 -> 2 threads): with the state in
/// memory and the helper asleep (a `cold` row: as a layer's decode finds them between the steps
/// of a model) two threads gained nothing up to 17 MB moved (Gated DeltaNet B = 1, 2, 4: 90 ->
/// 84-108, 158 -> 163, 315 -> 315 us; Mamba-2 B = 1, 2: 170-176 -> 175-187, 310 -> 333 us): a
/// helper woken by an IPI to a halted vCPU arrives when the work is done, and the caller has
/// paid for waking it. Called back to back (state in cache, helper spinning) two threads gained
/// (Mamba-2 B = 1: 140 -> 86 us) or lost (Gated DeltaNet B = 1: 51 -> 33-67 us, dirty state
/// lines moving between the cores' L2s as the claims fall). So single-sequence decodes of every
/// family (4.2-8.4 MB) and Mamba-1's (1 MiB of state) stay; larger batches spread.
pub(crate) const MIN_PARALLEL_BYTES: usize = 12 << 20;

/// `MIN_PARALLEL_BYTES` on a team of the process's OpenMP threads (`SSMK_POOL=openmp`): in a
/// runtime that runs its own work on them they are spinning from its last parallel region, so a
/// team starts in microseconds, and a decode moving more than about 60 us of one core's streaming
/// (2 MiB) gains from it (a one-sequence Gated DeltaNet decode in vLLM, measured in
/// docs/vllm.md).
pub(crate) const MIN_PARALLEL_BYTES_OPENMP: usize = 2 << 20;

/// Threads for a context created with `num_threads == 0`: `SSMK_NUM_THREADS`, else the cores.
pub fn default_threads() -> usize {
    std::env::var("SSMK_NUM_THREADS")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Execution context: a thread count and, when that is above one, a private pool built on first
/// parallel use. Shareable by many host threads at once.
pub struct Context {
    threads: usize,
    pool: OnceLock<Option<rayon::ThreadPool>>,
    /// The process's OpenMP runtime, when `SSMK_POOL=openmp` asked for it at creation and the
    /// process has one: calls then spread over its threads instead of the private pool.
    openmp: Option<OpenMp>,
    /// Set on a [`Context::recording`] context: the passes its calls ran.
    recorder: Option<Mutex<Vec<Pass>>>,
}

/// One [`Context::for_each`] of a recorded call: how long each of its tasks took, in task order.
/// The passes of a call run one after another (each `for_each` returns when its last task has),
/// so a call is its passes in order plus whatever ran on the calling thread outside them.
#[derive(Clone, Debug, Default)]
pub struct Pass {
    pub task_seconds: Vec<f64>,
}

impl Context {
    /// `num_threads == 0` → [`default_threads`].
    pub fn new(num_threads: u32) -> Context {
        let threads = if num_threads == 0 {
            default_threads()
        } else {
            num_threads as usize
        };
        Context {
            threads,
            pool: OnceLock::new(),
            openmp: openmp_requested().then(process_openmp).flatten(),
            recorder: None,
        }
    }

    /// A context that splits every call exactly as a `threads`-thread context would, but runs
    /// the tasks one after another on the calling thread and records how long each took: the
    /// real tasks of the real call, for replaying on any number of simulated workers (the
    /// benchmark's `--simulate-threads`). Results are those of any other context: bitwise equal
    /// whatever the thread count.
    pub fn recording(threads: usize) -> Context {
        Context {
            recorder: Some(Mutex::new(Vec::new())),
            ..Context::new(threads.clamp(1, u32::MAX as usize) as u32)
        }
    }

    /// The passes recorded since the last call (empty unless [`Context::recording`]).
    pub fn take_passes(&self) -> Vec<Pass> {
        self.recorder.as_ref().map_or_else(Vec::new, |r| {
            std::mem::take(&mut *r.lock().unwrap_or_else(|e| e.into_inner()))
        })
    }

    /// The process-wide context used when a call passes NULL.
    pub fn process_default() -> &'static Context {
        static DEFAULT: OnceLock<Context> = OnceLock::new();
        DEFAULT.get_or_init(|| Context::new(0))
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The helpers: one thread fewer than the context's, the calling thread being the other.
    fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.pool
            .get_or_init(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(self.threads - 1)
                    .thread_name(|i| format!("ssmk-{i}"))
                    .build()
                    .ok()
            })
            .as_ref()
    }

    /// [`Context::for_each`] for work that moves about `bytes` (state read and written, rows in
    /// and out): below `MIN_PARALLEL_BYTES` (on an OpenMP team `MIN_PARALLEL_BYTES_OPENMP`)
    /// the tasks run in order on the calling thread.
    pub fn for_each_moving(&self, n: usize, bytes: usize, task: impl Fn(usize) + Send + Sync) {
        let least = match self.openmp {
            Some(_) => MIN_PARALLEL_BYTES_OPENMP,
            None => MIN_PARALLEL_BYTES,
        };
        match bytes < least && !every_call_parallel() {
            true => (0..n).for_each(task),
            false => self.for_each(n, task),
        }
    }

    /// Runs `task(i)` for every `i in 0..n`. With one thread (or one task) it runs in order on the
    /// caller's thread and starts nothing. Otherwise the calling thread and up to `threads - 1`
    /// helpers from the private pool claim the tasks in index order from a shared counter, each
    /// taking the next run as it finishes one (see `Claims::run`). The caller wakes at most two
    /// helpers and each helper wakes at most two more ([`helper_tree`]), so a wide pool starts in
    /// a few wake-ups. The caller then starts at once and never waits for a helper to wake: a
    /// helper that comes late (its core busy with another runtime's threads, e.g. torch's OpenMP
    /// workers spinning after a GEMM) finds the tasks taken and leaves, and the call costs what
    /// one thread would. The caller waits only for tasks a helper has claimed. If the pool cannot
    /// be built the tasks run inline: results never depend on where a task ran. A panic in a
    /// task is re-raised on the calling thread once no helper runs a task.
    pub fn for_each(&self, n: usize, task: impl Fn(usize) + Send + Sync) {
        if let Some(recorder) = &self.recorder {
            let task_seconds = (0..n)
                .map(|i| {
                    let start = Instant::now();
                    task(i);
                    start.elapsed().as_secs_f64()
                })
                .collect();
            let mut passes = recorder.lock().unwrap_or_else(|e| e.into_inner());
            passes.push(Pass { task_seconds });
            return;
        }
        let pool = match (self.threads > 1 && n > 1, self.openmp) {
            (false, _) => None,
            (true, Some(omp)) => return run_on_openmp(omp, self.threads.min(n), n, &task),
            (true, None) => self.pool(),
        };
        let Some(pool) = pool else {
            (0..n).for_each(task);
            return;
        };
        let claims = Arc::new(Claims::default());
        let job: &(dyn Fn(usize) + Sync) = &task;
        // SAFETY (lifetime): a helper calls `job` only while it is counted in `claims.active`,
        // and only after reading `closed` false; this function sets `closed` and then waits for
        // `active` to reach zero before it returns (or unwinds), so `task` outlives every call.
        let job = SharedJob(unsafe {
            std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(job)
        });
        let workers = self.threads.min(n);
        let pass = HelperPass {
            claims: Arc::clone(&claims),
            job,
            n,
            workers,
        };
        for helpers in helper_tree(workers - 1) {
            pass.launch(helpers, &|helper| pool.spawn(helper));
        }
        let mine = catch_unwind(AssertUnwindSafe(|| claims.run(&task, n, workers)));
        claims.closed.store(true, Ordering::SeqCst);
        let mut spins = 0u32;
        while claims.active.load(Ordering::SeqCst) != 0 {
            spins += 1;
            match spins < 1 << 10 {
                true => std::hint::spin_loop(),
                false => std::thread::yield_now(),
            }
        }
        if let Err(payload) = mine {
            resume_unwind(payload);
        }
        if claims.panicked.load(Ordering::SeqCst) {
            resume_unwind(Box::new("a task panicked on a pool thread"));
        }
    }
}

/// libgomp's entry point of a parallel region: runs `f(data)` on a team of up to `num_threads`
/// threads, the caller among them, and returns when all have returned.
type GompParallel = unsafe extern "C" fn(
    f: unsafe extern "C" fn(*mut std::ffi::c_void),
    data: *mut std::ffi::c_void,
    num_threads: std::ffi::c_uint,
    flags: std::ffi::c_uint,
);

/// Whether `SSMK_POOL=openmp` is set: a runtime whose own work runs on OpenMP (torch, and so
/// vLLM) keeps one set of threads busy on its cores. Two pools on the same cores fight: after
/// each GEMM torch's workers spin on their cores, pinned, so ssmk's helpers wait for a timeslice
/// (measured in docs/vllm.md).
fn openmp_requested() -> bool {
    std::env::var("SSMK_POOL").is_ok_and(|v| v == "openmp")
}

/// `omp_get_thread_num`: a member's number in its team.
type OmpThreadNum = unsafe extern "C" fn() -> std::ffi::c_int;

/// The entry points of the process's OpenMP runtime that ssmk calls.
#[derive(Clone, Copy)]
struct OpenMp {
    parallel: GompParallel,
    thread_num: OmpThreadNum,
}

/// `GOMP_parallel` and `omp_get_thread_num` of the libgomp loaded in the process when the
/// context is created (torch loads it with global symbols), if any. ssmk never loads an OpenMP
/// runtime itself.
fn process_openmp() -> Option<OpenMp> {
    // SAFETY: dlsym with RTLD_DEFAULT only looks the names up among loaded objects.
    let (parallel, thread_num) = unsafe {
        (
            libc::dlsym(libc::RTLD_DEFAULT, c"GOMP_parallel".as_ptr()),
            libc::dlsym(libc::RTLD_DEFAULT, c"omp_get_thread_num".as_ptr()),
        )
    };
    // SAFETY: libgomp's GOMP_parallel and omp_get_thread_num have these signatures in every
    // version that exports them.
    (!parallel.is_null() && !thread_num.is_null()).then(|| unsafe {
        OpenMp {
            parallel: std::mem::transmute::<*mut libc::c_void, GompParallel>(parallel),
            thread_num: std::mem::transmute::<*mut libc::c_void, OmpThreadNum>(thread_num),
        }
    })
}

/// One pass on an OpenMP team. Member `i` owns the `i`-th of `workers` equal runs of the tasks
/// and takes them in order; a member done with its run takes what is left of the others' runs,
/// one task at a time from each run's end. So a call that follows another of the same shape
/// gives each member the tasks it ran last time, whose state is still in its core's L2, as
/// OpenMP's static schedule does for the runtime's own loops (a one-sequence Gated DeltaNet
/// decode repeated on 2 threads: 97 us with claims in index order, whose runs move between the
/// cores from call to call), while a late member's run is still taken by the others.
struct OpenMpPass<'a> {
    /// Per run: how many tasks have been taken from its start (low 32 bits) and from its end
    /// (high 32 bits), one word so both ends claim with one compare-and-swap.
    taken: Vec<AtomicU64>,
    /// Per run, its tasks: `bounds[r]..bounds[r + 1]`.
    bounds: Vec<usize>,
    task: &'a (dyn Fn(usize) + Sync),
    thread_num: OmpThreadNum,
    panicked: AtomicBool,
}

impl OpenMpPass<'_> {
    /// Takes the next task of run `r` from its start (`from_end` false) or its end, unless
    /// none is left.
    fn take(&self, r: usize, from_end: bool) -> Option<usize> {
        let (start, end) = (self.bounds[r], self.bounds[r + 1]);
        let step = if from_end { 1 << 32 } else { 1 };
        let taken = &self.taken[r];
        let mut current = taken.load(Ordering::Relaxed);
        loop {
            let (front, back) = ((current & 0xffff_ffff) as usize, (current >> 32) as usize);
            if front + back >= end - start {
                return None;
            }
            match taken.compare_exchange_weak(
                current,
                current + step,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(if from_end {
                        end - 1 - back
                    } else {
                        start + front
                    });
                }
                Err(now) => current = now,
            }
        }
    }

    fn run_member(&self, member: usize) {
        let runs = self.bounds.len() - 1;
        let own = member % runs;
        while let Some(i) = self.take(own, false) {
            (self.task)(i);
        }
        for r in (1..runs).map(|d| (own + d) % runs) {
            while let Some(i) = self.take(r, true) {
                (self.task)(i);
            }
        }
    }
}

/// The body each member of the team runs; a panic must not unwind into libgomp.
unsafe extern "C" fn openmp_member(data: *mut std::ffi::c_void) {
    // SAFETY: `data` is the `OpenMpPass` of `run_on_openmp`, alive until GOMP_parallel returns.
    let pass = unsafe { &*data.cast::<OpenMpPass>() };
    // SAFETY: called on a member of the team GOMP_parallel started.
    let member = unsafe { (pass.thread_num)() }.max(0) as usize;
    if catch_unwind(AssertUnwindSafe(|| pass.run_member(member))).is_err() {
        pass.panicked.store(true, Ordering::SeqCst);
    }
}

/// [`Context::for_each`] on a team of the process's OpenMP threads. The team's threads are
/// already awake when the runtime has just run a parallel region (its workers spin a while
/// after each); the region ends when every member has returned.
fn run_on_openmp(omp: OpenMp, workers: usize, n: usize, task: &(dyn Fn(usize) + Sync)) {
    // Each run's two counts share a 64-bit word.
    assert!(n < 1 << 32, "{n} tasks in one pass");
    let pass = OpenMpPass {
        taken: (0..workers).map(|_| AtomicU64::new(0)).collect(),
        bounds: (0..=workers).map(|r| r * n / workers).collect(),
        task,
        thread_num: omp.thread_num,
        panicked: AtomicBool::new(false),
    };
    let data = (&pass as *const OpenMpPass).cast_mut().cast();
    // SAFETY: `openmp_member` only reads `pass` through `data`, which outlives the region.
    unsafe { (omp.parallel)(openmp_member, data, workers as std::ffi::c_uint, 0) };
    if pass.panicked.load(Ordering::SeqCst) {
        resume_unwind(Box::new("a task panicked on an OpenMP thread"));
    }
}

/// The shared state of one [`Context::for_each`] pass.
#[derive(Default)]
struct Claims {
    /// The next unclaimed task.
    next: AtomicUsize,
    /// Helpers inside the pass (that may call the task).
    active: AtomicUsize,
    /// Set by the caller once it has run out of tasks: a helper arriving later leaves.
    closed: AtomicBool,
    panicked: AtomicBool,
}

impl Claims {
    /// Runs runs of tasks claimed in index order until none is left. A claim takes a share of
    /// what is left (guided scheduling: `left / (2 * workers)`, at least one), so a worker
    /// streams long runs of adjacent tasks — adjacent state slots for a decode — while the
    /// last claims stay small enough to balance.
    fn run(&self, task: &(dyn Fn(usize) + Sync), n: usize, workers: usize) {
        let mut next = self.next.load(Ordering::Relaxed);
        loop {
            if next >= n {
                return;
            }
            let take = ((n - next) / (2 * workers)).max(1);
            match self.next.compare_exchange_weak(
                next,
                next + take,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    (next..next + take).for_each(task);
                    next = self.next.load(Ordering::Relaxed);
                }
                Err(current) => next = current,
            }
        }
    }
}

/// How a worker shares out the `helpers` it must start: it wakes one helper per nonzero entry,
/// and the helper woken for entry `k` starts the other `k - 1` itself, shared out the same way.
/// A binary tree: the last of P workers starts after about 2 log2(P) wake-ups, not P - 1 in a
/// row on the calling thread (the bench's `--simulate-threads` replays the same tree).
pub fn helper_tree(helpers: usize) -> [usize; 2] {
    let first = helpers.div_ceil(2);
    [first, helpers - first]
}

/// What a helper of one pass needs: the claims, the task, and the pass's size.
#[derive(Clone)]
struct HelperPass {
    claims: Arc<Claims>,
    job: SharedJob,
    n: usize,
    workers: usize,
}

impl HelperPass {
    /// Starts a helper through `spawn` that starts `helpers - 1` more (see [`helper_tree`]),
    /// then claims tasks with the others. Nothing when `helpers` is 0.
    fn launch(&self, helpers: usize, spawn: &dyn Fn(Box<dyn FnOnce() + Send>)) {
        if helpers == 0 {
            return;
        }
        let pass = self.clone();
        spawn(Box::new(move || {
            let claims = &pass.claims;
            claims.active.fetch_add(1, Ordering::SeqCst);
            if !claims.closed.load(Ordering::SeqCst) {
                // On a pool thread, `rayon::spawn` queues to this pool (the thread's own).
                for more in helper_tree(helpers - 1) {
                    pass.launch(more, &|helper| rayon::spawn(helper));
                }
                let job = pass.job;
                let run = || claims.run(job.0, pass.n, pass.workers);
                if catch_unwind(AssertUnwindSafe(run)).is_err() {
                    claims.panicked.store(true, Ordering::SeqCst);
                }
            }
            claims.active.fetch_sub(1, Ordering::SeqCst);
        }));
    }
}

/// The task of a pass, handed to the helpers (see the lifetime argument in `for_each`).
#[derive(Clone, Copy)]
struct SharedJob(&'static (dyn Fn(usize) + Sync));

/// A raw pointer that tasks may share; the kernel that creates one proves the tasks touch
/// disjoint memory.
#[derive(Clone, Copy, Debug)]
pub struct SharedPtr<T>(pub *mut T);

// SAFETY: only a pointer value; every dereference is justified where it happens.
unsafe impl<T> Send for SharedPtr<T> {}
unsafe impl<T> Sync for SharedPtr<T> {}

impl<T> SharedPtr<T> {
    #[inline(always)]
    pub fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn one_thread_runs_inline_in_order() {
        let ctx = Context::new(1);
        let caller = std::thread::current().id();
        let order = std::sync::Mutex::new(Vec::new());
        ctx.for_each(5, |i| {
            assert_eq!(std::thread::current().id(), caller);
            order.lock().unwrap().push(i);
        });
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        assert!(
            ctx.pool.get().is_none(),
            "a 1-thread context must not build a pool"
        );
    }

    #[test]
    fn pool_is_private_and_runs_every_task() {
        let ctx = Context::new(3);
        let caller = std::thread::current().id();
        let hits = AtomicUsize::new(0);
        ctx.for_each(100, |_| {
            let on_pool = std::thread::current()
                .name()
                .unwrap_or("")
                .starts_with("ssmk-");
            assert!(on_pool || std::thread::current().id() == caller);
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 100);
        assert_eq!(ctx.pool().map(|p| p.current_num_threads()), Some(2));
    }

    #[test]
    fn helper_tree_starts_each_helper_once_in_few_rounds() {
        /// Helpers started by a worker that must start `k`, and the rounds of wake-ups it takes.
        fn started(k: usize) -> (usize, usize) {
            helper_tree(k)
                .into_iter()
                .enumerate()
                .filter(|&(_, part)| part > 0)
                .map(|(i, part)| {
                    let (more, rounds) = started(part - 1);
                    (1 + more, i + 1 + rounds)
                })
                .fold((0, 0), |(n, r), (m, q)| (n + m, r.max(q)))
        }
        for k in 0..200 {
            let (n, rounds) = started(k);
            assert_eq!(n, k, "{k} helpers");
            assert!(rounds <= 2 * (k + 1).ilog2() as usize + 1, "{k}: {rounds}");
        }
    }

    #[test]
    fn a_wide_pool_wakes_helpers_through_helpers() {
        // The caller wakes two helpers itself; more threads than three at work means helpers
        // woke helpers. Tasks sleep, so every thread gets a core even on a small machine.
        let ctx = Context::new(8);
        let seen = std::sync::Mutex::new(std::collections::HashSet::new());
        let hits = AtomicUsize::new(0);
        ctx.for_each(64, |_| {
            std::thread::sleep(std::time::Duration::from_millis(2));
            seen.lock().unwrap().insert(std::thread::current().id());
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 64);
        let threads = seen.lock().unwrap().len();
        assert!((4..=8).contains(&threads), "{threads} threads ran tasks");
    }

    #[test]
    fn caller_does_not_wait_for_a_busy_helper() {
        let ctx = Context::new(2);
        let pool = ctx.pool().expect("a pool");
        // The only helper is held until the pass is over: the caller must run every task.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (started, wait_started) = std::sync::mpsc::channel::<()>();
        pool.spawn(move || {
            started.send(()).unwrap();
            held.recv().unwrap();
        });
        wait_started.recv().unwrap();
        let caller = std::thread::current().id();
        let on_caller = AtomicUsize::new(0);
        ctx.for_each(50, |_| {
            if std::thread::current().id() == caller {
                on_caller.fetch_add(1, Ordering::Relaxed);
            }
        });
        assert_eq!(on_caller.load(Ordering::Relaxed), 50);
        release.send(()).unwrap();
        // The helper's late arrival finds the pass closed; a new pass still works.
        let hits = AtomicUsize::new(0);
        ctx.for_each(50, |_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 50);
    }

    #[test]
    fn a_task_panic_reaches_the_caller() {
        let ctx = Context::new(2);
        for bad in [0, 37] {
            let ran = AtomicUsize::new(0);
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                ctx.for_each(64, |i| {
                    ran.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(std::time::Duration::from_micros(50));
                    assert!(i != bad, "task {i}");
                })
            }));
            assert!(result.is_err(), "the panic of task {bad} was lost");
        }
    }

    #[test]
    fn small_work_stays_on_the_calling_thread() {
        let ctx = Context::new(2);
        let caller = std::thread::current().id();
        let on_caller = |bytes: usize| {
            let hits = AtomicUsize::new(0);
            ctx.for_each_moving(8, bytes, |_| {
                // Long enough for the helper to wake and take some.
                std::thread::sleep(std::time::Duration::from_millis(2));
                if std::thread::current().id() == caller {
                    hits.fetch_add(1, Ordering::Relaxed);
                }
            });
            hits.load(Ordering::Relaxed)
        };
        assert_eq!(on_caller(MIN_PARALLEL_BYTES - 1), 8);
        assert!(with_every_call_parallel(|| on_caller(1)) < 8);
        assert!(
            on_caller(MIN_PARALLEL_BYTES) < 8,
            "large work runs on the pool"
        );
    }

    #[test]
    fn recording_runs_inline_and_keeps_every_pass() {
        let ctx = Context::recording(64);
        assert_eq!(ctx.threads(), 64);
        let caller = std::thread::current().id();
        let seen = std::sync::Mutex::new(Vec::new());
        ctx.for_each(3, |i| {
            assert_eq!(std::thread::current().id(), caller);
            seen.lock().unwrap().push(i);
        });
        ctx.for_each(1, |i| seen.lock().unwrap().push(10 + i));
        assert_eq!(*seen.lock().unwrap(), vec![0, 1, 2, 10]);
        let passes = ctx.take_passes();
        let tasks: Vec<usize> = passes.iter().map(|p| p.task_seconds.len()).collect();
        assert_eq!(tasks, vec![3, 1]);
        assert!(ctx.take_passes().is_empty());
        assert!(ctx.pool.get().is_none(), "a recording context runs no pool");
        assert!(Context::new(4).take_passes().is_empty());
    }
}
