//! What the chunked prefill forms share (delta rule, Mamba-2 scan): which sequences of a call take
//! the chunked form, their chunks, and the chunk scratch kept per calling thread.

use std::cell::RefCell;
use std::mem::MaybeUninit;

use super::{Path, Sequence, StateWrite};
use crate::error::{Error, Result, Status};
use crate::runtime::{Context, SharedPtr};

/// One chunk: `len` tokens from packed token `start`.
#[derive(Clone, Copy, Debug)]
pub struct Chunk {
    pub start: usize,
    pub len: usize,
}

/// A call's sequences split by form.
pub struct Plan {
    /// The chunks of every chunked sequence, in order.
    pub chunks: Vec<Chunk>,
    /// `(sequence, first chunk, chunk count)` of every chunked sequence.
    pub chunked: Vec<(usize, usize, usize)>,
    /// Sequences for the recurrence (or zero rows, when padded).
    pub simple: Vec<usize>,
}

impl Plan {
    /// Sequences of at least `min_len` tokens (any length >= 1 with [`Path::Chunked`], none with
    /// [`Path::Recurrent`]) take chunks of `chunk` tokens; padded, empty and speculative ones
    /// never do (speculative mode stores every token's state).
    pub fn new(sequences: &[Sequence], path: Path, chunk: usize, min_len: usize) -> Plan {
        let mut plan = Plan {
            chunks: Vec::new(),
            chunked: Vec::new(),
            simple: Vec::new(),
        };
        for (b, seq) in sequences.iter().enumerate() {
            let eligible =
                !seq.padded && seq.len > 0 && !matches!(seq.write, StateWrite::PerToken(_));
            let chunked = eligible
                && match path {
                    Path::Auto => seq.len >= min_len,
                    Path::Recurrent => false,
                    Path::Chunked => true,
                };
            if !chunked {
                plan.simple.push(b);
                continue;
            }
            let first = plan.chunks.len();
            let mut off = 0;
            while off < seq.len {
                let len = chunk.min(seq.len - off);
                plan.chunks.push(Chunk {
                    start: seq.start + off,
                    len,
                });
                off += len;
            }
            plan.chunked.push((b, first, plan.chunks.len() - first));
        }
        plan
    }
}

/// The two passes of a chunked form over a call, in waves of `wave` of its `units` (the q/k
/// heads or groups whose pass-1 data the pass-2 tasks share), so the chunk scratch holds one
/// wave, not the whole call: per wave, pass 1 runs `pass1(first, units_in_wave, task)` for
/// `chunks * units_in_wave` tasks (the first wave also runs the `simple` tasks, the recurrent
/// and padded sequences, beside it), then pass 2 runs `pass2(first, units_in_wave, task)` for
/// `pass2_tasks(units_in_wave)` tasks.
pub struct Waves<'a> {
    pub ctx: &'a Context,
    pub chunks: usize,
    pub units: usize,
    pub wave: usize,
    pub simple_tasks: usize,
}

impl Waves<'_> {
    pub fn run(
        &self,
        pass1: impl Fn(usize, usize, usize) + Send + Sync,
        simple: impl Fn(usize) + Send + Sync,
        pass2_tasks: impl Fn(usize) -> usize,
        pass2: impl Fn(usize, usize, usize) + Send + Sync,
    ) {
        let mut first = 0;
        while first < self.units {
            let count = self.wave.min(self.units - first);
            let pass1_tasks = self.chunks * count;
            let extra = if first == 0 { self.simple_tasks } else { 0 };
            self.ctx
                .for_each(pass1_tasks + extra, |task| match task < pass1_tasks {
                    true => pass1(first, count, task),
                    false => simple(task - pass1_tasks),
                });
            self.ctx
                .for_each(pass2_tasks(count), |task| pass2(first, count, task));
            first += count;
        }
    }
}

/// One cache line of f32. Scratch and task buffers are allocated in lines, so a row of a
/// multiple of 16 floats starts on a line: a large `Vec<f32>` starts 16 bytes into a page (the
/// allocator's header), where half of all 32-byte loads straddle two lines and cost two (on
/// Zen 3 the delta rule's pass-2 GEMMs ran 28% slower from such buffers, the prefill 10%).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; LINE_FLOATS]);

const LINE_FLOATS: usize = 16;

/// Lines that hold `floats` f32.
fn lines_for(floats: usize) -> usize {
    floats.div_ceil(LINE_FLOATS)
}

/// Chunk scratch up to this size (64 MiB) stays with the calling thread for the next call.
const KEEP_SCRATCH_FLOATS: usize = 16 << 20;

thread_local! {
    /// Chunk scratch of the calling thread, kept between calls so a steady stream of prefills
    /// does not fault fresh pages in every time.
    static SCRATCH: RefCell<Vec<MaybeUninit<Line>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `body` with `floats` uninitialised f32 of scratch, starting on a cache line (the caller
/// writes every element before reading it); `kernel` names the call in the allocation error.
pub fn with_scratch(floats: usize, kernel: &str, body: impl FnOnce(SharedPtr<f32>)) -> Result<()> {
    let lines = lines_for(floats);
    SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        if scratch.len() < lines {
            scratch.clear();
            scratch.shrink_to_fit();
            scratch.try_reserve_exact(lines).map_err(|_| {
                Error::new(
                    Status::Allocation,
                    format!(
                        "{kernel}: cannot allocate {} bytes of chunk scratch",
                        floats as u128 * 4
                    ),
                )
            })?;
            scratch.resize(lines, MaybeUninit::uninit());
        }
        body(SharedPtr(scratch.as_mut_ptr().cast::<f32>()));
        if floats > KEEP_SCRATCH_FLOATS {
            // An unusually long prefill: do not keep its scratch alive between calls.
            *scratch = Vec::new();
        }
        Ok(())
    })
}

/// Per-thread task buffers up to this size (16 MiB) are kept for the next task.
const KEEP_TASK_FLOATS: usize = 4 << 20;

thread_local! {
    /// Working memory of the chunk tasks a (pool or calling) thread runs. Buffers of a few hundred
    /// KiB, allocated per task, came from fresh mmap'd pages each time: zeroing them in the kernel
    /// took a quarter of a Mamba-2 prefill.
    static TASK_BUFFER: std::cell::Cell<Vec<Line>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `floats` f32 of this thread's task buffer (zeroed by [`TaskBuffer::take`]), starting on a
/// cache line, returned to it on drop. (A guard, not a closure: closures do not inherit `#[target_feature]`, so SIMD code inside
/// one would not inline.)
pub struct TaskBuffer {
    lines: Vec<Line>,
    floats: usize,
}

impl TaskBuffer {
    pub fn take(floats: usize) -> TaskBuffer {
        let mut buf = TaskBuffer::take_reused(floats);
        buf.fill(0.0);
        buf
    }

    /// As [`TaskBuffer::take`] without the zeroing: the values are whatever this thread's last
    /// task left (or zeros), for a task that writes every element it reads. Zeroing costs as
    /// much as a short task's work (a Mamba-1 decode block's).
    pub fn take_reused(floats: usize) -> TaskBuffer {
        let mut lines = TASK_BUFFER.take();
        // Grows or shrinks to fit; added lines are zero.
        lines.resize(lines_for(floats), Line([0.0; LINE_FLOATS]));
        TaskBuffer { lines, floats }
    }
}

impl std::ops::Deref for TaskBuffer {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `lines` holds at least `floats` initialised f32.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast(), self.floats) }
    }
}

impl std::ops::DerefMut for TaskBuffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as for `deref`, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast(), self.floats) }
    }
}

impl Drop for TaskBuffer {
    fn drop(&mut self) {
        if self.lines.capacity() * LINE_FLOATS <= KEEP_TASK_FLOATS {
            TASK_BUFFER.set(std::mem::take(&mut self.lines));
        }
    }
}
