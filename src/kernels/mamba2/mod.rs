//! Mamba-2's selective-state scan (ABI.md §4.9) for prefill, decode and speculative decode.
//!
//! One recurrence per (sequence, head `h`), with `d_t` the token's step (`dt + dt_bias`, softplus,
//! clamp) and `a_t = exp(d_t A[h])`:
//! `h_t = a_t h_{t-1} + d_t x_t (x) B_t` (`P x N`), `y_t = h_t C_t + D[h] x_t`, `y_t *= silu(z_t)`.
//! With `A` of shape `[NH, N]` (Mamba-1) the decay is per state channel: `exp(d_t A[h][n])`
//! scales column `n` of the state.
//! - [`reference`](mod@reference): the per-token recurrence in f64, the crate's oracle (`Isa::Scalar`).
//! - `recurrent`: the recurrence in f32 SIMD for decodes, speculative and short sequences. Rows
//!   `p` of the state evolve independently, so each row runs every token while it sits in L1: the
//!   state is streamed from memory once per call (once per token written in speculative mode).
//! - `channels`: scans with one channel per head (`P = 1`, Mamba-1's `d_inner` channels), the
//!   channels in SIMD lanes, for every kind of sequence.
//! - `chunked`: the SSD form with chunks of `CHUNK` tokens, as small GEMMs. Pass 1 (parallel
//!   over (chunk, group)) builds `C B^T`, shared by the group's heads; pass 2 (parallel over
//!   (sequence, head)) runs the chunks of one sequence in order through the state.
//!
//! The state is kept in f32 during a call: a narrow state is rounded once when a sequence's final
//! state is stored, and once per token in speculative mode.

pub mod reference;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod channels;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod chunked;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod recurrent;

// Before the architecture files: they instantiate its `mamba2_entry_points!`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[macro_use]
mod driver;

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::dtype::DType;
use crate::error::Result;
use crate::kernels::gdn::gating::softplus;
use crate::kernels::strided::{Strided, load_row, read_f32};
use crate::kernels::{Path, Sequence};
use crate::runtime::{Context, Isa};

/// Tokens per chunk of the SSD form. The intra-chunk product `(C B^T o L) (d x)` costs `CHUNK * P`
/// FLOPs per token and head, the state terms `4 P N` whatever the chunk, so shorter chunks save
/// work; 64 keeps every GEMM's depth long enough to run near the FMA peak.
pub(crate) const CHUNK: usize = 64;

/// Sequences shorter than this take the recurrence even in prefill (measured crossover).
pub(crate) const RECURRENT_MAX_LEN: usize = 16;

/// A validated `ssmk_mamba2_scan` call. Shapes: x, z, out `[T, NH, P]`, dt `[T, NH]`, B, C
/// `[T, G, N]`, state `[S, NH, P, N]`; the per-head constants are read once into f32 vectors.
#[derive(Clone, Debug)]
pub struct Scan {
    /// Packed tokens T.
    pub tokens: usize,
    /// Heads NH, head dim P, groups G, state size N.
    pub heads: usize,
    pub head_dim: usize,
    pub groups: usize,
    pub state_dim: usize,
    pub x: Strided,
    pub dt: Strided,
    pub b: Strided,
    pub c: Strided,
    pub z: Option<Strided>,
    pub out: Strided,
    pub state: Option<Strided>,
    /// `A[h]` (`[NH]`; empty when `A` is per state channel), `D[h]` (0 when NULL), `dt_bias[h]`
    /// (0 when NULL).
    pub a: Vec<f32>,
    /// `A` `[NH, N]` f32 (one decay rate per state channel, Mamba-1), read in place: a layer's is
    /// `8192 x 16`, and a copy per call would cost a single decode a quarter of its time.
    pub a_states: Option<Strided>,
    pub d: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// Apply softplus to `dt + dt_bias`.
    pub dt_softplus: bool,
    /// The step is clamped to `[dt_min, dt_max]` (infinities = no limit).
    pub dt_min: f32,
    pub dt_max: f32,
    pub sequences: Vec<Sequence>,
}

impl Scan {
    /// Group (of B and C) of head `h`.
    #[inline(always)]
    pub fn group(&self, h: usize) -> usize {
        h / (self.heads / self.groups)
    }

    /// The step `d` of `token`, head `h`, in f32: `dt + dt_bias`, softplus, clamp.
    ///
    /// # Safety
    /// `token < T`, `h < NH`.
    #[inline(always)]
    pub unsafe fn step(&self, token: usize, h: usize) -> f32 {
        let raw = unsafe { read_f32(self.dt.at(&[token, h]), self.dt.dtype) } + self.dt_bias[h];
        let d = if self.dt_softplus {
            softplus(raw, 1.0, 20.0)
        } else {
            raw
        };
        clamp(d, self.dt_min, self.dt_max)
    }

    /// `A` of head `h` and state channel `n`.
    #[inline(always)]
    pub fn a_at(&self, h: usize, n: usize) -> f32 {
        match &self.a_states {
            // SAFETY: `h < NH`, `n < N` are inside the validated `[NH, N]` view.
            Some(a) => unsafe { read_f32(a.at(&[h, n]), DType::F32) },
            None => self.a[h],
        }
    }

    /// Whether `A` is `[NH, N]` (per state channel).
    #[inline(always)]
    pub fn a_per_state(&self) -> bool {
        self.a_states.is_some()
    }

    /// Row `h` of a per-state-channel `A` (`N` rates) into `dst`.
    ///
    /// # Safety
    /// `h < NH`, `A` is per state channel, `dst.len() == N`.
    #[inline(always)]
    pub unsafe fn a_row(&self, h: usize, dst: &mut [f32]) {
        let a = self.a_states.as_ref().expect("A per head has no rows");
        unsafe { load_row(a.at(&[h, 0]), DType::F32, a.strides[1], dst) };
    }

    /// Bytes of one head's `[P, N]` state in the pool (f32 without a pool).
    pub fn head_state_bytes(&self) -> usize {
        self.head_dim * self.state_dim * self.state_dtype().size()
    }

    /// The state's dtype (f32 when there is none).
    pub fn state_dtype(&self) -> DType {
        self.state.as_ref().map_or(DType::F32, |s| s.dtype)
    }
}

/// `min(max(d, lo), hi)` that keeps a NaN step NaN (`f32::max` would replace it by `lo`).
#[inline(always)]
pub(crate) fn clamp<F: PartialOrd>(d: F, lo: F, hi: F) -> F {
    if d < lo {
        lo
    } else if d > hi {
        hi
    } else {
        d
    }
}

/// Runs the scan with the implementation for `isa` (`Isa::Scalar` = the f64 reference). Results
/// are bitwise identical for any thread count.
///
/// # Safety
/// `args` must describe validated memory: every index within its shape is in bounds, outputs do not
/// overlap inputs, slots written by different sequences are distinct.
pub unsafe fn mamba2_scan(ctx: &Context, isa: Isa, path: Path, args: &Scan) -> Result<()> {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if isa > Isa::Scalar {
        return unsafe { driver::mamba2_scan(ctx, isa, path, args) };
    }
    let _ = (path, isa);
    unsafe { reference::mamba2_scan(ctx, args) };
    Ok(())
}
