//! Gated DeltaNet and Kimi Delta Attention: `ssmk_gdn_gating` and `ssmk_gated_delta_rule` (with
//! `g` `[T, HV]` or per key channel `[T, HV, K]`) against an independent f64 per-token reference
//! written here, plus splits, mixed batches, speculative mode, padding, NULL arguments, every
//! rejected input, thread-count determinism and every ISA level, for both gate shapes.
//!
//! Tolerances (|got - want| <= atol + rtol * |want|), set from the storage rounding of each dtype
//! plus f32 accumulation over a few hundred tokens:
//! - out:   f32 1e-4 + 1e-4 rel; f16 2e-4 + 2e-3 rel; bf16 1e-3 + 8e-3 rel.
//! - state: f32 1e-4 + 1e-4 rel; f16 2e-4 + 2e-3 rel; bf16 1e-3 + 8e-3 rel.
//! - gating: g 1e-5 rel (+1e-6 abs); beta by its dtype as above.
mod common;

use std::collections::HashMap;

use common::recurrent::{
    PAD, RecurrentCall, RefSeq, SeqArgs, Written, check_checkpoint_errors, check_checkpoints,
    check_out, check_state_pool, checkpoint_tables, cu_seqlens, fill, one_call_per_sequence,
    plain_seqs, ptr, ptr_mut, reversed_slots, run_every_isa, run_reference, set_slots,
    shuffled_slots, slot_table, spec_seqs, tol, values,
};
use common::{Ctx, Rng, SEQ_LEN_LISTS, Tensor, assert_error};
use ssmk::dtype::DType;
use ssmk::ffi::context::{ssmk_context, ssmk_context_create, ssmk_context_destroy};
use ssmk::ffi::gdn::{
    SSMK_GDN_GQA_TILED, SSMK_GDN_QK_L2NORM, ssmk_gated_delta_rule, ssmk_gdn_gating,
};
use ssmk::ffi::status::*;
use ssmk::kernels::gdn::Path;
use ssmk::runtime::{Isa, with_every_call_parallel};
use ssmk::tensor::ssmk_tensor;

/// One call's tensors.
#[derive(Clone)]
struct Gdn {
    t: usize,
    h: usize,
    hv: usize,
    kd: usize,
    vd: usize,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Option<Tensor>,
    cu: Option<Tensor>,
    idx: Option<Tensor>,
    init: Option<Tensor>,
    accepted: Option<Tensor>,
    ckpt_offsets: Option<Tensor>,
    ckpt_slots: Option<Tensor>,
    flags: u32,
    eps: f32,
    scale: f32,
    out: Tensor,
}

impl Gdn {
    /// Random inputs for `t` tokens; q/k scaled so `|k|^2 ~ 1` without l2norm (a stable delta rule).
    #[allow(clippy::too_many_arguments)]
    fn new(
        seed: u64,
        t: usize,
        h: usize,
        hv: usize,
        kd: usize,
        vd: usize,
        act: DType,
        state: Option<(DType, usize)>,
        l2norm: bool,
    ) -> Gdn {
        let mut rng = Rng::new(seed);
        let mut q = Tensor::zeros(act, &[t, h, kd]);
        let mut k = Tensor::zeros(act, &[t, h, kd]);
        let mut v = Tensor::zeros(act, &[t, hv, vd]);
        let mut g = Tensor::zeros(DType::F32, &[t, hv]);
        let mut beta = Tensor::zeros(act, &[t, hv]);
        let s = if l2norm {
            1.0
        } else {
            (3.0 / kd as f64).sqrt()
        };
        fill(&mut q, &mut rng, |u| (2.0 * u - 1.0) * s);
        fill(&mut k, &mut rng, |u| (2.0 * u - 1.0) * s);
        fill(&mut v, &mut rng, |u| 2.0 * u - 1.0);
        fill(&mut g, &mut rng, |u| -0.02 - 0.6 * u);
        fill(&mut beta, &mut rng, |u| 0.05 + 0.9 * u);
        let state = state.map(|(dt, slots)| {
            let mut st = Tensor::zeros(dt, &[slots, hv, kd, vd]);
            fill(&mut st, &mut rng, |u| u - 0.5);
            st
        });
        Gdn {
            t,
            h,
            hv,
            kd,
            vd,
            q,
            k,
            v,
            g,
            beta,
            state,
            cu: None,
            idx: None,
            init: None,
            accepted: None,
            ckpt_offsets: None,
            ckpt_slots: None,
            flags: if l2norm { SSMK_GDN_QK_L2NORM } else { 0 },
            eps: 1e-6,
            scale: 0.0,
            out: {
                let mut o = Tensor::zeros(act, &[t, hv, vd]);
                fill(&mut o, &mut rng, |u| 100.0 + u); // sentinel: untouched rows stay recognisable
                o
            },
        }
    }

    /// Per-channel (KDA) log-decays `[T, HV, K]` over [-20, 0]: per (v-head, channel), one in
    /// four channels barely decays (`g` in [-1e-3, 0]), one in four decays by about -20 per
    /// token, the rest draw each token's `g` from [-20, 0]; so every chunk mixes ~0 and -20.
    fn with_channel_decays(mut self, seed: u64) -> Gdn {
        let mut rng = Rng::new(seed);
        let (t, hv, kd) = (self.t, self.hv, self.kd);
        let kinds: Vec<usize> = (0..hv * kd).map(|_| rng.below(4)).collect();
        let g = Tensor::zeros(DType::F32, &[t, hv, kd]);
        let p = g.base().cast::<f32>();
        for i in 0..t * hv * kd {
            let u = rng.uniform();
            let x = match kinds[i % (hv * kd)] {
                0 => -1e-3 * u,
                1 => -19.5 - 0.5 * u,
                _ => -20.0 * u,
            };
            unsafe { p.add(i).write(x as f32) };
        }
        self.g = g;
        self
    }

    /// The same call with the per-head `g` `[T, HV]` repeated over every key channel.
    fn with_broadcast_decays(&self) -> Gdn {
        let mut p = self.clone();
        let (t, hv, kd) = (self.t, self.hv, self.kd);
        let g = values(&self.g);
        let wide = Tensor::zeros(DType::F32, &[t, hv, kd]);
        let w = wide.base().cast::<f32>();
        for i in 0..t * hv * kd {
            unsafe { w.add(i).write(g[i / kd] as f32) };
        }
        p.g = wide;
        p
    }

    /// The same call with the state pool `[S, HV, K, V]` viewed over `[S, HV, V, K]` memory (k
    /// contiguous: llama.cpp's ggml layout), holding the same values.
    fn with_transposed_state(mut self) -> Gdn {
        let st = self.state.take().unwrap();
        let (s, hv, kd, vd) = (st.shape[0] as usize, self.hv, self.kd, self.vd);
        let strides = [hv * vd * kd, vd * kd, 1, kd];
        let mut t =
            Tensor::with_layout(st.dtype, &[s, hv, kd, vd], Some(&strides), s * hv * vd * kd);
        for idx in st.indices() {
            t.set(&idx, st.get(&idx));
        }
        self.state = Some(t);
        self
    }

    fn with_seqs(mut self, lens: &[usize]) -> Gdn {
        self.cu = Some(cu_seqlens(lens));
        self
    }

    /// Calls through `f` after `m` edits the descriptors.
    fn call_mut(&mut self, m: impl FnOnce(&mut Descs), f: impl FnOnce(&Descs) -> i32) -> i32 {
        let opt = |t: &Option<Tensor>| t.as_ref().map(|t| t.desc());
        let d = Descs {
            q: self.q.desc(),
            k: self.k.desc(),
            v: self.v.desc(),
            g: self.g.desc(),
            beta: self.beta.desc(),
            state: opt(&self.state),
            cu: opt(&self.cu),
            idx: opt(&self.idx),
            init: opt(&self.init),
            accepted: opt(&self.accepted),
            ckpt_offsets: opt(&self.ckpt_offsets),
            ckpt_slots: opt(&self.ckpt_slots),
            out: self.out.desc(),
            scale: self.scale,
            flags: self.flags,
            eps: self.eps,
        };
        let mut d = d;
        m(&mut d);
        f(&d)
    }
}

impl RecurrentCall for Gdn {
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

/// The export, with every descriptor of `d`.
unsafe fn export(ctx: *const ssmk_context, d: &Descs) -> i32 {
    unsafe {
        ssmk_gated_delta_rule(
            ctx,
            &d.q,
            &d.k,
            &d.v,
            &d.g,
            &d.beta,
            d.scale,
            ptr_mut(&d.state),
            ptr(&d.cu),
            ptr(&d.idx),
            ptr(&d.init),
            ptr(&d.accepted),
            d.flags,
            d.eps,
            PAD,
            (&d.out as *const ssmk_tensor).cast_mut(),
            ptr(&d.ckpt_offsets),
            ptr(&d.ckpt_slots),
        )
    }
}

struct Descs {
    q: ssmk_tensor,
    k: ssmk_tensor,
    v: ssmk_tensor,
    g: ssmk_tensor,
    beta: ssmk_tensor,
    state: Option<ssmk_tensor>,
    cu: Option<ssmk_tensor>,
    idx: Option<ssmk_tensor>,
    init: Option<ssmk_tensor>,
    accepted: Option<ssmk_tensor>,
    ckpt_offsets: Option<ssmk_tensor>,
    ckpt_slots: Option<ssmk_tensor>,
    out: ssmk_tensor,
    scale: f32,
    flags: u32,
    eps: f32,
}

/// Expected outputs: out rows (None = untouched) and the state of every written slot.
struct Expect {
    out: Vec<Option<f64>>,
    states: HashMap<usize, Vec<f64>>,
}

/// The f64 per-token recurrence of ABI.md §4.4, straight from the formula.
fn reference(p: &Gdn, seqs: &[RefSeq]) -> Expect {
    let (h_n, hv_n, kd, vd) = (p.h, p.hv, p.kd, p.vd);
    let (q, k, v, g, beta) = (
        values(&p.q),
        values(&p.k),
        values(&p.v),
        values(&p.g),
        values(&p.beta),
    );
    let st0 = p.state.as_ref().map(values);
    let slot_len = hv_n * kd * vd;
    let scale = if p.scale <= 0.0 {
        1.0 / (kd as f64).sqrt()
    } else {
        p.scale as f64
    };
    let l2 = p.flags & SSMK_GDN_QK_L2NORM != 0;
    let per_channel = p.g.shape.len() == 3;
    let mut out = vec![None; p.t * hv_n * vd];
    let states = run_reference(seqs, st0.as_deref(), slot_len, |t, state| {
        let Some(state) = state else {
            out[t * hv_n * vd..][..hv_n * vd].fill(Some(0.0));
            return;
        };
        for hv in 0..hv_n {
            let h = match p.flags & SSMK_GDN_GQA_TILED != 0 {
                true => hv % h_n,
                false => hv / (hv_n / h_n),
            };
            let norm = |x: &[f64]| {
                if l2 {
                    1.0 / (x.iter().map(|a| a * a).sum::<f64>() + p.eps as f64).sqrt()
                } else {
                    1.0
                }
            };
            let qr = &q[(t * h_n + h) * kd..][..kd];
            let kr = &k[(t * h_n + h) * kd..][..kd];
            let (qn, kn) = (norm(qr), norm(kr));
            // a_t per state row: one per v-head, or one per key channel (KDA).
            let a: Vec<f64> = match per_channel {
                true => g[(t * hv_n + hv) * kd..][..kd]
                    .iter()
                    .map(|&x| clamped_decay(x))
                    .collect(),
                false => vec![clamped_decay(g[t * hv_n + hv]); kd],
            };
            let b = beta[t * hv_n + hv];
            let sm = &mut state[hv * kd * vd..][..kd * vd];
            let mut kv = vec![0f64; vd];
            for (r, &a) in a.iter().enumerate() {
                let kr = kr[r] * kn;
                for j in 0..vd {
                    sm[r * vd + j] *= a;
                    kv[j] += sm[r * vd + j] * kr;
                }
            }
            let delta: Vec<f64> = (0..vd)
                .map(|j| b * (v[(t * hv_n + hv) * vd + j] - kv[j]))
                .collect();
            let mut o = vec![0f64; vd];
            for r in 0..kd {
                let (kr, qr) = (kr[r] * kn, qr[r] * qn);
                for j in 0..vd {
                    sm[r * vd + j] += kr * delta[j];
                    o[j] += sm[r * vd + j] * qr;
                }
            }
            for (e, o) in out[(t * hv_n + hv) * vd..][..vd].iter_mut().zip(&o) {
                *e = Some(o * scale);
            }
        }
    });
    Expect { out, states }
}

/// Checks `after` against `exp`; untouched out rows and state slots must keep `before`'s bits.
fn verify(before: &Gdn, after: &Gdn, exp: &Expect, what: &str) {
    let ot = tol(after.out.dtype);
    let pos = |i| format!("out[{i}]");
    check_out(&before.out, &after.out, &exp.out, what, pos, |i, g, w| {
        assert!(
            ot.close(g, w),
            "{what}: out[{i}] = {g} vs reference {w} (tol {ot:?})"
        )
    });
    if let (Some(sa), Some(sb)) = (&after.state, &before.state) {
        let st = tol(sa.dtype);
        check_state_pool(sb, sa, &exp.states, what, |slot, i, g, w| {
            assert!(
                st.close(g, w),
                "{what}: state slot {slot} [{i}] = {g} vs reference {w} (tol {st:?})"
            )
        });
    }
}

/// `exp(g)` as the header documents it: a log-decay below -87.33655 (`-inf` included) acts as
/// -87.33655, the smallest normal float's exponent.
fn clamped_decay(g: f64) -> f64 {
    g.max(-87.336_55).exp()
}

/// A batch of `lens` over a pool with two spare slots, slots reversed, alternate initial states.
fn batch_case(
    seed: u64,
    lens: &[usize],
    heads: (usize, usize),
    dims: (usize, usize),
    act: DType,
    state: DType,
    l2norm: bool,
) -> Gdn {
    let t: usize = lens.iter().sum();
    let slots = lens.len() + 2;
    let mut p = Gdn::new(
        seed,
        t,
        heads.0,
        heads.1,
        dims.0,
        dims.1,
        act,
        Some((state, slots)),
        l2norm,
    )
    .with_seqs(lens);
    let (idx, init) = reversed_slots(lens.len(), slots);
    (p.idx, p.init) = (Some(idx), Some(init));
    p
}

/// Every level of [`Isa::under_test`] (the SIMD ones on every path) against the f64 reference.
fn run_and_verify(p: &Gdn, what: &str) {
    let exp = reference(p, &plain_seqs(p));
    let paths = [Path::Auto, Path::Recurrent, Path::Chunked];
    run_every_isa(p, &paths, what, |a, what| verify(p, a, &exp, what));
}

const HEADS: [(usize, usize); 2] = [(2, 4), (4, 4)];
const STATES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// The full product for the small head dims (every seq-len list x heads x state dtype x l2norm;
/// one case in 34 in the small-shape mode).
#[test]
fn every_isa_matches_reference_small_head_dims() {
    let mut seed = 1;
    for dims in [(32, 32), (64, 32), (64, 64)] {
        for lens in SEQ_LEN_LISTS {
            for heads in HEADS {
                for state in STATES {
                    for l2norm in [true, false] {
                        seed += 1;
                        if !common::sampled(seed, 34) {
                            continue;
                        }
                        let p = batch_case(seed, lens, heads, dims, DType::BF16, state, l2norm);
                        run_and_verify(
                            &p,
                            &format!(
                                "lens {lens:?} heads {heads:?} dims {dims:?} state {state:?} l2norm {l2norm}"
                            ),
                        );
                    }
                }
            }
        }
    }
}

/// K = V = 128: the same full product (one case in 38 in the small-shape mode), plus heads (4,4)
/// with a decode next to a long prefill (130 tokens, 70 in the small-shape mode).
#[test]
fn every_isa_matches_reference_head_dim_128() {
    let mut seed = 100;
    for lens in SEQ_LEN_LISTS {
        for heads in HEADS {
            for state in STATES {
                for l2norm in [true, false] {
                    seed += 1;
                    if !common::sampled(seed, 38) {
                        continue;
                    }
                    let p = batch_case(seed, lens, heads, (128, 128), DType::BF16, state, l2norm);
                    run_and_verify(
                        &p,
                        &format!(
                            "lens {lens:?} heads {heads:?} dims (128,128) state {state:?} l2norm {l2norm}"
                        ),
                    );
                }
            }
        }
    }
    let p = batch_case(
        99,
        &[1, common::sized(130, 70)],
        (4, 4),
        (128, 128),
        DType::BF16,
        DType::F32,
        true,
    );
    run_and_verify(&p, "decode + prefill, dims (128,128)");
}

/// `SSMK_GDN_GQA_TILED` (v-head `hv` reads q/k head `hv % H`): GQA groups of 2, 3 and 4, on
/// both paths and in waves of q/k heads, decodes beside prefills, both gate shapes; with H = 1
/// and HV = H the two orders coincide. Every second case in the small-shape mode.
#[test]
fn every_isa_tiled_gqa_order_matches_reference() {
    let mut seed = 900;
    for (heads, dims) in [
        ((2, 4), (32, 32)),
        ((2, 6), (64, 48)),
        ((4, 16), (32, 16)),
        ((1, 3), (16, 24)),
        ((3, 3), (32, 32)),
    ] {
        for (lens, state) in [
            (&[1usize, 70, 1][..], DType::F32),
            (&[130, 2, 64], DType::BF16),
        ] {
            for kda in [false, true] {
                seed += 1;
                if !common::sampled(seed, 2) {
                    continue;
                }
                let mut p = batch_case(
                    seed,
                    lens,
                    heads,
                    dims,
                    DType::BF16,
                    state,
                    seed.is_multiple_of(3),
                );
                if kda {
                    p = p.with_channel_decays(seed);
                }
                p.flags |= SSMK_GDN_GQA_TILED;
                run_and_verify(
                    &p,
                    &format!("tiled heads {heads:?} dims {dims:?} lens {lens:?} kda {kda}"),
                );
            }
        }
    }
}

/// Per-channel decays (KDA) over every seq-len list x head dims (32, 64, 128 and odd sizes), each
/// case taking the next of the head configs (GQA in both orders, no GQA), state dtypes and l2norm
/// settings in turn (strides coprime to the list count, so each list meets each option); one case
/// in 5 in the small-shape mode.
#[test]
fn every_isa_kda_matches_reference() {
    // (1, 3): a group of three v-heads, a pair sharing pass 1's pair loop and one alone.
    let heads_orders: [((usize, usize), bool); 4] = [
        ((2, 4), false),
        ((2, 4), true),
        ((3, 3), false),
        ((1, 3), false),
    ];
    let mut seed = 1000u64;
    for dims in [(32, 32), (64, 64), (128, 128), (45, 36), (20, 80)] {
        for lens in SEQ_LEN_LISTS {
            seed += 1;
            if !common::sampled(seed, 5) {
                continue;
            }
            let (heads, tiled) = heads_orders[seed as usize % 4];
            let state = STATES[(seed / 3) as usize % 3];
            let l2norm = seed.is_multiple_of(2);
            let mut p = batch_case(seed, lens, heads, dims, DType::BF16, state, l2norm)
                .with_channel_decays(seed);
            if tiled {
                p.flags |= SSMK_GDN_GQA_TILED;
            }
            run_and_verify(
                &p,
                &format!(
                    "kda lens {lens:?} heads {heads:?} tiled {tiled} dims {dims:?} state {state:?} l2norm {l2norm}"
                ),
            );
        }
    }
}

/// `g` `[T, HV, K]` with every channel equal to the per-head gate gives the `[T, HV]` result on
/// every ISA and path, within twice the tolerance of each against the reference (both forms
/// round differently: per-row decays fold into `kv`, and the chunked forms differ).
#[test]
fn every_isa_kda_equal_channels_match_per_head_gate() {
    for (i, (lens, dims, state)) in [
        (&[1usize, 130, 3][..], (64, 64), DType::F32),
        (&[70, 1, 2], (45, 36), DType::BF16),
    ]
    .into_iter()
    .enumerate()
    {
        let scalar = batch_case(1100 + i as u64, lens, (2, 4), dims, DType::F32, state, true);
        let wide = scalar.with_broadcast_decays();
        for isa in Isa::under_test() {
            for path in [Path::Auto, Path::Recurrent, Path::Chunked] {
                let (mut a, mut b) = (scalar.clone(), wide.clone());
                for x in [&mut a, &mut b] {
                    let code = x.call_with(isa, path, std::ptr::null());
                    assert_eq!(code, SSMK_OK, "{}", common::last_error());
                }
                for (x, y) in [
                    (&b.out, &a.out),
                    (b.state.as_ref().unwrap(), a.state.as_ref().unwrap()),
                ] {
                    let t = tol(x.dtype).times(2.0);
                    for (j, (g, w)) in values(x).iter().zip(values(y)).enumerate() {
                        assert!(
                            t.close(*g, w),
                            "{isa:?} {path:?} lens {lens:?}: [{j}] per-channel {g} vs per-head {w}"
                        );
                    }
                }
            }
        }
    }
}

/// Activation dtypes other than bf16, mixed per tensor, an explicit scale, and strided inputs.
#[test]
fn every_isa_activation_dtypes_scale_and_strides() {
    for (i, act) in [DType::F32, DType::F16].into_iter().enumerate() {
        let mut p = batch_case(
            200 + i as u64,
            &[5, 70],
            (2, 4),
            (32, 48),
            act,
            DType::F32,
            i == 0,
        );
        p.scale = 0.3;
        run_and_verify(&p, &format!("act {act:?}"));
    }
    // q/k/v with padded rows (non-compact strides), out with a strided last dim.
    let mut p = batch_case(
        210,
        &[2, 67],
        (1, 2),
        (16, 24),
        DType::BF16,
        DType::F16,
        true,
    );
    let t = p.t;
    let mut rng = Rng::new(5);
    let mut q = Tensor::with_layout(DType::F32, &[t, 1, 16], Some(&[40, 20, 1]), t * 40);
    fill(&mut q, &mut rng, |u| u - 0.5);
    let mut v = Tensor::with_layout(DType::F16, &[t, 2, 24], Some(&[100, 50, 2]), t * 100);
    fill(&mut v, &mut rng, |u| u - 0.5);
    let mut out = Tensor::with_layout(DType::F32, &[t, 2, 24], Some(&[96, 48, 2]), t * 96);
    fill(&mut out, &mut rng, |u| u + 7.0);
    p.q = q;
    p.v = v;
    p.out = out;
    run_and_verify(&p, "strided");
}

/// A prefill split over two calls (the second continuing from the state) matches one call, for
/// both gate shapes.
#[test]
fn two_calls_equal_one_call() {
    for (i, &(t, split)) in [(128, 64), (145, 64), (145, 73), (273, 128), (192, 65)]
        .iter()
        .enumerate()
    {
        for (state, kda) in STATES.into_iter().flat_map(|s| [(s, false), (s, true)]) {
            let mut one = Gdn::new(
                300 + i as u64,
                t,
                2,
                4,
                64,
                64,
                DType::BF16,
                Some((state, 2)),
                true,
            );
            if kda {
                one = one.with_channel_decays(i as u64);
            }
            one.idx = Some(Tensor::ints(DType::I32, &[1]));
            one.init = Some(Tensor::ints(DType::U8, &[1]));
            let mut two = one.clone();
            let what = format!("T {t} split {split} state {state:?} kda {kda}");
            one.run(Path::Auto, std::ptr::null(), &what);
            two.cu = Some(Tensor::ints(DType::I32, &[0, split as i64]));
            two.run(Path::Auto, std::ptr::null(), &what);
            two.cu = Some(Tensor::ints(DType::I32, &[split as i64, t as i64]));
            two.run(Path::Auto, std::ptr::null(), &what);
            let (o1, o2) = (values(&one.out), values(&two.out));
            let ot = tol(DType::BF16).times(2.0);
            for (j, (a, b)) in o1.iter().zip(&o2).enumerate() {
                assert!(ot.close(*b, *a), "{what}: out[{j}] {b} vs one call {a}");
            }
            let (s1, s2) = (
                values(one.state.as_ref().unwrap()),
                values(two.state.as_ref().unwrap()),
            );
            let st = tol(state).times(2.0);
            for (j, (a, b)) in s1.iter().zip(&s2).enumerate() {
                assert!(st.close(*b, *a), "{what}: state[{j}] {b} vs one call {a}");
            }
        }
    }
}

/// A k-contiguous state (`[v][k]` memory, llama.cpp's layout) on every path and ISA: a batch of
/// decodes (the one-pass transposed decode), decodes beside prefills, odd and SIMD-wide head
/// dims, per-head and per-channel gates, every state dtype (one case in 4, and no 128-wide heads,
/// in the small-shape mode); a decode batch is bitwise the same on 1, 2 and 3 threads.
#[test]
fn every_isa_transposed_state_matches_reference() {
    let mut seed = 5100;
    for (lens, dims) in [
        (&[1usize, 1, 1, 1, 1][..], (24, 20)),
        (&[1, 40, 1, 3][..], (24, 20)),
        (&[1, 1, 1, 1][..], (128, 128)),
        (&[1, 33, 1][..], (64, 64)),
    ] {
        for kda in [false, true] {
            for state in STATES {
                seed += 1;
                if common::small_shapes() && (dims.0 == 128 || !common::sampled(seed, 4)) {
                    continue;
                }
                let mut p = batch_case(seed, lens, (2, 4), dims, DType::BF16, state, true);
                if kda {
                    p = p.with_channel_decays(seed);
                }
                let p = p.with_transposed_state();
                let what = format!(
                    "transposed state lens {lens:?} dims {dims:?} kda {kda} state {state:?}"
                );
                run_and_verify(&p, &what);
                if lens.iter().all(|&n| n == 1) {
                    let mut one = p.clone();
                    one.run(Path::Auto, Ctx::new(1).0, &what);
                    for threads in [2, 3] {
                        let mut other = p.clone();
                        let ctx = Ctx::new(threads);
                        with_every_call_parallel(|| other.run(Path::Auto, ctx.0, &what));
                        assert!(
                            one.out.bytes() == other.out.bytes()
                                && one.state.as_ref().unwrap().bytes()
                                    == other.state.as_ref().unwrap().bytes(),
                            "{what}: {threads} threads differ from 1"
                        );
                    }
                }
            }
        }
    }
}

/// Gates far below the exp clamp (-87.3) — -87, -1e4, -1e5, -1e30 and `-inf` in one token of
/// ten — per v-head and per key channel, every state dtype: every ISA on both paths against the
/// clamped reference, in a batch mixing a decode, a short prefill and long ones, and a chunked
/// prefill split over two calls against one call.
#[test]
fn every_isa_extreme_log_decays_match_clamped_reference() {
    let lens = [1usize, 2, 50, 33];
    let mut seed = 4900;
    for depth in [-87.0f32, -1e4, -1e5, -1e30, f32::NEG_INFINITY] {
        for kda in [false, true] {
            for state in STATES {
                seed += 1;
                let mut p = batch_case(seed, &lens, (2, 4), (24, 8), DType::BF16, state, true);
                if kda {
                    p = p.with_channel_decays(seed);
                }
                let mut rng = Rng::new(seed);
                let g = p.g.base().cast::<f32>();
                for i in 0..p.g.numel() {
                    if rng.below(10) == 0 {
                        unsafe { g.add(i).write(depth) };
                    }
                }
                let what = format!("g {depth} kda {kda} state {state:?}");
                run_and_verify(&p, &what);
                split_prefill_agrees(&p, &lens, 2, 21, &what);
            }
        }
    }
}

/// Sequence `b` of `p` (its other sequences dropped) on the chunked path in one call, and split
/// after `split` tokens over two, agree within twice the tolerance.
fn split_prefill_agrees(p: &Gdn, lens: &[usize], b: usize, split: usize, what: &str) {
    let start: usize = lens[..b].iter().sum();
    let cu =
        |a: usize, z: usize| Tensor::ints(DType::I32, &[(start + a) as i64, (start + z) as i64]);
    let slot = values(p.idx.as_ref().unwrap())[b] as i64;
    let mut one = p.clone();
    (one.idx, one.init) = (
        Some(Tensor::ints(DType::I32, &[slot])),
        Some(Tensor::ints(DType::U8, &[1])),
    );
    let mut two = one.clone();
    one.cu = Some(cu(0, lens[b]));
    one.run(Path::Chunked, std::ptr::null(), what);
    two.cu = Some(cu(0, split));
    two.run(Path::Chunked, std::ptr::null(), what);
    two.cu = Some(cu(split, lens[b]));
    two.run(Path::Chunked, std::ptr::null(), what);
    let rows = start * p.hv * p.vd..(start + lens[b]) * p.hv * p.vd;
    let (o1, o2) = (values(&one.out), values(&two.out));
    let ot = tol(p.out.dtype).times(2.0);
    for j in rows {
        assert!(
            ot.close(o2[j], o1[j]),
            "{what}: split out[{j}] {} vs one call {}",
            o2[j],
            o1[j]
        );
    }
    let (s1, s2) = (
        values(one.state.as_ref().unwrap()),
        values(two.state.as_ref().unwrap()),
    );
    let st = tol(one.state.as_ref().unwrap().dtype).times(2.0);
    for (j, (a, b)) in s1.iter().zip(&s2).enumerate() {
        assert!(
            st.close(*b, *a),
            "{what}: split state[{j}] {b} vs one call {a}"
        );
    }
}

/// Decodes and prefills (and a padded and a zero-length sequence) in one call give bit-identical
/// results to one call per sequence, for both gate shapes.
#[test]
fn mixed_batch_equals_separate_calls() {
    for kda in [false, true] {
        mixed_batch_case(kda);
    }
}

fn mixed_batch_case(kda: bool) {
    let lens = [1usize, 100, 1, 0, 1, 70, 3, 1];
    let slots = [3i64, 0, 7, PAD, 2, 5, 1, 9];
    let init = [1i64, 0, 1, 1, 1, 1, 0, 1];
    let mut all = Gdn::new(
        400,
        lens.iter().sum(),
        2,
        4,
        64,
        32,
        DType::BF16,
        Some((DType::F32, 10)),
        true,
    )
    .with_seqs(&lens);
    if kda {
        all = all.with_channel_decays(400);
    }
    all.idx = Some(Tensor::ints(DType::I32, &slots));
    all.init = Some(Tensor::ints(DType::Bool, &init));
    let mut sep = all.clone();
    let before = all.clone();
    let what = format!("mixed batch kda {kda}");
    all.run(Path::Auto, std::ptr::null(), &what);
    for (cu, idx, init) in one_call_per_sequence(&lens, &slots, &init) {
        (sep.cu, sep.idx, sep.init) = (Some(cu), Some(idx), Some(init));
        sep.run(Path::Auto, std::ptr::null(), &what);
    }
    assert!(
        all.out.bytes() == sep.out.bytes(),
        "kda {kda}: outputs differ"
    );
    assert!(
        all.state.as_ref().unwrap().bytes() == sep.state.as_ref().unwrap().bytes(),
        "kda {kda}: states differ"
    );
    verify(
        &before,
        &all,
        &reference(&before, &plain_seqs(&before)),
        &what,
    );
}

/// Speculative decode: per-token state writes to `idx[b][t]`, reads from `idx[b][max(n-1,0)]`,
/// including n = 0 and n = 1, a padded row, a zero-length sequence and `has_initial_state` false.
#[test]
fn every_isa_speculative_matches_reference() {
    let smax = 4usize;
    let lens = [3usize, 1, 4, 0, 2, 4];
    let accepted = [2i64, 0, 1, 3, 4, 1];
    let init = [1i64, 1, 1, 1, 0, 1];
    let pool = 30usize;
    let mut table = shuffled_slots(pool, 77)[..lens.len() * smax].to_vec();
    table[4 * smax] = PAD; // sequence 4 is padded
    for (state, dims, kda) in [
        (DType::F32, (32, 32), false),
        (DType::BF16, (64, 32), false),
        (DType::F16, (32, 48), false),
        (DType::F32, (32, 32), true),
        (DType::BF16, (45, 20), true),
    ] {
        let mut p = Gdn::new(
            500,
            lens.iter().sum(),
            2,
            4,
            dims.0,
            dims.1,
            DType::BF16,
            Some((state, pool)),
            true,
        )
        .with_seqs(&lens);
        if kda {
            p = p.with_channel_decays(500);
        }
        p.idx = Some(slot_table(DType::I32, &table, smax));
        p.accepted = Some(Tensor::ints(DType::I64, &accepted));
        p.init = Some(Tensor::ints(DType::I32, &init));
        p.eps = 1e-5;
        let seqs = spec_seqs(&lens, &accepted, &init, &table, smax, true);
        let exp = reference(&p, &seqs);
        assert!(exp.states.len() == 12, "the case writes twelve states");
        for isa in Isa::under_test() {
            let mut a = p.clone();
            let code = a.call_with(isa, Path::Auto, std::ptr::null());
            assert_eq!(code, SSMK_OK, "{}", common::last_error());
            verify(
                &p,
                &a,
                &exp,
                &format!("speculative {isa:?} state {state:?} kda {kda}"),
            );
        }
    }
}

/// Speculative mode: a `pad_slot_id` entry among the slots to write (a column t > 0 of
/// `state_indices [B, Smax]`) means that token's state is not written (ABI.md §4.4): the padded
/// slots keep their bytes, while every output and every other state equals, bit for bit, the same
/// call without the pad entries. Pads on a middle token (later tokens still written) and on the
/// last one; one sequence without pads; each ISA level, both gate shapes.
#[test]
fn every_isa_speculative_pad_entry_skips_that_state_write() {
    let smax = 4usize;
    let lens = [3usize, 4, 2];
    let accepted = [2i64, 1, 3];
    let init = [1i64, 1, 0];
    let table: [[i64; 4]; 3] = [[5, 2, 9, 0], [7, 1, 10, 4], [3, 8, 11, 6]];
    // (sequence, column) entries replaced by PAD; none is a read column (max(n-1, 0)).
    let pads = [(0usize, 2usize), (1, 1), (1, 3)];
    let padded_slots: Vec<usize> = pads.iter().map(|&(b, c)| table[b][c] as usize).collect();
    let pool = 12usize;
    for (state, dims, kda) in [(DType::F32, (32, 32), false), (DType::BF16, (45, 20), true)] {
        let mut p = Gdn::new(
            510,
            lens.iter().sum(),
            2,
            4,
            dims.0,
            dims.1,
            DType::BF16,
            Some((state, pool)),
            true,
        )
        .with_seqs(&lens);
        if kda {
            p = p.with_channel_decays(510);
        }
        p.accepted = Some(Tensor::ints(DType::I64, &accepted));
        p.init = Some(Tensor::ints(DType::I32, &init));
        p.eps = 1e-5;
        let idx = |with_pads: bool| {
            let mut idx = Tensor::zeros(DType::I32, &[lens.len(), smax]);
            for (b, row) in table.iter().enumerate() {
                for (c, &s) in row.iter().enumerate() {
                    let s = if with_pads && pads.contains(&(b, c)) {
                        PAD
                    } else {
                        s
                    };
                    idx.set(&[b, c], s as f64);
                }
            }
            idx
        };
        let slot_bytes = p.hv * p.kd * p.vd * state.size();
        let slot = |t: &Gdn, s: usize| {
            t.state.as_ref().unwrap().bytes()[s * slot_bytes..(s + 1) * slot_bytes].to_vec()
        };
        for isa in Isa::under_test() {
            let what = format!("{isa:?} state {state:?} kda {kda}");
            let mut full = p.clone();
            full.idx = Some(idx(false));
            let mut padded = p.clone();
            padded.idx = Some(idx(true));
            for a in [&mut full, &mut padded] {
                let code = a.call_with(isa, Path::Auto, std::ptr::null());
                assert_eq!(code, SSMK_OK, "{what}: {}", common::last_error());
            }
            assert!(
                full.out.bytes() == padded.out.bytes(),
                "{what}: outputs differ"
            );
            for s in 0..pool {
                if padded_slots.contains(&s) {
                    assert!(
                        slot(&padded, s) == slot(&p, s),
                        "{what}: padded slot {s} was written"
                    );
                    assert!(
                        slot(&full, s) != slot(&p, s),
                        "{what}: slot {s} is written without the pad entry"
                    );
                } else {
                    assert!(
                        slot(&padded, s) == slot(&full, s),
                        "{what}: slot {s} differs from the call without pad entries"
                    );
                }
            }
        }
    }
}

/// Pad slots give zero rows and leave the pool alone; NULL `has_initial_state` starts from zeros;
/// NULL `state` starts from zeros and writes nothing; zero-length sequences write their initial
/// state back (zeros without one).
#[test]
fn padding_null_arguments_and_empty_sequences() {
    for kda in [false, true] {
        padding_case(kda);
    }
}

fn padding_case(kda: bool) {
    let with_decays = |p: Gdn, seed| if kda { p.with_channel_decays(seed) } else { p };
    let lens = [4usize, 0, 66, 0, 1];
    let p = Gdn::new(
        600,
        71,
        2,
        4,
        32,
        32,
        DType::BF16,
        Some((DType::BF16, 6)),
        true,
    )
    .with_seqs(&lens);
    let mut p = with_decays(p, 600);
    p.idx = Some(Tensor::ints(DType::I32, &[PAD, 4, 2, 0, PAD]));
    p.init = Some(Tensor::ints(DType::Bool, &[1, 1, 1, 0, 1]));
    let mut a = p.clone();
    a.run(
        Path::Auto,
        std::ptr::null(),
        "pad slots and empty sequences",
    );
    verify(
        &p,
        &a,
        &reference(&p, &plain_seqs(&p)),
        "pad slots and empty sequences",
    );
    // Slot 4 (zero-length, initial state) is bit-identical; slot 0 (zero-length, none) is zero.
    let (sb, sa) = (p.state.as_ref().unwrap(), a.state.as_ref().unwrap());
    let slot_bytes = 4 * 32 * 32 * 2;
    assert!(
        sa.bytes()[4 * slot_bytes..5 * slot_bytes] == sb.bytes()[4 * slot_bytes..5 * slot_bytes]
    );
    assert!(sa.bytes()[..slot_bytes].iter().all(|&x| x == 0));

    let p = Gdn::new(
        601,
        70,
        2,
        4,
        32,
        32,
        DType::BF16,
        Some((DType::F32, 3)),
        false,
    )
    .with_seqs(&[1, 69]);
    let mut p = with_decays(p, 601);
    let mut a = p.clone();
    a.run(Path::Auto, std::ptr::null(), "NULL has_initial_state");
    verify(
        &p,
        &a,
        &reference(&p, &plain_seqs(&p)),
        "NULL has_initial_state",
    );

    p.state = None;
    p.idx = Some(Tensor::ints(DType::I32, &[PAD, 12345]));
    let mut a = p.clone();
    a.run(Path::Auto, std::ptr::null(), "NULL state");
    verify(&p, &a, &reference(&p, &plain_seqs(&p)), "NULL state");
}

/// Results are bitwise identical on 1, 2, 3 and 8 threads and on the splits of 16 and 64 (run
/// by recording contexts, which split a call as that many threads would and run the tasks in
/// turn), for both gate shapes. With two q/k heads and two chunked sequences, 1 and 2 threads run
/// each (sequence, head) as one task through both passes, 3 and 8 split those tasks by state
/// columns too, 16 and 64 run the passes in waves with pass 2 split by columns.
#[test]
fn thread_counts_bitwise_equal() {
    for kda in [false, true] {
        threads_case(kda);
    }
}

fn threads_case(kda: bool) {
    let lens = [1usize, 130, 1, 65, 2, 1];
    let mut p = Gdn::new(
        700,
        lens.iter().sum(),
        2,
        4,
        64,
        64,
        DType::BF16,
        Some((DType::F32, 6)),
        true,
    )
    .with_seqs(&lens);
    if kda {
        p = p.with_channel_decays(700);
    }
    p.init = Some(Tensor::ints(DType::Bool, &[1, 1, 0, 1, 1, 1]));
    let mut results = Vec::new();
    for threads in [1, 2, 3, 8, 16, 64] {
        let ctx = match threads {
            16.. => ssmk_context::recording(threads as usize),
            _ => ssmk_context_create(threads),
        };
        let mut a = p.clone();
        // Small as it is, every call spreads its tasks (decodes would otherwise stay inline).
        with_every_call_parallel(|| {
            a.run(Path::Auto, ctx, &format!("kda {kda}, {threads} threads"))
        });
        unsafe { ssmk_context_destroy(ctx) };
        results.push((threads, a.out.bytes(), a.state.as_ref().unwrap().bytes()));
    }
    for (threads, out, state) in &results[1..] {
        let (_, out1, state1) = &results[0];
        assert!(
            out == out1 && state == state1,
            "kda {kda}: 1 vs {threads} threads differ"
        );
    }
}

/// Every ISA level this CPU runs, each path, against the crate's f64 reference (`Isa::Scalar`);
/// odd K and V with SIMD tails, every state dtype, both gate shapes.
#[test]
fn every_isa_matches_crate_reference() {
    for (dims, state, kda) in [
        ((45, 36), DType::F32, false),
        ((32, 20), DType::BF16, false),
        ((16, 7), DType::F16, false),
        ((45, 36), DType::F32, true),
        ((17, 20), DType::BF16, true),
    ] {
        every_isa_case(dims, state, kda);
    }
}

fn every_isa_case(dims: (usize, usize), state: DType, kda: bool) {
    let lens = [1usize, 3, 64, 129, 1];
    let mut p = Gdn::new(
        800,
        lens.iter().sum(),
        2,
        4,
        dims.0,
        dims.1,
        DType::BF16,
        Some((state, 5)),
        true,
    )
    .with_seqs(&lens);
    if kda {
        p = p.with_channel_decays(800);
    }
    p.init = Some(Tensor::ints(DType::Bool, &[1, 0, 1, 1, 0]));
    let mut want = p.clone();
    assert_eq!(
        want.call_with(Isa::Scalar, Path::Auto, std::ptr::null()),
        SSMK_OK
    );
    for isa in Isa::under_test() {
        for path in [Path::Auto, Path::Recurrent, Path::Chunked] {
            let mut a = p.clone();
            assert_eq!(
                a.call_with(isa, path, std::ptr::null()),
                SSMK_OK,
                "{}",
                common::last_error()
            );
            for (x, y) in [
                (&a.out, &want.out),
                (a.state.as_ref().unwrap(), want.state.as_ref().unwrap()),
            ] {
                let t = tol(x.dtype);
                for (i, (g, w)) in values(x).iter().zip(values(y)).enumerate() {
                    assert!(
                        t.close(*g, w),
                        "{isa:?} {path:?} kda {kda}: [{i}] {g} vs reference {w}"
                    );
                }
            }
        }
    }
}

/// `ssmk_gdn_gating` against f64 math. Gating has one portable implementation, run here under
/// every level of [`Isa::under_test`] (so the AVX-512 emulation lane and CI's check of which
/// levels `cargo test` ran count it like the others).
#[test]
fn every_isa_gating_matches_reference() {
    for isa in Isa::under_test() {
        ssmk::runtime::with_isa(isa, gating_matches_reference);
    }
}

fn gating_matches_reference() {
    for (n, hv, beta_dtype, sp_beta, threshold) in [
        (1, 4, DType::BF16, 1.0f32, 20.0f32),
        (9, 8, DType::F32, 1.0, 20.0),
        (40, 8, DType::F16, 2.0, 5.0),
        (300, 32, DType::BF16, 1.0, 20.0),
    ] {
        let mut rng = Rng::new(n as u64);
        let mut a_log = Tensor::zeros(DType::F32, &[hv]);
        let mut a = Tensor::zeros(DType::BF16, &[n, hv]);
        let mut b = Tensor::zeros(DType::BF16, &[n, hv]);
        let mut dt_bias = Tensor::zeros(DType::BF16, &[hv]);
        fill(&mut a_log, &mut rng, |u| 3.0 * u - 1.0);
        fill(&mut a, &mut rng, |u| 30.0 * u - 12.0); // crosses the threshold both ways
        fill(&mut b, &mut rng, |u| 16.0 * u - 8.0);
        fill(&mut dt_bias, &mut rng, |u| u - 0.5);
        let g = Tensor::zeros(DType::F32, &[n, hv]);
        let beta = Tensor::zeros(beta_dtype, &[n, hv]);
        let (da, dx, db, dd, dg, dbeta) = (
            a_log.desc(),
            a.desc(),
            b.desc(),
            dt_bias.desc(),
            g.desc(),
            beta.desc(),
        );
        let code = unsafe {
            ssmk_gdn_gating(
                std::ptr::null(),
                &da,
                &dx,
                &db,
                &dd,
                sp_beta,
                threshold,
                (&dg as *const ssmk_tensor).cast_mut(),
                (&dbeta as *const ssmk_tensor).cast_mut(),
            )
        };
        assert_eq!(code, SSMK_OK, "{}", common::last_error());
        let bt = tol(beta_dtype);
        for i in 0..n {
            for h in 0..hv {
                let x = a.get(&[i, h]) + dt_bias.get(&[h]);
                let bx = sp_beta as f64 * x;
                let sp = if bx > threshold as f64 {
                    x
                } else {
                    bx.exp().ln_1p() / sp_beta as f64
                };
                let want_g = -a_log.get(&[h]).exp() * sp;
                let got_g = g.get(&[i, h]);
                assert!(
                    (got_g - want_g).abs() <= 1e-6 + 1e-5 * want_g.abs(),
                    "g[{i}][{h}] = {got_g} vs {want_g}"
                );
                let want_b = 1.0 / (1.0 + (-b.get(&[i, h])).exp());
                let got_b = beta.get(&[i, h]);
                assert!(
                    bt.close(got_b, want_b),
                    "beta[{i}][{h}] = {got_b} vs {want_b}"
                );
            }
        }
    }
}

/// Every bad gating input is rejected with its message and nothing written.
#[test]
fn gating_rejects_bad_inputs() {
    let a_log = Tensor::zeros(DType::F32, &[4]);
    let a = Tensor::zeros(DType::BF16, &[3, 4]);
    let b = Tensor::zeros(DType::BF16, &[3, 4]);
    let dt_bias = Tensor::zeros(DType::BF16, &[4]);
    let mut g = Tensor::zeros(DType::F32, &[3, 4]);
    fill(&mut g, &mut Rng::new(1), |u| u + 1.0);
    let beta = Tensor::zeros(DType::BF16, &[3, 4]);
    let wrong = Tensor::zeros(DType::BF16, &[3, 5]);
    let g_bf16 = Tensor::zeros(DType::BF16, &[3, 4]);
    // A whole 2-D descriptor: a descriptor's shape array must hold `ndim` entries.
    let dt_bias_2d = Tensor::zeros(DType::BF16, &[4, 1]);
    type Edit<'a> = Box<dyn Fn(&mut [ssmk_tensor; 6], &mut f32, &mut f32) + 'a>;
    let cases: Vec<(Edit, i32, &str)> = vec![
        (
            Box::new(|d, _, _| d[1] = wrong.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "a.shape[1] = 5",
        ),
        (
            Box::new(|d, _, _| d[2] = wrong.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "b.shape[1] = 5",
        ),
        (
            Box::new(|d, _, _| d[4] = g_bf16.desc()),
            SSMK_ERR_UNSUPPORTED_DTYPE,
            "g.dtype = bfloat16",
        ),
        (
            Box::new(|d, _, _| d[3] = dt_bias_2d.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "dt_bias.ndim",
        ),
        (
            Box::new(|_, sb, _| *sb = 0.0),
            SSMK_ERR_INVALID_ARGUMENT,
            "softplus_beta = 0",
        ),
        (
            Box::new(|_, _, th| *th = f32::NAN),
            SSMK_ERR_INVALID_ARGUMENT,
            "softplus_threshold",
        ),
        (
            Box::new(|d, _, _| d[5].data = d[1].data),
            SSMK_ERR_ALIASING,
            "beta bytes",
        ),
        (
            Box::new(|d, _, _| d[5].data = d[4].data),
            SSMK_ERR_ALIASING,
            "overlap",
        ),
        (
            Box::new(|d, _, _| d[0].device.device_type = 2),
            SSMK_ERR_UNSUPPORTED_DEVICE,
            "A_log.device",
        ),
    ];
    let g_before = g.bytes();
    for (edit, status, fragment) in cases {
        let mut d = [
            a_log.desc(),
            a.desc(),
            b.desc(),
            dt_bias.desc(),
            g.desc(),
            beta.desc(),
        ];
        let (mut sb, mut th) = (1.0f32, 20.0f32);
        edit(&mut d, &mut sb, &mut th);
        let code = unsafe {
            ssmk_gdn_gating(
                std::ptr::null(),
                &d[0],
                &d[1],
                &d[2],
                &d[3],
                sb,
                th,
                &mut d[4],
                &mut d[5],
            )
        };
        assert_error(code, status, &[fragment]);
        assert!(
            g.bytes() == g_before && beta.bytes().iter().all(|&x| x == 0),
            "{fragment}: an output was written"
        );
    }
    let code = unsafe {
        ssmk_gdn_gating(
            std::ptr::null(),
            std::ptr::null(),
            &a.desc(),
            &b.desc(),
            &dt_bias.desc(),
            1.0,
            20.0,
            &mut g.desc(),
            &mut beta.desc(),
        )
    };
    assert_error(code, SSMK_ERR_NULL_POINTER, &["A_log is NULL"]);
}

/// Every bad delta-rule input of ABI.md is rejected with its message, and no out or state byte changes.
#[test]
fn delta_rule_rejects_bad_inputs() {
    let base = || {
        let mut p = Gdn::new(900, 7, 2, 4, 8, 8, DType::BF16, Some((DType::F32, 4)), true)
            .with_seqs(&[3, 4]);
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
    let k_wrong = Tensor::zeros(DType::BF16, &[7, 2, 9]);
    let v_wrong = Tensor::zeros(DType::BF16, &[7, 3, 8]);
    let g_bf16 = Tensor::zeros(DType::BF16, &[7, 4]);
    let g_channels_bf16 = Tensor::zeros(DType::BF16, &[7, 4, 8]);
    let g_channels_wrong = Tensor::zeros(DType::F32, &[7, 4, 9]);
    let g_ndim4 = Tensor::zeros(DType::F32, &[7, 4, 8, 1]);
    let g_ndim1 = Tensor::zeros(DType::F32, &[7]);
    let beta_wrong = Tensor::zeros(DType::BF16, &[7, 5]);
    let out_wrong = Tensor::zeros(DType::BF16, &[7, 4, 9]);
    let out_int = Tensor::zeros(DType::I32, &[7, 4, 8]);
    let state_wrong = Tensor::zeros(DType::F32, &[4, 4, 9, 8]);
    let state_int = Tensor::zeros(DType::I32, &[4, 4, 8, 8]);
    let zero_k = Tensor::zeros(DType::BF16, &[7, 2, 0]);
    let acc_f32 = Tensor::zeros(DType::F32, &[2]);
    let self_overlap_strides = [0i64, 8, 1];
    type Setup<'a> = Box<dyn Fn(&mut Gdn) + 'a>;
    type Edit<'a> = Box<dyn Fn(&mut Descs) + 'a>;
    let none = || -> Setup { Box::new(|_| {}) };
    let keep = || -> Edit { Box::new(|_| {}) };
    let cases: Vec<(&str, Setup, Edit, i32, &str)> = vec![
        (
            "k shape",
            none(),
            Box::new(|d| d.k = k_wrong.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "k.shape[2] = 9, expected K = q.shape[2] = 8",
        ),
        (
            "HV % H",
            none(),
            Box::new(|d| d.v = v_wrong.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "v.shape[1] = 3",
        ),
        (
            "g dtype",
            none(),
            Box::new(|d| d.g = g_bf16.desc()),
            SSMK_ERR_UNSUPPORTED_DTYPE,
            "g.dtype = bfloat16",
        ),
        (
            "per-channel g dtype",
            none(),
            Box::new(|d| d.g = g_channels_bf16.desc()),
            SSMK_ERR_UNSUPPORTED_DTYPE,
            "g.dtype = bfloat16",
        ),
        (
            "per-channel g width",
            none(),
            Box::new(|d| d.g = g_channels_wrong.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "g.shape[2] = 9, expected K = q.shape[2] = 8",
        ),
        (
            "g ndim 4",
            none(),
            Box::new(|d| d.g = g_ndim4.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "g.ndim = 4, expected 2 ([T, HV], a decay per v-head) or 3 ([T, HV, K], a decay per key channel)",
        ),
        (
            "g ndim 1",
            none(),
            Box::new(|d| d.g = g_ndim1.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "g.ndim = 1, expected 2",
        ),
        (
            "beta shape",
            none(),
            Box::new(|d| d.beta = beta_wrong.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "beta.shape[1] = 5",
        ),
        (
            "out shape",
            none(),
            Box::new(|d| d.out = out_wrong.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "out.shape[2] = 9",
        ),
        (
            "out dtype",
            none(),
            Box::new(|d| d.out = out_int.desc()),
            SSMK_ERR_UNSUPPORTED_DTYPE,
            "out.dtype = int32",
        ),
        (
            "state shape",
            none(),
            Box::new(|d| d.state = Some(state_wrong.desc())),
            SSMK_ERR_INVALID_ARGUMENT,
            "state.shape[2] = 9",
        ),
        (
            "state dtype",
            none(),
            Box::new(|d| d.state = Some(state_int.desc())),
            SSMK_ERR_UNSUPPORTED_DTYPE,
            "state.dtype = int32",
        ),
        (
            "K = 0",
            none(),
            Box::new(|d| {
                d.q = zero_k.desc();
                d.k = zero_k.desc()
            }),
            SSMK_ERR_INVALID_ARGUMENT,
            "q.shape[2] = 0",
        ),
        (
            "flags",
            none(),
            Box::new(|d| d.flags = 4 | SSMK_GDN_GQA_TILED),
            SSMK_ERR_INVALID_ARGUMENT,
            "flags = 0x6",
        ),
        (
            "scale",
            none(),
            Box::new(|d| d.scale = f32::NAN),
            SSMK_ERR_INVALID_ARGUMENT,
            "scale = NaN",
        ),
        (
            "eps",
            none(),
            Box::new(|d| d.eps = -1.0),
            SSMK_ERR_INVALID_ARGUMENT,
            "l2norm_eps = -1",
        ),
        (
            "q NULL data",
            none(),
            Box::new(|d| d.q.data = std::ptr::null_mut()),
            SSMK_ERR_NULL_POINTER,
            "q.data is NULL",
        ),
        (
            "device",
            none(),
            Box::new(|d| d.v.device.device_type = 2),
            SSMK_ERR_UNSUPPORTED_DEVICE,
            "v.device",
        ),
        (
            "cu decreasing",
            Box::new(|p| p.cu = Some(Tensor::ints(DType::I32, &[0, 5, 4]))),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "non-decreasing",
        ),
        (
            "cu beyond T",
            Box::new(|p| p.cu = Some(Tensor::ints(DType::I32, &[0, 3, 8]))),
            keep(),
            SSMK_ERR_OUT_OF_BOUNDS,
            "cu_seqlens[2] = 8",
        ),
        (
            "slot range",
            Box::new(|p| p.idx = Some(Tensor::ints(DType::I32, &[1, 4]))),
            keep(),
            SSMK_ERR_OUT_OF_BOUNDS,
            "state_indices[1] = 4",
        ),
        (
            "slot negative",
            Box::new(|p| p.idx = Some(Tensor::ints(DType::I32, &[1, -2]))),
            keep(),
            SSMK_ERR_OUT_OF_BOUNDS,
            "state_indices[1] = -2",
        ),
        (
            "duplicate slots",
            Box::new(|p| p.idx = Some(Tensor::ints(DType::I32, &[2, 2]))),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "distinct",
        ),
        (
            "indices length",
            Box::new(|p| p.idx = Some(Tensor::ints(DType::I32, &[2]))),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "state_indices.shape[0] = 1",
        ),
        (
            "init length",
            Box::new(|p| p.init = Some(Tensor::ints(DType::Bool, &[1, 0, 0]))),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "has_initial_state.shape[0] = 3",
        ),
        (
            "init without state",
            none(),
            Box::new(|d| d.state = None),
            SSMK_ERR_INVALID_ARGUMENT,
            "has_initial_state[0] is true but state is NULL",
        ),
        (
            "2-D indices",
            Box::new(|p| p.idx = Some(Tensor::zeros(DType::I32, &[2, 2]))),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "state_indices.ndim = 2",
        ),
        (
            "out overlaps q",
            none(),
            Box::new(|d| d.out.data = d.q.data),
            SSMK_ERR_ALIASING,
            "out bytes",
        ),
        (
            "state overlaps out",
            none(),
            Box::new(|d| d.state.as_mut().unwrap().data = d.out.data),
            SSMK_ERR_ALIASING,
            "state bytes",
        ),
        (
            "out self-overlap",
            none(),
            Box::new(|d| d.out.strides = self_overlap_strides.as_ptr()),
            SSMK_ERR_ALIASING,
            "share memory",
        ),
        (
            "spec n > Smax",
            Box::new(|p| {
                *p = spec();
                p.accepted = Some(Tensor::ints(DType::I32, &[5, 1]))
            }),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "num_accepted_tokens[0] = 5",
        ),
        (
            "spec n < 0",
            Box::new(|p| {
                *p = spec();
                p.accepted = Some(Tensor::ints(DType::I32, &[-1, 1]))
            }),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "num_accepted_tokens[0] = -1",
        ),
        (
            "spec accepted dtype",
            Box::new(|p| {
                *p = spec();
                p.accepted = Some(acc_f32.clone())
            }),
            keep(),
            SSMK_ERR_UNSUPPORTED_DTYPE,
            "num_accepted_tokens.dtype",
        ),
        (
            "spec too long",
            Box::new(|p| {
                *p = spec();
                p.cu = Some(Tensor::ints(DType::I32, &[0, 5, 7]))
            }),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "sequence 0 has 5 tokens",
        ),
        (
            "spec 1-D indices",
            Box::new(|p| {
                *p = spec();
                p.idx = Some(Tensor::ints(DType::I32, &[0, 1]))
            }),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "state_indices.ndim = 1",
        ),
        (
            "spec NULL indices",
            Box::new(|p| {
                *p = spec();
                p.idx = None
            }),
            keep(),
            SSMK_ERR_NULL_POINTER,
            "state_indices is NULL",
        ),
        (
            "spec write slot range",
            Box::new(|p| {
                *p = spec();
                p.idx.as_mut().unwrap().set(&[0, 2], 9.0)
            }),
            keep(),
            SSMK_ERR_OUT_OF_BOUNDS,
            "state_indices[0][2] = 9",
        ),
        (
            "spec duplicate writes",
            Box::new(|p| {
                *p = spec();
                p.state = Some(Tensor::zeros(DType::F32, &[8, 4, 8, 8]));
                set_slots(p.idx.as_mut().unwrap(), 1, &[4, 5, 2, 6]);
            }),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "expected distinct slots for the states written",
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
            SSMK_ERR_INVALID_ARGUMENT,
            "sequence 1 reads slot 0",
        ),
    ];
    for (name, setup, edit, status, fragment) in cases {
        let mut p = base();
        setup(&mut p);
        let before = Written::of(&p);
        let code = p.call_mut(edit, |d| unsafe { export(std::ptr::null(), d) });
        assert_error(code, status, &[fragment]);
        before.assert_kept(&p, name);
    }
    let mut p = base();
    let code = p.call_mut(
        |_| {},
        |d| unsafe {
            ssmk_gated_delta_rule(
                std::ptr::null(),
                std::ptr::null(),
                &d.k,
                &d.v,
                &d.g,
                &d.beta,
                0.0,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null(),
                0,
                0.0,
                PAD,
                (&d.out as *const ssmk_tensor).cast_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        },
    );
    assert_error(code, SSMK_ERR_NULL_POINTER, &["q is NULL"]);
}

/// Rough throughput of the performance cases (run in release:
/// `cargo test --release --test gdn perf -- --ignored --nocapture`). Prefill GFLOP/s count
/// `2 T HV (3KV + 2CK + 2CV)` with C = 64; decode GB/s count the state bytes read and written.
#[test]
#[ignore]
fn perf_report() {
    let time = |p: &mut Gdn, isa: Isa, path: Path, threads: u32, reps: usize| -> f64 {
        let ctx = ssmk_context_create(threads);
        assert_eq!(
            p.call_with(isa, path, ctx),
            SSMK_OK,
            "{}",
            common::last_error()
        ); // warm-up
        // On a shared machine wall time includes other processes' turns; with one thread the
        // calling thread's CPU time is the better measure, so take the smaller of the two.
        let cpu = || {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
        };
        let mut best = f64::MAX;
        for _ in 0..reps {
            let (t0, c0) = (std::time::Instant::now(), cpu());
            assert_eq!(p.call_with(isa, path, ctx), SSMK_OK);
            let wall = t0.elapsed().as_secs_f64();
            best = best.min(if threads == 1 {
                wall.min(cpu() - c0)
            } else {
                wall
            });
        }
        unsafe { ssmk_context_destroy(ctx) };
        best
    };
    // GDN_KDA=1: Kimi Linear's heads with per-channel decays.
    let kda = std::env::var("GDN_KDA").is_ok();
    let (h, hv, kd, vd) = (if kda { 32 } else { 16 }, 32, 128, 128);
    let with_decays = |p: Gdn| if kda { p.with_channel_decays(1) } else { p };
    let isa = Isa::detected();
    if std::env::var("GDN_PERF").as_deref() == Ok("crossover") {
        for len in [8usize, 16, 24, 32, 48, 64, 128] {
            let b = 2048 / len;
            let mut p = Gdn::new(
                3,
                b * len,
                h,
                hv,
                kd,
                vd,
                DType::BF16,
                Some((DType::F32, b)),
                true,
            )
            .with_seqs(&vec![len; b]);
            p.init = Some(Tensor::ints(DType::Bool, &vec![1; b]));
            let r = time(&mut p, isa, Path::Recurrent, 1, 3);
            let c = time(&mut p, isa, Path::Chunked, 1, 3);
            println!(
                "{b} x {len}: recurrent {:.1} ms, chunked {:.1} ms",
                r * 1e3,
                c * 1e3
            );
        }
        return;
    }
    // GDN_PERF=decode or =prefill runs one part (for profiling).
    let only = std::env::var("GDN_PERF").unwrap_or_default();
    let paths: &[Path] = if only == "chunked" {
        &[Path::Chunked]
    } else {
        &[Path::Chunked, Path::Recurrent]
    };
    let prefill_cases: &[&[usize]] = if only == "decode" {
        &[]
    } else {
        &[&[2048], &[512, 512, 512, 512]]
    };
    for &lens in prefill_cases {
        let t: usize = lens.iter().sum();
        let p = Gdn::new(
            1,
            t,
            h,
            hv,
            kd,
            vd,
            DType::BF16,
            Some((DType::F32, lens.len())),
            true,
        )
        .with_seqs(lens);
        let mut p = with_decays(p);
        p.init = Some(Tensor::ints(DType::Bool, &vec![1; lens.len()]));
        let flops = 2.0 * (t * hv) as f64 * (3 * kd * vd + 2 * 64 * kd + 2 * 64 * vd) as f64;
        for &path in paths {
            for threads in [1, 2] {
                let s = time(&mut p, isa, path, threads, 3);
                println!(
                    "prefill {}x{} {isa:?} {path:?} {threads} thread(s): {:.1} ms, {:.1} GFLOP/s",
                    lens.len(),
                    lens[0],
                    s * 1e3,
                    flops / s / 1e9
                );
            }
        }
        if lens.len() == 4 && only.is_empty() {
            let s = time(&mut p, Isa::Scalar, Path::Auto, 2, 1);
            println!(
                "prefill {}x{} f64 reference 2 threads: {:.1} ms, {:.2} GFLOP/s",
                lens.len(),
                lens[0],
                s * 1e3,
                flops / s / 1e9
            );
        }
    }
    let b = 64;
    let p = Gdn::new(
        2,
        b,
        h,
        hv,
        kd,
        vd,
        DType::BF16,
        Some((DType::F32, b)),
        true,
    )
    .with_seqs(&vec![1; b]);
    let mut p = with_decays(p);
    p.init = Some(Tensor::ints(DType::Bool, &vec![1; b]));
    let bytes = 2.0 * (b * hv * kd * vd * 4) as f64;
    for threads in [1, 2] {
        let s = time(&mut p, isa, Path::Auto, threads, 10);
        println!(
            "decode B={b} {isa:?} {threads} thread(s): {:.2} ms, {:.1} GB/s of state",
            s * 1e3,
            bytes / s / 1e9
        );
    }
    // Same-run memcpy baseline over the same byte count (half read, half written).
    let n = b * hv * kd * vd;
    let src = vec![1f32; n];
    let mut dst = vec![0f32; n];
    let mut best = f64::MAX;
    for _ in 0..10 {
        let t0 = std::time::Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        best = best.min(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    println!(
        "memcpy of the state bytes: {:.2} ms, {:.1} GB/s",
        best * 1e3,
        bytes / best / 1e9
    );
    let s = time(&mut p, Isa::Scalar, Path::Auto, 1, 1);
    println!(
        "decode B={b} f64 reference 1 thread: {:.2} ms, {:.1} GB/s of state",
        s * 1e3,
        bytes / s / 1e9
    );
}

/// Sequences of the checkpoint cases: a long prefill, a decode, a prefill without checkpoints, a
/// padded sequence, a prefill of whole chunks and a short one the recurrence takes; with each
/// sequence's `(offset, slot)` checkpoints (slots from 7 up; the padded sequence's is ignored).
fn checkpoint_batch() -> (Vec<usize>, Vec<Vec<(i64, i64)>>) {
    let lens = vec![100, 1, 37, 5, 64, 20];
    let offsets: [&[i64]; 6] = [
        &[1, 15, 16, 17, 31, 32, 33, 48, 99, 100],
        &[1],
        &[],
        &[3],
        &[16, 32, 48, 64],
        &[5, 19, 20],
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
fn checkpoint_case(seed: u64, act: DType, state: DType, kda: bool, tiled: bool) -> Gdn {
    let (lens, _) = checkpoint_batch();
    let mut p = Gdn::new(
        seed,
        lens.iter().sum(),
        2,
        4,
        32,
        24,
        act,
        Some((state, 32)),
        true,
    )
    .with_seqs(&lens);
    if kda {
        p = p.with_channel_decays(seed + 1);
    }
    if tiled {
        p.flags |= SSMK_GDN_GQA_TILED;
    }
    p.idx = Some(Tensor::ints(DType::I32, &[0, 1, 2, PAD, 4, 5]));
    p.init = Some(Tensor::ints(DType::U8, &[1, 0, 1, 0, 1, 0]));
    p
}

/// ABI.md §4.10: every checkpoint equals the state a call ending at that token stores (within
/// the two-calls-equal-one tolerance; bit for bit on the f64 path); offsets at 1, at chunk
/// boundaries and one token either side, at `len_b`; many, one and none per sequence; a padded
/// sequence's checkpoint ignored; a decode beside prefills; every state dtype; per-head and
/// per-channel decays, both GQA orders; `out` and the final states bit-identical to the call
/// without checkpoints, on both paths and one and three threads, on every ISA.
#[test]
fn every_isa_checkpoints_equal_calls_ending_there() {
    let (_, rows) = checkpoint_batch();
    let paths = [Path::Recurrent, Path::Chunked, Path::Auto];
    for (i, state) in [DType::F32, DType::BF16, DType::F16]
        .into_iter()
        .enumerate()
    {
        for (kda, tiled) in [(false, false), (true, true)] {
            let act = [DType::BF16, DType::F32, DType::F16][(i + kda as usize) % 3];
            let p = checkpoint_case(900 + i as u64, act, state, kda, tiled);
            let what = format!("checkpoints act {act:?} state {state:?} kda {kda} tiled {tiled}");
            check_checkpoints(&p, &rows, &paths, &what, tol(state).times(2.0));
        }
    }
}

/// Every bad checkpoint table of ABI.md §4.10 is rejected with nothing written; tables asking for
/// nothing are accepted wherever NULL is (speculative mode and no state pool included).
#[test]
fn rejects_bad_checkpoints() {
    let p = checkpoint_case(950, DType::F32, DType::F32, false, false);
    check_checkpoint_errors(&p, 0, 20);
    // No state pool: any live checkpoint is an error, pad entries are fine.
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
    // Speculative mode: a live checkpoint is an error, a table of pad entries is fine.
    let mut spec = Gdn::new(
        951,
        3,
        2,
        4,
        32,
        24,
        DType::F32,
        Some((DType::F32, 8)),
        true,
    )
    .with_seqs(&[2, 1]);
    spec.idx = Some(slot_table(DType::I32, &[0, 1, 2, PAD], 2));
    spec.accepted = Some(Tensor::ints(DType::I32, &[1, 1]));
    let (o, s) = checkpoint_tables(&[vec![(1, 5)], vec![]]);
    spec.set_checkpoints(Some(o), Some(s));
    let before = Written::of(&spec);
    assert_error(
        spec.call(std::ptr::null()),
        SSMK_ERR_INVALID_ARGUMENT,
        &["checkpoint_slots[0][0] = 5", "speculative mode"],
    );
    before.assert_kept(&spec, "speculative");
    let (o, s) = checkpoint_tables(&[vec![(1, PAD)], vec![(9, PAD)]]);
    spec.set_checkpoints(Some(o), Some(s));
    assert_eq!(
        spec.call(std::ptr::null()),
        SSMK_OK,
        "{}",
        common::last_error()
    );
}

/// The recurrence on a state pool kept `[v][k]` (ggml's layout, a strided `[S, HV, K, V]` view)
/// gives bit-identical outputs and states to the same call on a compact pool, on every ISA level
/// (the f32 view moves through register transposes, the narrow ones element by element). No
/// one-token sequences: a compact pool's decode runs in place, summing in another order.
#[test]
fn every_isa_value_major_state_equals_compact() {
    let lens = [2usize, 40, 3, 5];
    for (state, dims) in [
        (DType::F32, (64, 64)),
        (DType::F32, (20, 36)),
        (DType::BF16, (16, 24)),
    ] {
        let mut compact = Gdn::new(
            1900,
            lens.iter().sum(),
            2,
            4,
            dims.0,
            dims.1,
            DType::BF16,
            Some((state, 5)),
            true,
        )
        .with_seqs(&lens);
        compact.init = Some(Tensor::ints(DType::Bool, &[1, 1, 0, 1]));
        let (slots, hv, kd, vd) = (5, 4, dims.0, dims.1);
        let mut value_major = compact.clone();
        let mut st = Tensor::with_layout(
            state,
            &[slots, hv, kd, vd],
            Some(&[hv * vd * kd, vd * kd, 1, kd]),
            slots * hv * kd * vd,
        );
        let want = values(compact.state.as_ref().unwrap());
        common::recurrent::fill_with(&mut st, |i| want[i]);
        value_major.state = Some(st);
        for isa in Isa::under_test() {
            let (mut a, mut b) = (compact.clone(), value_major.clone());
            for p in [&mut a, &mut b] {
                let code = p.call_with(isa, Path::Recurrent, std::ptr::null());
                assert_eq!(code, SSMK_OK, "{}", common::last_error());
            }
            let what = format!("{isa:?} {state:?} {dims:?}");
            assert!(a.out.bytes() == b.out.bytes(), "{what}: outputs differ");
            let (sa, sb) = (
                values(a.state.as_ref().unwrap()),
                values(b.state.as_ref().unwrap()),
            );
            let first = sa
                .iter()
                .zip(&sb)
                .position(|(x, y)| x.to_bits() != y.to_bits());
            assert!(
                first.is_none(),
                "{what}: states differ first at {first:?}: {:?} vs {:?}",
                first.map(|i| sa[i]),
                first.map(|i| sb[i])
            );
        }
    }
}
