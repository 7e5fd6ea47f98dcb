//! Gated DeltaNet (ABI.md §4.3–4.4): the gating pre-pass and the gated delta rule for prefill,
//! decode and speculative decode.
//!
//! Three implementations of one recurrence per (sequence, v-head):
//! `S_t = a_t S_{t-1} + k_t (x) beta_t (v_t - (a_t S_{t-1})^T k_t)`, `o_t = scale * S_t^T q_t`,
//! where `a_t` is one decay per v-head (Gated DeltaNet, `g` `[T, HV]`) or one per key channel,
//! scaling row `i` of the state (Kimi Delta Attention, `g` `[T, HV, K]`).
//! - [`reference`]: the per-token recurrence in f64, the crate's oracle (`Isa::Scalar`).
//! - `recurrent`: the same recurrence in f32 SIMD, for decodes, speculative sequences and short
//!   prefills. Columns of the state evolve independently, so it keeps a `K x 2*LANES` column block
//!   in L1 and runs every token over it: the state is streamed from memory once per call.
//! - `chunked`: the WY form with chunks of [`CHUNK`] tokens for long prefills, as small GEMMs. Pass 1
//!   (parallel over (chunk, q/k head)) builds every chunk's state-independent pieces; pass 2
//!   (parallel over (sequence, v-head)) runs the chunks of one sequence in order through the state.
//!
//! The state is kept in f32 during a call: a narrow state is rounded once when a sequence's final
//! state is stored, and once per token in speculative mode, where every token's state is stored.

pub mod gating;
pub mod reference;

#[cfg(target_arch = "x86_64")]
mod chunked;
#[cfg(target_arch = "x86_64")]
mod gemm;
#[cfg(target_arch = "x86_64")]
mod recurrent;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::kernels::simd::Simd;
use crate::runtime::{Context, Isa};

/// Tokens per chunk of the WY form.
pub(crate) const CHUNK: usize = 64;

/// Sequences shorter than this take the recurrence even in prefill (measured crossover).
pub(crate) const RECURRENT_MAX_LEN: usize = 24;

/// How many tokens ahead the strided q/k/v/out rows are prefetched.
pub(crate) const PREFETCH_TOKENS: usize = 8;

/// A strided float (or f32-only) tensor of caller memory: base address, dtype and per-dimension
/// strides in elements. Built from a validated `View`, so every index inside the validated shape
/// is in bounds.
#[derive(Clone, Copy, Debug)]
pub struct Strided {
    pub ptr: *mut u8,
    pub dtype: DType,
    pub strides: [usize; 4],
}

// SAFETY: a description of caller memory; the kernels prove their tasks touch disjoint outputs.
unsafe impl Send for Strided {}
unsafe impl Sync for Strided {}

impl Strided {
    /// Address of element `index` (up to four dimensions).
    #[inline(always)]
    pub fn at(&self, index: &[usize]) -> *mut u8 {
        let mut off = 0usize;
        for (i, s) in index.iter().zip(&self.strides) {
            off += i * s;
        }
        self.ptr.wrapping_add(off * self.dtype.size())
    }
}

/// Reads one element as f32.
///
/// # Safety
/// `p` must point to a readable, aligned element of `dtype` (a float dtype).
#[inline(always)]
pub unsafe fn read_f32(p: *const u8, dtype: DType) -> f32 {
    unsafe {
        match dtype {
            DType::F32 => p.cast::<f32>().read(),
            DType::BF16 => p.cast::<half::bf16>().read().to_f32(),
            DType::F16 => Element::to_f32(p.cast::<half::f16>().read()),
            other => unreachable!("float element of dtype {other:?}"),
        }
    }
}

/// Writes one element, rounded to nearest even for narrow dtypes.
///
/// # Safety
/// `p` must point to a writable, aligned element of `dtype` (a float dtype).
#[inline(always)]
pub unsafe fn write_f32(p: *mut u8, dtype: DType, x: f32) {
    unsafe {
        match dtype {
            DType::F32 => p.cast::<f32>().write(x),
            DType::BF16 => p
                .cast::<half::bf16>()
                .write(<half::bf16 as Element>::from_f32(x)),
            DType::F16 => p
                .cast::<half::f16>()
                .write(<half::f16 as Element>::from_f32(x)),
            other => unreachable!("float element of dtype {other:?}"),
        }
    }
}

/// Loads `dst.len()` elements spaced `stride` apart as f32.
///
/// # Safety
/// Every element `p + i*stride` (`i < dst.len()`) must be readable.
#[inline(always)]
pub unsafe fn load_row(p: *const u8, dtype: DType, stride: usize, dst: &mut [f32]) {
    let size = dtype.size();
    unsafe {
        match (dtype, stride) {
            (DType::F32, 1) => {
                std::ptr::copy_nonoverlapping(p.cast::<f32>(), dst.as_mut_ptr(), dst.len())
            }
            (DType::BF16, 1) => {
                let src = std::slice::from_raw_parts(p.cast::<u16>(), dst.len());
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = f32::from_bits((s as u32) << 16);
                }
            }
            _ => {
                for (i, d) in dst.iter_mut().enumerate() {
                    *d = read_f32(p.add(i * stride * size), dtype);
                }
            }
        }
    }
}

/// Stores `src` to elements spaced `stride` apart, rounding to `dtype`.
///
/// # Safety
/// Every element `p + i*stride` (`i < src.len()`) must be writable.
#[inline(always)]
pub unsafe fn store_row(p: *mut u8, dtype: DType, stride: usize, src: &[f32]) {
    let size = dtype.size();
    unsafe {
        match (dtype, stride) {
            (DType::F32, 1) => {
                std::ptr::copy_nonoverlapping(src.as_ptr(), p.cast::<f32>(), src.len())
            }
            (DType::BF16, 1) => {
                let dst = std::slice::from_raw_parts_mut(p.cast::<u16>(), src.len());
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = crate::dtype::f32_to_bf16_bits(s);
                }
            }
            _ => {
                for (i, &s) in src.iter().enumerate() {
                    write_f32(p.add(i * stride * size), dtype, s);
                }
            }
        }
    }
}

/// Where a live sequence's states go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateWrite {
    /// `state` is NULL: nothing is written.
    Nothing,
    /// The final state is written to this slot.
    Final(usize),
    /// Speculative mode: the state after token `t` is written to slot `slots[t]`.
    PerToken(Vec<usize>),
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
}

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

    /// Loads q (normalised, times `scale`) and k (normalised) of `token` and head `h` as f32.
    ///
    /// # Safety
    /// `token < T`, `h < H`, `q_row.len() == k_row.len() == K`.
    #[inline(always)]
    pub(crate) unsafe fn load_qk(
        &self,
        token: usize,
        h: usize,
        q_row: &mut [f32],
        k_row: &mut [f32],
    ) {
        self.prefetch_qk(token + PREFETCH_TOKENS, h);
        unsafe {
            load_row(
                self.q.at(&[token, h]),
                self.q.dtype,
                self.q.strides[2],
                q_row,
            );
            load_row(
                self.k.at(&[token, h]),
                self.k.dtype,
                self.k.strides[2],
                k_row,
            );
        }
        let (mut q_scale, mut k_scale) = (self.scale, 1.0f32);
        if let Some(eps) = self.l2norm_eps {
            q_scale /= (sum_squares(q_row) + eps).sqrt();
            k_scale = 1.0 / (sum_squares(k_row) + eps).sqrt();
        }
        q_row.iter_mut().for_each(|x| *x *= q_scale);
        if k_scale != 1.0 {
            k_row.iter_mut().for_each(|x| *x *= k_scale);
        }
    }

    /// Prefetches the q/k rows of `token` for head `h`, if in range.
    #[inline(always)]
    pub(crate) fn prefetch_qk(&self, token: usize, h: usize) {
        if token < self.tokens && self.q.strides[2] == 1 && self.k.strides[2] == 1 {
            prefetch(self.q.at(&[token, h]), self.k_dim * self.q.dtype.size());
            prefetch(self.k.at(&[token, h]), self.k_dim * self.k.dtype.size());
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

/// `out[i] = exp(x[i])` with the vector exp (a zero-padded vector for the tail).
///
/// # Safety
/// The CPU supports `S`; `x.len() == out.len()`.
#[inline(always)]
pub(crate) unsafe fn exp_into<S: Simd>(x: &[f32], out: &mut [f32]) {
    let l = S::LANES;
    let n = x.len();
    debug_assert!(out.len() == n && l <= 16);
    let mut i = 0;
    unsafe {
        while i + l <= n {
            S::store_f32(
                out.as_mut_ptr().add(i),
                S::exp(S::load_f32(x.as_ptr().add(i))),
            );
            i += l;
        }
        if i < n {
            let mut buf = [0f32; 16];
            buf[..n - i].copy_from_slice(&x[i..]);
            let mut res = [0f32; 16];
            S::store_f32(res.as_mut_ptr(), S::exp(S::load_f32(buf.as_ptr())));
            out[i..].copy_from_slice(&res[..n - i]);
        }
    }
}

/// Asks for the cache lines of `[p, p + bytes)` ahead of use: token rows of q/k/v/out are a page
/// apart, where the hardware prefetchers stop. Never faults, whatever the address.
#[inline(always)]
pub(crate) fn prefetch(p: *const u8, bytes: usize) {
    prefetch_lines::<PREFETCH_L1>(p, bytes)
}

/// Like [`prefetch`], into L2 only (for data needed a while later).
#[inline(always)]
pub(crate) fn prefetch_l2(p: *const u8, bytes: usize) {
    prefetch_lines::<PREFETCH_L2>(p, bytes)
}

#[cfg(target_arch = "x86_64")]
const PREFETCH_L1: i32 = std::arch::x86_64::_MM_HINT_T0;
#[cfg(target_arch = "x86_64")]
const PREFETCH_L2: i32 = std::arch::x86_64::_MM_HINT_T1;
#[cfg(not(target_arch = "x86_64"))]
const PREFETCH_L1: i32 = 0;
#[cfg(not(target_arch = "x86_64"))]
const PREFETCH_L2: i32 = 0;

/// Prefetches every line of `[p, p + bytes)` with hint `HINT`.
#[inline(always)]
fn prefetch_lines<const HINT: i32>(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..bytes).step_by(64) {
        // SAFETY: prefetch is a hint; it never faults.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(p.wrapping_add(off).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}

/// Sum of squares in f32 with four partial sums (a fixed order, so deterministic).
#[inline(always)]
pub(crate) fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            acc[i] += c[i] * c[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &t in tail {
        s += t * t;
    }
    s
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
    /// Runs `f` with every `ssmk_gated_delta_rule` call it makes on this thread taking `self`.
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
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        return unsafe { x86::gated_delta_rule(ctx, isa, path, args) };
    }
    let _ = (path, isa);
    unsafe { reference::gated_delta_rule(ctx, args) };
    Ok(())
}
