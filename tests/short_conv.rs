//! LFM2 ShortConv (`ssmk_short_conv`): `out = C * conv(B * x)` must equal, bit for bit, the
//! unfused composition a runtime would run — `B*x` stored in the activation dtype, then
//! `ssmk_causal_conv1d_fwd` without activation, then `C*y` stored in the activation dtype —
//! for every dtype, width, batch shape, state layout and thread count. Padded sequences give
//! zero rows (the composition may give -0.0 there, so pad rows compare by value).

mod common;

use std::ptr::{null, null_mut};

use common::{Ctx, Rng, SEQ_LEN_LISTS, Tensor, assert_error};
use ssmk::dtype::DType;
use ssmk::ffi::context::ssmk_context;
use ssmk::ffi::conv::{SSMK_ACTIVATION_NONE, ssmk_causal_conv1d_fwd};
use ssmk::ffi::short_conv::ssmk_short_conv;
use ssmk::ffi::status::*;
use ssmk::runtime::{Isa, with_every_call_parallel};
use ssmk::tensor::ssmk_tensor;

/// One call's inputs. `slots[b] == -1` pads sequence `b`.
#[derive(Clone)]
struct Case {
    dtype: DType,
    dim: usize,
    lens: Vec<usize>,
    slots: Vec<i64>,
    initial: Vec<bool>,
    bcx: Tensor,
    weight: Tensor,
    bias: Option<Tensor>,
    states: Option<Tensor>,
    /// `(checkpoint_offsets, checkpoint_slots)`, or both NULL.
    ckpt: Option<(Tensor, Tensor)>,
}

impl Case {
    fn new(dtype: DType, dim: usize, width: usize, lens: &[usize], seed: u64) -> Case {
        let t: usize = lens.iter().sum();
        let slots_n = lens.len() + 2;
        let mut rng = Rng::new(seed);
        // Slots in a shuffled order, state rows L = W+1 (wider than W-1: rows W-1.. untouched).
        let mut order: Vec<i64> = (0..slots_n as i64).collect();
        for i in (1..slots_n).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let slots = order[..lens.len()].to_vec();
        let mut bcx = Tensor::zeros(dtype, &[t, 3 * dim]);
        bcx.fill_random(seed, 2.0);
        let mut weight = Tensor::zeros(dtype, &[dim, width]);
        weight.fill_random(seed + 1, 0.7);
        let mut bias = Tensor::zeros(dtype, &[dim]);
        bias.fill_random(seed + 2, 0.3);
        let mut states = Tensor::zeros(dtype, &[slots_n, width + 1, dim]);
        states.fill_random(seed + 3, 1.5);
        let initial = (0..lens.len()).map(|_| rng.below(2) == 0).collect();
        Case {
            dtype,
            dim,
            lens: lens.to_vec(),
            slots,
            initial,
            bcx,
            weight,
            bias: Some(bias),
            states: Some(states),
            ckpt: None,
        }
    }

    /// The cache indices and has_initial_state tensors of the batch.
    fn slots_and_initial(&self) -> (Tensor, Tensor) {
        let initial: Vec<i64> = self.initial.iter().map(|&i| i as i64).collect();
        (
            Tensor::ints(DType::I64, &self.slots),
            Tensor::ints(DType::Bool, &initial),
        )
    }

    fn starts(&self) -> Tensor {
        let mut acc = 0i64;
        let v: Vec<i64> = std::iter::once(0)
            .chain(self.lens.iter().map(|&l| {
                acc += l as i64;
                acc
            }))
            .collect();
        Tensor::ints(DType::I32, &v)
    }

    fn tokens(&self) -> usize {
        self.lens.iter().sum()
    }

    /// `ssmk_short_conv` (at `isa`, or the active kernels) → (out, states after).
    fn fused(&self, ctx: &Ctx, isa: Option<Isa>) -> (Tensor, Option<Tensor>) {
        let out = Tensor::zeros(self.dtype, &[self.tokens(), self.dim]);
        let states = self.states.clone();
        let (bcx, w, q) = (self.bcx.desc(), self.weight.desc(), self.starts());
        let b = self.bias.as_ref().map(Tensor::desc);
        let (idx, init) = self.slots_and_initial();
        let mut sd = states.as_ref().map(Tensor::desc);
        let mut od = out.desc();
        let (qd, id, hd) = (q.desc(), idx.desc(), init.desc());
        let args = (
            b.as_ref().map_or(null(), |d| d as *const _),
            sd.as_mut().map_or(null_mut(), |d| d as *mut _),
            if states.is_some() {
                &hd as *const ssmk_tensor
            } else {
                null()
            },
        );
        let ckpt = self.ckpt.as_ref().map(|(o, s)| (o.desc(), s.desc()));
        let (co, cs) = ckpt
            .as_ref()
            .map_or((null(), null()), |(o, s)| (o as *const _, s as *const _));
        let call = || unsafe {
            ssmk_short_conv(
                ctx.0, &bcx, &w, args.0, args.1, &qd, &id, args.2, -1, &mut od, co, cs,
            )
        };
        let code = common::with_optional_isa(isa, call);
        assert_eq!(code, SSMK_OK, "{}", common::last_error());
        (out, states)
    }

    /// The unfused composition through the C ABI.
    fn composed(&self, ctx: &Ctx) -> (Tensor, Option<Tensor>) {
        let (t, d) = (self.tokens(), self.dim);
        let mut bx = Tensor::zeros(self.dtype, &[t, d]);
        for i in 0..t {
            for c in 0..d {
                let v = self.bcx.get(&[i, c]) as f32 * self.bcx.get(&[i, 2 * d + c]) as f32;
                bx.set(&[i, c], v as f64);
            }
        }
        let y = Tensor::zeros(self.dtype, &[t, d]);
        let states = self.states.clone();
        let (xd, w, q) = (bx.desc(), self.weight.desc(), self.starts());
        let b = self.bias.as_ref().map(Tensor::desc);
        let (idx, init) = self.slots_and_initial();
        let mut sd = states.as_ref().map(Tensor::desc);
        let mut yd = y.desc();
        let (qd, id, hd) = (q.desc(), idx.desc(), init.desc());
        let code = unsafe {
            ssmk_causal_conv1d_fwd(
                ctx.0,
                &xd,
                &w,
                b.as_ref().map_or(null(), |d| d as *const _),
                sd.as_mut().map_or(null_mut(), |d| d as *mut _),
                &qd,
                &id,
                if states.is_some() { &hd } else { null() },
                SSMK_ACTIVATION_NONE,
                -1,
                &mut yd,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(code, SSMK_OK, "{}", common::last_error());
        let mut out = Tensor::zeros(self.dtype, &[t, d]);
        for i in 0..t {
            for c in 0..d {
                let v = self.bcx.get(&[i, d + c]) as f32 * y.get(&[i, c]) as f32;
                out.set(&[i, c], v as f64);
            }
        }
        (out, states)
    }

    fn padded_token(&self, t: usize) -> bool {
        let mut start = 0;
        for (b, &l) in self.lens.iter().enumerate() {
            if t < start + l {
                return self.slots[b] == -1;
            }
            start += l;
        }
        false
    }
}

fn assert_same(
    case: &Case,
    got: &(Tensor, Option<Tensor>),
    want: &(Tensor, Option<Tensor>),
    what: &str,
) {
    let d = case.dim;
    for t in 0..case.tokens() {
        for c in 0..d {
            let (g, w) = (got.0.get(&[t, c]), want.0.get(&[t, c]));
            if case.padded_token(t) {
                assert!(
                    g == 0.0 && g.is_sign_positive() && w == 0.0,
                    "{what}: pad row {t} ch {c}: {g} vs {w}"
                );
            } else {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{what}: out[{t}][{c}] = {g}, composition {w}"
                );
            }
        }
    }
    match (&got.1, &want.1) {
        (Some(g), Some(w)) => assert!(g.bytes() == w.bytes(), "{what}: states differ"),
        (None, None) => {}
        _ => unreachable!(),
    }
}

#[test]
fn every_isa_equals_unfused_composition_bit_for_bit() {
    let ctx = Ctx::new(2);
    let mut seed = 1;
    for dtype in [DType::BF16, DType::F16, DType::F32] {
        for (i, lens) in SEQ_LEN_LISTS.iter().enumerate() {
            let width = [2, 3, 4, 8][i % 4];
            seed += 1;
            let mut case = Case::new(dtype, 136, width, lens, seed);
            if i % 3 == 0 {
                case.bias = None;
            }
            let want = case.composed(&ctx);
            for isa in Isa::under_test() {
                let what = format!("{dtype:?} W={width} lens={lens:?} {isa:?}");
                assert_same(&case, &case.fused(&ctx, Some(isa)), &want, &what);
            }
        }
    }
}

/// Bit patterns of NaNs (quiet and signaling, with payloads in either half of an f32), infinities,
/// the largest finite value, the smallest subnormal, -0 and a value whose square overflows.
fn special_values(dtype: DType) -> &'static [u32] {
    match dtype {
        DType::BF16 => &[
            0x7fc0, 0x7f81, 0xffa5, 0x7fff, 0xffff, 0x7f80, 0xff80, 0x7f7f, 0x0001, 0x8000, 0x5f80,
        ],
        DType::F16 => &[
            0x7e00, 0x7c01, 0xfd55, 0x7fff, 0xffff, 0x7c00, 0xfc00, 0x7bff, 0x0001, 0x8000, 0x5c00,
        ],
        _ => &[
            0x7fc0_0000,
            0x7f80_0001,
            0xffa5_a5a5,
            0x7fff_ffff,
            0xffff_0001,
            0x7f80_0000,
            0xff80_0000,
            0x7f7f_ffff,
            0x0000_0001,
            0x8000_0000,
            0x5f80_0000,
        ],
    }
}

/// Overwrites about one element in `1/every` of `t` with a special value.
fn sprinkle_specials(t: &mut Tensor, rng: &mut Rng, every: usize) {
    let specials = special_values(t.dtype);
    for idx in t.indices() {
        if rng.below(every) == 0 {
            t.set_bits(&idx, specials[rng.below(specials.len())]);
        }
    }
}

/// `t`'s values in an f32 tensor of the same shape.
fn widened(t: &Tensor) -> Tensor {
    let mut wide = Tensor::zeros(
        DType::F32,
        &t.shape.iter().map(|&n| n as usize).collect::<Vec<_>>(),
    );
    for idx in t.indices() {
        wide.set(&idx, t.get(&idx));
    }
    wide
}

/// NaNs, infinities, overflowing products and subnormals in the inputs, the states and a few taps
/// (16-bit activations also with f32 taps and states, whose NaNs may carry payload bits a 16-bit
/// type lacks): each output is NaN where the composition's is (payloads may differ: the
/// composition's own scalar steps quiet them differently), else the same bits. Catches a rounding
/// that turns a NaN into an infinity or a zero, on every ISA.
#[test]
fn every_isa_special_values_match_composition() {
    let mut rng = Rng::new(99);
    let cases = [
        (DType::BF16, false),
        (DType::BF16, true),
        (DType::F16, false),
        (DType::F16, true),
        (DType::F32, false),
    ];
    for (dtype, wide) in cases {
        for (width, lens) in [(3, &[1, 70, 5, 300][..]), (4, &[2, 1, 33]), (8, &[40, 1])] {
            let mut case = Case::new(dtype, 136, width, lens, 7 + width as u64);
            if wide {
                case.weight = widened(&case.weight);
                case.bias = case.bias.as_ref().map(widened);
                case.states = case.states.as_ref().map(widened);
            }
            sprinkle_specials(&mut case.bcx, &mut rng, 30);
            sprinkle_specials(case.states.as_mut().unwrap(), &mut rng, 30);
            sprinkle_specials(&mut case.weight, &mut rng, 200);
            sprinkle_specials(case.bias.as_mut().unwrap(), &mut rng, 50);
            let want = case.composed(&Ctx::new(1));
            for isa in Isa::under_test() {
                let got = case.fused(&Ctx::new(2), Some(isa));
                let what = format!("{dtype:?} wide={wide} W={width} lens={lens:?} {isa:?}");
                for t in 0..case.tokens() {
                    for c in 0..case.dim {
                        let (g, w) = (got.0.get(&[t, c]), want.0.get(&[t, c]));
                        assert!(
                            g.to_bits() == w.to_bits() || g.is_nan() && w.is_nan(),
                            "{what}: out[{t}][{c}] = {g:e}, composition {w:e}"
                        );
                    }
                }
            }
        }
    }
}

/// NaNs, infinities and subnormals in the inputs, states and taps: outputs and states are the
/// same bits, NaN payloads included, on 1, 2 and 3 threads and on the task splits of 16 and 64
/// (recording contexts), on every ISA (a channel's path, vector body or scalar tail, follows the
/// split).
#[test]
fn every_isa_special_values_are_bitwise_equal_for_every_thread_count() {
    let mut rng = Rng::new(4901);
    let contexts = [
        (1, Ctx::new(1)),
        (2, Ctx::new(2)),
        (3, Ctx::new(3)),
        (16, Ctx(ssmk_context::recording(16))),
        (64, Ctx(ssmk_context::recording(64))),
    ];
    for (dtype, wide) in [
        (DType::BF16, true),
        (DType::F16, false),
        (DType::F32, false),
    ] {
        for (width, lens) in [(3, &[1, 70, 5, 300][..]), (4, &[2, 1, 33])] {
            let mut case = Case::new(dtype, 140, width, lens, 11 + width as u64);
            if wide {
                case.weight = widened(&case.weight);
                case.states = case.states.as_ref().map(widened);
            }
            sprinkle_specials(&mut case.bcx, &mut rng, 20);
            sprinkle_specials(case.states.as_mut().unwrap(), &mut rng, 20);
            sprinkle_specials(&mut case.weight, &mut rng, 100);
            for isa in Isa::under_test() {
                let what = format!("{dtype:?} wide={wide} W={width} {isa:?}");
                let (out, states) = case.fused(&contexts[0].1, Some(isa));
                for (threads, ctx) in &contexts[1..] {
                    let (o, s) = with_every_call_parallel(|| case.fused(ctx, Some(isa)));
                    assert!(o.bytes() == out.bytes(), "{what}: out, {threads} threads");
                    assert!(
                        s.unwrap().bytes() == states.as_ref().unwrap().bytes(),
                        "{what}: states, {threads} threads"
                    );
                }
            }
        }
    }
}

#[test]
fn every_isa_and_thread_count_agrees() {
    let mut case = Case::new(DType::BF16, 300, 3, &[1, 70, 0, 5, 300], 77);
    case.slots[3] = -1;
    let want = case.composed(&Ctx::new(1));
    for isa in Isa::under_test() {
        for threads in [1, 2, 3] {
            let got = with_every_call_parallel(|| case.fused(&Ctx::new(threads), Some(isa)));
            assert_same(&case, &got, &want, &format!("{isa:?} threads={threads}"));
        }
    }
}

#[test]
fn pads_null_states_and_strided_rows() {
    let ctx = Ctx::new(2);
    // Padded sequences and a zero-length one.
    let mut case = Case::new(DType::F16, 64, 3, &[5, 0, 9, 1], 5);
    case.slots[0] = -1;
    let (out, states) = case.fused(&ctx, None);
    assert_same(
        &case,
        &(Tensor::clone(&out), states.clone()),
        &case.composed(&ctx),
        "pads",
    );
    // Padded slot's state untouched: compare with the initial pool at the slot it would not use.
    // No state pool at all: zero history, nothing written.
    let mut stateless = Case::new(DType::BF16, 40, 4, &[7, 3], 6);
    stateless.states = None;
    stateless.initial = vec![false, false];
    assert_same(
        &stateless,
        &stateless.fused(&ctx, None),
        &stateless.composed(&ctx),
        "no states",
    );
    // bcx rows with padding between them (row stride > 3D).
    let mut strided = Case::new(DType::F32, 48, 3, &[10, 20], 8);
    let t = strided.tokens();
    let mut wide = Tensor::with_layout(DType::F32, &[t, 144], Some(&[150, 1]), t * 150);
    for i in 0..t {
        for c in 0..144 {
            wide.set(&[i, c], strided.bcx.get(&[i, c]));
        }
    }
    let want = strided.composed(&ctx);
    strided.bcx = wide;
    assert_same(
        &strided,
        &strided.fused(&ctx, None),
        &want,
        "strided bcx rows",
    );
}

/// A prefill split over two calls (the second continuing from the state) equals one call.
#[test]
fn chunked_prefill_is_bit_exact() {
    let ctx = Ctx::new(2);
    for (total, first) in [(128, 64), (145, 64), (145, 73), (273, 128), (192, 65)] {
        for dtype in [DType::BF16, DType::F32] {
            let mut whole = Case::new(dtype, 96, 3, &[total], total as u64);
            whole.initial = vec![false];
            let one = whole.fused(&ctx, None);
            let d = whole.dim;
            let part = |rows: std::ops::Range<usize>| {
                let mut t = Tensor::zeros(dtype, &[rows.len(), 3 * d]);
                for (i, r) in rows.enumerate() {
                    for c in 0..3 * d {
                        t.set(&[i, c], whole.bcx.get(&[r, c]));
                    }
                }
                t
            };
            let mut a = Case::new(dtype, 96, 3, &[first], 1);
            a.bcx = part(0..first);
            a.weight = Tensor::clone(&whole.weight);
            a.bias = whole.bias.clone();
            a.states = whole.states.clone();
            a.slots = whole.slots.clone();
            a.initial = vec![false];
            let (out_a, states_a) = a.fused(&ctx, None);
            let mut b = Case::new(dtype, 96, 3, &[total - first], 2);
            b.bcx = part(first..total);
            b.weight = Tensor::clone(&whole.weight);
            b.bias = whole.bias.clone();
            b.states = states_a;
            b.slots = whole.slots.clone();
            b.initial = vec![true];
            let (out_b, states_b) = b.fused(&ctx, None);
            for t in 0..total {
                for c in 0..d {
                    let got = if t < first {
                        out_a.get(&[t, c])
                    } else {
                        out_b.get(&[t - first, c])
                    };
                    assert_eq!(
                        got.to_bits(),
                        one.0.get(&[t, c]).to_bits(),
                        "split ({total},{first}) {dtype:?} t={t}"
                    );
                }
            }
            assert!(
                states_b.unwrap().bytes() == one.1.unwrap().bytes(),
                "split state ({total},{first})"
            );
        }
    }
}

/// Decodes (length-1 sequences continuing from state) and prefills in one call equal separate calls.
#[test]
fn mixed_decode_and_prefill_equals_separate_calls() {
    let ctx = Ctx::new(2);
    let mut mixed = Case::new(DType::BF16, 128, 3, &[1, 1, 37, 1, 200], 41);
    mixed.initial = vec![true, true, false, true, true];
    let together = mixed.fused(&ctx, None);
    let mut states = mixed.states.clone();
    let mut start = 0;
    for b in 0..mixed.lens.len() {
        let len = mixed.lens[b];
        let mut one = Case::new(DType::BF16, 128, 3, &[len], 3);
        one.bcx = Tensor::zeros(DType::BF16, &[len, 384]);
        for i in 0..len {
            for c in 0..384 {
                one.bcx.set(&[i, c], mixed.bcx.get(&[start + i, c]));
            }
        }
        one.weight = Tensor::clone(&mixed.weight);
        one.bias = mixed.bias.clone();
        one.states = states;
        one.slots = vec![mixed.slots[b]];
        one.initial = vec![mixed.initial[b]];
        let (out, after) = one.fused(&ctx, None);
        for i in 0..len {
            for c in 0..128 {
                assert_eq!(
                    out.get(&[i, c]).to_bits(),
                    together.0.get(&[start + i, c]).to_bits(),
                    "seq {b} t={i}"
                );
            }
        }
        states = after;
        start += len;
    }
    assert!(states.unwrap().bytes() == together.1.unwrap().bytes());
}

#[test]
fn rejects_bad_inputs_without_writing() {
    let ctx = Ctx::new(2);
    let case = Case::new(DType::BF16, 32, 3, &[4, 6], 9);
    let t = case.tokens();
    let states = Tensor::clone(case.states.as_ref().unwrap());
    let out = Tensor::zeros(DType::BF16, &[t, 32]);
    let (out_before, states_before) = (out.bytes(), states.bytes());
    let q = case.starts();
    let idx = Tensor::ints(DType::I64, &case.slots);
    let call = |bcx: &ssmk_tensor,
                w: &ssmk_tensor,
                q: &ssmk_tensor,
                idx: &ssmk_tensor,
                init: *const ssmk_tensor,
                out: &mut ssmk_tensor| {
        let mut sd = states.desc();
        unsafe {
            ssmk_short_conv(
                ctx.0,
                bcx,
                w,
                null(),
                &mut sd,
                q,
                idx,
                init,
                -1,
                out,
                std::ptr::null(),
                std::ptr::null(),
            )
        }
    };
    let (bcx, w, qd, id) = (case.bcx.desc(), case.weight.desc(), q.desc(), idx.desc());
    // bcx columns not 3 * D.
    let narrow = Tensor::zeros(DType::BF16, &[t, 95]);
    assert_error(
        call(&narrow.desc(), &w, &qd, &id, null(), &mut out.desc()),
        SSMK_ERR_INVALID_ARGUMENT,
        &["bcx.shape[1] = 95", "3 * D"],
    );
    // weight for another D.
    let w40 = Tensor::zeros(DType::BF16, &[40, 3]);
    assert_error(
        call(&bcx, &w40.desc(), &qd, &id, null(), &mut out.desc()),
        SSMK_ERR_INVALID_ARGUMENT,
        &["weight.shape[0] = 40"],
    );
    // Width outside 2..=8.
    let w9 = Tensor::zeros(DType::BF16, &[32, 9]);
    assert_error(
        call(&bcx, &w9.desc(), &qd, &id, null(), &mut out.desc()),
        SSMK_ERR_INVALID_ARGUMENT,
        &["weight.shape[1] = 9"],
    );
    // Output dtype differs from bcx.
    let out32 = Tensor::zeros(DType::F32, &[t, 32]);
    assert_error(
        call(&bcx, &w, &qd, &id, null(), &mut out32.desc()),
        SSMK_ERR_UNSUPPORTED_DTYPE,
        &["out.dtype = float32"],
    );
    // Slot out of range, duplicate slots, offsets past T.
    let bad_idx = Tensor::ints(DType::I64, &[0, 99]);
    assert_error(
        call(&bcx, &w, &qd, &bad_idx.desc(), null(), &mut out.desc()),
        SSMK_ERR_OUT_OF_BOUNDS,
        &["cache_indices[1] = 99"],
    );
    let dup = Tensor::ints(DType::I64, &[2, 2]);
    assert_error(
        call(&bcx, &w, &qd, &dup.desc(), null(), &mut out.desc()),
        SSMK_ERR_INVALID_ARGUMENT,
        &["distinct"],
    );
    let far = Tensor::ints(DType::I32, &[0, 4, 11]);
    assert_error(
        call(&bcx, &w, &far.desc(), &id, null(), &mut out.desc()),
        SSMK_ERR_OUT_OF_BOUNDS,
        &["query_start_loc[2] = 11"],
    );
    // out aliasing bcx.
    let mut alias = case.bcx.desc();
    let alias_shape = [t as i64, 32];
    let alias_strides = [96i64, 1];
    alias.shape = alias_shape.as_ptr();
    alias.strides = alias_strides.as_ptr();
    assert_error(
        call(&bcx, &w, &qd, &id, null(), &mut alias),
        SSMK_ERR_ALIASING,
        &["out"],
    );
    // has_initial_state of the wrong length.
    let init3 = Tensor::ints(DType::Bool, &[1, 0, 1]);
    assert_error(
        call(&bcx, &w, &qd, &id, &init3.desc(), &mut out.desc()),
        SSMK_ERR_INVALID_ARGUMENT,
        &["has_initial_state.shape[0] = 3"],
    );
    // NULL required arguments.
    let mut od = out.desc();
    let mut sd = states.desc();
    let code = unsafe {
        ssmk_short_conv(
            ctx.0,
            null(),
            &w,
            null(),
            &mut sd,
            &qd,
            &id,
            null(),
            -1,
            &mut od,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_error(code, SSMK_ERR_NULL_POINTER, &["bcx is NULL"]);
    assert!(
        out.bytes() == out_before && states.bytes() == states_before,
        "nothing written on error"
    );
}

/// ABI.md §4.10 for ShortConv on every ISA and dtype: rows `0..W-1` of each checkpoint slot are
/// bit-identical to the state a call ending at that token stores (the rounded `B * x` inputs, or
/// history rows for a checkpoint within `W-1` tokens of the start), rows `W-1..` untouched; `out`
/// and every other slot bit-identical to the call without checkpoints; a padded sequence's
/// checkpoint ignored; one and three threads bitwise equal.
#[test]
fn every_isa_checkpoints_equal_calls_ending_there() {
    let ctx = Ctx::new(2);
    let lens = [300usize, 1, 40, 2, 5];
    let own = [0i64, 1, 2, 3, -1];
    let offsets: [&[i64]; 5] = [&[1, 2, 255, 256, 257, 300], &[1], &[], &[1, 2], &[3]];
    let mut next = 5i64;
    let rows: Vec<Vec<(i64, i64)>> = offsets
        .iter()
        .map(|r| {
            r.iter()
                .map(|&o| {
                    next += 1;
                    (o, next - 1)
                })
                .collect()
        })
        .collect();
    let cols = rows.iter().map(Vec::len).max().unwrap();
    let (mut offs, mut slots) = (
        Tensor::zeros(DType::I32, &[lens.len(), cols]),
        Tensor::zeros(DType::I64, &[lens.len(), cols]),
    );
    for (b, row) in rows.iter().enumerate() {
        for c in 0..cols {
            let (o, s) = row.get(c).copied().unwrap_or((0, -1));
            offs.set(&[b, c], o as f64);
            slots.set(&[b, c], s as f64);
        }
    }
    for (i, dtype) in [DType::F32, DType::BF16, DType::F16]
        .into_iter()
        .enumerate()
    {
        let width = [3usize, 4, 2][i];
        let mut case = Case::new(dtype, 40, width, &lens, 70 + i as u64);
        case.slots = own.to_vec();
        case.initial = vec![true, true, false, true, false];
        // f32 states for the narrow dtypes: the rounding of `B * x` then shows in the state.
        let sdt = if dtype == DType::F32 {
            dtype
        } else {
            DType::F32
        };
        let mut pool = Tensor::zeros(sdt, &[next as usize + 2, width + 1, case.dim]);
        pool.fill_random(80 + i as u64, 1.5);
        case.states = Some(pool);
        let starts: Vec<usize> = case.starts().to_vec().iter().map(|&v| v as usize).collect();
        let initial = case.states.clone().unwrap();
        for isa in Isa::under_test() {
            let what = format!("{dtype:?} W {width} [{isa:?}]");
            let (plain_out, plain_st) = case.fused(&ctx, Some(isa));
            let mut with = case.clone();
            with.ckpt = Some((offs.clone(), slots.clone()));
            let (out, st) = with.fused(&ctx, Some(isa));
            let st = st.unwrap();
            assert!(out.storage == plain_out.storage, "{what}: out changed");
            let plain_st = plain_st.unwrap();
            let taken: Vec<usize> = rows[..4]
                .iter()
                .flatten()
                .map(|&(_, s)| s as usize)
                .collect();
            for s in 0..st.shape[0] as usize {
                for j in 0..=width {
                    for c in 0..case.dim {
                        let want = match (taken.contains(&s), j + 1 >= width) {
                            (true, false) => continue,
                            (true, true) => initial.get(&[s, j, c]),
                            (false, _) => plain_st.get(&[s, j, c]),
                        };
                        assert_eq!(
                            st.get(&[s, j, c]).to_bits(),
                            want.to_bits(),
                            "{what}: slot {s} row {j} channel {c}"
                        );
                    }
                }
            }
            for (b, row) in rows[..4].iter().enumerate() {
                for &(o, slot) in row {
                    let mut alone = case.clone();
                    alone.lens = vec![o as usize];
                    alone.slots = vec![own[b]];
                    alone.initial = vec![case.initial[b]];
                    let mut bcx = Tensor::zeros(dtype, &[o as usize, 3 * case.dim]);
                    for t in 0..o as usize {
                        for c in 0..3 * case.dim {
                            bcx.set(&[t, c], case.bcx.get(&[starts[b] + t, c]));
                        }
                    }
                    alone.bcx = bcx;
                    let (_, one) = alone.fused(&ctx, Some(isa));
                    let one = one.unwrap();
                    for j in 0..width - 1 {
                        for c in 0..case.dim {
                            assert_eq!(
                                st.get(&[slot as usize, j, c]).to_bits(),
                                one.get(&[own[b] as usize, j, c]).to_bits(),
                                "{what}: checkpoint of sequence {b} at {o} row {j} channel {c}"
                            );
                        }
                    }
                }
            }
            let (out3, st3) = with_every_call_parallel(|| with.fused(&Ctx::new(3), Some(isa)));
            assert!(
                out3.storage == out.storage && st3.unwrap().storage == st.storage,
                "{what}: three threads differ"
            );
        }
    }
}
