//! Gated DeltaNet: `ssmk_gdn_gating` and `ssmk_gated_delta_rule` against an independent f64
//! per-token reference written here, plus splits, mixed batches, speculative mode, padding, NULL
//! arguments, every rejected input, thread-count determinism and every ISA level.
//!
//! Tolerances (|got - want| <= atol + rtol * |want|), set from the storage rounding of each dtype
//! plus f32 accumulation over a few hundred tokens:
//! - out:   f32 1e-4 + 1e-4 rel; f16 2e-4 + 2e-3 rel; bf16 1e-3 + 8e-3 rel.
//! - state: f32 1e-4 + 1e-4 rel; f16 2e-4 + 2e-3 rel; bf16 1e-3 + 8e-3 rel.
//! - gating: g 1e-5 rel (+1e-6 abs); beta by its dtype as above.
mod common;

use std::collections::HashMap;

use common::{Rng, Tensor, assert_error};
use half::bf16;
use ssmk::dtype::{DType, Element};
use ssmk::ffi::context::{ssmk_context, ssmk_context_create, ssmk_context_destroy};
use ssmk::ffi::gdn::{
    SSMK_GDN_QK_L2NORM, gated_delta_rule_with, ssmk_gated_delta_rule, ssmk_gdn_gating,
};
use ssmk::ffi::status::*;
use ssmk::kernels::gdn::Path;
use ssmk::runtime::Isa;
use ssmk::tensor::ssmk_tensor;

const PAD: i64 = -1;

#[derive(Clone, Copy, Debug)]
struct Tol {
    atol: f64,
    rtol: f64,
}

fn tol(dtype: DType) -> Tol {
    match dtype {
        DType::F32 => Tol {
            atol: 1e-4,
            rtol: 1e-4,
        },
        DType::F16 => Tol {
            atol: 2e-4,
            rtol: 2e-3,
        },
        _ => Tol {
            atol: 1e-3,
            rtol: 8e-3,
        },
    }
}

fn close(got: f64, want: f64, t: Tol) -> bool {
    (got - want).abs() <= t.atol + t.rtol * want.abs()
}

/// One call's tensors.
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
    flags: u32,
    eps: f32,
    scale: f32,
    out: Tensor,
}

fn fill(t: &mut Tensor, rng: &mut Rng, f: impl Fn(f64) -> f64) {
    for i in t.indices() {
        let u = rng.uniform();
        t.set(&i, f(u));
    }
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

    fn with_seqs(mut self, lens: &[usize]) -> Gdn {
        let mut cu = vec![0i64];
        for &l in lens {
            cu.push(cu.last().unwrap() + l as i64);
        }
        self.cu = Some(Tensor::ints(DType::I32, &cu));
        self
    }

    /// Calls through `f` with every descriptor.
    fn call_raw(&mut self, f: impl FnOnce(&Descs) -> i32) -> i32 {
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
            out: self.out.desc(),
            scale: self.scale,
            flags: self.flags,
            eps: self.eps,
        };
        f(&d)
    }

    fn call(&mut self, ctx: *const ssmk_context) -> i32 {
        self.call_raw(|d| unsafe {
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
            )
        })
    }

    fn call_with(&mut self, isa: Isa, path: Path, ctx: *const ssmk_context) -> i32 {
        self.call_raw(|d| unsafe {
            gated_delta_rule_with(
                isa,
                path,
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
            )
        })
    }

    fn clone_all(&self) -> Gdn {
        let c = |t: &Tensor| Tensor {
            dtype: t.dtype,
            shape: t.shape.clone(),
            strides: t.strides.clone(),
            storage: t.storage.clone(),
        };
        let o = |t: &Option<Tensor>| t.as_ref().map(c);
        Gdn {
            t: self.t,
            h: self.h,
            hv: self.hv,
            kd: self.kd,
            vd: self.vd,
            q: c(&self.q),
            k: c(&self.k),
            v: c(&self.v),
            g: c(&self.g),
            beta: c(&self.beta),
            state: o(&self.state),
            cu: o(&self.cu),
            idx: o(&self.idx),
            init: o(&self.init),
            accepted: o(&self.accepted),
            flags: self.flags,
            eps: self.eps,
            scale: self.scale,
            out: c(&self.out),
        }
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
    out: ssmk_tensor,
    scale: f32,
    flags: u32,
    eps: f32,
}

fn ptr(d: &Option<ssmk_tensor>) -> *const ssmk_tensor {
    d.as_ref().map_or(std::ptr::null(), |d| d as *const _)
}

fn ptr_mut(d: &Option<ssmk_tensor>) -> *mut ssmk_tensor {
    ptr(d).cast_mut()
}

/// What the reference says one sequence does.
#[derive(Clone, Debug)]
enum Writes {
    Nothing,
    Final(usize),
    PerToken(Vec<usize>),
}

#[derive(Clone, Debug)]
struct RefSeq {
    start: usize,
    len: usize,
    padded: bool,
    read: Option<usize>,
    writes: Writes,
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
        p.q.to_vec(),
        p.k.to_vec(),
        p.v.to_vec(),
        p.g.to_vec(),
        p.beta.to_vec(),
    );
    let st0 = p.state.as_ref().map(|s| s.to_vec());
    let slot_len = hv_n * kd * vd;
    let scale = if p.scale <= 0.0 {
        1.0 / (kd as f64).sqrt()
    } else {
        p.scale as f64
    };
    let l2 = p.flags & SSMK_GDN_QK_L2NORM != 0;
    let mut exp = Expect {
        out: vec![None; p.t * hv_n * vd],
        states: HashMap::new(),
    };
    for s in seqs {
        if s.padded {
            for t in s.start..s.start + s.len {
                for i in 0..hv_n * vd {
                    exp.out[t * hv_n * vd + i] = Some(0.0);
                }
            }
            continue;
        }
        let mut state = match s.read {
            Some(slot) => st0.as_ref().unwrap()[slot * slot_len..(slot + 1) * slot_len].to_vec(),
            None => vec![0.0; slot_len],
        };
        for (i, t) in (s.start..s.start + s.len).enumerate() {
            for hv in 0..hv_n {
                let h = hv / (hv_n / h_n);
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
                let a = g[t * hv_n + hv].exp();
                let b = beta[t * hv_n + hv];
                let sm = &mut state[hv * kd * vd..][..kd * vd];
                for x in sm.iter_mut() {
                    *x *= a;
                }
                for j in 0..vd {
                    let kv: f64 = (0..kd).map(|r| sm[r * vd + j] * kr[r] * kn).sum();
                    let delta = b * (v[(t * hv_n + hv) * vd + j] - kv);
                    for r in 0..kd {
                        sm[r * vd + j] += kr[r] * kn * delta;
                    }
                    let o: f64 = (0..kd).map(|r| sm[r * vd + j] * qr[r] * qn).sum();
                    exp.out[(t * hv_n + hv) * vd + j] = Some(o * scale);
                }
            }
            if let Writes::PerToken(slots) = &s.writes {
                exp.states.insert(slots[i], state.clone());
            }
        }
        if let Writes::Final(slot) = s.writes {
            exp.states.insert(slot, state);
        }
    }
    exp
}

/// Checks `after` against `exp`; untouched out rows and state slots must keep `before`'s bits.
fn verify(before: &Gdn, after: &Gdn, exp: &Expect, what: &str) {
    let ot = tol(after.out.dtype);
    let got = after.out.to_vec();
    let old = before.out.to_vec();
    let mut worst = 0f64;
    for (i, e) in exp.out.iter().enumerate() {
        match e {
            Some(w) => {
                worst = worst.max((got[i] - w).abs());
                assert!(
                    close(got[i], *w, ot),
                    "{what}: out[{i}] = {} vs reference {w} (tol {ot:?})",
                    got[i]
                );
            }
            None => assert_eq!(
                got[i].to_bits(),
                old[i].to_bits(),
                "{what}: out[{i}] outside every sequence was written"
            ),
        }
    }
    if let (Some(sa), Some(sb)) = (&after.state, &before.state) {
        let st = tol(sa.dtype);
        let (ga, gb) = (sa.to_vec(), sb.to_vec());
        let slot_len = after.hv * after.kd * after.vd;
        for slot in 0..sa.shape[0] as usize {
            let range = slot * slot_len..(slot + 1) * slot_len;
            match exp.states.get(&slot) {
                Some(w) => {
                    for (i, (g, w)) in ga[range].iter().zip(w).enumerate() {
                        assert!(
                            close(*g, *w, st),
                            "{what}: state slot {slot} [{i}] = {g} vs reference {w} (tol {st:?})"
                        );
                    }
                }
                None => assert!(
                    ga[range.clone()] == gb[range],
                    "{what}: state slot {slot} was written"
                ),
            }
        }
    }
}

/// Sequences of an ordinary (non-speculative) call as the ABI defines them.
fn plain_seqs(p: &Gdn) -> Vec<RefSeq> {
    let cu: Vec<usize> = match &p.cu {
        Some(c) => c.to_vec().iter().map(|&x| x as usize).collect(),
        None => vec![0, p.t],
    };
    let b = cu.len() - 1;
    let idx: Vec<i64> = match &p.idx {
        Some(i) => i.to_vec().iter().map(|&x| x as i64).collect(),
        None => (0..b as i64).collect(),
    };
    let init: Vec<bool> = match &p.init {
        Some(i) => i.to_vec().iter().map(|&x| x != 0.0).collect(),
        None => vec![false; b],
    };
    (0..b)
        .map(|s| {
            let padded = idx[s] == PAD;
            let slot = idx[s] as usize;
            RefSeq {
                start: cu[s],
                len: cu[s + 1] - cu[s],
                padded,
                read: (!padded && init[s]).then_some(slot),
                writes: if padded || p.state.is_none() {
                    Writes::Nothing
                } else {
                    Writes::Final(slot)
                },
            }
        })
        .collect()
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
    p.idx = Some(Tensor::ints(
        DType::I64,
        &(0..lens.len())
            .map(|b| (slots - 1 - b) as i64)
            .collect::<Vec<_>>(),
    ));
    p.init = Some(Tensor::ints(
        DType::Bool,
        &(0..lens.len())
            .map(|b| (b % 2 == 0) as i64)
            .collect::<Vec<_>>(),
    ));
    p
}

fn run_and_verify(p: &Gdn, what: &str) {
    let exp = reference(p, &plain_seqs(p));
    let mut runs: Vec<(String, Gdn)> = Vec::new();
    let mut a = p.clone_all();
    assert_eq!(
        a.call(std::ptr::null()),
        SSMK_OK,
        "{what}: {}",
        common::last_error()
    );
    runs.push(("export".into(), a));
    for path in [Path::Recurrent, Path::Chunked] {
        let mut a = p.clone_all();
        assert_eq!(
            a.call_with(Isa::detected(), path, std::ptr::null()),
            SSMK_OK,
            "{what}: {}",
            common::last_error()
        );
        runs.push((format!("{path:?}"), a));
    }
    for (name, a) in &runs {
        verify(p, a, &exp, &format!("{what} [{name}]"));
    }
}

const SEQ_LENS: [&[usize]; 8] = [
    &[1],
    &[1, 2, 3],
    &[63],
    &[64],
    &[65],
    &[63, 64, 65],
    &[127, 128, 129],
    &[273],
];
const HEADS: [(usize, usize); 2] = [(2, 4), (4, 4)];
const STATES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// The full product for the small head dims (every seq-len list x heads x state dtype x l2norm).
#[test]
fn matches_reference_small_head_dims() {
    let mut seed = 1;
    for dims in [(32, 32), (64, 32), (64, 64)] {
        for lens in SEQ_LENS {
            for heads in HEADS {
                for state in STATES {
                    for l2norm in [true, false] {
                        seed += 1;
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

/// K = V = 128: every seq-len list with heads (2,4); the state dtypes and l2norm alternate (the
/// full product would take minutes on two cores).
#[test]
fn matches_reference_head_dim_128() {
    for (i, lens) in SEQ_LENS.iter().enumerate() {
        let state = STATES[i % 3];
        let l2norm = i % 2 == 0;
        let p = batch_case(
            100 + i as u64,
            lens,
            (2, 4),
            (128, 128),
            DType::BF16,
            state,
            l2norm,
        );
        run_and_verify(
            &p,
            &format!("lens {lens:?} dims (128,128) state {state:?} l2norm {l2norm}"),
        );
    }
    let p = batch_case(
        120,
        &[3, 130],
        (4, 4),
        (128, 128),
        DType::BF16,
        DType::F32,
        true,
    );
    run_and_verify(&p, "heads (4,4) dims (128,128)");
}

/// Activation dtypes other than bf16, mixed per tensor, an explicit scale, and strided inputs.
#[test]
fn activation_dtypes_scale_and_strides() {
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
