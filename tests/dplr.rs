//! RWKV-7's generalized delta rule, `ssmk_dplr_delta_rule` (ABI.md §4.11), against an independent
//! f64 per-token recurrence written here: both state layouts (`[k][v]` and ggml's `[v][k]`
//! view), every activation and state dtype, varlen batches with pads and initial states, splits,
//! mixed batches, speculative mode, checkpoints, the linear-`w` flag, extreme decays, thread-count
//! determinism, every ISA level, and every rejected input with nothing written.
//!
//! Inputs follow RWKV-7: `a = -kk`, `b = kk * iclr` with `kk` a unit vector and `iclr` in
//! (0, 1), log-decays in [-0.61, 0] unless a test says otherwise, so the state stays bounded.
//! Tolerances (|got - want| <= atol + rtol * |want|), the recurrent families' shared ones: the
//! storage rounding of each dtype plus f32 accumulation over a few hundred tokens:
//! f32 1e-4 + 1e-4 rel; f16 2e-4 + 2e-3 rel; bf16 1e-3 + 8e-3 rel (out and state).
mod common;

use std::collections::HashMap;

use common::recurrent::{
    PAD, RecurrentCall, RefSeq, SeqArgs, Tol, Written, check_checkpoint_errors, check_checkpoints,
    check_out, check_state_pool, cu_seqlens, fill, one_call_per_sequence, plain_seqs, ptr, ptr_mut,
    reversed_slots, run_every_isa, run_reference, shuffled_slots, slot_table, spec_seqs, tol,
    values,
};
use common::{Rng, SEQ_LEN_LISTS, Tensor, assert_error, sampled};
use ssmk::dtype::DType;
use ssmk::ffi::context::{ssmk_context, ssmk_context_create, ssmk_context_destroy};
use ssmk::ffi::dplr::{SSMK_DPLR_W_LINEAR, ssmk_dplr_delta_rule};
use ssmk::ffi::status::*;
use ssmk::kernels::Path;
use ssmk::runtime::{Isa, with_every_call_parallel};
use ssmk::tensor::ssmk_tensor;

/// Where the state pool keeps a head's `K x V` state.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    /// `[S, H, K, V]` compact (vLLM, Hugging Face, fla).
    KeyMajor,
    /// `[S, H, V, K]` memory passed as a strided `[S, H, K, V]` view (ggml's `wkv7` state).
    ValueMajor,
}

/// One call's tensors.
#[derive(Clone)]
struct Dplr {
    t: usize,
    h: usize,
    kd: usize,
    vd: usize,
    r: Tensor,
    w: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    state: Option<Tensor>,
    cu: Option<Tensor>,
    idx: Option<Tensor>,
    init: Option<Tensor>,
    accepted: Option<Tensor>,
    ckpt_offsets: Option<Tensor>,
    ckpt_slots: Option<Tensor>,
    flags: u32,
    scale: f32,
    out: Tensor,
}

/// A `[S, H, K, V]` state pool of `dtype` in `layout`, filled from `rng`.
fn state_pool(dtype: DType, dims: [usize; 4], layout: Layout, rng: &mut Rng) -> Tensor {
    let [s, h, kd, vd] = dims;
    let mut st = match layout {
        Layout::KeyMajor => Tensor::zeros(dtype, &dims),
        Layout::ValueMajor => Tensor::with_layout(
            dtype,
            &dims,
            Some(&[h * vd * kd, vd * kd, 1, kd]),
            s * h * kd * vd,
        ),
    };
    fill(&mut st, rng, |u| u - 0.5);
    st
}

impl Dplr {
    /// RWKV-7-like random inputs for `t` tokens (see the file header).
    #[allow(clippy::too_many_arguments)]
    fn new(
        seed: u64,
        t: usize,
        h: usize,
        kd: usize,
        vd: usize,
        act: DType,
        state: Option<(DType, usize, Layout)>,
    ) -> Dplr {
        let mut rng = Rng::new(seed);
        let qk = (3.0 / kd as f64).sqrt();
        let mut r = Tensor::zeros(act, &[t, h, kd]);
        let mut k = Tensor::zeros(act, &[t, h, kd]);
        let mut v = Tensor::zeros(act, &[t, h, vd]);
        let mut w = Tensor::zeros(DType::F32, &[t, h, kd]);
        fill(&mut r, &mut rng, |u| (2.0 * u - 1.0) * qk);
        fill(&mut k, &mut rng, |u| (2.0 * u - 1.0) * qk);
        fill(&mut v, &mut rng, |u| 2.0 * u - 1.0);
        fill(&mut w, &mut rng, |u| -0.606531 * u);
        let (mut a, mut b) = (
            Tensor::zeros(act, &[t, h, kd]),
            Tensor::zeros(act, &[t, h, kd]),
        );
        for row in 0..t * h {
            let kk: Vec<f64> = (0..kd).map(|_| rng.uniform() - 0.5).collect();
            let norm = kk.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-3);
            for (c, x) in kk.iter().enumerate() {
                let iclr = rng.uniform();
                let at = [row / h, row % h, c];
                a.set(&at, -x / norm);
                b.set(&at, x / norm * iclr);
            }
        }
        let state =
            state.map(|(dt, slots, layout)| state_pool(dt, [slots, h, kd, vd], layout, &mut rng));
        let mut out = Tensor::zeros(act, &[t, h, vd]);
        fill(&mut out, &mut rng, |u| 100.0 + u); // sentinel: untouched rows stay recognisable
        Dplr {
            t,
            h,
            kd,
            vd,
            r,
            w,
            k,
            v,
            a,
            b,
            state,
            cu: None,
            idx: None,
            init: None,
            accepted: None,
            ckpt_offsets: None,
            ckpt_slots: None,
            flags: 0,
            scale: 0.0,
            out,
        }
    }

    fn with_seqs(mut self, lens: &[usize]) -> Dplr {
        self.cu = Some(cu_seqlens(lens));
        self
    }

    /// Calls the export after `m` edits the descriptors.
    fn call_mut(&mut self, m: impl FnOnce(&mut Descs), ctx: *const ssmk_context) -> i32 {
        let opt = |t: &Option<Tensor>| t.as_ref().map(|t| t.desc());
        let mut d = Descs {
            r: self.r.desc(),
            w: self.w.desc(),
            k: self.k.desc(),
            v: self.v.desc(),
            a: self.a.desc(),
            b: self.b.desc(),
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
        };
        m(&mut d);
        unsafe {
            ssmk_dplr_delta_rule(
                ctx,
                &d.r,
                &d.w,
                &d.k,
                &d.v,
                &d.a,
                &d.b,
                d.scale,
                ptr_mut(&d.state),
                ptr(&d.cu),
                ptr(&d.idx),
                ptr(&d.init),
                ptr(&d.accepted),
                d.flags,
                PAD,
                (&d.out as *const ssmk_tensor).cast_mut(),
                ptr(&d.ckpt_offsets),
                ptr(&d.ckpt_slots),
            )
        }
    }
}

struct Descs {
    r: ssmk_tensor,
    w: ssmk_tensor,
    k: ssmk_tensor,
    v: ssmk_tensor,
    a: ssmk_tensor,
    b: ssmk_tensor,
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
}

impl RecurrentCall for Dplr {
    fn args(&self) -> SeqArgs<'_> {
        SeqArgs::new(&self.out, &self.state, &self.cu, &self.idx, &self.init)
    }

    fn call(&mut self, ctx: *const ssmk_context) -> i32 {
        self.call_mut(|_| {}, ctx)
    }

    fn set_checkpoints(&mut self, offsets: Option<Tensor>, slots: Option<Tensor>) {
        (self.ckpt_offsets, self.ckpt_slots) = (offsets, slots);
    }

    fn set_sequences(&mut self, cu: Tensor, idx: Tensor, init: Tensor) {
        (self.cu, self.idx, self.init) = (Some(cu), Some(idx), Some(init));
    }
}

/// Expected outputs: out rows (None = untouched) and the state of every written slot.
struct Expect {
    out: Vec<Option<f64>>,
    states: HashMap<usize, Vec<f64>>,
}

/// The smallest normal f32: what the ABI's clamp makes of any log-decay below about -87.
const SMALLEST_DECAY: f64 = f32::MIN_POSITIVE as f64;

/// The f64 per-token recurrence of ABI.md §4.11, straight from the formula.
fn reference(p: &Dplr, seqs: &[RefSeq]) -> Expect {
    let (h_n, kd, vd) = (p.h, p.kd, p.vd);
    let [r, w, k, v, a, b] = [&p.r, &p.w, &p.k, &p.v, &p.a, &p.b].map(values);
    let st0 = p.state.as_ref().map(values);
    let scale = if p.scale <= 0.0 { 1.0 } else { p.scale as f64 };
    let linear = p.flags & SSMK_DPLR_W_LINEAR != 0;
    let mut out = vec![None; p.t * h_n * vd];
    let states = run_reference(seqs, st0.as_deref(), h_n * kd * vd, |t, state| {
        let Some(state) = state else {
            out[t * h_n * vd..][..h_n * vd].fill(Some(0.0));
            return;
        };
        for h in 0..h_n {
            let row = |x: &[f64]| x[(t * h_n + h) * kd..][..kd].to_vec();
            let (rr, ww, kk, aa, bb) = (row(&r), row(&w), row(&k), row(&a), row(&b));
            let vv = &v[(t * h_n + h) * vd..][..vd];
            let s = &mut state[h * kd * vd..][..kd * vd];
            let mut sa = vec![0f64; vd];
            for x in 0..kd {
                for j in 0..vd {
                    sa[j] += aa[x] * s[x * vd + j];
                }
            }
            for x in 0..kd {
                let d = match linear {
                    true => ww[x],
                    false => ww[x].exp().max(SMALLEST_DECAY),
                };
                for j in 0..vd {
                    s[x * vd + j] = d * s[x * vd + j] + bb[x] * sa[j] + kk[x] * vv[j];
                }
            }
            for j in 0..vd {
                let o: f64 = (0..kd).map(|x| rr[x] * s[x * vd + j]).sum();
                out[(t * h_n + h) * vd + j] = Some(o * scale);
            }
        }
    });
    Expect { out, states }
}

/// Checks `after` against `exp` within `scale` times the dtype tolerances; untouched out rows
/// and state slots must keep `before`'s bits.
fn verify_within(before: &Dplr, after: &Dplr, exp: &Expect, what: &str, scale: f64) {
    let ot = tol(after.out.dtype).times(scale);
    let pos = |i| format!("out[{i}]");
    check_out(&before.out, &after.out, &exp.out, what, pos, |i, g, w| {
        assert!(
            ot.close(g, w),
            "{what}: out[{i}] = {g} vs reference {w} (tol {ot:?})"
        )
    });
    if let (Some(sa), Some(sb)) = (&after.state, &before.state) {
        let st = tol(sa.dtype).times(scale);
        check_state_pool(sb, sa, &exp.states, what, |slot, i, g, w| {
            assert!(
                st.close(g, w),
                "{what}: state slot {slot} [{i}] = {g} vs reference {w} (tol {st:?})"
            )
        });
    }
}

fn verify(before: &Dplr, after: &Dplr, exp: &Expect, what: &str) {
    verify_within(before, after, exp, what, 1.0)
}

/// Every level of [`Isa::under_test`] against the f64 reference.
fn run_and_verify(p: &Dplr, what: &str) {
    let exp = reference(p, &plain_seqs(p));
    run_every_isa(p, &[Path::Auto], what, |a, what| verify(p, a, &exp, what));
}

/// A batch of `lens` over a pool with two spare slots, slots reversed, alternate initial states.
fn batch_case(
    seed: u64,
    lens: &[usize],
    dims: (usize, usize),
    act: DType,
    state: DType,
    layout: Layout,
) -> Dplr {
    let slots = lens.len() + 2;
    let mut p = Dplr::new(
        seed,
        lens.iter().sum(),
        3,
        dims.0,
        dims.1,
        act,
        Some((state, slots, layout)),
    )
    .with_seqs(lens);
    let (idx, init) = reversed_slots(lens.len(), slots);
    (p.idx, p.init) = (Some(idx), Some(init));
    p
}

const STATES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];
const LAYOUTS: [Layout; 2] = [Layout::KeyMajor, Layout::ValueMajor];

/// Every sequence-length list x state dtype x layout x activation dtype, at head dims with and
/// without SIMD tails (one case in 7 in the small-shape mode).
#[test]
fn every_isa_matches_reference() {
    let mut n = 0;
    for (i, lens) in SEQ_LEN_LISTS.iter().enumerate() {
        for state in STATES {
            for layout in LAYOUTS {
                n += 1;
                if !sampled(n, 7) {
                    continue;
                }
                let act = [DType::F32, DType::BF16, DType::F16][n as usize % 3];
                let dims = [(64, 64), (16, 16), (45, 36), (7, 20)][(i + n as usize) % 4];
                let p = batch_case(n, lens, dims, act, state, layout);
                run_and_verify(
                    &p,
                    &format!("{lens:?} {dims:?} {act:?} {state:?} {layout:?}"),
                );
            }
        }
    }
}

/// Each activation tensor with its own dtype and strides, and a scale other than 1.
#[test]
fn every_isa_mixed_dtypes_scale_and_strides() {
    let lens = [5usize, 70, 1];
    let mut p = batch_case(
        20,
        &lens,
        (24, 40),
        DType::BF16,
        DType::F32,
        Layout::KeyMajor,
    );
    let t = p.t;
    let mut rng = Rng::new(21);
    let mut r = Tensor::with_layout(DType::F32, &[t, 3, 24], Some(&[150, 50, 2]), t * 150);
    fill(&mut r, &mut rng, |u| (u - 0.5) * 0.5);
    let mut v = Tensor::with_layout(DType::F16, &[t, 3, 40], Some(&[200, 40, 1]), t * 200);
    fill(&mut v, &mut rng, |u| u - 0.5);
    let mut out = Tensor::with_layout(DType::F16, &[t, 3, 40], Some(&[130, 43, 1]), t * 130);
    fill(&mut out, &mut rng, |u| u + 7.0);
    let mut k = Tensor::zeros(DType::F16, &[t, 3, 24]);
    fill(&mut k, &mut rng, |u| (u - 0.5) * 0.5);
    (p.r, p.v, p.out, p.k) = (r, v, out, k);
    p.scale = 0.75;
    run_and_verify(&p, "mixed dtypes, strides, scale 0.75");
}

/// The SIMD levels against the crate's own f64 reference (`Isa::Scalar`), both layouts.
#[test]
fn every_isa_matches_crate_reference() {
    for (n, (dims, state, layout)) in [
        ((64, 64), DType::F32, Layout::KeyMajor),
        ((64, 64), DType::F32, Layout::ValueMajor),
        ((33, 17), DType::BF16, Layout::ValueMajor),
        ((16, 8), DType::F16, Layout::KeyMajor),
    ]
    .into_iter()
    .enumerate()
    {
        let lens = [1usize, 3, 64, 129, 0];
        let mut p = batch_case(30 + n as u64, &lens, dims, DType::BF16, state, layout);
        p.init = Some(Tensor::ints(DType::Bool, &[1, 0, 1, 1, 1]));
        let mut want = p.clone();
        assert_eq!(
            want.call_with(Isa::Scalar, Path::Auto, std::ptr::null()),
            SSMK_OK
        );
        for isa in Isa::under_test() {
            let mut a = p.clone();
            let code = a.call_with(isa, Path::Auto, std::ptr::null());
            assert_eq!(code, SSMK_OK, "{}", common::last_error());
            for (x, y) in [
                (&a.out, &want.out),
                (a.state.as_ref().unwrap(), want.state.as_ref().unwrap()),
            ] {
                let t = tol(x.dtype);
                for (i, (g, w)) in values(x).iter().zip(values(y)).enumerate() {
                    assert!(
                        t.close(*g, w),
                        "{isa:?} {dims:?} {layout:?}: [{i}] {g} vs {w}"
                    );
                }
            }
        }
    }
}

/// Log-decays far below RWKV-7's range act as the clamp (-87.3: the smallest normal factor),
/// `-inf` included: finite results equal to the reference's, never NaN. One token in three
/// carries extreme decays in some channels.
#[test]
fn every_isa_extreme_decays() {
    let extremes = [-87.0f32, -1e4, -1e30, f32::NEG_INFINITY, -20.0];
    let lens = [40usize, 1, 9];
    for layout in LAYOUTS {
        let p = batch_case(40, &lens, (32, 32), DType::F32, DType::F32, layout);
        let wp = p.w.base().cast::<f32>();
        for i in 0..p.w.numel() {
            if (i / p.kd).is_multiple_of(3) && !i.is_multiple_of(5) {
                unsafe { wp.add(i).write(extremes[i % extremes.len()]) };
            }
        }
        let exp = reference(&p, &plain_seqs(&p));
        run_every_isa(
            &p,
            &[Path::Auto],
            &format!("extreme w {layout:?}"),
            |a, what| {
                assert!(
                    values(&a.out).iter().all(|x| x.is_finite()),
                    "{what}: non-finite out"
                );
                verify(&p, a, &exp, what)
            },
        );
    }
}

/// `SSMK_DPLR_W_LINEAR`: `w` holds the factor; against the reference, and within rounding of the
/// same call with the factor's log.
#[test]
fn every_isa_linear_w_matches_log_form() {
    let lens = [1usize, 66, 3];
    for layout in LAYOUTS {
        let log = batch_case(50, &lens, (64, 32), DType::BF16, DType::F32, layout);
        let mut linear = log.clone();
        linear.flags = SSMK_DPLR_W_LINEAR;
        let wp = linear.w.base().cast::<f32>();
        for i in 0..linear.w.numel() {
            unsafe { wp.add(i).write(wp.add(i).read().exp()) };
        }
        run_and_verify(&linear, &format!("linear w {layout:?}"));
        let (mut a, mut b) = (log.clone(), linear.clone());
        a.run(Path::Auto, std::ptr::null(), "log w");
        b.run(Path::Auto, std::ptr::null(), "linear w");
        let t = tol(DType::BF16);
        for (i, (x, y)) in values(&a.out).iter().zip(values(&b.out)).enumerate() {
            assert!(t.close(y, *x), "{layout:?}: out[{i}] linear {y} vs log {x}");
        }
    }
}

/// f32 rows of unit stride with `w` linear and scale 1 (llama.cpp's and the `rwkv` package's
/// calls) are read where they are instead of copied: the same bits as the copying path (taken
/// here because `r` has an element stride of 2), and the reference within tolerance.
#[test]
fn every_isa_rows_read_in_place_equal_copied_rows() {
    let lens = [70usize, 1, 5];
    for ((kd, vd), layout) in [((64, 64), Layout::ValueMajor), ((24, 32), Layout::KeyMajor)] {
        let mut direct = batch_case(60, &lens, (kd, vd), DType::F32, DType::F32, layout);
        direct.flags = SSMK_DPLR_W_LINEAR;
        let wp = direct.w.base().cast::<f32>();
        for i in 0..direct.w.numel() {
            unsafe { wp.add(i).write(wp.add(i).read().exp()) };
        }
        run_and_verify(&direct, &format!("rows in place {layout:?}"));
        let mut copied = direct.clone();
        let t = direct.t;
        copied.r = Tensor::with_layout(
            DType::F32,
            &[t, 3, kd],
            Some(&[6 * kd, 2 * kd, 2]),
            t * 6 * kd,
        );
        for index in direct.r.indices() {
            copied.r.set(&index, direct.r.get(&index));
        }
        for isa in Isa::under_test() {
            let (mut a, mut b) = (direct.clone(), copied.clone());
            assert_eq!(
                a.call_with(isa, Path::Auto, std::ptr::null()),
                SSMK_OK,
                "{}",
                common::last_error()
            );
            assert_eq!(
                b.call_with(isa, Path::Auto, std::ptr::null()),
                SSMK_OK,
                "{}",
                common::last_error()
            );
            assert_eq!(a.out.to_vec(), b.out.to_vec(), "{isa:?} {layout:?}: out");
            assert_eq!(
                a.state.as_ref().unwrap().bytes(),
                b.state.as_ref().unwrap().bytes(),
                "{isa:?} {layout:?}: state"
            );
        }
    }
}

/// A prefill split over two calls (the second continuing from the state) matches one call.
#[test]
fn two_calls_equal_one_call() {
    for (i, &(t, split)) in [(128, 64), (145, 73), (200, 1)].iter().enumerate() {
        for (state, layout) in
            STATES
                .into_iter()
                .zip([Layout::KeyMajor, Layout::ValueMajor, Layout::KeyMajor])
        {
            let mut one = Dplr::new(
                60 + i as u64,
                t,
                2,
                64,
                64,
                DType::BF16,
                Some((state, 2, layout)),
            );
            one.idx = Some(Tensor::ints(DType::I32, &[1]));
            one.init = Some(Tensor::ints(DType::U8, &[1]));
            let mut two = one.clone();
            let what = format!("T {t} split {split} state {state:?} {layout:?}");
            one.run(Path::Auto, std::ptr::null(), &what);
            two.cu = Some(Tensor::ints(DType::I32, &[0, split as i64]));
            two.run(Path::Auto, std::ptr::null(), &what);
            two.cu = Some(Tensor::ints(DType::I32, &[split as i64, t as i64]));
            two.run(Path::Auto, std::ptr::null(), &what);
            for (x, y, dt) in [
                (&one.out, &two.out, DType::BF16),
                (
                    one.state.as_ref().unwrap(),
                    two.state.as_ref().unwrap(),
                    state,
                ),
            ] {
                let tl = tol(dt).times(2.0);
                for (j, (a, b)) in values(x).iter().zip(values(y)).enumerate() {
                    assert!(tl.close(b, *a), "{what}: [{j}] {b} vs one call {a}");
                }
            }
        }
    }
}

/// Decodes and prefills (and a padded and a zero-length sequence) in one call give bit-identical
/// results to one call per sequence, and match the reference.
#[test]
fn mixed_batch_equals_separate_calls() {
    let lens = [1usize, 100, 1, 0, 1, 70, 3, 1];
    let slots = [3i64, 0, 7, PAD, 2, 5, 1, 9];
    let init = [1i64, 0, 1, 1, 1, 1, 0, 1];
    for layout in LAYOUTS {
        let mut all = Dplr::new(
            70,
            lens.iter().sum(),
            2,
            64,
            32,
            DType::BF16,
            Some((DType::F32, 10, layout)),
        )
        .with_seqs(&lens);
        all.idx = Some(Tensor::ints(DType::I32, &slots));
        all.init = Some(Tensor::ints(DType::Bool, &init));
        let (mut sep, before) = (all.clone(), all.clone());
        let what = format!("mixed batch {layout:?}");
        all.run(Path::Auto, std::ptr::null(), &what);
        for (cu, idx, init) in one_call_per_sequence(&lens, &slots, &init) {
            (sep.cu, sep.idx, sep.init) = (Some(cu), Some(idx), Some(init));
            sep.run(Path::Auto, std::ptr::null(), &what);
        }
        assert!(all.out.bytes() == sep.out.bytes(), "{what}: outputs differ");
        assert!(
            all.state.as_ref().unwrap().bytes() == sep.state.as_ref().unwrap().bytes(),
            "{what}: states differ"
        );
        verify(
            &before,
            &all,
            &reference(&before, &plain_seqs(&before)),
            &what,
        );
    }
}

/// Speculative decode: per-token state writes to `idx[b][t]` (a pad entry skips its write),
/// reads from `idx[b][max(n-1,0)]`, including n = 0 and n = 1, a padded row, a zero-length
/// sequence and `has_initial_state` false.
#[test]
fn every_isa_speculative_matches_reference() {
    let smax = 4usize;
    let lens = [3usize, 1, 4, 0, 2, 4];
    let accepted = [2i64, 0, 1, 3, 4, 1];
    let init = [1i64, 1, 1, 1, 0, 1];
    let pool = 30usize;
    let mut table = shuffled_slots(pool, 77)[..lens.len() * smax].to_vec();
    table[4 * smax] = PAD; // sequence 4 is padded
    table[2 * smax + 2] = PAD; // sequence 2's third state is not written
    for (state, dims, layout) in [
        (DType::F32, (32, 32), Layout::KeyMajor),
        (DType::BF16, (64, 32), Layout::ValueMajor),
        (DType::F16, (20, 48), Layout::KeyMajor),
    ] {
        let mut p = Dplr::new(
            80,
            lens.iter().sum(),
            2,
            dims.0,
            dims.1,
            DType::BF16,
            Some((state, pool, layout)),
        )
        .with_seqs(&lens);
        p.idx = Some(slot_table(DType::I32, &table, smax));
        p.accepted = Some(Tensor::ints(DType::I64, &accepted));
        p.init = Some(Tensor::ints(DType::I32, &init));
        let seqs = spec_seqs(&lens, &accepted, &init, &table, smax, true);
        let exp = reference(&p, &seqs);
        assert_eq!(exp.states.len(), 11, "the case writes eleven states");
        for isa in Isa::under_test() {
            let mut a = p.clone();
            let code = a.call_with(isa, Path::Auto, std::ptr::null());
            assert_eq!(code, SSMK_OK, "{}", common::last_error());
            verify(
                &p,
                &a,
                &exp,
                &format!("speculative {isa:?} {state:?} {layout:?}"),
            );
        }
    }
}

/// Pad slots give zero rows and leave the pool alone; NULL `has_initial_state` starts from zeros;
/// NULL `state` starts from zeros and writes nothing; zero-length sequences write their initial
/// state back (zeros without one).
#[test]
fn padding_null_arguments_and_empty_sequences() {
    let lens = [4usize, 0, 66, 0, 1];
    let mut p = Dplr::new(
        90,
        71,
        2,
        32,
        32,
        DType::BF16,
        Some((DType::BF16, 6, Layout::KeyMajor)),
    )
    .with_seqs(&lens);
    p.idx = Some(Tensor::ints(DType::I32, &[PAD, 4, 2, 0, PAD]));
    p.init = Some(Tensor::ints(DType::Bool, &[1, 1, 1, 0, 1]));
    let mut a = p.clone();
    a.run(Path::Auto, std::ptr::null(), "pads and empty sequences");
    verify(
        &p,
        &a,
        &reference(&p, &plain_seqs(&p)),
        "pads and empty sequences",
    );
    let (sb, sa) = (p.state.as_ref().unwrap(), a.state.as_ref().unwrap());
    let slot_bytes = 2 * 32 * 32 * 2;
    assert!(
        sa.bytes()[4 * slot_bytes..5 * slot_bytes] == sb.bytes()[4 * slot_bytes..5 * slot_bytes]
    );
    assert!(sa.bytes()[..slot_bytes].iter().all(|&x| x == 0));

    let mut p = Dplr::new(
        91,
        70,
        2,
        32,
        32,
        DType::BF16,
        Some((DType::F32, 3, Layout::ValueMajor)),
    )
    .with_seqs(&[1, 69]);
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

/// Results are bitwise identical on 1, 2 and 3 threads and on the split of 16 (a recording
/// context), both layouts.
#[test]
fn thread_counts_bitwise_equal() {
    let lens = [1usize, 130, 1, 65, 2, 1];
    for layout in LAYOUTS {
        let mut p = Dplr::new(
            100,
            lens.iter().sum(),
            2,
            64,
            64,
            DType::BF16,
            Some((DType::F32, 6, layout)),
        )
        .with_seqs(&lens);
        p.init = Some(Tensor::ints(DType::Bool, &[1, 1, 0, 1, 1, 1]));
        let mut results = Vec::new();
        for threads in [1, 2, 3, 16] {
            let ctx = match threads {
                16 => ssmk_context::recording(16),
                _ => ssmk_context_create(threads),
            };
            let mut a = p.clone();
            // Small as it is, every call spreads its tasks (decodes would otherwise stay inline).
            with_every_call_parallel(|| a.run(Path::Auto, ctx, &format!("{threads} threads")));
            unsafe { ssmk_context_destroy(ctx) };
            results.push((threads, a.out.bytes(), a.state.as_ref().unwrap().bytes()));
        }
        for (threads, out, state) in &results[1..] {
            let (_, out1, state1) = &results[0];
            assert!(
                out == out1 && state == state1,
                "{layout:?}: 1 vs {threads} threads differ"
            );
        }
    }
}

/// Checkpoints (ABI.md §4.10) hold, bit for bit, what a call ending there stores; they change
/// nothing else; every checkpoint error is refused with nothing written.
#[test]
fn every_isa_checkpoints_equal_calls_ending_there() {
    let lens = [70usize, 1, 0, 33, 5];
    let rows = vec![
        vec![(1, 8), (69, 9), (70, 10), (3, PAD)],
        vec![(1, 11)],
        vec![],
        vec![(32, 12)],
        vec![(2, PAD)],
    ];
    for state in [DType::F32, DType::BF16] {
        let mut p = Dplr::new(
            110,
            lens.iter().sum(),
            2,
            32,
            48,
            DType::BF16,
            Some((state, 14, Layout::KeyMajor)),
        )
        .with_seqs(&lens);
        p.idx = Some(Tensor::ints(DType::I32, &[0, 1, 2, 3, PAD]));
        p.init = Some(Tensor::ints(DType::Bool, &[1, 0, 1, 1, 1]));
        let exact = Tol {
            atol: 0.0,
            rtol: 0.0,
        };
        check_checkpoints(
            &p,
            &rows,
            &[Path::Auto],
            &format!("checkpoints {state:?}"),
            exact,
        );
        check_checkpoint_errors(&p, 0, 13);
    }
}

/// Every rejected input: the status, a message naming the argument with expected and actual
/// values, and nothing written.
#[test]
fn rejects_bad_inputs() {
    let base = || {
        let mut p = Dplr::new(
            120,
            7,
            2,
            8,
            8,
            DType::BF16,
            Some((DType::F32, 4, Layout::KeyMajor)),
        )
        .with_seqs(&[3, 4]);
        p.idx = Some(Tensor::ints(DType::I32, &[1, 2]));
        p.init = Some(Tensor::ints(DType::Bool, &[1, 0]));
        p
    };
    let spec = || {
        let mut p = base();
        p.idx = Some(slot_table(DType::I32, &[0, 1, 2, 3, PAD, PAD, PAD, PAD], 4));
        p.accepted = Some(Tensor::ints(DType::I32, &[1, 1]));
        p
    };
    let k_wrong = Tensor::zeros(DType::BF16, &[7, 2, 9]);
    let a_heads = Tensor::zeros(DType::BF16, &[7, 3, 8]);
    let b_tokens = Tensor::zeros(DType::BF16, &[6, 2, 8]);
    let w_bf16 = Tensor::zeros(DType::BF16, &[7, 2, 8]);
    let v_heads = Tensor::zeros(DType::BF16, &[7, 3, 8]);
    let out_f32 = Tensor::zeros(DType::F32, &[7, 2, 8]);
    let out_wrong = Tensor::zeros(DType::BF16, &[7, 2, 9]);
    let r_int = Tensor::zeros(DType::I32, &[7, 2, 8]);
    let state_wrong = Tensor::zeros(DType::F32, &[4, 2, 8, 9]);
    let state_int = Tensor::zeros(DType::I32, &[4, 2, 8, 8]);
    let zero_k = Tensor::zeros(DType::BF16, &[7, 2, 0]);
    type Setup<'a> = Box<dyn Fn(&mut Dplr) + 'a>;
    type Edit<'a> = Box<dyn Fn(&mut Descs) + 'a>;
    let none = || -> Setup { Box::new(|_| {}) };
    let keep = || -> Edit { Box::new(|_| {}) };
    let cases: Vec<(&str, Setup, Edit, i32, &str)> = vec![
        (
            "k shape",
            none(),
            Box::new(|d| d.k = k_wrong.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "k.shape[2] = 9, expected K = r.shape[2] = 8",
        ),
        (
            "a heads",
            none(),
            Box::new(|d| d.a = a_heads.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "a.shape[1] = 3, expected H = r.shape[1] = 2",
        ),
        (
            "b tokens",
            none(),
            Box::new(|d| d.b = b_tokens.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "b.shape[0] = 6, expected T = r.shape[0] = 7",
        ),
        (
            "w dtype",
            none(),
            Box::new(|d| d.w = w_bf16.desc()),
            SSMK_ERR_UNSUPPORTED_DTYPE,
            "w.dtype = bfloat16, expected float32",
        ),
        (
            "v heads",
            none(),
            Box::new(|d| d.v = v_heads.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "v.shape[1] = 3, expected H = r.shape[1] = 2",
        ),
        (
            "out dtype",
            none(),
            Box::new(|d| d.out = out_f32.desc()),
            SSMK_ERR_UNSUPPORTED_DTYPE,
            "out.dtype = float32, expected v.dtype = bfloat16",
        ),
        (
            "out shape",
            none(),
            Box::new(|d| d.out = out_wrong.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "out.shape[2] = 9, expected V = v.shape[2] = 8",
        ),
        (
            "r dtype",
            none(),
            Box::new(|d| d.r = r_int.desc()),
            SSMK_ERR_UNSUPPORTED_DTYPE,
            "r.dtype = int32",
        ),
        (
            "K = 0",
            none(),
            Box::new(|d| d.r = zero_k.desc()),
            SSMK_ERR_INVALID_ARGUMENT,
            "r.shape[2] = 0, expected K >= 1",
        ),
        (
            "state shape",
            none(),
            Box::new(|d| d.state = Some(state_wrong.desc())),
            SSMK_ERR_INVALID_ARGUMENT,
            "state.shape[3] = 9, expected V = v.shape[2] = 8",
        ),
        (
            "state dtype",
            none(),
            Box::new(|d| d.state = Some(state_int.desc())),
            SSMK_ERR_UNSUPPORTED_DTYPE,
            "state.dtype = int32",
        ),
        (
            "flags",
            none(),
            Box::new(|d| d.flags = 2),
            SSMK_ERR_INVALID_ARGUMENT,
            "flags = 0x2, expected 0 or SSMK_DPLR_W_LINEAR (1)",
        ),
        (
            "scale NaN",
            none(),
            Box::new(|d| d.scale = f32::NAN),
            SSMK_ERR_INVALID_ARGUMENT,
            "scale = NaN",
        ),
        (
            "scale inf",
            none(),
            Box::new(|d| d.scale = f32::INFINITY),
            SSMK_ERR_INVALID_ARGUMENT,
            "scale = inf",
        ),
        (
            "out overlaps r",
            none(),
            Box::new(|d| d.out = d.r),
            SSMK_ERR_ALIASING,
            "out",
        ),
        (
            "r NULL data",
            none(),
            Box::new(|d| d.r.data = std::ptr::null_mut()),
            SSMK_ERR_NULL_POINTER,
            "r",
        ),
        (
            "slot out of range",
            Box::new(|p| p.idx = Some(Tensor::ints(DType::I32, &[1, 4]))),
            keep(),
            SSMK_ERR_OUT_OF_BOUNDS,
            "state_indices[1] = 4, expected 0 <= slot < 4",
        ),
        (
            "duplicate slots",
            Box::new(|p| p.idx = Some(Tensor::ints(DType::I32, &[2, 2]))),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "expected distinct slots",
        ),
        (
            "cu_seqlens past T",
            Box::new(|p| p.cu = Some(Tensor::ints(DType::I32, &[0, 3, 8]))),
            keep(),
            SSMK_ERR_OUT_OF_BOUNDS,
            "cu_seqlens[2] = 8",
        ),
        (
            "cu_seqlens decreasing",
            Box::new(|p| p.cu = Some(Tensor::ints(DType::I32, &[0, 4, 3]))),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "non-decreasing",
        ),
        (
            "initial state without pool",
            Box::new(|p| p.state = None),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "has_initial_state[0] is true but state is NULL",
        ),
        (
            "speculative without [B, Smax]",
            Box::new(|p| {
                p.accepted = Some(Tensor::ints(DType::I32, &[1, 1]));
            }),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "state_indices.ndim = 1, expected 2",
        ),
        (
            "num_accepted_tokens > Smax",
            Box::new(|p| {
                *p = spec();
                p.accepted = Some(Tensor::ints(DType::I32, &[5, 1]));
            }),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "num_accepted_tokens[0] = 5",
        ),
        (
            "sequence longer than Smax",
            Box::new(|p| {
                *p = spec();
                p.idx = Some(slot_table(DType::I32, &[0, 1, PAD, PAD], 2));
            }),
            keep(),
            SSMK_ERR_INVALID_ARGUMENT,
            "sequence 0 has 3 tokens",
        ),
    ];
    for (name, setup, edit, status, fragment) in cases {
        let mut p = base();
        setup(&mut p);
        let before = Written::of(&p);
        let code = p.call_mut(|d| edit(d), std::ptr::null());
        assert_error(code, status, &[fragment]);
        before.assert_kept(&p, name);
    }
}

/// Both state layouts take a fast path: a pool kept `[v][k]` (ggml's) gives the outputs and
/// states of a compact `[k][v]` pool holding the same values. Multi-token sequences run one
/// blocked recurrence for both, bit for bit; a decode on `[v][k]` runs a one-pass path that sums
/// each column of the state along its contiguous row, a different order than `[k][v]`'s two
/// passes, so decodes agree within a few roundings of the stored dtypes.
#[test]
fn every_isa_value_major_state_equals_key_major() {
    for (lens, bitwise) in [
        (&[40usize, 3, 2][..], true),
        (&[1usize, 1, 1, 1][..], false),
    ] {
        for (state, dims) in [
            (DType::F32, (64, 64)),
            (DType::F32, (20, 36)),
            (DType::F16, (16, 24)),
        ] {
            let kv = batch_case(140, lens, dims, DType::BF16, state, Layout::KeyMajor);
            let mut vk = kv.clone();
            let [slots, h] = [lens.len() + 2, 3];
            let mut st = state_pool(
                state,
                [slots, h, dims.0, dims.1],
                Layout::ValueMajor,
                &mut Rng::new(1),
            );
            let want = values(kv.state.as_ref().unwrap());
            common::recurrent::fill_with(&mut st, |i| want[i]);
            vk.state = Some(st);
            for isa in Isa::under_test() {
                let (mut a, mut b) = (kv.clone(), vk.clone());
                for p in [&mut a, &mut b] {
                    let code = p.call_with(isa, Path::Auto, std::ptr::null());
                    assert_eq!(code, SSMK_OK, "{}", common::last_error());
                }
                let what = format!("{isa:?} {state:?} {dims:?} lens {lens:?}");
                let pairs = [
                    ("outputs", values(&a.out), values(&b.out), 2f64.powi(-7)),
                    (
                        "states",
                        values(a.state.as_ref().unwrap()),
                        values(b.state.as_ref().unwrap()),
                        if state == DType::F16 {
                            2f64.powi(-9)
                        } else {
                            1e-5
                        },
                    ),
                ];
                for (name, x, y, rel) in pairs {
                    let first = x.iter().zip(&y).position(|(x, y)| match bitwise {
                        true => x.to_bits() != y.to_bits(),
                        // A few roundings of the stored dtype, relative to the row's scale.
                        false => (x - y).abs() > rel * (1.0 + x.abs()),
                    });
                    assert!(first.is_none(), "{what}: {name} differ first at {first:?}");
                }
            }
        }
    }
}
