//! The math. Each family has a plain portable `reference` and SIMD variants picked once per
//! process from the active instruction set; nothing here knows about C descriptors.

pub mod chunking;
pub mod conv;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) mod decode_rows;
pub mod dplr;
pub mod gdn;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub mod gemm;
pub mod mamba2;
pub mod memory;
pub mod simd;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) mod state_blocks;
pub mod strided;

// The sequences of a recurrent-kernel call (delta rule, Mamba-2 scan), as validated by
// `ffi::sequences`: each kernel family runs them, none re-checks them.

/// Where a live sequence's states go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateWrite {
    /// `state` is NULL: nothing is written.
    Nothing,
    /// The final state is written to this slot.
    Final(usize),
    /// Speculative mode: the state after token `t` is written to slot `slots[t]` (`None`: a pad
    /// entry, not written).
    PerToken(Vec<Option<usize>>),
}

impl StateWrite {
    /// The slot the state after the sequence's first token goes to: a one-token sequence's only
    /// write.
    pub fn after_first_token(&self) -> Option<usize> {
        match self {
            StateWrite::Nothing => None,
            StateWrite::Final(slot) => Some(*slot),
            StateWrite::PerToken(slots) => slots[0],
        }
    }
}

/// A state checkpoint inside a prefill (ABI.md §4.10): the state after the sequence's first
/// `after` tokens (`1..=len`) goes to `slot` as well.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Checkpoint {
    pub after: usize,
    pub slot: usize,
}

/// One sequence of the call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sequence {
    /// Packed token range.
    pub start: usize,
    pub len: usize,
    /// Padded: output rows are zeros and no state is read or written.
    pub padded: bool,
    /// Slot the initial state is read from; `None` = zero initial state.
    pub read: Option<usize>,
    pub write: StateWrite,
    /// Checkpoints sorted by `after` (none in speculative mode, or when padded).
    pub checkpoints: Vec<Checkpoint>,
}

impl Sequence {
    /// The checkpoints taken after the sequence's first `after` tokens.
    pub fn checkpoints_after(&self, after: usize) -> &[Checkpoint] {
        let first = self.checkpoints.partition_point(|c| c.after < after);
        let end = self.checkpoints.partition_point(|c| c.after <= after);
        &self.checkpoints[first..end]
    }

    /// The checkpoints strictly inside tokens `from..to` of the sequence (`from < after < to`).
    pub fn checkpoints_inside(&self, from: usize, to: usize) -> &[Checkpoint] {
        let first = self.checkpoints.partition_point(|c| c.after <= from);
        let end = self.checkpoints.partition_point(|c| c.after < to);
        &self.checkpoints[first..end.max(first)]
    }
}

/// Bytes the recurrent (or padded) sequences `which` of a call move, for
/// [`crate::runtime::Context::for_each_moving`]: each of their `heads` states of `head_bytes` read
/// and written once, and swept once more per token after the first (in cache, but the
/// recurrence's time grows with the tokens).
pub fn recurrent_bytes(
    sequences: &[Sequence],
    which: impl Iterator<Item = usize>,
    heads: usize,
    head_bytes: usize,
) -> usize {
    let sweeps: usize = which.map(|b| sequences[b].len.max(1) + 1).sum();
    sweeps.saturating_mul(heads).saturating_mul(head_bytes)
}

/// Which algorithm long sequences take; `Auto` unless [`Path::with`] forces one, which lets tests
/// cover both on every length and lets benchmarks compare them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Auto,
    /// Every sequence takes the recurrence.
    Recurrent,
    /// Every non-speculative sequence of at least one token takes the chunked form.
    Chunked,
}

thread_local! {
    static FORCED_PATH: std::cell::Cell<Path> = const { std::cell::Cell::new(Path::Auto) };
}

impl Path {
    /// Runs `f` with every recurrent-kernel call (`ssmk_gated_delta_rule`, `ssmk_mamba2_scan`) it
    /// makes on this thread taking `self`.
    pub fn with<R>(self, f: impl FnOnce() -> R) -> R {
        /// Restores the previous path even if `f` unwinds.
        struct Restore(Path);
        impl Drop for Restore {
            fn drop(&mut self) {
                FORCED_PATH.set(self.0);
            }
        }
        let _restore = Restore(FORCED_PATH.replace(self));
        f()
    }

    /// The path this thread's calls take.
    pub fn current() -> Path {
        FORCED_PATH.get()
    }
}
