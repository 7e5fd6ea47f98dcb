//! Gated DeltaNet (ABI.md §4.3–4.4): the gating pre-pass and the gated delta rule for prefill,
//! decode and speculative decode.
//!
//! Three implementations of one recurrence per (sequence, v-head):
//! `S_t = a_t S_{t-1} + k_t (x) beta_t (v_t - (a_t S_{t-1})^T k_t)`, `o_t = scale * S_t^T q_t`,
//! where `a_t` is one decay per v-head (Gated DeltaNet, `g` `[T, HV]`) or one per key channel,
//! scaling row `i` of the state (Kimi Delta Attention, `g` `[T, HV, K]`).
//! - [`reference`](mod@reference): the per-token recurrence in f64, the crate's oracle (`Isa::Scalar`).
//! - `recurrent`: the same recurrence in f32 SIMD, for decodes, speculative sequences and short
//!   prefills. Columns of the state evolve independently, so it keeps a `K x 2*LANES` column block
//!   in L1 and runs every token over it: the state is streamed from memory once per call.
//! - `chunked`: the WY form with chunks of `CHUNK` tokens for long prefills, as small GEMMs. Pass 1
//!   (parallel over (chunk, q/k head)) builds every chunk's state-independent pieces; pass 2
//!   (parallel over (sequence, v-head)) runs the chunks of one sequence in order through the state.
//!
//! The state is kept in f32 during a call: a narrow state is rounded once when a sequence's final
//! state is stored, and once per token in speculative mode, where every token's state is stored.

pub mod gating;
pub mod reference;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod chunked;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod recurrent;

// Before the architecture files: they instantiate its `gdn_entry_points!`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[macro_use]
mod driver;

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::dtype::DType;
use crate::error::Result;
use crate::kernels::simd::{Simd, load_row_simd, scale_in_place, sum_squares};
pub use crate::kernels::strided::Strided;
pub(crate) use crate::kernels::strided::{
    load_row, prefetch, prefetch_l2, read_f32, store_row, write_f32,
};
pub use crate::kernels::{Path, Sequence, StateWrite};
use crate::runtime::{Context, Isa};

/// Tokens per chunk of the WY form.
pub(crate) const CHUNK: usize = 16;

/// Sequences shorter than this take the recurrence even in prefill (measured crossover).
pub(crate) const RECURRENT_MAX_LEN: usize = 24;

/// How many tokens ahead the strided q/k/v/out rows are prefetched.
pub(crate) const PREFETCH_TOKENS: usize = 8;

/// A validated `ssmk_gated_delta_rule` call. Shapes: q, k `[T, H, K]`, v `[T, HV, V]`, g f32
/// `[T, HV]` or `[T, HV, K]` (`per_channel`), beta `[T, HV]`, out `[T, HV, V]`, state
/// `[S, HV, K, V]`.
#[derive(Clone, Debug)]
pub struct DeltaRule {
    /// Packed tokens T.
    pub tokens: usize,
    pub heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub q: Strided,
    pub k: Strided,
    pub v: Strided,
    pub g: Strided,
    pub beta: Strided,
    pub out: Strided,
    pub state: Option<Strided>,
    /// Multiplies `S^T q` (already resolved from `<= 0`).
    pub scale: f32,
    /// `Some(eps)`: q and k are l2-normalised as `x / sqrt(sum x^2 + eps)`.
    pub l2norm_eps: Option<f32>,
    /// The v-heads of q/k head `h` are `h, h + H, h + 2H, ...` (llama.cpp's GGUF order) instead of
    /// `h * HV/H ..` (Hugging Face's and vLLM's).
    pub gqa_tiled: bool,
    /// `g` is `[T, HV, K]`: one log-decay per key channel (KDA) rather than per v-head.
    pub per_channel: bool,
    pub sequences: Vec<Sequence>,
}

impl DeltaRule {
    /// q/k head of v-head `hv`.
    #[inline(always)]
    pub fn qk_head(&self, hv: usize) -> usize {
        match self.gqa_tiled {
            true => hv % self.heads,
            false => hv / (self.v_heads / self.heads),
        }
    }

    /// Which of its q/k head's `HV/H` v-heads `hv` is (`v_head(qk_head(hv), member(hv)) == hv`).
    #[inline(always)]
    pub fn member(&self, hv: usize) -> usize {
        match self.gqa_tiled {
            true => hv / self.heads,
            false => hv % (self.v_heads / self.heads),
        }
    }

    /// v-head number `j` of q/k head `h`.
    #[inline(always)]
    pub fn v_head(&self, h: usize, j: usize) -> usize {
        match self.gqa_tiled {
            true => h + j * self.heads,
            false => h * (self.v_heads / self.heads) + j,
        }
    }

    /// Loads q (normalised, times `scale`) and k (normalised) of `token` and head `h` as f32, and
    /// returns the factors applied to the raw rows, `(q, k)`.
    ///
    /// # Safety
    /// `token < T`, `h < H`, `q_row.len() == k_row.len() == K`.
    #[inline(always)]
    pub(crate) unsafe fn load_qk<S: Simd>(
        &self,
        token: usize,
        h: usize,
        q_row: &mut [f32],
        k_row: &mut [f32],
    ) -> (f32, f32) {
        self.prefetch_qk(token + PREFETCH_TOKENS, h);
        unsafe {
            load_row_simd::<S>(
                self.q.at(&[token, h]),
                self.q.dtype,
                self.q.strides[2],
                q_row,
            );
            load_row_simd::<S>(
                self.k.at(&[token, h]),
                self.k.dtype,
                self.k.strides[2],
                k_row,
            );
        }
        let (mut q_scale, mut k_scale) = (self.scale, 1.0f32);
        if let Some(eps) = self.l2norm_eps {
            unsafe {
                q_scale /= (sum_squares::<S>(q_row) + eps).sqrt();
                k_scale = 1.0 / (sum_squares::<S>(k_row) + eps).sqrt();
            }
        }
        unsafe {
            scale_in_place::<S>(q_row, q_scale);
            if k_scale != 1.0 {
                scale_in_place::<S>(k_row, k_scale);
            }
        }
        (q_scale, k_scale)
    }

    /// Prefetches the q/k rows of `token` for head `h`, if in range.
    #[inline(always)]
    pub(crate) fn prefetch_qk(&self, token: usize, h: usize) {
        if token < self.tokens && self.q.strides[2] == 1 && self.k.strides[2] == 1 {
            prefetch(self.q.at(&[token, h]), self.k_dim * self.q.dtype.size());
            prefetch(self.k.at(&[token, h]), self.k_dim * self.k.dtype.size());
        }
    }

    /// Rows of a token that pass 1 of the chunked form reads for one q/k head: q, k, then v, g
    /// and beta of each of its v-heads.
    #[inline(always)]
    pub(crate) fn pass1_rows(&self) -> usize {
        2 + 3 * (self.v_heads / self.heads)
    }

    /// Prefetches into L2 row `row` (numbered as in [`Self::pass1_rows`]) of what pass 1 reads of
    /// `token` for q/k head `h`.
    #[inline(always)]
    pub(crate) fn prefetch_pass1_row_l2(&self, token: usize, h: usize, row: usize) {
        match row {
            0 => prefetch_l2(self.q.at(&[token, h]), self.k_dim * self.q.dtype.size()),
            1 => prefetch_l2(self.k.at(&[token, h]), self.k_dim * self.k.dtype.size()),
            _ => {
                let hv = self.v_head(h, (row - 2) / 3);
                match (row - 2) % 3 {
                    0 => prefetch_l2(self.v.at(&[token, hv]), self.v_dim * self.v.dtype.size()),
                    1 => {
                        let g_row = if self.per_channel { self.k_dim * 4 } else { 4 };
                        prefetch_l2(self.g.at(&[token, hv]), g_row)
                    }
                    _ => prefetch_l2(self.beta.at(&[token, hv]), 4),
                }
            }
        }
    }

    /// Prefetches the v row (or, with `out`, the output row) of `token`, v-head `hv`, if in range.
    #[inline(always)]
    pub(crate) fn prefetch_v(&self, token: usize, hv: usize, out: bool) {
        let t = if out { &self.out } else { &self.v };
        if token < self.tokens && t.strides[2] == 1 {
            prefetch(t.at(&[token, hv]), self.v_dim * t.dtype.size());
        }
    }

    /// `g` and `beta` of `token`, v-head `hv` (`g` of channel 0 when `per_channel`).
    ///
    /// # Safety
    /// `token < T`, `hv < HV`.
    #[inline(always)]
    pub(crate) unsafe fn gate(&self, token: usize, hv: usize) -> (f32, f32) {
        unsafe {
            (
                read_f32(self.g.at(&[token, hv]), DType::F32),
                read_f32(self.beta.at(&[token, hv]), self.beta.dtype),
            )
        }
    }

    /// The per-channel log-decays of `token`, v-head `hv` (`per_channel` only).
    ///
    /// # Safety
    /// `token < T`, `hv < HV`, `row.len() == K`.
    #[inline(always)]
    pub(crate) unsafe fn log_decays(&self, token: usize, hv: usize, row: &mut [f32]) {
        debug_assert!(self.per_channel && row.len() == self.k_dim);
        unsafe { load_row(self.g.at(&[token, hv]), DType::F32, self.g.strides[2], row) }
    }
}

/// Runs the gated delta rule with the implementation for `isa` (`Isa::Scalar` = the f64
/// reference). Results are bitwise identical for any thread count.
///
/// # Safety
/// `args` must describe validated memory: every index within its shape is in bounds, outputs do not
/// overlap inputs, slots written by different sequences are distinct.
pub unsafe fn gated_delta_rule(
    ctx: &Context,
    isa: Isa,
    path: Path,
    args: &DeltaRule,
) -> Result<()> {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if isa > Isa::Scalar {
        return unsafe { driver::gated_delta_rule(ctx, isa, path, args) };
    }
    let _ = (path, isa);
    unsafe { reference::gated_delta_rule(ctx, args) };
    Ok(())
}
