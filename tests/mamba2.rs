//! Mamba-2 selective-state scan: `ssmk_mamba2_scan` (ABI.md §4.9) against an independent f64
//! per-token reference written here, on the recurrent and the chunked (SSD) path at every ISA
//! level, plus prefill splits, mixed batches, speculative mode, padding, NULL arguments,
//! zero-length sequences, strided views, thread-count determinism and every rejected input.
//!
//! Data are realistic: `A = -exp(U(ln 1, ln 16))` per head; `d` about 1e-3..0.1 per token (with
//! the softplus flag `dt_bias = ln(e^d0 - 1)` for `d0` log-uniform in [1e-3, 0.1] and raw
//! `dt ~ N(0, 0.5)`; without it `dt` is `d0 * e^N(0, 0.5)` directly); x, B, C ~ U[-1, 1],
//! z ~ U[-3, 3], D ~ U[-1, 1], initial states U[-0.5, 0.5]. One family drives `A d` to about -20
//! per token on half the heads (decays that underflow within a chunk), one feeds softplus raw
//! `dt` over [-100, 100] (across its threshold of 20 and past f32 `exp` overflow), and both have
//! a head that decays hard for most of each chunk and then softly (see [`hard_then_soft`]).
//!
//! Tolerances, from the storage rounding of each dtype plus f32 accumulation over ~1000 tokens
//! (a state carries up to ~1/(1-a) decayed terms, so the terms are relative):
//! - state, `|got - want| <= atol + rtol * |want|`: f32 1e-4 + 1e-4 rel (about 1000 tokens of
//!   f32 decay and accumulation; measured worst 5e-7); f16 2e-4 + 2e-3 rel (4x its half-ulp
//!   2^-11, rounded once; measured 0.17 of it); bf16 1e-3 + 8e-3 rel (2x its half-ulp 2^-8;
//!   measured 0.39 of it).
//! - out: `atol + rtol * |want| + r * s`, with atol/rtol of out's dtype as above and `s =
//!   |silu(z)| * ||h_t[p] o C_t||_2` the size of the N state terms the output sums: the output's
//!   error grows with its terms, not with their possibly cancelling sum. `r` is f32's 1e-4, or the
//!   state dtype's rtol where the output is computed from a state rounded inside the call's span
//!   (speculative mode, which rounds after every token; a prefill split over two calls). Measured
//!   worst: f32 0.017 of the bound, f16 0.24, bf16 0.47 (a single rounding of out is at most 0.49).
//!   The plain-call bound assumes what the kernel documents: a narrow state is kept in f32 during
//!   a call and rounded once when stored. The ABI would also allow one rounding per 64-token
//!   chunk; simulated in the reference, that uses up to 2.8x this output bound on the 1100-token
//!   bf16-state case (slow heads swamp their per-chunk increments), so such a kernel would need
//!   `r` = the state's rtol times ~4 for long prefills.
//! - A prefill split over two calls against one call: twice the above.
//!
//! Set `MAMBA2_REPORT=1` (with `--nocapture`) to print the fraction of the bound each case uses.
mod common;

use std::collections::HashMap;

use common::recurrent::{
    PAD, RecurrentCall, RefSeq, SeqArgs, Tol, Worst, Written, check_checkpoint_errors,
    check_checkpoints, check_out, check_state_pool, checkpoint_tables, cu_seqlens, fill_with,
    one_call_per_sequence, plain_seqs, ptr, ptr_mut, reversed_slots, run_every_isa, run_reference,
    set_slots, shuffled_slots, slot_table, spec_seqs, tol, values,
};
use common::{Ctx, Rng, SEQ_LEN_LISTS, Tensor, assert_error};
use ssmk::dtype::DType;
use ssmk::ffi::context::ssmk_context;
use ssmk::ffi::mamba2::{SSMK_MAMBA2_DT_SOFTPLUS, ssmk_mamba2_scan};
use ssmk::ffi::status::*;
use ssmk::kernels::Path;
use ssmk::runtime::with_every_call_parallel;
use ssmk::tensor::ssmk_tensor;

const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

fn report() -> bool {
    std::env::var("MAMBA2_REPORT").is_ok()
}

/// How the per-token step sizes `d` are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Decays {
    /// `d` about 1e-3..0.1, `A d` down to about -1.6.
    Normal,
    /// Even heads: `d0` log-uniform in [0.3, 1.25], so `A d` reaches about -20 per token.
    Large,
    /// Softplus input (`dt + dt_bias`) over [-100, 100] and `A` down to -1e-3.
    Extreme,
}

/// What a case turns on, and the dtype of each tensor.
#[derive(Clone, Copy, Debug)]
struct Opts {
    x: DType,
    dt: DType,
    bc: DType,
    zt: DType,
    /// `None`: `state` NULL.
    state: Option<DType>,
    d: bool,
    z: bool,
    bias: bool,
    softplus: bool,
    clamp: bool,
    decays: Decays,
    /// `A` of shape `[NH, N]` (one rate per state channel, Mamba-1) instead of `[NH]`.
    a_per_state: bool,
}

impl Opts {
    /// Every option on, no clamp.
    fn all(act: DType, state: DType) -> Opts {
        Opts {
            x: act,
            dt: act,
            bc: act,
            zt: act,
            state: Some(state),
            d: true,
            z: true,
            bias: true,
            softplus: true,
            clamp: false,
            decays: Decays::Normal,
            a_per_state: false,
        }
    }

    /// Case `n` of a rotation: the five on/off options are the bits of `n % 32`, the dtypes of
    /// x, dt, B/C, z and the state rotate at different rates.
    fn rotate(n: usize) -> Opts {
        let bits = n % 32;
        Opts {
            x: FLOATS[(n / 3) % 3],
            dt: FLOATS[(n / 5) % 3],
            bc: FLOATS[(2 * n / 3) % 3],
            zt: FLOATS[(2 * n / 5) % 3],
            state: Some(FLOATS[(3 * n / 5) % 3]),
            d: bits & 1 != 0,
            z: bits & 2 != 0,
            bias: bits & 4 != 0,
            softplus: bits & 8 != 0,
            clamp: bits & 16 != 0,
            decays: Decays::Normal,
            a_per_state: false,
        }
    }
}

/// One call's tensors.
#[derive(Clone)]
struct Scan {
    t: usize,
    nh: usize,
    p: usize,
    g: usize,
    n: usize,
    x: Tensor,
    dt: Tensor,
    a: Tensor,
    b: Tensor,
    c: Tensor,
    d: Option<Tensor>,
    z: Option<Tensor>,
    dt_bias: Option<Tensor>,
    dt_min: f32,
    dt_max: f32,
    flags: u32,
    state: Option<Tensor>,
    cu: Option<Tensor>,
    idx: Option<Tensor>,
    init: Option<Tensor>,
    accepted: Option<Tensor>,
    ckpt_offsets: Option<Tensor>,
    ckpt_slots: Option<Tensor>,
    out: Tensor,
}

/// Uniform in `[lo, hi)`.
fn uniform(rng: &mut Rng, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * rng.uniform()
}

/// Standard normal (Box-Muller).
fn gauss(rng: &mut Rng) -> f64 {
    let u = 1.0 - rng.uniform(); // (0, 1]
    let v = rng.uniform();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// `x` with `softplus(x) = d`.
fn softplus_inv(d: f64) -> f64 {
    d.exp_m1().ln()
}

fn filled(dtype: DType, shape: &[usize], rng: &mut Rng, lo: f64, hi: f64) -> Tensor {
    let mut t = Tensor::zeros(dtype, shape);
    fill_with(&mut t, |_| uniform(rng, lo, hi));
    t
}

/// The same logical tensor over storage with `strides` (elements; gaps zero).
fn restride(t: &Tensor, strides: &[usize]) -> Tensor {
    let shape: Vec<usize> = t.shape.iter().map(|&s| s as usize).collect();
    let span = shape
        .iter()
        .zip(strides)
        .map(|(&n, &s)| (n.max(1) - 1) * s)
        .sum::<usize>()
        + 1;
    let mut r = Tensor::with_layout(t.dtype, &shape, Some(strides), span);
    for idx in t.indices() {
        r.set(&idx, t.get(&idx));
    }
    r
}

impl Scan {
    /// Random inputs for `t` tokens with heads `(NH, P, G, N)` and, when `o.state` is set, a pool
    /// of `slots` random states.
    fn new(seed: u64, t: usize, dims: (usize, usize, usize, usize), o: Opts, slots: usize) -> Scan {
        let (nh, p, g, n) = dims;
        let mut rng = Rng::new(seed);
        let ln = f64::ln;
        let a_lo = if o.decays == Decays::Extreme {
            ln(1e-3)
        } else {
            0.0
        };
        let a_heads: Vec<f64> = (0..nh)
            .map(|_| -uniform(&mut rng, a_lo, ln(16.0)).exp())
            .collect();
        let d0: Vec<f64> = (0..nh)
            .map(|h| match o.decays {
                Decays::Large if h % 2 == 0 => uniform(&mut rng, ln(0.3), ln(1.25)).exp(),
                _ => uniform(&mut rng, ln(1e-3), ln(0.1)).exp(),
            })
            .collect();
        let mut a = match o.a_per_state {
            true => Tensor::zeros(DType::F32, &[nh, n]),
            false => Tensor::zeros(DType::F32, &[nh]),
        };
        // Per state channel: each head's rate times a spread of U(1/4, 1) (Mamba-1's channels
        // decay at different rates; its checkpoints start from A[h][n] = -(n + 1)).
        fill_with(&mut a, |i| match o.a_per_state {
            true => a_heads[i / n] * (0.25 + 0.75 * uniform(&mut rng, 0.0, 1.0)),
            false => a_heads[i],
        });
        let bias: Vec<f64> = (0..nh)
            .map(|h| match (o.decays, o.softplus) {
                (Decays::Extreme, _) => uniform(&mut rng, -1.0, 1.0),
                (_, true) => softplus_inv(d0[h]),
                (_, false) => 0.5 * d0[h],
            })
            .collect();
        let dt_bias = o.bias.then(|| {
            let mut b = Tensor::zeros(DType::F32, &[nh]);
            fill_with(&mut b, |h| bias[h]);
            b
        });
        let mut dt = Tensor::zeros(o.dt, &[t, nh]);
        const EDGES: [f64; 10] = [
            -100.0, -30.0, -20.5, -1.0, 19.9, 20.1, 30.0, 88.9, 95.0, 100.0,
        ];
        fill_with(&mut dt, |i| {
            let h = i % nh;
            match (o.decays, o.softplus, o.bias) {
                (Decays::Extreme, _, _) => {
                    if rng.uniform() < 0.5 {
                        uniform(&mut rng, -100.0, 100.0)
                    } else {
                        EDGES[rng.below(EDGES.len())]
                    }
                }
                (_, true, true) => 0.5 * gauss(&mut rng),
                (_, true, false) => softplus_inv(d0[h]) + 0.5 * gauss(&mut rng),
                (_, false, true) => 0.5 * d0[h] * (0.5 * gauss(&mut rng)).exp(),
                (_, false, false) => d0[h] * (0.5 * gauss(&mut rng)).exp(),
            }
        });
        let (dt_min, dt_max) = match (o.clamp, o.decays) {
            (false, _) => (f32::NEG_INFINITY, f32::INFINITY),
            (true, Decays::Normal) => (2e-3, 0.08),
            (true, Decays::Large) => (2e-3, 1.0),
            (true, Decays::Extreme) => (1e-6, 50.0),
        };
        let x = filled(o.x, &[t, nh, p], &mut rng, -1.0, 1.0);
        let b = filled(o.bc, &[t, g, n], &mut rng, -1.0, 1.0);
        let c = filled(o.bc, &[t, g, n], &mut rng, -1.0, 1.0);
        let d = o.d.then(|| filled(DType::F32, &[nh], &mut rng, -1.0, 1.0));
        let z = o.z.then(|| filled(o.zt, &[t, nh, p], &mut rng, -3.0, 3.0));
        let state = o
            .state
            .map(|st| filled(st, &[slots, nh, p, n], &mut rng, -0.5, 0.5));
        // Sentinel: rows no sequence owns must keep it.
        let out = filled(o.x, &[t, nh, p], &mut rng, 100.0, 101.0);
        Scan {
            t,
            nh,
            p,
            g,
            n,
            x,
            dt,
            a,
            b,
            c,
            d,
            z,
            dt_bias,
            dt_min,
            dt_max,
            flags: if o.softplus {
                SSMK_MAMBA2_DT_SOFTPLUS
            } else {
                0
            },
            state,
            cu: None,
            idx: None,
            init: None,
            accepted: None,
            ckpt_offsets: None,
            ckpt_slots: None,
            out,
        }
    }

    fn with_seqs(mut self, lens: &[usize]) -> Scan {
        self.cu = Some(cu_seqlens(lens));
        self
    }

    /// Calls through `f` after `m` edits the descriptors.
    fn call_mut(&mut self, m: impl FnOnce(&mut Descs), f: impl FnOnce(&Descs) -> i32) -> i32 {
        let opt = |t: &Option<Tensor>| t.as_ref().map(|t| t.desc());
        let mut d = Descs {
            x: self.x.desc(),
            dt: self.dt.desc(),
            a: self.a.desc(),
            b: self.b.desc(),
            c: self.c.desc(),
            d: opt(&self.d),
            z: opt(&self.z),
            dt_bias: opt(&self.dt_bias),
            dt_min: self.dt_min,
            dt_max: self.dt_max,
            flags: self.flags,
            state: opt(&self.state),
            cu: opt(&self.cu),
            idx: opt(&self.idx),
            init: opt(&self.init),
            accepted: opt(&self.accepted),
            ckpt_offsets: opt(&self.ckpt_offsets),
            ckpt_slots: opt(&self.ckpt_slots),
            out: self.out.desc(),
        };
        m(&mut d);
        f(&d)
    }
}

impl RecurrentCall for Scan {
    fn args(&self) -> SeqArgs<'_> {
        SeqArgs::new(&self.out, &self.state, &self.cu, &self.idx, &self.init)
    }

    fn call(&mut self, ctx: *const ssmk_context) -> i32 {
        self.call_mut(|_| {}, |d| unsafe { export(ctx, d) })
    }

    fn set_checkpoints(&mut self, offsets: Option<Tensor>, slots: Option<Tensor>) {
        (self.ckpt_offsets, self.ckpt_slots) = (offsets, slots);
    }

    fn set_sequences(&mut self, cu: Tensor, idx: Tensor, init: Tensor) {
        (self.cu, self.idx, self.init) = (Some(cu), Some(idx), Some(init));
    }
}

struct Descs {
    x: ssmk_tensor,
    dt: ssmk_tensor,
    a: ssmk_tensor,
    b: ssmk_tensor,
    c: ssmk_tensor,
    d: Option<ssmk_tensor>,
    z: Option<ssmk_tensor>,
    dt_bias: Option<ssmk_tensor>,
    dt_min: f32,
    dt_max: f32,
    flags: u32,
    state: Option<ssmk_tensor>,
    cu: Option<ssmk_tensor>,
    idx: Option<ssmk_tensor>,
    init: Option<ssmk_tensor>,
    accepted: Option<ssmk_tensor>,
    ckpt_offsets: Option<ssmk_tensor>,
    ckpt_slots: Option<ssmk_tensor>,
    out: ssmk_tensor,
}

/// The export, with every descriptor of `d`.
unsafe fn export(ctx: *const ssmk_context, d: &Descs) -> i32 {
    unsafe {
        ssmk_mamba2_scan(
            ctx,
            &d.x,
            &d.dt,
            &d.a,
            &d.b,
            &d.c,
            ptr(&d.d),
            ptr(&d.z),
            ptr(&d.dt_bias),
            d.dt_min,
            d.dt_max,
            d.flags,
            ptr_mut(&d.state),
            ptr(&d.cu),
            ptr(&d.idx),
            ptr(&d.init),
            ptr(&d.accepted),
            PAD,
            (&d.out as *const ssmk_tensor).cast_mut(),
            ptr(&d.ckpt_offsets),
            ptr(&d.ckpt_slots),
        )
    }
}

/// Expected outputs: out elements (None = untouched), the scale of each output's state term
/// (`|silu(z)| * ||h_t[p] o C_t||_2`, see [`out_bound`]) and the state of every written slot.
struct Expect {
    out: Vec<Option<f64>>,
    scale: Vec<f64>,
    states: HashMap<usize, Vec<f64>>,
}

/// The f64 per-token recurrence of ABI.md §4.9, straight from the formula.
fn reference(p: &Scan, seqs: &[RefSeq]) -> Expect {
    let (nh, pd, ng, nd) = (p.nh, p.p, p.g, p.n);
    let (x, dt, a, b, c) = (
        values(&p.x),
        values(&p.dt),
        values(&p.a),
        values(&p.b),
        values(&p.c),
    );
    let dv = p.d.as_ref().map(values);
    let z = p.z.as_ref().map(values);
    let bias = p.dt_bias.as_ref().map(values);
    let st0 = p.state.as_ref().map(values);
    let slot_len = nh * pd * nd;
    let heads_per_group = nh / ng;
    let softplus = p.flags & SSMK_MAMBA2_DT_SOFTPLUS != 0;
    let per_state = p.a.shape.len() == 2;
    let (mut out, mut scale) = (vec![None; p.t * nh * pd], vec![0.0; p.t * nh * pd]);
    let states = run_reference(seqs, st0.as_deref(), slot_len, |t, state| {
        let Some(state) = state else {
            out[t * nh * pd..][..nh * pd].fill(Some(0.0));
            return;
        };
        for h in 0..nh {
            let grp = h / heads_per_group;
            let mut d = dt[t * nh + h] + bias.as_ref().map_or(0.0, |b| b[h]);
            if softplus {
                d = if d > 20.0 { d } else { d.exp().ln_1p() };
            }
            d = d.max(p.dt_min as f64).min(p.dt_max as f64);
            let decay: Vec<f64> = (0..nd)
                .map(|j| clamped_decay(d * a[if per_state { h * nd + j } else { h }]))
                .collect();
            let bt = &b[(t * ng + grp) * nd..][..nd];
            let ct = &c[(t * ng + grp) * nd..][..nd];
            let sm = &mut state[h * pd * nd..][..pd * nd];
            for r in 0..pd {
                let e = (t * nh + h) * pd + r;
                let dx = d * x[e];
                let row = &mut sm[r * nd..][..nd];
                let (mut y, mut sq) = (0.0, 0.0);
                for j in 0..nd {
                    row[j] = decay[j] * row[j] + dx * bt[j];
                    y += row[j] * ct[j];
                    sq += (row[j] * ct[j]).powi(2);
                }
                if let Some(dv) = &dv {
                    y += dv[h] * x[e];
                }
                let mut gate = 1.0;
                if let Some(z) = &z {
                    gate = z[e] / (1.0 + (-z[e]).exp());
                }
                out[e] = Some(y * gate);
                scale[e] = sq.sqrt() * gate.abs();
            }
        }
    });
    Expect { out, scale, states }
}

/// The tolerance of `p`'s state (f32 without a pool).
fn state_tol(p: &Scan) -> Tol {
    p.state.as_ref().map_or(tol(DType::F32), |s| tol(s.dtype))
}

/// The allowed error of an output whose reference is `want` with state-term scale `scale`:
/// its dtype's tolerance plus a relative tolerance of the scale (the output is a sum of `N`
/// state terms, so accumulation errors grow with the terms, not with their possibly cancelling
/// sum). That relative tolerance is f32's, or the state's when `rounded_state`: where the output
/// is computed from a state rounded to its dtype inside the call's span (speculative decode
/// rounds after every token; a prefill split over two calls rounds at the split).
fn out_bound(p: &Scan, want: f64, scale: f64, rounded_state: bool) -> f64 {
    let t = tol(p.out.dtype);
    let st = if rounded_state {
        state_tol(p)
    } else {
        tol(DType::F32)
    };
    t.atol + t.rtol * want.abs() + st.rtol * scale
}

/// [`Tol::ratio`] for an output of `p` (its state rounded inside the call in speculative mode).
fn out_ratio(p: &Scan, got: f64, want: f64, scale: f64) -> f64 {
    let r = (got - want).abs() / out_bound(p, want, scale, p.accepted.is_some());
    if r.is_nan() { f64::INFINITY } else { r }
}

/// Byte positions of `t`'s storage that no element of its view covers.
fn gaps(t: &Tensor) -> Vec<usize> {
    let size = t.dtype.size();
    let mut covered = vec![false; t.storage.len() * 8];
    let strides = t.elem_strides();
    for idx in t.indices() {
        let off: usize = idx.iter().zip(&strides).map(|(i, s)| i * s).sum();
        for b in 0..size {
            covered[off * size + b] = true;
        }
    }
    (0..covered.len()).filter(|&i| !covered[i]).collect()
}

/// Bytes of a strided view's storage outside the view are unchanged.
fn assert_gaps_unchanged(before: &Tensor, after: &Tensor, what: &str) {
    if after.strides.is_none() {
        return;
    }
    let (b, a) = (before.bytes(), after.bytes());
    for i in gaps(after) {
        assert_eq!(a[i], b[i], "{what}: byte {i} outside the view was written");
    }
}

fn out_pos(p: &Scan, i: usize) -> String {
    let (t, r) = (i / (p.nh * p.p), i % (p.nh * p.p));
    format!("out[{t}][{}][{}]", r / p.p, r % p.p)
}

fn state_pos(p: &Scan, slot: usize, i: usize) -> String {
    let (h, r) = (i / (p.p * p.n), i % (p.p * p.n));
    format!("state[{slot}][{h}][{}][{}]", r / p.n, r % p.n)
}

/// Checks `after` against `exp`; untouched out elements and state slots (and the bytes of
/// strided storage outside each view) must keep `before`'s bits.
fn verify(before: &Scan, after: &Scan, exp: &Expect, what: &str) {
    let st = state_tol(after);
    let mut worst = Worst::new();
    let mut strict = Worst::new();
    let strict_tol = tol(after.out.dtype);
    let pos = |i| out_pos(after, i);
    check_out(&before.out, &after.out, &exp.out, what, pos, |i, g, w| {
        let scale = exp.scale[i];
        worst.add(out_ratio(after, g, w, scale), || {
            format!(
                "{} = {g} vs reference {w} (state-term scale {scale:.3e})",
                out_pos(after, i)
            )
        });
        strict.add(strict_tol.ratio(g, w), String::new);
    });
    assert_gaps_unchanged(&before.out, &after.out, what);
    let mut sworst = Worst::new();
    if let (Some(sa), Some(sb)) = (&after.state, &before.state) {
        check_state_pool(sb, sa, &exp.states, what, |slot, i, g, w| {
            sworst.add(st.ratio(g, w), || {
                format!("{} = {g} vs reference {w}", state_pos(after, slot, i))
            });
        });
        assert_gaps_unchanged(sb, sa, what);
    }
    if report() {
        eprintln!(
            "{what}: out {:.3} (without the state term: {:.3}), state {:.3}",
            worst.ratio, strict.ratio, sworst.ratio
        );
    }
    worst.check(&format!("{what}: output"), strict_tol);
    sworst.check(&format!("{what}: state"), st);
}

/// A batch of `lens` over a pool with two spare slots, slots reversed, alternate initial states.
fn batch_case(seed: u64, lens: &[usize], dims: (usize, usize, usize, usize), o: Opts) -> Scan {
    let t: usize = lens.iter().sum();
    let slots = lens.len() + 2;
    let mut p = Scan::new(seed, t, dims, o, slots).with_seqs(lens);
    let (idx, init) = reversed_slots(lens.len(), slots);
    (p.idx, p.init) = (Some(idx), Some(init));
    p
}

/// Head `h` of every sequence decays hard (`A = -16`, `d = big`) for the first 56 tokens of each
/// 64-token stretch and barely (`d = small`) for the other 8: the outputs after a run of hard
/// decays must be as accurate as the recurrence's, although the chunk's cumulative log-decay is
/// then large (a difference of two f32 cumulative sums would be off by their ulp, ~1e-4 at
/// -1100). Needs a case without softplus, dt_bias or clamp (`dt` is then `d`).
fn hard_then_soft(p: &mut Scan, h: usize, big: f64, small: f64) {
    assert!(p.flags == 0 && p.dt_bias.is_none() && p.dt_min == f32::NEG_INFINITY);
    p.a.set(&[h], -16.0);
    for s in plain_seqs(p) {
        for k in 0..s.len {
            let d = if k % 64 < 56 { big } else { small };
            p.dt.set(&[s.start + k, h], d);
        }
    }
}

/// Both paths at every SIMD level of [`Isa::under_test`] (`Isa::Scalar`, the crate's f64
/// recurrence, has one) against `exp`.
fn verify_every_isa(p: &Scan, exp: &Expect, what: &str) {
    let paths = [Path::Recurrent, Path::Chunked];
    run_every_isa(p, &paths, what, |a, what| verify(p, a, exp, what));
}

fn run_and_verify(p: &Scan, what: &str) {
    verify_every_isa(p, &reference(p, &plain_seqs(p)), what);
}

/// Heads `(NH, P, G, N)`: Mamba-2-like (8 heads of 64, one group of 128), grouped heads, three
/// groups, odd sizes below and just past SIMD widths, a group per head, many small heads.
const SHAPES: [(usize, usize, usize, usize); 7] = [
    (8, 64, 1, 128),
    (4, 32, 2, 16),
    (6, 24, 3, 40),
    (3, 5, 1, 7),
    (4, 17, 2, 33),
    (2, 64, 2, 64),
    (16, 8, 4, 16),
];

/// Every seq-len list x head shape, twice, each case taking the next combination of D, z, dt_bias,
/// softplus and a finite clamp and of the five dtypes (see [`Opts::rotate`]); both paths; one
/// pass and one case in 7 in the small-shape mode.
#[test]
fn every_isa_matches_reference() {
    let mut case = 0u64;
    for pass in 0..2 {
        for (s, &dims) in SHAPES.iter().enumerate() {
            for (l, lens) in SEQ_LEN_LISTS.iter().enumerate() {
                case += 1;
                // The second pass (other data, the next combinations) runs in the full mode only.
                if !common::sampled(case, 7) || (pass == 1 && common::small_shapes()) {
                    continue;
                }
                let o = Opts::rotate(13 * s + l + 17 * pass);
                let p = batch_case(case, lens, dims, o);
                run_and_verify(&p, &format!("lens {lens:?} dims {dims:?} {o:?}"));
            }
        }
    }
}

/// One sequence of over 1000 tokens (many chunks, state carried far): a small-head one in both
/// modes, Mamba-2-sized heads and f16 states only in the full mode.
#[test]
fn every_isa_long_sequence_matches_reference() {
    let mut cases = vec![(
        (4, 32, 2, 16),
        1037,
        Opts {
            clamp: true,
            softplus: false,
            ..Opts::all(DType::F16, DType::F32)
        },
    )];
    if !common::small_shapes() {
        cases.push(((8, 64, 1, 128), 1100, Opts::all(DType::BF16, DType::BF16)));
        cases.push((
            (6, 24, 3, 40),
            1200,
            Opts {
                z: false,
                ..Opts::all(DType::F32, DType::F16)
            },
        ));
    }
    for (i, (dims, t, o)) in cases.into_iter().enumerate() {
        let p = batch_case(50 + i as u64, &[t], dims, o);
        run_and_verify(&p, &format!("T {t} dims {dims:?} {o:?}"));
    }
}

/// `A d` down to about -20 per token on half the heads, beside ordinary heads: decays underflow
/// inside a chunk and must give zeros, never NaN or inf.
#[test]
fn every_isa_large_decays_match_reference() {
    for (i, (dims, lens, act, state, clamp)) in [
        (
            (4, 32, 2, 16),
            &[1usize, 64, 200, 3][..],
            DType::F32,
            DType::F32,
            false,
        ),
        (
            (6, 24, 3, 40),
            &[130, 1, 65],
            DType::BF16,
            DType::BF16,
            true,
        ),
        ((3, 5, 1, 7), &[273], DType::F16, DType::F16, false),
    ]
    .into_iter()
    .enumerate()
    {
        let o = Opts {
            clamp,
            decays: Decays::Large,
            d: i != 1,
            ..Opts::all(act, state)
        };
        let p = batch_case(60 + i as u64, lens, dims, o);
        run_and_verify(
            &p,
            &format!("large decays lens {lens:?} dims {dims:?} {o:?}"),
        );
    }
    // 56 tokens at -20 per token, then 8 at -0.016: cumulative log-decays past -1100 in a chunk.
    for (i, act) in [DType::F32, DType::BF16].into_iter().enumerate() {
        let o = Opts {
            bias: false,
            softplus: false,
            decays: Decays::Large,
            ..Opts::all(act, DType::F32)
        };
        let mut p = batch_case(65 + i as u64, &[130, 1, 64], (4, 32, 2, 16), o);
        hard_then_soft(&mut p, 1, 1.25, 1e-3);
        run_and_verify(&p, &format!("hard then soft decays, act {act:?}"));
    }
}

/// `exp(d A)` as the header documents it: an exponent below -87.33655 (`-inf` included) acts as
/// -87.33655, the smallest normal float's exponent.
fn clamped_decay(x: f64) -> f64 {
    x.max(-87.336_55).exp()
}

/// `d A` far below the exp clamp (-87.3): -87, -1e4, -1e5, -1e30 and `-inf`. A Mamba-2 head
/// decays by about the depth for the first 56 tokens of each 64-token stretch and by -0.01 for
/// the other 8 (finite depths: the chunk's cumulative exponent reaches 56 times the depth;
/// `-inf` decays on every token), and one in ten of Mamba-1's per-channel rates is the depth:
/// every ISA on both paths against the clamped reference.
#[test]
fn every_isa_extreme_decays_match_clamped_reference() {
    for (i, depth) in [-87.0f64, -1e4, -1e5, -1e30, f64::NEG_INFINITY]
        .into_iter()
        .enumerate()
    {
        let o = Opts {
            bias: false,
            softplus: false,
            ..Opts::all(DType::BF16, DType::F32)
        };
        let mut p = batch_case(4900 + i as u64, &[1, 130, 3, 64], (4, 32, 2, 16), o);
        let soft = if depth.is_finite() {
            0.01 / -depth
        } else {
            1.0
        };
        hard_then_soft(&mut p, 1, 1.0, soft);
        p.a.set(&[1], depth);
        run_and_verify(&p, &format!("Mamba-2 d A {depth}"));
        let o = mamba1(Opts::all(DType::F32, DType::F32));
        let mut p = batch_case(4950 + i as u64, &[1, 90, 5], (37, 1, 1, 16), o);
        let mut rng = Rng::new(4950 + i as u64);
        for h in 0..37 {
            for n in 0..16 {
                if rng.below(10) == 0 {
                    p.a.set(&[h, n], depth);
                }
            }
        }
        run_and_verify(&p, &format!("Mamba-1 A {depth}"));
    }
}

/// Softplus inputs over [-100, 100] (either side of its threshold of 20, and where f32
/// `1 + e^x` overflows), `A` down to -1e-3; no limit, a finite one, and `dt_min == dt_max`.
#[test]
fn every_isa_extreme_dt_matches_reference() {
    for (i, (bias, limits)) in [
        (false, (f32::NEG_INFINITY, f32::INFINITY)),
        (true, (1e-6, 50.0)),
        (true, (0.05, 0.05)),
    ]
    .into_iter()
    .enumerate()
    {
        let o = Opts {
            bias,
            decays: Decays::Extreme,
            ..Opts::all(DType::F32, DType::F32)
        };
        let mut p = batch_case(70 + i as u64, &[1, 70, 3], (3, 8, 1, 12), o);
        (p.dt_min, p.dt_max) = limits;
        run_and_verify(&p, &format!("extreme dt, bias {bias}, limits {limits:?}"));
    }
    // 56 tokens at A d = -1600, then 8 at -0.03 (cumulative log-decays near -90000 in a chunk).
    let o = Opts {
        bias: false,
        softplus: false,
        ..Opts::all(DType::F32, DType::F32)
    };
    let mut p = batch_case(73, &[1, 70, 3], (3, 8, 1, 12), o);
    hard_then_soft(&mut p, 2, 100.0, 2e-3);
    run_and_verify(&p, "extreme hard then soft decays");
}

/// Non-compact views of every tensor: padded rows, a strided last dimension, a transposed `dt`,
/// strided per-head vectors, and states with padded slots or `[p][n]` stored transposed.
#[test]
fn every_isa_strided_views_match_reference() {
    let (nh, p, g, n) = (4, 16, 2, 24);
    for variant in 0..2 {
        let o = Opts {
            x: DType::BF16,
            dt: DType::F32,
            bc: DType::F16,
            zt: DType::BF16,
            ..Opts::all(DType::BF16, [DType::F32, DType::BF16][variant])
        };
        let mut s = batch_case(80 + variant as u64, &[2, 67, 1], (nh, p, g, n), o);
        let t = s.t;
        s.x = restride(&s.x, &[nh * (p + 4), p + 4, 1]);
        s.dt = restride(&s.dt, &[1, t]);
        s.b = restride(&s.b, &[g * 32, 32, 1]);
        s.c = restride(&s.c, &[g * n * 2, n * 2, 2]);
        s.z = Some(restride(s.z.as_ref().unwrap(), &[nh * p * 2, p * 2, 2]));
        s.a = restride(&s.a, &[2]);
        s.d = Some(restride(s.d.as_ref().unwrap(), &[3]));
        s.dt_bias = Some(restride(s.dt_bias.as_ref().unwrap(), &[5]));
        let st = s.state.as_ref().unwrap();
        s.state = Some(if variant == 0 {
            restride(st, &[nh * p * n + 40, p * n, n, 1])
        } else {
            restride(st, &[nh * p * n, p * n, 1, p])
        });
        s.out = if variant == 0 {
            restride(&s.out, &[nh * (p + 3), p + 3, 1])
        } else {
            restride(&s.out, &[nh * p * 2, p * 2, 2])
        };
        run_and_verify(&s, &format!("strided views, variant {variant}"));
    }
}

/// A prefill split over two calls (the second continuing from the state the first wrote) matches
/// one call within twice the tolerance, split at chunk multiples and elsewhere, including an
/// empty first part.
#[test]
fn two_calls_equal_one_call() {
    for (i, &(t, split)) in [
        (128, 64),
        (145, 64),
        (145, 73),
        (273, 128),
        (200, 1),
        (200, 199),
        (130, 0),
        (700, 333),
    ]
    .iter()
    .enumerate()
    {
        for (k, state) in FLOATS.into_iter().enumerate() {
            let dims = [(4, 32, 2, 16), (6, 24, 3, 40), (8, 64, 1, 128)][(i + k) % 3];
            let o = Opts {
                state: Some(state),
                ..Opts::rotate(i + 5 * k)
            };
            let one = Scan::new(300 + 3 * i as u64 + k as u64, t, dims, o, 2);
            check_split(
                one,
                split,
                &format!("T {t} split {split} dims {dims:?} {o:?}"),
            );
        }
    }
}

/// `p` (one sequence over all its tokens, from slot 1 of a 2-slot pool) run as one call and as
/// two split at token `split` agree within twice the tolerance.
fn check_split(mut one: Scan, split: usize, what: &str) {
    let t = one.t;
    one.idx = Some(Tensor::ints(DType::I32, &[1]));
    one.init = Some(Tensor::ints(DType::U8, &[1]));
    let mut two = one.clone();
    let scale = reference(&one, &plain_seqs(&one)).scale;
    one.run(Path::Auto, std::ptr::null(), what);
    two.cu = Some(Tensor::ints(DType::I32, &[0, split as i64]));
    two.run(Path::Auto, std::ptr::null(), what);
    two.cu = Some(Tensor::ints(DType::I64, &[split as i64, t as i64]));
    two.run(Path::Auto, std::ptr::null(), what);
    let mut worst = Worst::new();
    for (j, (a, b)) in values(&two.out).iter().zip(values(&one.out)).enumerate() {
        let r = (a - b).abs() / (2.0 * out_bound(&one, b, scale[j], true));
        worst.add(if r.is_nan() { f64::INFINITY } else { r }, || {
            format!("{} {a} vs one call {b}", out_pos(&one, j))
        });
    }
    let st = state_tol(&one).times(2.0);
    let mut sworst = Worst::new();
    let (s2, s1) = (two.state.as_ref().unwrap(), one.state.as_ref().unwrap());
    for (j, (a, b)) in values(s2).iter().zip(values(s1)).enumerate() {
        sworst.add(st.ratio(*a, b), || {
            format!("state[{j}] {a} vs one call {b}")
        });
    }
    if report() {
        eprintln!("{what}: out {:.3} state {:.3}", worst.ratio, sworst.ratio);
    }
    worst.check(&format!("{what}: output"), tol(one.out.dtype).times(2.0));
    sworst.check(&format!("{what}: state"), st);
}

/// Decodes and prefills, padded and zero-length sequences in one call give bit-identical results
/// to one call per sequence, on every path.
#[test]
fn mixed_batch_equals_separate_calls() {
    for (i, (dims, o)) in [
        ((4, 32, 2, 16), Opts::all(DType::BF16, DType::F32)),
        ((6, 24, 3, 40), Opts::rotate(5)),
        ((8, 64, 1, 128), Opts::rotate(26)),
    ]
    .into_iter()
    .enumerate()
    {
        check_mixed(400 + i as u64, dims, o);
    }
}

/// A batch of decodes, prefills, padded and zero-length sequences of heads `dims` gives the
/// bytes of one call per sequence, on every path, and matches the reference.
fn check_mixed(seed: u64, dims: (usize, usize, usize, usize), o: Opts) {
    let lens = [1usize, 100, 1, 0, 1, 70, 3, 1, 300, 0, 5];
    let slots = [3i64, 0, 7, PAD, 2, 5, PAD, 9, 4, 6, 8];
    let init = [1i64, 0, 1, 1, 1, 1, 0, 1, 1, 0, 1];
    let mut all = Scan::new(seed, lens.iter().sum(), dims, o, 10).with_seqs(&lens);
    all.idx = Some(Tensor::ints(DType::I32, &slots));
    all.init = Some(Tensor::ints(DType::Bool, &init));
    let before = all.clone();
    for path in [Path::Auto, Path::Recurrent, Path::Chunked] {
        let what = format!("mixed batch dims {dims:?} {o:?} {path:?}");
        let mut one = before.clone();
        one.run(path, std::ptr::null(), &what);
        let mut sep = before.clone();
        for (cu, idx, init) in one_call_per_sequence(&lens, &slots, &init) {
            (sep.cu, sep.idx, sep.init) = (Some(cu), Some(idx), Some(init));
            sep.run(path, std::ptr::null(), &what);
        }
        assert!(one.out.bytes() == sep.out.bytes(), "{what}: outputs differ");
        assert!(
            one.state.as_ref().unwrap().bytes() == sep.state.as_ref().unwrap().bytes(),
            "{what}: states differ"
        );
        if path == Path::Auto {
            verify(
                &before,
                &one,
                &reference(&before, &plain_seqs(&before)),
                &what,
            );
        }
    }
}

/// The speculative batch of [`every_isa_speculative_matches_reference`]: per sequence its
/// length, `num_accepted_tokens`, `has_initial_state` and the pad entries of its slot row.
const SPEC_SMAX: usize = 4;
const SPEC: [(usize, i64, i64, &[usize]); 10] = [
    (3, 2, 1, &[]),     // typical
    (1, 0, 1, &[]),     // n = 0 reads column 0
    (4, 1, 1, &[]),     // n = 1
    (0, 3, 1, &[]),     // zero-length: writes nothing
    (2, 4, 0, &[0]),    // row[0] = pad: a padded sequence
    (4, 4, 1, &[]),     // n = Smax
    (4, 2, 1, &[2, 3]), // tokens 2 and 3 not written
    (1, 1, 1, &[2, 3]), // a decode; pads past its tokens
    (3, 0, 0, &[1]),    // from zeros, token 1 not written
    (2, 4, 1, &[]),     // reads column 3, beyond its tokens
];

/// A `[B, Smax]` slot table of distinct shuffled slots over a pool of `pool`, with the pads of
/// [`SPEC`].
fn spec_table(pool: usize, seed: u64) -> Vec<i64> {
    let mut table = shuffled_slots(pool, seed)[..SPEC.len() * SPEC_SMAX].to_vec();
    for (b, (_, _, _, pads)) in SPEC.iter().enumerate() {
        for &c in pads.iter() {
            table[b * SPEC_SMAX + c] = PAD;
        }
    }
    table
}

/// The speculative case: `state` None gives NULL `state` (then `has_initial_state` is all false).
fn spec_case(seed: u64, dims: (usize, usize, usize, usize), o: Opts) -> (Scan, Vec<RefSeq>) {
    let pool = 44;
    let lens: Vec<usize> = SPEC.iter().map(|s| s.0).collect();
    let accepted: Vec<i64> = SPEC.iter().map(|s| s.1).collect();
    let init: Vec<i64> = SPEC
        .iter()
        .map(|s| if o.state.is_some() { s.2 } else { 0 })
        .collect();
    let table = spec_table(pool, seed);
    let mut p = Scan::new(seed, lens.iter().sum(), dims, o, pool).with_seqs(&lens);
    p.idx = Some(slot_table(DType::I64, &table, SPEC_SMAX));
    p.accepted = Some(Tensor::ints(DType::I32, &accepted));
    p.init = Some(Tensor::ints(DType::U8, &init));
    let seqs = spec_seqs(
        &lens,
        &accepted,
        &init,
        &table,
        SPEC_SMAX,
        o.state.is_some(),
    );
    (p, seqs)
}

/// Speculative decode: per-token state writes to `idx[b][t]` (none for a pad entry), reads from
/// `idx[b][max(n-1, 0)]`, with n = 0, 1 and Smax, a padded sequence, a zero-length one,
/// `has_initial_state` false, and NULL `state`.
#[test]
fn every_isa_speculative_matches_reference() {
    for (i, (dims, state)) in [
        ((4, 32, 2, 16), Some(DType::F32)),
        ((6, 24, 3, 40), Some(DType::BF16)),
        ((3, 5, 1, 7), Some(DType::F16)),
        ((8, 64, 1, 128), Some(DType::F32)),
        ((4, 17, 2, 33), None),
    ]
    .into_iter()
    .enumerate()
    {
        // Mamba-2-sized heads over a 44-slot pool: mostly state traffic, full mode only.
        if dims.0 == 8 && common::small_shapes() {
            continue;
        }
        let o = Opts {
            state,
            ..Opts::rotate(7 * i + 3)
        };
        let (p, seqs) = spec_case(500 + i as u64, dims, o);
        let exp = reference(&p, &seqs);
        if state.is_some() {
            assert_eq!(exp.states.len(), 19, "the case writes nineteen states");
        }
        verify_every_isa(&p, &exp, &format!("speculative dims {dims:?} {o:?}"));
    }
}

/// Pad slots give zero rows and leave the pool alone; tokens outside every sequence are not
/// touched; zero-length sequences write their initial state back (zeros without one); NULL
/// `has_initial_state` and NULL `state_indices`; NULL `state` (any non-pad slot then goes);
/// calls with no tokens.
#[test]
fn padding_null_arguments_and_empty_sequences() {
    let dims = (4, 16, 2, 24);
    let lens = [4usize, 0, 66, 0, 1, 130];
    // Tokens 0..3 and the last 2 belong to no sequence: untouched.
    let t = lens.iter().sum::<usize>() + 5;
    let mut p = Scan::new(600, t, dims, Opts::rotate(9), 7);
    let mut cu = vec![3i64];
    for &l in &lens {
        cu.push(cu.last().unwrap() + l as i64);
    }
    p.cu = Some(Tensor::ints(DType::I64, &cu));
    p.state = Some(filled(
        DType::BF16,
        &[7, 4, 16, 24],
        &mut Rng::new(1),
        -0.5,
        0.5,
    ));
    p.idx = Some(Tensor::ints(DType::I32, &[PAD, 4, 2, 0, PAD, 5]));
    p.init = Some(Tensor::ints(DType::I64, &[1, 1, 1, 0, 1, 1]));
    let exp = reference(&p, &plain_seqs(&p));
    for path in [Path::Auto, Path::Recurrent, Path::Chunked] {
        let mut a = p.clone();
        a.run(path, std::ptr::null(), "pads");
        verify(
            &p,
            &a,
            &exp,
            &format!("pad slots and empty sequences {path:?}"),
        );
        // Slot 4 (zero-length, initial state) is bit-identical; slot 0 (zero-length, none) is zero.
        let (sb, sa) = (
            p.state.as_ref().unwrap().bytes(),
            a.state.as_ref().unwrap().bytes(),
        );
        let slot_bytes = 4 * 16 * 24 * 2;
        assert!(sa[4 * slot_bytes..5 * slot_bytes] == sb[4 * slot_bytes..5 * slot_bytes]);
        assert!(sa[..slot_bytes].iter().all(|&x| x == 0));
    }

    // NULL has_initial_state (zeros) and NULL state_indices (sequence b in slot b).
    let mut p = Scan::new(601, 70, dims, Opts::all(DType::BF16, DType::F32), 3).with_seqs(&[1, 69]);
    let mut a = p.clone();
    a.run(Path::Auto, std::ptr::null(), "NULL has_initial_state");
    verify(
        &p,
        &a,
        &reference(&p, &plain_seqs(&p)),
        "NULL has_initial_state",
    );

    // NULL state: zeros in, nothing out; slots are not range-checked without a pool.
    p.state = None;
    p.idx = Some(Tensor::ints(DType::I32, &[PAD, 12345]));
    let mut a = p.clone();
    a.run(Path::Auto, std::ptr::null(), "NULL state");
    verify(&p, &a, &reference(&p, &plain_seqs(&p)), "NULL state");

    // No tokens: B = 0 touches nothing; NULL cu_seqlens is one empty sequence in slot 0, which
    // gets zeros, or keeps its state with has_initial_state true.
    let p = Scan::new(602, 0, dims, Opts::all(DType::F32, DType::F32), 2);
    let mut a = p.clone();
    a.cu = Some(Tensor::ints(DType::I32, &[0]));
    a.run(Path::Auto, std::ptr::null(), "B = 0");
    assert!(a.state.as_ref().unwrap().bytes() == p.state.as_ref().unwrap().bytes());
    let mut a = p.clone();
    a.run(Path::Auto, std::ptr::null(), "T = 0");
    let (sa, sb) = (
        a.state.as_ref().unwrap().bytes(),
        p.state.as_ref().unwrap().bytes(),
    );
    let slot_bytes = 4 * 16 * 24 * 4;
    assert!(
        sa[..slot_bytes].iter().all(|&x| x == 0),
        "T = 0: slot 0 not zeroed"
    );
    assert!(
        sa[slot_bytes..] == sb[slot_bytes..],
        "T = 0: slot 1 written"
    );
    let mut a = p.clone();
    a.init = Some(Tensor::ints(DType::I32, &[1]));
    a.run(Path::Auto, std::ptr::null(), "T = 0 with initial state");
    assert!(a.state.as_ref().unwrap().bytes() == p.state.as_ref().unwrap().bytes());
}

/// Results are bitwise identical on one and two threads, on every path, for a mixed batch with
/// enough heads and tokens to split into many tasks, for a speculative batch and for a Mamba-1
/// batch (channel blocks).
#[test]
fn one_and_two_threads_bitwise_equal() {
    let lens = [1usize, 130, 1, 65, 2, 1, 300];
    let mut p = Scan::new(
        700,
        lens.iter().sum(),
        (8, 64, 1, 128),
        Opts::all(DType::BF16, DType::F32),
        7,
    )
    .with_seqs(&lens);
    p.init = Some(Tensor::ints(DType::Bool, &[1, 1, 0, 1, 1, 1, 1]));
    let (spec, _) = spec_case(701, (8, 32, 2, 64), Opts::all(DType::F16, DType::BF16));
    let mut mamba1 = Scan::new(
        702,
        lens.iter().sum(),
        (300, 1, 1, 16),
        mamba1(Opts::all(DType::BF16, DType::F32)),
        7,
    )
    .with_seqs(&lens);
    mamba1.init = p.init.clone();
    let (c1, c2) = (Ctx::new(1), Ctx::new(2));
    for (name, case) in [("mixed", &p), ("speculative", &spec), ("mamba1", &mamba1)] {
        for path in [Path::Auto, Path::Recurrent, Path::Chunked] {
            let mut results = Vec::new();
            for ctx in [&c1, &c2] {
                let mut a = case.clone();
                // Small as it is, every call spreads its tasks (decodes would stay inline).
                with_every_call_parallel(|| a.run(path, ctx.0, name));
                results.push((a.out.bytes(), a.state.as_ref().unwrap().bytes()));
            }
            assert!(
                results[0] == results[1],
                "{name} {path:?}: 1 vs 2 threads differ"
            );
        }
    }
}

/// Every bad input is rejected with its status and a message naming the argument, and no out
/// or state byte changes.
#[test]
fn rejects_bad_inputs() {
    // T = 7, NH = 4, P = 8, G = 2, N = 8; sequences [3, 4] in slots 1 and 2 of 4.
    let base = || {
        let o = Opts {
            clamp: true,
            ..Opts::all(DType::BF16, DType::F32)
        };
        let mut p = Scan::new(900, 7, (4, 8, 2, 8), o, 4).with_seqs(&[3, 4]);
        p.idx = Some(Tensor::ints(DType::I32, &[1, 2]));
        p.init = Some(Tensor::ints(DType::Bool, &[1, 0]));
        p
    };
    let spec = || {
        let mut p = base();
        let table = [0, 1, 2, 3, PAD, PAD, PAD, PAD];
        p.idx = Some(slot_table(DType::I32, &table, 4));
        p.accepted = Some(Tensor::ints(DType::I32, &[1, 1]));
        p
    };
    let z = |dt: DType, shape: &[usize]| Tensor::zeros(dt, shape);
    let (bf, f32_, i32_) = (DType::BF16, DType::F32, DType::I32);
    let x_2d = z(bf, &[7, 32]);
    let x_int = z(i32_, &[7, 4, 8]);
    let dt_heads = z(bf, &[7, 5]);
    let dt_tokens = z(bf, &[6, 4]);
    let dt_int = z(i32_, &[7, 4]);
    let a_wrong = z(f32_, &[5]);
    let a_bf16 = z(bf, &[4]);
    let a_state_n = z(f32_, &[4, 9]);
    let a_state_heads = z(f32_, &[5, 8]);
    let a_state_bf16 = z(bf, &[4, 8]);
    let a_3d = z(f32_, &[4, 8, 1]);
    let c_n = z(bf, &[7, 2, 9]);
    let c_g = z(bf, &[7, 1, 8]);
    let bc_g3 = z(bf, &[7, 3, 8]);
    let b_tokens = z(bf, &[6, 2, 8]);
    let b_int = z(i32_, &[7, 2, 8]);
    let d_wrong = z(f32_, &[5]);
    let d_bf16 = z(bf, &[4]);
    let bias_wrong = z(f32_, &[3]);
    let bias_f16 = z(DType::F16, &[4]);
    let z_wrong = z(bf, &[7, 4, 9]);
    let z_int = z(i32_, &[7, 4, 8]);
    let out_wrong = z(bf, &[7, 4, 9]);
    let out_f32 = z(f32_, &[7, 4, 8]);
    let out_int = z(i32_, &[7, 4, 8]);
    let state_n = z(f32_, &[4, 4, 8, 9]);
    let state_p = z(f32_, &[4, 4, 9, 8]);
    let state_h = z(f32_, &[4, 3, 8, 8]);
    let state_3d = z(f32_, &[4, 4, 64]);
    let state_int = z(i32_, &[4, 4, 8, 8]);
    let out_self_overlap = [0i64, 8, 1];
    let state_self_overlap = [0i64, 64, 8, 1];
    type Setup<'a> = Box<dyn Fn(&mut Scan) + 'a>;
    type Edit<'a> = Box<dyn Fn(&mut Descs) + 'a>;
    let none = || -> Setup { Box::new(|_| {}) };
    let keep = || -> Edit { Box::new(|_| {}) };
    const ALIAS: i32 = SSMK_ERR_ALIASING;
    const INVALID: i32 = SSMK_ERR_INVALID_ARGUMENT;
    const OOB: i32 = SSMK_ERR_OUT_OF_BOUNDS;
    const DTYPE: i32 = SSMK_ERR_UNSUPPORTED_DTYPE;
    let cases: Vec<(&str, Setup, Edit, i32, &[&str])> = vec![
        (
            "x ndim",
            none(),
            Box::new(|d| d.x = x_2d.desc()),
            INVALID,
            &["x.ndim = 2"],
        ),
        (
            "x dtype",
            none(),
            Box::new(|d| d.x = x_int.desc()),
            DTYPE,
            &["x.dtype = int32"],
        ),
        (
            "dt heads",
            none(),
            Box::new(|d| d.dt = dt_heads.desc()),
            INVALID,
            &["dt.shape[1] = 5"],
        ),
        (
            "dt tokens",
            none(),
            Box::new(|d| d.dt = dt_tokens.desc()),
            INVALID,
            &["dt.shape[0] = 6"],
        ),
        (
            "dt dtype",
            none(),
            Box::new(|d| d.dt = dt_int.desc()),
            DTYPE,
            &["dt.dtype"],
        ),
        (
            "A shape",
            none(),
            Box::new(|d| d.a = a_wrong.desc()),
            INVALID,
            &["A.shape[0] = 5"],
        ),
        (
            "A dtype",
            none(),
            Box::new(|d| d.a = a_bf16.desc()),
            DTYPE,
            &["A.dtype = bfloat16"],
        ),
        (
            "A ndim",
            none(),
            Box::new(|d| d.a = a_3d.desc()),
            INVALID,
            &[
                "A.ndim = 3",
                "expected 1 ([NH], Mamba-2) or 2 ([NH, N], Mamba-1)",
            ],
        ),
        (
            "A per state channel, wrong N",
            none(),
            Box::new(|d| d.a = a_state_n.desc()),
            INVALID,
            &["A.shape[1] = 9", "N = B.shape[2] = 8"],
        ),
        (
            "A per state channel, wrong NH",
            none(),
            Box::new(|d| d.a = a_state_heads.desc()),
            INVALID,
            &["A.shape[0] = 5"],
        ),
        (
            "A per state channel, not f32",
            none(),
            Box::new(|d| d.a = a_state_bf16.desc()),
            DTYPE,
            &["A.dtype = bfloat16"],
        ),
        (
            "C state size",
            none(),
            Box::new(|d| d.c = c_n.desc()),
            INVALID,
            &["C.shape[2] = 9"],
        ),
        (
            "C groups",
            none(),
            Box::new(|d| d.c = c_g.desc()),
            INVALID,
            &["C.shape[1] = 1"],
        ),
        (
            "NH % G",
            none(),
            Box::new(|d| {
                d.b = bc_g3.desc();
                d.c = bc_g3.desc()
            }),
            INVALID,
            &["B.shape[1] = 3"],
        ),
        (
            "B tokens",
            none(),
            Box::new(|d| d.b = b_tokens.desc()),
            INVALID,
            &["B.shape[0] = 6"],
        ),
        (
            "B dtype",
            none(),
            Box::new(|d| d.b = b_int.desc()),
            DTYPE,
            &["B.dtype"],
        ),
        (
            "D shape",
            none(),
            Box::new(|d| d.d = Some(d_wrong.desc())),
            INVALID,
            &["D.shape[0] = 5"],
        ),
        (
            "D dtype",
            none(),
            Box::new(|d| d.d = Some(d_bf16.desc())),
            DTYPE,
            &["D.dtype = bfloat16"],
        ),
        (
            "dt_bias shape",
            none(),
            Box::new(|d| d.dt_bias = Some(bias_wrong.desc())),
            INVALID,
            &["dt_bias.shape[0] = 3"],
        ),
        (
            "dt_bias dtype",
            none(),
            Box::new(|d| d.dt_bias = Some(bias_f16.desc())),
            DTYPE,
            &["dt_bias.dtype = float16"],
        ),
        (
            "z shape",
            none(),
            Box::new(|d| d.z = Some(z_wrong.desc())),
            INVALID,
            &["z.shape[2] = 9"],
        ),
        (
            "z dtype",
            none(),
            Box::new(|d| d.z = Some(z_int.desc())),
            DTYPE,
            &["z.dtype"],
        ),
        (
            "out shape",
            none(),
            Box::new(|d| d.out = out_wrong.desc()),
            INVALID,
            &["out.shape[2] = 9"],
        ),
        (
            "out dtype differs from x",
            none(),
            Box::new(|d| d.out = out_f32.desc()),
            DTYPE,
            &["out.dtype = float32"],
        ),
        (
            "out dtype",
            none(),
            Box::new(|d| d.out = out_int.desc()),
            DTYPE,
            &["out.dtype = int32"],
        ),
        (
            "state N",
            none(),
            Box::new(|d| d.state = Some(state_n.desc())),
            INVALID,
            &["state.shape[3] = 9"],
        ),
        (
            "state P",
            none(),
            Box::new(|d| d.state = Some(state_p.desc())),
            INVALID,
            &["state.shape[2] = 9"],
        ),
        (
            "state NH",
            none(),
            Box::new(|d| d.state = Some(state_h.desc())),
            INVALID,
            &["state.shape[1] = 3"],
        ),
        (
            "state ndim",
            none(),
            Box::new(|d| d.state = Some(state_3d.desc())),
            INVALID,
            &["state.ndim = 3"],
        ),
        (
            "state dtype",
            none(),
            Box::new(|d| d.state = Some(state_int.desc())),
            DTYPE,
            &["state.dtype = int32"],
        ),
        (
            "dt_min NaN",
            none(),
            Box::new(|d| d.dt_min = f32::NAN),
            INVALID,
            &["dt_min"],
        ),
        (
            "dt_max NaN",
            none(),
            Box::new(|d| d.dt_max = f32::NAN),
            INVALID,
            &["dt_max"],
        ),
        (
            "dt_min > dt_max",
            none(),
            Box::new(|d| {
                d.dt_min = 0.5;
                d.dt_max = 0.25
            }),
            INVALID,
            &["dt_min", "0.5"],
        ),
        (
            "dt_min = inf > dt_max = -inf",
            none(),
            Box::new(|d| {
                d.dt_min = f32::INFINITY;
                d.dt_max = f32::NEG_INFINITY
            }),
            INVALID,
            &["dt_min"],
        ),
        (
            "flags 2",
            none(),
            Box::new(|d| d.flags = 2),
            INVALID,
            &["flags"],
        ),
        (
            "flags high bit",
            none(),
            Box::new(|d| d.flags = SSMK_MAMBA2_DT_SOFTPLUS | 1 << 31),
            INVALID,
            &["flags"],
        ),
        (
            "init without state",
            none(),
            Box::new(|d| d.state = None),
            INVALID,
            &["has_initial_state[0]"],
        ),
        (
            "slot range",
            Box::new(|p| p.idx = Some(Tensor::ints(DType::I32, &[1, 4]))),
            keep(),
            OOB,
            &["state_indices[1] = 4"],
        ),
        (
            "slot negative",
            Box::new(|p| p.idx = Some(Tensor::ints(DType::I64, &[1, -2]))),
            keep(),
            OOB,
            &["state_indices[1] = -2"],
        ),
        (
            "duplicate slots",
            Box::new(|p| p.idx = Some(Tensor::ints(DType::I32, &[2, 2]))),
            keep(),
            INVALID,
            &["state_indices"],
        ),
        (
            "indices length",
            Box::new(|p| p.idx = Some(Tensor::ints(DType::I32, &[2]))),
            keep(),
            INVALID,
            &["state_indices.shape[0] = 1"],
        ),
        (
            "2-D indices",
            Box::new(|p| p.idx = Some(Tensor::zeros(DType::I32, &[2, 2]))),
            keep(),
            INVALID,
            &["state_indices.ndim = 2"],
        ),
        (
            "indices dtype",
            Box::new(|p| p.idx = Some(Tensor::zeros(DType::F32, &[2]))),
            keep(),
            DTYPE,
            &["state_indices.dtype"],
        ),
        (
            "init length",
            Box::new(|p| p.init = Some(Tensor::ints(DType::Bool, &[1, 0, 0]))),
            keep(),
            INVALID,
            &["has_initial_state.shape[0] = 3"],
        ),
        (
            "cu decreasing",
            Box::new(|p| p.cu = Some(Tensor::ints(DType::I32, &[0, 5, 4]))),
            keep(),
            INVALID,
            &["cu_seqlens[2]"],
        ),
        (
            "cu beyond T",
            Box::new(|p| p.cu = Some(Tensor::ints(DType::I32, &[0, 3, 8]))),
            keep(),
            OOB,
            &["cu_seqlens[2] = 8"],
        ),
        (
            "x NULL data",
            none(),
            Box::new(|d| d.x.data = std::ptr::null_mut()),
            SSMK_ERR_NULL_POINTER,
            &["x.data is NULL"],
        ),
        (
            "device",
            none(),
            Box::new(|d| d.dt.device.device_type = 2),
            SSMK_ERR_UNSUPPORTED_DEVICE,
            &["dt.device"],
        ),
        (
            "out overlaps x",
            none(),
            Box::new(|d| d.out.data = d.x.data),
            ALIAS,
            &["out", "x"],
        ),
        (
            "out overlaps dt",
            none(),
            Box::new(|d| d.out.data = d.dt.data),
            ALIAS,
            &["out bytes"],
        ),
        (
            "out overlaps A",
            none(),
            Box::new(|d| d.out.data = d.a.data),
            ALIAS,
            &["out bytes"],
        ),
        (
            "out overlaps B",
            none(),
            Box::new(|d| d.out.data = d.b.data),
            ALIAS,
            &["out bytes"],
        ),
        (
            "out overlaps C",
            none(),
            Box::new(|d| d.out.data = d.c.data),
            ALIAS,
            &["out bytes"],
        ),
        (
            "out overlaps D",
            none(),
            Box::new(|d| d.out.data = d.d.unwrap().data),
            ALIAS,
            &["out bytes"],
        ),
        (
            "out overlaps z",
            none(),
            Box::new(|d| d.out.data = d.z.unwrap().data),
            ALIAS,
            &["out bytes"],
        ),
        (
            "out overlaps dt_bias",
            none(),
            Box::new(|d| d.out.data = d.dt_bias.unwrap().data),
            ALIAS,
            &["out bytes"],
        ),
        (
            "out self-overlap",
            none(),
            Box::new(|d| d.out.strides = out_self_overlap.as_ptr()),
            ALIAS,
            &["out"],
        ),
        (
            "state overlaps x",
            none(),
            Box::new(|d| d.state.as_mut().unwrap().data = d.x.data),
            ALIAS,
            &["state bytes"],
        ),
        (
            "state overlaps C",
            none(),
            Box::new(|d| d.state.as_mut().unwrap().data = d.c.data),
            ALIAS,
            &["state bytes"],
        ),
        (
            "state overlaps out",
            none(),
            Box::new(|d| d.state.as_mut().unwrap().data = d.out.data),
            ALIAS,
            &["state bytes"],
        ),
        (
            "state self-overlap",
            none(),
            Box::new(|d| d.state.as_mut().unwrap().strides = state_self_overlap.as_ptr()),
            ALIAS,
            &["state"],
        ),
        (
            "spec n > Smax",
            Box::new(|p| {
                *p = spec();
                p.accepted = Some(Tensor::ints(DType::I32, &[5, 1]))
            }),
            keep(),
            INVALID,
            &["num_accepted_tokens[0] = 5"],
        ),
        (
            "spec n < 0",
            Box::new(|p| {
                *p = spec();
                p.accepted = Some(Tensor::ints(DType::I64, &[-1, 1]))
            }),
            keep(),
            INVALID,
            &["num_accepted_tokens[0] = -1"],
        ),
        (
            "spec accepted dtype",
            Box::new(|p| {
                *p = spec();
                p.accepted = Some(Tensor::zeros(DType::F32, &[2]))
            }),
            keep(),
            DTYPE,
            &["num_accepted_tokens.dtype"],
        ),
        (
            "spec accepted length",
            Box::new(|p| {
                *p = spec();
                p.accepted = Some(Tensor::ints(DType::I32, &[1, 1, 1]))
            }),
            keep(),
            INVALID,
            &["num_accepted_tokens.shape[0] = 3"],
        ),
        (
            "spec too long",
            Box::new(|p| {
                *p = spec();
                p.cu = Some(Tensor::ints(DType::I32, &[0, 5, 7]))
            }),
            keep(),
            INVALID,
            &["sequence 0", "5"],
        ),
        (
            "spec 1-D indices",
            Box::new(|p| {
                *p = spec();
                p.idx = Some(Tensor::ints(DType::I32, &[0, 1]))
            }),
            keep(),
            INVALID,
            &["state_indices.ndim = 1"],
        ),
        (
            "spec NULL indices",
            Box::new(|p| {
                *p = spec();
                p.idx = None
            }),
            keep(),
            SSMK_ERR_NULL_POINTER,
            &["state_indices"],
        ),
        (
            "spec write slot range",
            Box::new(|p| {
                *p = spec();
                p.idx.as_mut().unwrap().set(&[0, 2], 9.0)
            }),
            keep(),
            OOB,
            &["state_indices[0][2] = 9"],
        ),
        (
            "spec duplicate writes",
            Box::new(|p| {
                *p = spec();
                p.state = Some(Tensor::zeros(DType::F32, &[8, 4, 8, 8]));
                set_slots(p.idx.as_mut().unwrap(), 1, &[4, 5, 2, 6]);
            }),
            keep(),
            INVALID,
            &["state_indices"],
        ),
        (
            "spec read of another's write",
            Box::new(|p| {
                *p = spec();
                p.cu = Some(Tensor::ints(DType::I32, &[0, 3, 5]));
                p.init = Some(Tensor::ints(DType::Bool, &[1, 1]));
                p.accepted = Some(Tensor::ints(DType::I32, &[1, 3]));
                set_slots(p.idx.as_mut().unwrap(), 1, &[4, 5, 0, 7]);
                p.state = Some(Tensor::zeros(DType::F32, &[8, 4, 8, 8]));
            }),
            keep(),
            INVALID,
            &["slot 0"],
        ),
    ];
    for (name, setup, edit, status, fragments) in cases {
        let mut p = base();
        setup(&mut p);
        let before = Written::of(&p);
        let code = p.call_mut(edit, |d| unsafe { export(std::ptr::null(), d) });
        let msg = common::last_error();
        assert_eq!(
            code, status,
            "{name}: status {code}, expected {status}: {msg}"
        );
        for f in fragments {
            assert!(msg.contains(f), "{name}: message {msg:?} lacks {f:?}");
        }
        before.assert_kept(&p, name);
    }

    // The accepted corner values: no limit, dt_min == dt_max, flags 0 and optional tensors NULL.
    for (lo, hi, flags) in [
        (f32::NEG_INFINITY, f32::INFINITY, 0),
        (0.01, 0.01, SSMK_MAMBA2_DT_SOFTPLUS),
        (f32::NEG_INFINITY, 0.1, 0),
    ] {
        let mut p = base();
        p.dt_min = lo;
        p.dt_max = hi;
        p.flags = flags;
        p.d = None;
        p.z = None;
        p.dt_bias = None;
        let exp = reference(&p, &plain_seqs(&p));
        let mut a = p.clone();
        a.run(Path::Auto, std::ptr::null(), "accepted corner values");
        verify(&p, &a, &exp, &format!("limits ({lo}, {hi}) flags {flags}"));
    }
}

/// A NULL required descriptor is SSMK_ERR_NULL_POINTER naming it, with nothing written.
#[test]
fn null_required_pointers() {
    let mut p = Scan::new(950, 5, (2, 4, 1, 4), Opts::all(DType::F32, DType::F32), 2);
    let before = Written::of(&p);
    for (k, name) in ["x", "dt", "A", "B", "C", "out"].into_iter().enumerate() {
        let code = p.call_mut(
            |_| {},
            |d| {
                let nul = std::ptr::null::<ssmk_tensor>();
                let pick = |i: usize, t: &ssmk_tensor| if i == k { nul } else { t as *const _ };
                unsafe {
                    ssmk_mamba2_scan(
                        std::ptr::null(),
                        pick(0, &d.x),
                        pick(1, &d.dt),
                        pick(2, &d.a),
                        pick(3, &d.b),
                        pick(4, &d.c),
                        ptr(&d.d),
                        ptr(&d.z),
                        ptr(&d.dt_bias),
                        d.dt_min,
                        d.dt_max,
                        d.flags,
                        ptr_mut(&d.state),
                        ptr(&d.cu),
                        ptr(&d.idx),
                        ptr(&d.init),
                        ptr(&d.accepted),
                        PAD,
                        pick(5, &d.out).cast_mut(),
                        std::ptr::null(),
                        std::ptr::null(),
                    )
                }
            },
        );
        assert_error(code, SSMK_ERR_NULL_POINTER, &[&format!("{name} is NULL")]);
        before.assert_kept(&p, name);
    }
}

/// Sequences of the checkpoint cases: a long prefill, a decode, a prefill without checkpoints, a
/// padded sequence, a prefill of whole chunks and a short one the recurrence takes; with each
/// sequence's `(offset, slot)` checkpoints (slots from 7 up; the padded sequence's is ignored).
fn checkpoint_batch() -> (Vec<usize>, Vec<Vec<(i64, i64)>>) {
    let lens = vec![200, 1, 70, 5, 128, 15];
    let offsets: [&[i64]; 6] = [
        &[1, 63, 64, 65, 127, 128, 129, 199, 200],
        &[1],
        &[],
        &[3],
        &[64, 128],
        &[7, 15],
    ];
    let mut slot = 7;
    let rows = offsets
        .iter()
        .map(|row| {
            row.iter()
                .map(|&o| {
                    slot += 1;
                    (o, slot - 1)
                })
                .collect()
        })
        .collect();
    (lens, rows)
}

/// The checkpoint batch over a pool of 32 slots: sequence `b` in slot `b` (sequence 3 padded),
/// initial states on the even sequences.
fn checkpoint_case(seed: u64, dims: (usize, usize, usize, usize), o: Opts) -> Scan {
    let (lens, _) = checkpoint_batch();
    let mut p = Scan::new(seed, lens.iter().sum(), dims, o, 32).with_seqs(&lens);
    p.idx = Some(Tensor::ints(DType::I32, &[0, 1, 2, PAD, 4, 5]));
    p.init = Some(Tensor::ints(DType::U8, &[1, 0, 1, 0, 1, 0]));
    p
}

/// ABI.md §4.10: every checkpoint equals the state a call ending at that token stores (within
/// the two-calls-equal-one tolerance; bit for bit on the f64 path); offsets at 1, at chunk
/// boundaries and one token either side, at `len_b`; many, one and none per sequence; a padded
/// sequence's checkpoint ignored; a decode beside prefills; every state dtype and option;
/// `out` and the final states bit-identical to the call without checkpoints, on both paths and
/// one and three threads, on every ISA.
#[test]
fn every_isa_checkpoints_equal_calls_ending_there() {
    let (_, rows) = checkpoint_batch();
    let paths = [Path::Recurrent, Path::Chunked, Path::Auto];
    for (i, dims) in [(4, 32, 2, 16), (3, 5, 1, 7), (2, 64, 2, 64)]
        .into_iter()
        .enumerate()
    {
        let o = Opts {
            state: Some(FLOATS[i]),
            ..Opts::rotate(7 * i + 3)
        };
        let p = checkpoint_case(700 + i as u64, dims, o);
        let what = format!("checkpoints dims {dims:?} {o:?}");
        check_checkpoints(&p, &rows, &paths, &what, state_tol(&p).times(2.0));
    } // Mamba-1 (channel blocks; `A` per state channel) and `A` per state channel with `P > 1`.
    for (i, dims) in [(64, 1, 1, 16), (37, 1, 1, 5), (3, 8, 1, 16)]
        .into_iter()
        .enumerate()
    {
        let o = mamba1(Opts {
            state: Some(FLOATS[i]),
            ..Opts::rotate(5 * i + 1)
        });
        let p = checkpoint_case(720 + i as u64, dims, o);
        let what = format!("mamba1 checkpoints dims {dims:?} {o:?}");
        check_checkpoints(&p, &rows, &paths, &what, state_tol(&p).times(2.0));
    }
}

/// Every bad checkpoint table of ABI.md §4.10 is rejected with nothing written; tables asking for
/// nothing are accepted wherever NULL is (speculative mode and no state pool included).
#[test]
fn rejects_bad_checkpoints() {
    let p = checkpoint_case(750, (4, 32, 2, 16), Opts::all(DType::F32, DType::F32));
    check_checkpoint_errors(&p, 0, 20);
    let mut none = p.clone();
    (none.state, none.idx, none.init) = (None, None, None);
    let (o, s) = checkpoint_tables(&[vec![(1, 3)], vec![], vec![], vec![], vec![], vec![]]);
    none.set_checkpoints(Some(o), Some(s));
    let before = Written::of(&none);
    assert_error(
        none.call(std::ptr::null()),
        SSMK_ERR_INVALID_ARGUMENT,
        &["checkpoint_slots[0][0] = 3", "state pool is NULL"],
    );
    before.assert_kept(&none, "no pool");
    let (o, s) = checkpoint_tables(&[vec![(1, PAD)], vec![], vec![], vec![], vec![], vec![]]);
    none.set_checkpoints(Some(o), Some(s));
    assert_eq!(
        none.call(std::ptr::null()),
        SSMK_OK,
        "{}",
        common::last_error()
    );
    let (mut spec, _) = spec_case(751, (4, 32, 2, 16), Opts::all(DType::F32, DType::F32));
    let b = SPEC.len();
    let mut rows = vec![vec![]; b];
    rows[0] = vec![(1, 43)];
    let (o, s) = checkpoint_tables(&rows);
    spec.set_checkpoints(Some(o), Some(s));
    let before = Written::of(&spec);
    assert_error(
        spec.call(std::ptr::null()),
        SSMK_ERR_INVALID_ARGUMENT,
        &["checkpoint_slots[0][0] = 43", "speculative mode"],
    );
    before.assert_kept(&spec, "speculative");
    rows[0] = vec![(1, PAD)];
    let (o, s) = checkpoint_tables(&rows);
    spec.set_checkpoints(Some(o), Some(s));
    assert_eq!(
        spec.call(std::ptr::null()),
        SSMK_OK,
        "{}",
        common::last_error()
    );
}

/// Mamba-1 layer shapes `(NH = d_inner, P = 1, G, N)`: channel counts on and off the block
/// width (32 channels on AVX2, 64 on AVX-512), N = 16 as Mamba-1 checkpoints ship it, an odd N,
/// two groups.
const MAMBA1_SHAPES: [(usize, usize, usize, usize); 5] = [
    (64, 1, 1, 16),
    (37, 1, 1, 16),
    (100, 1, 1, 5),
    (40, 1, 2, 17),
    (200, 1, 1, 16),
];

/// `o` with `A` of shape `[NH, N]`.
fn mamba1(o: Opts) -> Opts {
    Opts {
        a_per_state: true,
        ..o
    }
}

/// Mamba-1 (`A [NH, N]`, `P = 1`) against the reference, every seq-len list x shape with the
/// rotating options; every other case keeps `A` per head (the channel path serves both). Then
/// `A` per state channel with `P > 1`, which takes the recurrence.
#[test]
fn every_isa_mamba1_matches_reference() {
    let mut case = 0u64;
    for (s, &dims) in MAMBA1_SHAPES.iter().enumerate() {
        for (l, lens) in SEQ_LEN_LISTS.iter().enumerate() {
            case += 1;
            if !common::sampled(case, 7) {
                continue;
            }
            let o = Opts {
                a_per_state: case % 2 == 1,
                ..Opts::rotate(11 * s + l)
            };
            let p = batch_case(1000 + case, lens, dims, o);
            run_and_verify(&p, &format!("mamba1 lens {lens:?} dims {dims:?} {o:?}"));
        }
    }
    for (i, dims) in [(4, 8, 2, 16), (3, 5, 1, 7)].into_iter().enumerate() {
        let o = mamba1(Opts::rotate(3 + i));
        let p = batch_case(1100 + i as u64, &[1, 40, 3, 70], dims, o);
        run_and_verify(&p, &format!("A per state channel, dims {dims:?} {o:?}"));
    }
}

/// Decays of `d A` down to about -20 (and below, with the extreme `dt`) per token: never NaN or
/// inf, states that underflow give zeros.
#[test]
fn every_isa_mamba1_large_decays_match_reference() {
    for (i, decays) in [Decays::Large, Decays::Extreme].into_iter().enumerate() {
        let o = mamba1(Opts {
            decays,
            ..Opts::all(DType::F32, DType::F32)
        });
        let p = batch_case(1150 + i as u64, &[1, 90, 5], (37, 1, 1, 16), o);
        run_and_verify(&p, &format!("mamba1 {decays:?}"));
    }
}

/// Channel-major views (tokens contiguous per channel: vLLM's `[d_inner, T]`, one row of Hugging
/// Face's `[B, d_inner, L]`) for x, dt, z and out, with padded state rows in one case and a
/// strided `A` in another.
#[test]
fn every_isa_mamba1_channel_major_matches_reference() {
    for (i, (dims, act, state)) in [
        ((64, 1, 1, 16), DType::BF16, DType::F32),
        ((37, 1, 1, 16), DType::F32, DType::BF16),
        ((20, 1, 1, 5), DType::F16, DType::F16),
    ]
    .into_iter()
    .enumerate()
    {
        let o = mamba1(Opts::all(act, state));
        let mut s = batch_case(1200 + i as u64, &[1, 70, 33, 0, 2], dims, o);
        let (t, nh, n) = (s.t, dims.0, dims.3);
        s.x = restride(&s.x, &[1, t, 1]);
        s.dt = restride(&s.dt, &[1, t]);
        s.z = Some(restride(s.z.as_ref().unwrap(), &[1, t, 1]));
        s.out = restride(&s.out, &[1, t, 1]);
        if i == 1 {
            let st = s.state.as_ref().unwrap();
            s.state = Some(restride(st, &[nh * (n + 3), n + 3, n + 3, 1]));
        }
        if i == 2 {
            // `A` read in place through its strides (rows padded, channels every other float).
            s.a = restride(&s.a, &[2 * n + 1, 2]);
        }
        run_and_verify(&s, &format!("channel-major {dims:?} {o:?}"));
    }
}

/// Speculative decode of Mamba-1 shapes: every token's state of every channel block.
#[test]
fn every_isa_mamba1_speculative_matches_reference() {
    for (i, (dims, state)) in [
        ((64, 1, 1, 16), Some(DType::F32)),
        ((37, 1, 1, 16), Some(DType::BF16)),
        ((20, 1, 1, 5), None),
    ]
    .into_iter()
    .enumerate()
    {
        let o = mamba1(Opts {
            state,
            ..Opts::rotate(7 * i + 1)
        });
        let (p, seqs) = spec_case(1300 + i as u64, dims, o);
        verify_every_isa(
            &p,
            &reference(&p, &seqs),
            &format!("mamba1 speculative {o:?}"),
        );
    }
}

/// Mamba-1 prefills split over two calls agree with one call; mixed batches equal one call per
/// sequence bit for bit.
#[test]
fn mamba1_two_calls_and_mixed_batches() {
    for (i, &(t, split)) in [(100, 37), (200, 1), (64, 32), (97, 0), (150, 149)]
        .iter()
        .enumerate()
    {
        let dims = MAMBA1_SHAPES[i % 2];
        let o = mamba1(Opts {
            state: Some(FLOATS[i % 3]),
            ..Opts::rotate(3 * i)
        });
        let one = Scan::new(1400 + i as u64, t, dims, o, 2);
        check_split(one, split, &format!("mamba1 T {t} split {split} {o:?}"));
    }
    check_mixed(
        1450,
        (64, 1, 1, 16),
        mamba1(Opts::all(DType::BF16, DType::F32)),
    );
    check_mixed(1451, (37, 1, 1, 16), mamba1(Opts::rotate(7)));
}

/// Fixed-decay linear attention ("lightning", ABI.md §4.9) over `lens`: `x = v`, `B = k`,
/// `C = q` with a group per head (`G = NH = H`, `P = dv`, `N = dk`), `dt` ones through a
/// stride-0 view, `A[h] = -s_h` with MiniMax-like slopes `2^(-8 (h+1) / H)`, no D, z, bias or
/// clamp, so `S_t = e^(-s_h) S_{t-1} + v_t k_t^T`, `o_t = S_t q_t`; the state pool in vLLM's
/// `[S, H, dk, dv]` order, passed as a strided `[S, NH, P, N]` view.
fn lightning(seed: u64, lens: &[usize], (h, dv, dk): (usize, usize, usize), act: DType) -> Scan {
    let o = Opts {
        d: false,
        z: false,
        bias: false,
        softplus: false,
        clamp: false,
        ..Opts::all(act, DType::F32)
    };
    let mut s = batch_case(seed, lens, (h, dv, h, dk), o);
    let mut ones = Tensor::zeros(DType::F32, &[s.t, h]);
    fill_with(&mut ones, |_| 1.0);
    s.dt = restride(&ones, &[0, 0]);
    fill_with(&mut s.a, |i| -(2f64).powf(-8.0 * (i + 1) as f64 / h as f64));
    let st = s.state.as_ref().unwrap();
    s.state = Some(restride(st, &[h * dk * dv, dk * dv, 1, dv]));
    s
}

/// Lightning attention against the reference on both paths: decodes beside prefills, a padded
/// sequence, the state in vLLM's layout; a prefill split over two calls agrees with one call.
#[test]
fn every_isa_lightning_matches_reference() {
    let mut cases = vec![((4, 32, 32), DType::BF16), ((3, 20, 12), DType::F32)];
    if !common::small_shapes() {
        cases.push(((2, 128, 128), DType::BF16));
    }
    for (i, (dims, act)) in cases.into_iter().enumerate() {
        let mut p = lightning(1500 + i as u64, &[1, 130, 3, 64, 1], dims, act);
        let idx = values(p.idx.as_ref().unwrap());
        let mut slots: Vec<i64> = idx.iter().map(|&v| v as i64).collect();
        slots[3] = PAD;
        p.idx = Some(Tensor::ints(DType::I32, &slots));
        run_and_verify(&p, &format!("lightning {dims:?} {act:?}"));
        let mut one = lightning(1550 + i as u64, &[150], dims, act);
        one.cu = None;
        check_split(one, 70, &format!("lightning split {dims:?}"));
    }
}
