//! Causal conv1d (`ssmk_causal_conv1d_fwd` / `_update`) through the exported C functions, against
//! an independent f64 reference written here.
//!
//! Tolerances against f64 (inputs are exactly representable, so the only errors are the f32
//! accumulation and the final rounding): |got - ref| <= rel * |ref| + 2e-6 with rel = 2^-8 for
//! bfloat16, 2^-10 for float16 and 2e-6 for float32. States hold input values and must match
//! exactly, byte for byte (untouched rows and gaps included). Variants vs the crate's portable
//! reference: bitwise without activation (same fused multiply-add order), within one unit of the
//! output dtype with silu (vector `exp`).

mod common;

use std::ptr::{null, null_mut};

use common::{Ctx, Rng, SEQ_LEN_LISTS, Tensor, assert_error};
use ssmk::dtype::DType;
use ssmk::ffi::context::ssmk_context;
use ssmk::ffi::conv::*;
use ssmk::ffi::status::*;
use ssmk::runtime::{Isa, with_every_call_parallel};
use ssmk::tensor::ssmk_tensor;

fn desc(t: &Option<Tensor>) -> Option<ssmk_tensor> {
    t.as_ref().map(Tensor::desc)
}

fn ptr(d: &Option<ssmk_tensor>) -> *const ssmk_tensor {
    d.as_ref().map_or(null(), |d| d as *const _)
}

fn ptr_mut(d: &mut Option<ssmk_tensor>) -> *mut ssmk_tensor {
    d.as_mut().map_or(null_mut(), |d| d as *mut _)
}

/// Layout of a state pool `[S, L, D]`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Pool {
    Compact,
    /// `[S, D, L]` memory viewed as `[S, L, D]`.
    ChannelMajor,
    /// Rows and slots with gaps between them.
    Gapped,
}

fn pool(dtype: DType, s: usize, l: usize, d: usize, layout: Pool, seed: u64) -> Tensor {
    let mut t = match layout {
        Pool::Compact => Tensor::zeros(dtype, &[s, l, d]),
        Pool::ChannelMajor => {
            Tensor::with_layout(dtype, &[s, l, d], Some(&[l * d, 1, l]), s * l * d)
        }
        Pool::Gapped => {
            let row = d + 3;
            let slot = row * l + 5;
            Tensor::with_layout(dtype, &[s, l, d], Some(&[slot, row, 1]), s * slot)
        }
    };
    // Fill the whole storage (gaps too) so untouched bytes are recognisable.
    let mut rng = Rng::new(seed);
    for w in t.storage.iter_mut() {
        *w = rng.next_u64() & 0x3f00_3f00_3f00_3f00 | 0x0001_0001_0001_0001;
    }
    t.fill_random(seed + 1, 1.0);
    t
}

/// One `ssmk_causal_conv1d_fwd` call's arguments.
#[derive(Clone)]
struct Fwd {
    x: Tensor,
    weight: Tensor,
    bias: Option<Tensor>,
    states: Option<Tensor>,
    qsl: Option<Tensor>,
    idx: Option<Tensor>,
    init: Option<Tensor>,
    act: u32,
    pad: i64,
    out: Tensor,
    /// `(checkpoint_offsets, checkpoint_slots)`, or both NULL.
    ckpt: Option<(Tensor, Tensor)>,
}

/// Descriptors of a call, editable before the call (for bad-input tests).
struct FwdDescs {
    x: Option<ssmk_tensor>,
    w: Option<ssmk_tensor>,
    b: Option<ssmk_tensor>,
    s: Option<ssmk_tensor>,
    q: Option<ssmk_tensor>,
    i: Option<ssmk_tensor>,
    h: Option<ssmk_tensor>,
    o: Option<ssmk_tensor>,
}

impl Fwd {
    fn descs(&self) -> FwdDescs {
        FwdDescs {
            x: Some(self.x.desc()),
            w: Some(self.weight.desc()),
            b: desc(&self.bias),
            s: desc(&self.states),
            q: desc(&self.qsl),
            i: desc(&self.idx),
            h: desc(&self.init),
            o: Some(self.out.desc()),
        }
    }

    fn invoke(&self, ctx: &Ctx, isa: Option<Isa>, d: &mut FwdDescs) -> i32 {
        let args = (
            ptr(&d.x),
            ptr(&d.w),
            ptr(&d.b),
            ptr_mut(&mut d.s),
            ptr(&d.q),
            ptr(&d.i),
            ptr(&d.h),
        );
        let o = ptr_mut(&mut d.o);
        let ckpt = self.ckpt.as_ref().map(|(o, s)| (o.desc(), s.desc()));
        let (co, cs) = ckpt
            .as_ref()
            .map_or((null(), null()), |(o, s)| (o as *const _, s as *const _));
        let call = || unsafe {
            ssmk_causal_conv1d_fwd(
                ctx.0, args.0, args.1, args.2, args.3, args.4, args.5, args.6, self.act, self.pad,
                o, co, cs,
            )
        };
        common::with_optional_isa(isa, call)
    }

    fn call(&mut self, ctx: &Ctx, isa: Option<Isa>) -> i32 {
        let mut d = self.descs();
        self.invoke(ctx, isa, &mut d)
    }

    fn run(&mut self, ctx: &Ctx, isa: Option<Isa>) {
        let code = self.call(ctx, isa);
        assert_eq!(code, SSMK_OK, "{}", common::last_error());
    }

    fn dup(&self) -> Fwd {
        Fwd {
            x: Tensor::clone(&self.x),
            weight: Tensor::clone(&self.weight),
            bias: self.bias.clone(),
            states: self.states.clone(),
            qsl: self.qsl.clone(),
            idx: self.idx.clone(),
            init: self.init.clone(),
            act: self.act,
            pad: self.pad,
            out: Tensor::clone(&self.out),
            ckpt: self.ckpt.clone(),
        }
    }

    fn width(&self) -> usize {
        self.weight.shape[1] as usize
    }
}

/// What a random fwd case looks like.
#[derive(Clone, Debug)]
struct Spec {
    lens: Vec<usize>,
    d: usize,
    w: usize,
    act: DType,
    wdt: DType,
    sdt: DType,
    silu: bool,
    bias: bool,
    /// `None`: no state pool.
    state_rows: Option<usize>,
    layout: Pool,
    /// Per sequence: has initial state (None → pass NULL).
    init: Option<Vec<bool>>,
    /// Per sequence slot (None → pass NULL).
    slots: Option<Vec<i64>>,
    extra_slots: usize,
    /// Tokens after the last sequence (must stay untouched).
    tail: usize,
    /// x token stride padding (0 = compact); `usize::MAX` = channel-major x.
    x_pad: usize,
    seed: u64,
}

impl Spec {
    fn new(lens: &[usize], d: usize, w: usize, act: DType) -> Spec {
        Spec {
            lens: lens.to_vec(),
            d,
            w,
            act,
            wdt: act,
            sdt: act,
            silu: true,
            bias: true,
            state_rows: Some(w - 1),
            layout: Pool::Compact,
            init: Some((0..lens.len()).map(|b| b % 3 != 1).collect()),
            slots: None,
            extra_slots: 2,
            tail: 0,
            x_pad: 0,
            seed: 1,
        }
    }

    fn build(&self) -> Fwd {
        let b = self.lens.len();
        let t: usize = self.lens.iter().sum::<usize>() + self.tail;
        let d = self.d;
        let mut x = match self.x_pad {
            0 => Tensor::zeros(self.act, &[t, d]),
            usize::MAX => Tensor::with_layout(self.act, &[t, d], Some(&[1, t]), t * d),
            p => Tensor::with_layout(self.act, &[t, d], Some(&[d + p, 1]), t * (d + p)),
        };
        x.fill_random(self.seed, 1.0);
        let mut weight = Tensor::zeros(self.wdt, &[d, self.w]);
        weight.fill_random(self.seed + 2, 0.8);
        let bias = self.bias.then(|| {
            let mut t = Tensor::zeros(self.wdt, &[d]);
            t.fill_random(self.seed + 3, 0.5);
            t
        });
        let num_slots = b + self.extra_slots;
        let states = self
            .state_rows
            .map(|l| pool(self.sdt, num_slots, l, d, self.layout, self.seed + 4));
        let mut starts = vec![0i64];
        for &l in &self.lens {
            starts.push(starts.last().unwrap() + l as i64);
        }
        let mut out = Tensor::zeros(self.act, &[t, d]);
        out.fill_random(self.seed + 5, 3.0);
        Fwd {
            x,
            weight,
            bias,
            states,
            qsl: Some(Tensor::ints(DType::I32, &starts)),
            idx: self.slots.as_ref().map(|s| Tensor::ints(DType::I64, s)),
            init: self.init.as_ref().map(|v| {
                Tensor::ints(
                    DType::Bool,
                    &v.iter().map(|&b| b as i64).collect::<Vec<_>>(),
                )
            }),
            act: self.silu as u32,
            pad: -1,
            out,
            ckpt: None,
        }
    }
}

fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

/// Expected outputs (flat row-major; `None` = must be untouched) and state pool (exact) of a fwd call.
fn expect_fwd(f: &Fwd) -> (Vec<Option<f64>>, Option<Tensor>) {
    let (t, d, w) = (f.x.shape[0] as usize, f.x.shape[1] as usize, f.width());
    let starts: Vec<usize> = match &f.qsl {
        Some(q) => q.to_vec().iter().map(|&v| v as usize).collect(),
        None => vec![0, t],
    };
    let b = starts.len() - 1;
    let mut out = vec![None; t * d];
    let mut states = f.states.clone();
    for s in 0..b {
        let slot = f.idx.as_ref().map_or(s as i64, |i| i.get(&[s]) as i64);
        let init = f.init.as_ref().is_some_and(|h| h.get(&[s]) != 0.0);
        let (t0, n) = (starts[s], starts[s + 1] - starts[s]);
        if slot == f.pad {
            for tt in t0..t0 + n {
                for c in 0..d {
                    out[tt * d + c] = Some(0.0);
                }
            }
            continue;
        }
        for c in 0..d {
            // [history (W-1), x_seq]
            let mut input: Vec<f64> = (0..w - 1)
                .map(|j| match (&f.states, init) {
                    (Some(st), true) => st.get(&[slot as usize, j, c]),
                    _ => 0.0,
                })
                .collect();
            input.extend((0..n).map(|i| f.x.get(&[t0 + i, c])));
            let bias = f.bias.as_ref().map_or(0.0, |b| b.get(&[c]));
            for i in 0..n {
                let mut acc = bias;
                for k in 0..w {
                    acc += f.weight.get(&[c, k]) * input[i + k];
                }
                out[(t0 + i) * d + c] = Some(if f.act == SSMK_ACTIVATION_SILU {
                    silu(acc)
                } else {
                    acc
                });
            }
            if let Some(st) = states.as_mut() {
                for j in 0..w - 1 {
                    st.set(&[slot as usize, j, c], input[n + j]);
                }
            }
        }
    }
    (out, states)
}

fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 1.0 / 256.0,
        DType::F16 => 1.0 / 1024.0,
        _ => 2e-6,
    }
}

/// `got` matches the expected flat values within tolerance; untouched entries equal `before`.
fn check_out(got: &Tensor, before: &Tensor, want: &[Option<f64>], what: &str) {
    let (g, b) = (got.to_vec(), before.to_vec());
    let rel = tolerance(got.dtype);
    for (i, w) in want.iter().enumerate() {
        match w {
            None => assert_eq!(
                g[i].to_bits(),
                b[i].to_bits(),
                "{what}: element {i} must be untouched"
            ),
            Some(r) => assert!(
                (g[i] - r).abs() <= rel * r.abs() + 2e-6,
                "{what}: element {i} = {}, expected {r} (±{})",
                g[i],
                rel * r.abs() + 2e-6
            ),
        }
    }
}

fn check_states(got: &Option<Tensor>, want: &Option<Tensor>, what: &str) {
    let (Some(g), Some(w)) = (got, want) else {
        return;
    };
    if g.storage != w.storage {
        let (gv, wv) = (g.to_vec(), w.to_vec());
        let first = gv
            .iter()
            .zip(&wv)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        panic!("{what}: state differs (first logical element {first:?}; else a gap byte changed)");
    }
}

/// Same bytes, or (with silu) every value within one unit of the output dtype.
fn check_variant(got: &Tensor, reference: &Tensor, silu: bool, what: &str) {
    if !silu || got.storage == reference.storage {
        assert!(
            got.storage == reference.storage,
            "{what}: differs from the portable reference"
        );
        return;
    }
    let ulp = match got.dtype {
        DType::BF16 => 1.0 / 128.0,
        DType::F16 => 1.0 / 1024.0,
        _ => 2.0f64.powi(-22),
    };
    for (g, r) in got.to_vec().iter().zip(reference.to_vec()) {
        assert!(
            (g - r).abs() <= ulp * r.abs() + 1e-6,
            "{what}: {g} vs reference {r}"
        );
    }
}

/// The SIMD levels under test, each compared with the portable reference run beside it.
fn simd_levels() -> impl Iterator<Item = Isa> {
    Isa::under_test().into_iter().filter(|&i| i != Isa::Scalar)
}

/// Runs `f` through every ISA, checks each against the f64 reference and the portable reference.
fn check_fwd_all_isas(f: &Fwd, what: &str) {
    let ctx = Ctx::new(1);
    let (want_out, want_states) = expect_fwd(f);
    let mut reference = f.dup();
    reference.run(&ctx, Some(Isa::Scalar));
    check_out(&reference.out, &f.out, &want_out, &format!("{what} scalar"));
    check_states(&reference.states, &want_states, &format!("{what} scalar"));
    for isa in simd_levels() {
        let mut g = f.dup();
        g.run(&ctx, Some(isa));
        let w = format!("{what} {isa:?}");
        check_out(&g.out, &f.out, &want_out, &w);
        check_states(&g.states, &want_states, &w);
        check_variant(&g.out, &reference.out, f.act == SSMK_ACTIVATION_SILU, &w);
        check_states(&g.states, &reference.states, &w);
    }
}

const DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// Every seq-len list x width x dtype, with the other options rotating (one case in 7 in the
/// small-shape mode).
#[test]
fn every_isa_fwd_matches_f64_reference() {
    let mut n = 0u64;
    for (li, lens) in SEQ_LEN_LISTS.iter().enumerate() {
        for (wi, &w) in [2usize, 3, 4, 8].iter().enumerate() {
            for (ai, &act) in DTYPES.iter().enumerate() {
                // Rotate the remaining options so every combination of each pair shows up.
                n += 1;
                if !common::sampled(n, 14) {
                    continue;
                }
                let mut s = Spec::new(lens, 128, w, act);
                s.silu = (li + wi + ai) % 2 == 0;
                s.bias = (li + ai) % 2 == 1 || wi == 0;
                s.wdt = if (li + wi) % 2 == 0 { DType::F32 } else { act };
                s.sdt = if (wi + ai) % 2 == 0 { DType::F32 } else { act };
                s.seed = n;
                let what = format!(
                    "lens {lens:?} W {w} {act:?} w {:?} s {:?} silu {} bias {}",
                    s.wdt, s.sdt, s.silu, s.bias
                );
                check_fwd_all_isas(&s.build(), &what);
                // The other activation and bias setting on the same data.
                s.silu = !s.silu;
                s.bias = !s.bias;
                check_fwd_all_isas(&s.build(), &format!("{what} (flipped)"));
            }
        }
    }
}

#[test]
fn every_isa_fwd_wide_channels_and_tails() {
    // D = 8192 once (the widest channel block; 512 in the small-shape mode); odd D exercises the
    // scalar channel tail; a channel count below one vector (one dtype per shape, rotating, in
    // the small-shape mode).
    let wide = common::sized(8192, 512);
    let mut s = Spec::new(&[63, 64, 65], wide, 4, DType::BF16);
    s.sdt = DType::F32;
    check_fwd_all_isas(&s.build(), &format!("D {wide}"));
    for (i, (d, w)) in [(37usize, 3usize), (259, 4), (5, 2), (300, 8)]
        .into_iter()
        .enumerate()
    {
        for (j, act) in DTYPES.into_iter().enumerate() {
            if !common::sampled((i + j) as u64, DTYPES.len() as u64) {
                continue;
            }
            let mut s = Spec::new(&[1, 40, 0, 70], d, w, act);
            s.seed = d as u64;
            check_fwd_all_isas(&s.build(), &format!("D {d} W {w} {act:?}"));
        }
    }
}

#[test]
fn every_isa_fwd_pads_zero_length_and_untouched_tokens() {
    for act in DTYPES {
        // Slot order scrambled, a pad, zero-length sequences with and without initial state,
        // tokens after the last sequence, a wide buffer (rows W-1.. untouched).
        let mut s = Spec::new(&[5, 0, 300, 0, 1, 17], 96, 4, act);
        s.slots = Some(vec![3, 6, -1, 0, 7, 2]);
        s.init = Some(vec![true, true, true, false, false, true]);
        s.extra_slots = 3;
        s.state_rows = Some(6);
        s.tail = 9;
        check_fwd_all_isas(&s.build(), &format!("pads {act:?}"));
        // No state pool: zero history, nothing written; has_initial_state NULL.
        let mut s = Spec::new(&[5, 0, 40], 64, 3, act);
        s.state_rows = None;
        s.init = None;
        check_fwd_all_isas(&s.build(), &format!("no pool {act:?}"));
        // State pool with has_initial_state NULL: all start from zeros.
        let mut s = Spec::new(&[2, 9], 64, 4, act);
        s.init = None;
        check_fwd_all_isas(&s.build(), &format!("init NULL {act:?}"));
    }
    // query_start_loc NULL: one sequence of every token.
    let mut f = Spec::new(&[70], 64, 4, DType::BF16).build();
    f.qsl = None;
    check_fwd_all_isas(&f, "qsl NULL");
}

#[test]
fn every_isa_fwd_strided_and_channel_major_pools() {
    for layout in [Pool::ChannelMajor, Pool::Gapped] {
        for act in DTYPES {
            for x_pad in [0usize, 7, usize::MAX] {
                let mut s = Spec::new(&[1, 2, 70, 3], 72, 4, act);
                s.layout = layout;
                s.state_rows = Some(5);
                s.sdt = if x_pad == 7 { DType::F32 } else { act };
                s.x_pad = x_pad;
                check_fwd_all_isas(&s.build(), &format!("{layout:?} {act:?} x_pad {x_pad}"));
            }
        }
    }
}

/// The same sequences run as one call and as two calls split at `first` tokens.
#[test]
fn chunked_prefill_is_bit_exact() {
    let ctx = Ctx::new(2);
    let splits = [
        (128usize, 64usize),
        (145, 64),
        (145, 73),
        (273, 128),
        (192, 65),
    ];
    for (si, &(total, first)) in splits.iter().enumerate() {
        for act in DTYPES {
            for init in [false, true] {
                let w = [4usize, 3, 2, 8][si % 4];
                let mut s = Spec::new(&[total], 136, w, act);
                s.init = Some(vec![init]);
                s.sdt = if si % 2 == 0 { DType::F32 } else { act };
                s.state_rows = Some(w + 1);
                s.seed = si as u64 + 10;
                let mut whole = s.build();
                let mut part = whole.dup();
                whole.run(&ctx, None);
                // First chunk: tokens 0..first, then the rest continuing from the state.
                let t = total;
                let mut rest = part.dup();
                part.qsl = Some(Tensor::ints(DType::I32, &[0, first as i64]));
                part.run(&ctx, None);
                rest.states = part.states.clone();
                rest.qsl = Some(Tensor::ints(DType::I32, &[first as i64, t as i64]));
                rest.init = Some(Tensor::ints(DType::Bool, &[1]));
                rest.out = Tensor::clone(&part.out);
                rest.run(&ctx, None);
                let what = format!("split {total}/{first} {act:?} init {init}");
                assert!(
                    rest.out.storage == whole.out.storage,
                    "{what}: outputs differ"
                );
                assert!(
                    rest.states.as_ref().unwrap().storage == whole.states.as_ref().unwrap().storage,
                    "{what}: states differ"
                );
            }
        }
    }
}

/// Decodes (length-1 sequences with state) and prefills in one call equal separate calls.
#[test]
fn mixed_decode_and_prefill_equals_separate_calls() {
    let ctx = Ctx::new(2);
    for act in DTYPES {
        let lens = [1usize, 1, 1, 1, 50, 300, 7];
        let mut s = Spec::new(&lens, 200, 4, act);
        s.slots = Some(vec![9, 2, -1, 5, 0, 3, 8]);
        s.init = Some(vec![true, true, true, true, false, true, true]);
        s.extra_slots = 3;
        let mut all = s.build();
        let mut single = all.dup();
        all.run(&ctx, Some(Isa::active()));
        let starts: Vec<i64> = single
            .qsl
            .as_ref()
            .unwrap()
            .to_vec()
            .iter()
            .map(|&v| v as i64)
            .collect();
        let slots = s.slots.clone().unwrap();
        let init = s.init.clone().unwrap();
        for b in 0..lens.len() {
            single.qsl = Some(Tensor::ints(DType::I32, &[starts[b], starts[b + 1]]));
            single.idx = Some(Tensor::ints(DType::I32, &[slots[b]]));
            single.init = Some(Tensor::ints(DType::U8, &[init[b] as i64]));
            single.run(&ctx, None);
        }
        assert!(
            single.out.storage == all.out.storage,
            "{act:?}: outputs differ"
        );
        assert!(
            single.states.unwrap().storage == all.states.unwrap().storage,
            "{act:?}: states differ"
        );
    }
}

/// Results are bitwise identical on 1 and 2 threads, and the prefill also on the splits of 3,
/// 16 and 64 threads (16 and 64 run by recording contexts, which split a call as that many
/// threads would and run its tasks in turn): token groups of 32 tokens and channel blocks.
#[test]
fn thread_counts_are_bitwise_equal() {
    let (c1, c2) = (Ctx::new(1), Ctx::new(2));
    let wide = [
        Ctx::new(3),
        Ctx(ssmk_context::recording(16)),
        Ctx(ssmk_context::recording(64)),
    ];
    for act in DTYPES {
        let mut s = Spec::new(&[1, 1, 700, 33, 0, 513, 1], 1000, 4, act);
        s.state_rows = Some(5);
        let mut a = s.build();
        let first = a.dup();
        a.run(&c1, None);
        for (threads, ctx) in [(2, &c2), (3, &wide[0]), (16, &wide[1]), (64, &wide[2])] {
            let mut b = first.dup();
            with_every_call_parallel(|| b.run(ctx, None));
            assert!(
                a.out.storage == b.out.storage
                    && a.states.as_ref().unwrap().storage == b.states.unwrap().storage,
                "fwd {act:?}, {threads} threads"
            );
        }
        let mut u = UpdateSpec::new(64, 3, 1000, 4, act).build();
        u.accepted = Some(Tensor::ints(
            DType::I32,
            &(0..64).map(|i| 1 + i % 3).collect::<Vec<_>>(),
        ));
        let mut v = u.dup();
        u.run(&c1, None);
        with_every_call_parallel(|| v.run(&c2, None));
        assert!(
            u.out.storage == v.out.storage && u.states.storage == v.states.storage,
            "update {act:?}"
        );
    }
}

/// One `ssmk_causal_conv1d_update` call's arguments.
struct Update {
    x: Tensor,
    states: Tensor,
    weight: Tensor,
    bias: Option<Tensor>,
    idx: Option<Tensor>,
    accepted: Option<Tensor>,
    act: u32,
    pad: i64,
    out: Tensor,
}

struct UpdateDescs {
    x: Option<ssmk_tensor>,
    s: Option<ssmk_tensor>,
    w: Option<ssmk_tensor>,
    b: Option<ssmk_tensor>,
    i: Option<ssmk_tensor>,
    n: Option<ssmk_tensor>,
    o: Option<ssmk_tensor>,
}

impl Update {
    fn descs(&self) -> UpdateDescs {
        UpdateDescs {
            x: Some(self.x.desc()),
            s: Some(self.states.desc()),
            w: Some(self.weight.desc()),
            b: desc(&self.bias),
            i: desc(&self.idx),
            n: desc(&self.accepted),
            o: Some(self.out.desc()),
        }
    }

    fn invoke(&self, ctx: &Ctx, isa: Option<Isa>, d: &mut UpdateDescs) -> i32 {
        let (x, s, w, b, i, n) = (
            ptr(&d.x),
            ptr_mut(&mut d.s),
            ptr(&d.w),
            ptr(&d.b),
            ptr(&d.i),
            ptr(&d.n),
        );
        let o = ptr_mut(&mut d.o);
        let call =
            || unsafe { ssmk_causal_conv1d_update(ctx.0, x, s, w, b, i, n, self.act, self.pad, o) };
        common::with_optional_isa(isa, call)
    }

    fn call(&mut self, ctx: &Ctx, isa: Option<Isa>) -> i32 {
        let mut d = self.descs();
        self.invoke(ctx, isa, &mut d)
    }

    fn run(&mut self, ctx: &Ctx, isa: Option<Isa>) {
        let code = self.call(ctx, isa);
        assert_eq!(code, SSMK_OK, "{}", common::last_error());
    }

    fn dup(&self) -> Update {
        Update {
            x: Tensor::clone(&self.x),
            states: Tensor::clone(&self.states),
            weight: Tensor::clone(&self.weight),
            bias: self.bias.clone(),
            idx: self.idx.clone(),
            accepted: self.accepted.clone(),
            act: self.act,
            pad: self.pad,
            out: Tensor::clone(&self.out),
        }
    }

    fn width(&self) -> usize {
        self.weight.shape[1] as usize
    }

    /// (B, Q, D) whatever x's rank.
    fn dims(&self) -> (usize, usize, usize) {
        let s: Vec<usize> = self.x.shape.iter().map(|&v| v as usize).collect();
        if s.len() == 2 {
            (s[0], 1, s[1])
        } else {
            (s[0], s[1], s[2])
        }
    }

    fn x_at(&self, b: usize, q: usize, c: usize) -> f64 {
        if self.x.shape.len() == 2 {
            self.x.get(&[b, c])
        } else {
            self.x.get(&[b, q, c])
        }
    }
}

struct UpdateSpec {
    b: usize,
    q: Option<usize>,
    d: usize,
    w: usize,
    act: DType,
    sdt: DType,
    rows: usize,
    layout: Pool,
    silu: bool,
    bias: bool,
    slots: Option<Vec<i64>>,
    seed: u64,
}

impl UpdateSpec {
    /// `q == 1` with `[B, D]` x unless set otherwise through `q`.
    fn new(b: usize, q: usize, d: usize, w: usize, act: DType) -> UpdateSpec {
        UpdateSpec {
            b,
            q: Some(q),
            d,
            w,
            act,
            sdt: act,
            rows: w - 2 + q.max(1),
            layout: Pool::Compact,
            silu: true,
            bias: true,
            slots: None,
            seed: 7,
        }
    }

    fn build(&self) -> Update {
        let shape: Vec<usize> = match self.q {
            Some(q) => vec![self.b, q, self.d],
            None => vec![self.b, self.d],
        };
        let mut x = Tensor::zeros(self.act, &shape);
        x.fill_random(self.seed, 1.0);
        let mut weight = Tensor::zeros(self.act, &[self.d, self.w]);
        weight.fill_random(self.seed + 1, 0.8);
        let bias = self.bias.then(|| {
            let mut t = Tensor::zeros(DType::F32, &[self.d]);
            t.fill_random(self.seed + 2, 0.5);
            t
        });
        let states = pool(
            self.sdt,
            self.b + 3,
            self.rows,
            self.d,
            self.layout,
            self.seed + 3,
        );
        let mut out = Tensor::zeros(self.act, &shape);
        out.fill_random(self.seed + 4, 3.0);
        Update {
            x,
            states,
            weight,
            bias,
            idx: self.slots.as_ref().map(|s| Tensor::ints(DType::I32, s)),
            accepted: None,
            act: self.silu as u32,
            pad: -1,
            out,
        }
    }
}

/// Expected outputs (flat) and pool of an update call, straight from ABI.md §4.2.
fn expect_update(u: &Update) -> (Vec<Option<f64>>, Tensor) {
    let (bn, q, d) = u.dims();
    let (w, l) = (u.width(), u.states.shape[1] as usize);
    let mut out = vec![None; bn * q * d];
    let mut st = Tensor::clone(&u.states);
    for b in 0..bn {
        let slot = u.idx.as_ref().map_or(b as i64, |i| i.get(&[b]) as i64);
        if slot == u.pad {
            for e in out.iter_mut().skip(b * q * d).take(q * d) {
                *e = Some(0.0);
            }
            continue;
        }
        let slot = slot as usize;
        let n = u.accepted.as_ref().map(|a| a.get(&[b]) as usize);
        let first = n.map_or(0, |n| n - 1);
        for c in 0..d {
            let mut input: Vec<f64> = (0..w - 1)
                .map(|j| u.states.get(&[slot, first + j, c]))
                .collect();
            input.extend((0..q).map(|i| u.x_at(b, i, c)));
            let bias = u.bias.as_ref().map_or(0.0, |t| t.get(&[c]));
            for i in 0..q {
                let mut acc = bias;
                for k in 0..w {
                    acc += u.weight.get(&[c, k]) * input[i + k];
                }
                out[(b * q + i) * d + c] = Some(if u.act == SSMK_ACTIVATION_SILU {
                    silu(acc)
                } else {
                    acc
                });
            }
            match n {
                None => {
                    for j in 0..w - 1 {
                        st.set(&[slot, j, c], input[q + j]);
                    }
                }
                Some(n) => {
                    // Rows 0..W-2+Q: W-2 rows from row n on, then the Q inputs; the rest kept.
                    let old: Vec<f64> = (0..l).map(|r| u.states.get(&[slot, r, c])).collect();
                    let new: Vec<f64> = old[n..n + w - 2]
                        .iter()
                        .copied()
                        .chain((0..q).map(|i| u.x_at(b, i, c)))
                        .collect();
                    for (r, v) in new.into_iter().enumerate() {
                        st.set(&[slot, r, c], v);
                    }
                }
            }
        }
    }
    (out, st)
}

fn check_update_all_isas(u: &Update, what: &str) {
    let ctx = Ctx::new(1);
    let (want_out, want_states) = expect_update(u);
    let mut reference = u.dup();
    reference.run(&ctx, Some(Isa::Scalar));
    check_out(&reference.out, &u.out, &want_out, &format!("{what} scalar"));
    check_states(
        &Some(Tensor::clone(&reference.states)),
        &Some(Tensor::clone(&want_states)),
        &format!("{what} scalar"),
    );
    for isa in simd_levels() {
        let mut g = u.dup();
        g.run(&ctx, Some(isa));
        let w = format!("{what} {isa:?}");
        check_out(&g.out, &u.out, &want_out, &w);
        check_states(
            &Some(Tensor::clone(&g.states)),
            &Some(Tensor::clone(&want_states)),
            &w,
        );
        check_variant(&g.out, &reference.out, u.act == SSMK_ACTIVATION_SILU, &w);
    }
}

#[test]
fn every_isa_update_matches_f64_reference() {
    for act in DTYPES {
        for (i, &w) in [2usize, 3, 4, 8].iter().enumerate() {
            for q in [None, Some(1), Some(3)] {
                let mut s = UpdateSpec::new(5, q.unwrap_or(1), 136, w, act);
                s.q = q;
                s.rows = w - 1 + i % 2 * 3;
                s.sdt = if i % 2 == 0 { DType::F32 } else { act };
                s.silu = i % 2 == 1;
                s.bias = i != 2;
                s.layout = [Pool::Compact, Pool::ChannelMajor, Pool::Gapped][i % 3];
                s.slots = Some(vec![4, -1, 0, 7, 2]);
                check_update_all_isas(&s.build(), &format!("{act:?} W {w} Q {q:?}"));
            }
        }
    }
}

/// Speculative verifies (`num_accepted_tokens`): every accepted count the window allows, also
/// above this step's Q (the previous step verified more tokens than this one: `rows` is sized for
/// the widest step, `W-2+16`), on pools with a spare row or none; then a sequence of steps of
/// different Q with their accepted counts equals the plain conv over the accepted tokens; counts
/// outside `[1, L-W+2]` are rejected with nothing written.
#[test]
fn every_isa_speculative_rolling_buffer() {
    let cases: [(usize, usize, &[i64]); 7] = [
        (1, 1, &[1]),
        (4, 4, &[1, 2, 3, 4]),
        (4, 4, &[4, 3, 2, 1]),
        (4, 16, &[1, 5, 10, 16]),
        (4, 16, &[16, 10, 5, 1]),
        (4, 1, &[16, 1, 3, 9]),
        (3, 5, &[2, 16, 6]),
    ];
    let mut seed = 100;
    for (b, q, accepted) in cases {
        for act in [DType::BF16, DType::F32] {
            for (bias, silu) in [(false, false), (true, true), (true, false), (false, true)] {
                for reversed in [false, true] {
                    seed += 1;
                    let mut s = UpdateSpec::new(b, q, 72, 4, act);
                    s.bias = bias;
                    s.silu = silu;
                    s.seed = seed;
                    s.sdt = if seed % 2 == 0 { DType::F32 } else { act };
                    s.layout = if seed % 3 == 0 {
                        Pool::ChannelMajor
                    } else {
                        Pool::Compact
                    };
                    s.rows = 4 - 2 + 16 + (seed % 2) as usize;
                    let slots: Vec<i64> = (0..b as i64)
                        .map(|i| if reversed { b as i64 + 2 - i } else { i })
                        .collect();
                    s.slots = Some(slots);
                    let mut u = s.build();
                    u.accepted = Some(Tensor::ints(DType::I64, accepted));
                    check_update_all_isas(
                        &u,
                        &format!(
                            "spec B {b} Q {q} {accepted:?} {act:?} bias {bias} silu {silu} rev {reversed}"
                        ),
                    );
                }
            }
        }
        // n = 0 and n = L-W+3 are rejected with nothing written.
        for bad in [0i64, 16 + 1] {
            let mut s = UpdateSpec::new(b, q, 72, 4, DType::BF16);
            s.rows = 4 - 2 + 16;
            let mut u = s.build();
            let mut n = accepted.to_vec();
            n[b - 1] = bad;
            u.accepted = Some(Tensor::ints(DType::I32, &n));
            let (o, s) = (u.out.bytes(), u.states.bytes());
            let code = u.call(&Ctx::new(1), None);
            assert_error(
                code,
                SSMK_ERR_INVALID_ARGUMENT,
                &[
                    &format!("num_accepted_tokens[{}] = {bad}", b - 1),
                    "L-W+2 = 16",
                ],
            );
            assert!(u.out.bytes() == o && u.states.bytes() == s);
        }
    }
}

/// A decode with drafts, step after step: each step verifies `Q` tokens (1 to 4, changing from
/// step to step: drafters propose fewer tokens at times), of which the first `a` are the true
/// stream and the rest rejected drafts, and the next step passes `n = a`. On every ISA, every
/// accepted token's output equals the plain causal conv over the true stream (f64), so the
/// window lines up whatever `Q` the steps had, and the next step's window rows `a-1 .. a+W-3`
/// hold the last `W-1` true inputs.
#[test]
fn every_isa_speculative_steps_of_changing_length_follow_the_stream() {
    let (d, w, max_q) = (20usize, 4usize, 4usize);
    let rows = w - 2 + max_q;
    let mut rng = Rng::new(77);
    let mut weight = Tensor::zeros(DType::F32, &[d, w]);
    weight.fill_random(78, 0.8);
    let stream_len = 48;
    let truth: Vec<Vec<f64>> = (0..w - 1 + stream_len)
        .map(|_| {
            (0..d)
                .map(|_| (rng.uniform() * 2.0 - 1.0) as f32 as f64)
                .collect()
        })
        .collect();
    // The plain conv over the stream; truth[0..W-1] is the initial history.
    let plain =
        |t: usize, c: usize| -> f64 { (0..w).map(|k| weight.get(&[c, k]) * truth[t + k][c]).sum() };
    for isa in Isa::under_test() {
        let mut states = Tensor::zeros(DType::F32, &[2, rows, d]);
        states.fill_random(79, 5.0); // rows never written must not matter
        for (j, row) in truth.iter().take(w - 1).enumerate() {
            for (c, &v) in row.iter().enumerate() {
                states.set(&[1, j, c], v);
            }
        }
        let (mut pos, mut accepted) = (0usize, 1i64);
        let mut step = 0;
        while pos < stream_len {
            step += 1;
            let q = (1 + rng.below(max_q)).min(stream_len - pos);
            let a = 1 + rng.below(q);
            let mut x = Tensor::zeros(DType::F32, &[1, q, d]);
            for i in 0..q {
                let row = &truth[w - 1 + pos + i.min(a - 1)];
                for (c, &v) in row.iter().enumerate() {
                    let v = if i < a { v } else { 9.0 * rng.uniform() };
                    x.set(&[0, i, c], v);
                }
            }
            let mut u = Update {
                x,
                states: Tensor::clone(&states),
                weight: Tensor::clone(&weight),
                bias: None,
                idx: Some(Tensor::ints(DType::I32, &[1])),
                accepted: Some(Tensor::ints(DType::I32, &[accepted])),
                act: SSMK_ACTIVATION_NONE,
                pad: -1,
                out: Tensor::zeros(DType::F32, &[1, q, d]),
            };
            u.run(&Ctx::new(1), Some(isa));
            for i in 0..a {
                for c in 0..d {
                    let (got, want) = (u.out.get(&[0, i, c]), plain(pos + i, c));
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "{isa:?} step {step} (Q {q}, n {accepted}) token {i} channel {c}: {got} vs {want}"
                    );
                }
            }
            // The next step's window, rows n-1 .. n+W-3 with n = a: the last W-1 true inputs.
            for (j, row) in truth[pos + a..pos + a + w - 1].iter().enumerate() {
                for (c, &v) in row.iter().enumerate() {
                    let got = u.states.get(&[1, a - 1 + j, c]);
                    assert_eq!(got, v, "{isa:?} step {step} row {j}");
                }
            }
            states = u.states;
            (pos, accepted) = (pos + a, a as i64);
        }
    }
}

/// vLLM's legacy one-column block table `[B, 1]` (ABI.md §4.2) gives bit for bit what the same
/// slots as `[B]` give, strided or not; `[B, 2]` is refused with nothing written.
#[test]
fn update_reads_one_column_block_table() {
    let ctx = Ctx::new(1);
    let slots = [4i64, -1, 0, 2];
    for (dtype, q) in [(DType::BF16, None), (DType::F32, Some(3))] {
        let mut s = UpdateSpec::new(4, q.unwrap_or(1), 24, 4, dtype);
        s.q = q;
        s.slots = Some(slots.to_vec());
        let mut vector = s.build();
        vector.run(&ctx, None);
        for (column_stride, idx_dtype) in [(None, DType::I32), (Some(3), DType::I64)] {
            let mut table = s.build();
            let mut idx = match column_stride {
                // Every third entry of a longer buffer: a [B, 1] column view with a row stride.
                Some(stride) => {
                    let spread: Vec<i64> = slots.iter().flat_map(|&v| [v, 77, 77]).collect();
                    let mut t = Tensor::ints(idx_dtype, &spread);
                    t.strides = Some(vec![stride, 1]);
                    t
                }
                None => Tensor::ints(idx_dtype, &slots),
            };
            idx.shape = vec![slots.len() as i64, 1];
            table.idx = Some(idx);
            table.run(&ctx, None);
            assert!(
                table.out.storage == vector.out.storage
                    && table.states.storage == vector.states.storage,
                "{dtype:?} Q {q:?} [B, 1] strides {column_stride:?}: differs from [B]"
            );
        }
        let mut wide = s.build();
        let mut idx = Tensor::ints(DType::I32, &[4, 5, -1, 6, 0, 7, 2, 8]);
        idx.shape = vec![4, 2];
        wide.idx = Some(idx);
        let (o, st) = (wide.out.bytes(), wide.states.bytes());
        let code = wide.call(&ctx, None);
        assert_error(
            code,
            SSMK_ERR_INVALID_ARGUMENT,
            &["conv_state_indices.shape = [4, 2]", "[B, 1]"],
        );
        assert!(wide.out.bytes() == o && wide.states.bytes() == st);
    }
}

/// `update` on one token equals `fwd` on a length-1 sequence with state; `[B, Q, D]` equals
/// `fwd` on Q-token sequences with state.
#[test]
fn update_equals_fwd_with_state() {
    let ctx = Ctx::new(1);
    for act in DTYPES {
        for q in [None, Some(1), Some(5)] {
            let mut s = UpdateSpec::new(6, q.unwrap_or(1), 100, 4, act);
            s.q = q;
            s.rows = 4;
            s.slots = Some(vec![3, 0, -1, 8, 1, 5]);
            let mut u = s.build();
            let (bn, qn, d) = u.dims();
            let mut f = Fwd {
                x: Tensor::zeros(act, &[bn * qn, d]),
                weight: Tensor::clone(&u.weight),
                bias: u.bias.clone(),
                states: Some(Tensor::clone(&u.states)),
                qsl: Some(Tensor::ints(
                    DType::I64,
                    &(0..=bn as i64).map(|b| b * qn as i64).collect::<Vec<_>>(),
                )),
                idx: u.idx.clone(),
                init: Some(Tensor::ints(DType::I32, &vec![1; bn])),
                act: u.act,
                pad: u.pad,
                out: Tensor::zeros(act, &[bn * qn, d]),
                ckpt: None,
            };
            f.x.storage = u.x.storage.clone();
            f.out.storage = u.out.storage.clone();
            u.run(&ctx, None);
            f.run(&ctx, None);
            assert!(
                u.out.storage == f.out.storage,
                "{act:?} Q {q:?}: outputs differ"
            );
            assert!(
                u.states.storage == f.states.unwrap().storage,
                "{act:?} Q {q:?}: states differ"
            );
        }
    }
}

/// Runs `mutate` on a fresh valid fwd call's descriptors; asserts the status, the message
/// fragments, and that no output or state byte changed.
// Shapes and strides that descriptors in the bad-input tests point to.
static SHAPE_1_3_16: [i64; 3] = [1, 3, 16];
static SHAPE_1_4_16: [i64; 3] = [1, 4, 16];
static SHAPE_8_16: [i64; 2] = [8, 16];
static STRIDES_0_1: [i64; 2] = [0, 1];

fn expect_fwd_rejected(
    status: i32,
    fragments: &[&str],
    mutate: impl FnOnce(&mut Fwd, &mut FwdDescs),
) {
    let mut s = Spec::new(&[3, 5], 16, 4, DType::BF16);
    s.slots = Some(vec![1, 0]);
    let mut f = s.build();
    let mut probe = s.build();
    let mut d = f.descs();
    mutate(&mut probe, &mut d);
    (f.act, f.pad) = (probe.act, probe.pad);
    // The probe may own replacement tensors that descriptors point to.
    let (o, st) = (f.out.bytes(), f.states.as_ref().unwrap().bytes());
    let code = f.invoke(&Ctx::new(1), None, &mut d);
    assert_error(code, status, fragments);
    assert!(f.out.bytes() == o, "out changed after {fragments:?}");
    assert!(
        f.states.as_ref().unwrap().bytes() == st,
        "state changed after {fragments:?}"
    );
    drop(probe);
}

#[test]
fn fwd_rejects_bad_inputs() {
    use DType::*;
    expect_fwd_rejected(SSMK_ERR_NULL_POINTER, &["x is NULL"], |_, d| d.x = None);
    expect_fwd_rejected(SSMK_ERR_NULL_POINTER, &["weight is NULL"], |_, d| {
        d.w = None
    });
    expect_fwd_rejected(SSMK_ERR_NULL_POINTER, &["out is NULL"], |_, d| d.o = None);
    expect_fwd_rejected(SSMK_ERR_INVALID_ARGUMENT, &["x.ndim = 1"], |_, d| {
        d.x.as_mut().unwrap().ndim = 1
    });
    expect_fwd_rejected(SSMK_ERR_UNSUPPORTED_DTYPE, &["x.dtype = int32"], |_, d| {
        let x = d.x.as_mut().unwrap();
        x.dtype.code = 0;
        x.dtype.bits = 32;
    });
    expect_fwd_rejected(SSMK_ERR_UNSUPPORTED_DEVICE, &["x.device"], |_, d| {
        d.x.as_mut().unwrap().device.device_type = 2
    });
    expect_fwd_rejected(
        SSMK_ERR_INVALID_ARGUMENT,
        &["weight.shape[0] = 8", "dim = D = 16"],
        |p, d| {
            p.weight = Tensor::zeros(BF16, &[8, 4]);
            d.w = Some(p.weight.desc());
        },
    );
    for w in [1usize, 9] {
        expect_fwd_rejected(
            SSMK_ERR_INVALID_ARGUMENT,
            &[&format!("weight.shape[1] = {w}"), "2..=8"],
            |p, d| {
                p.weight = Tensor::zeros(BF16, &[16, w]);
                d.w = Some(p.weight.desc());
            },
        );
    }
    expect_fwd_rejected(
        SSMK_ERR_UNSUPPORTED_DTYPE,
        &["weight.dtype = float16", "bfloat16 or float32"],
        |p, d| {
            p.weight = Tensor::zeros(F16, &[16, 4]);
            d.w = Some(p.weight.desc());
        },
    );
    expect_fwd_rejected(
        SSMK_ERR_INVALID_ARGUMENT,
        &["bias.shape[0] = 15"],
        |p, d| {
            p.bias = Some(Tensor::zeros(BF16, &[15]));
            d.b = desc(&p.bias);
        },
    );
    expect_fwd_rejected(
        SSMK_ERR_UNSUPPORTED_DTYPE,
        &["out.dtype = float32"],
        |p, d| {
            p.out = Tensor::zeros(F32, &[8, 16]);
            d.o = Some(p.out.desc());
        },
    );
    expect_fwd_rejected(SSMK_ERR_INVALID_ARGUMENT, &["out.shape[0] = 9"], |p, d| {
        p.out = Tensor::zeros(BF16, &[9, 16]);
        d.o = Some(p.out.desc());
    });
    expect_fwd_rejected(SSMK_ERR_ALIASING, &["out", "share memory"], |_, d| {
        d.o.as_mut().unwrap().strides = STRIDES_0_1.as_ptr();
    });
    expect_fwd_rejected(
        SSMK_ERR_INVALID_ARGUMENT,
        &["conv_states.shape[1] = 2", "W-1 = 3"],
        |p, d| {
            p.states = Some(Tensor::zeros(BF16, &[4, 2, 16]));
            d.s = desc(&p.states);
        },
    );
    expect_fwd_rejected(
        SSMK_ERR_INVALID_ARGUMENT,
        &["conv_states.shape[2] = 8", "dim = D = 16"],
        |p, d| {
            p.states = Some(Tensor::zeros(BF16, &[4, 3, 8]));
            d.s = desc(&p.states);
        },
    );
    expect_fwd_rejected(
        SSMK_ERR_UNSUPPORTED_DTYPE,
        &["conv_states.dtype = float16"],
        |p, d| {
            p.states = Some(Tensor::zeros(F16, &[4, 3, 16]));
            d.s = desc(&p.states);
        },
    );
    expect_fwd_rejected(
        SSMK_ERR_INVALID_ARGUMENT,
        &["query_start_loc[2] = 2", "non-decreasing"],
        |p, d| {
            p.qsl = Some(Tensor::ints(I32, &[0, 3, 2]));
            d.q = desc(&p.qsl);
        },
    );
    expect_fwd_rejected(
        SSMK_ERR_OUT_OF_BOUNDS,
        &["query_start_loc[2] = 9", "<= 8"],
        |p, d| {
            p.qsl = Some(Tensor::ints(I32, &[0, 3, 9]));
            d.q = desc(&p.qsl);
        },
    );
    expect_fwd_rejected(
        SSMK_ERR_UNSUPPORTED_DTYPE,
        &["query_start_loc.dtype = float32"],
        |p, d| {
            p.qsl = Some(Tensor::zeros(F32, &[3]));
            d.q = desc(&p.qsl);
        },
    );
    expect_fwd_rejected(
        SSMK_ERR_OUT_OF_BOUNDS,
        &["cache_indices[1] = 4", "slot < 4"],
        |p, d| {
            p.idx = Some(Tensor::ints(I64, &[0, 4]));
            d.i = desc(&p.idx);
        },
    );
    expect_fwd_rejected(SSMK_ERR_OUT_OF_BOUNDS, &["implicit slot"], |p, d| {
        p.states = Some(Tensor::zeros(BF16, &[1, 3, 16]));
        d.s = desc(&p.states);
        d.i = None;
    });
    expect_fwd_rejected(SSMK_ERR_INVALID_ARGUMENT, &["distinct"], |p, d| {
        p.idx = Some(Tensor::ints(I64, &[2, 2]));
        d.i = desc(&p.idx);
    });
    expect_fwd_rejected(
        SSMK_ERR_INVALID_ARGUMENT,
        &["has_initial_state.shape[0] = 3"],
        |p, d| {
            p.init = Some(Tensor::ints(Bool, &[1, 1, 1]));
            d.h = desc(&p.init);
        },
    );
    expect_fwd_rejected(SSMK_ERR_INVALID_ARGUMENT, &["activation = 2"], |p, _| {
        p.act = 2
    });
    expect_fwd_rejected(
        SSMK_ERR_INVALID_ARGUMENT,
        &["has_initial_state[0] = true", "conv_states is NULL"],
        |_, d| d.s = None,
    );
    expect_fwd_rejected(SSMK_ERR_ALIASING, &["out", "x"], |_, d| {
        d.o = d.x;
    });
    expect_fwd_rejected(SSMK_ERR_ALIASING, &["conv_states", "weight"], |_, d| {
        // 48 bf16 = 96 bytes inside the weight's 128.
        d.s = d.w;
        let s = d.s.as_mut().unwrap();
        s.ndim = 3;
        s.shape = SHAPE_1_3_16.as_ptr();
        s.strides = null();
    });
    expect_fwd_rejected(SSMK_ERR_ALIASING, &["out", "conv_states"], |_, d| {
        d.o = d.s;
        d.o.as_mut().unwrap().ndim = 2;
        d.o.as_mut().unwrap().shape = SHAPE_8_16.as_ptr();
        d.o.as_mut().unwrap().strides = null();
    });
}

fn expect_update_rejected(
    status: i32,
    fragments: &[&str],
    mutate: impl FnOnce(&mut Update, &mut UpdateDescs),
) {
    let mut s = UpdateSpec::new(3, 2, 16, 4, DType::F16);
    s.slots = Some(vec![2, 0, 1]);
    let mut u = s.build();
    u.accepted = Some(Tensor::ints(DType::I32, &[1, 2, 2]));
    let mut probe = s.build();
    probe.accepted = Some(Tensor::ints(DType::I32, &[1, 2, 2]));
    let mut d = u.descs();
    mutate(&mut probe, &mut d);
    (u.act, u.pad) = (probe.act, probe.pad);
    let (o, st) = (u.out.bytes(), u.states.bytes());
    let code = u.invoke(&Ctx::new(1), None, &mut d);
    assert_error(code, status, fragments);
    assert!(
        u.out.bytes() == o && u.states.bytes() == st,
        "something written after {fragments:?}"
    );
    drop(probe);
}

#[test]
fn update_rejects_bad_inputs() {
    use DType::*;
    expect_update_rejected(SSMK_ERR_NULL_POINTER, &["conv_states is NULL"], |_, d| {
        d.s = None
    });
    expect_update_rejected(SSMK_ERR_NULL_POINTER, &["x is NULL"], |_, d| d.x = None);
    expect_update_rejected(SSMK_ERR_INVALID_ARGUMENT, &["x.ndim = 1"], |_, d| {
        d.x.as_mut().unwrap().ndim = 1
    });
    expect_update_rejected(
        SSMK_ERR_INVALID_ARGUMENT,
        &["out.shape[1] = 3", "x.shape[1] = 2"],
        |p, d| {
            p.out = Tensor::zeros(F16, &[3, 3, 16]);
            d.o = Some(p.out.desc());
        },
    );
    expect_update_rejected(
        SSMK_ERR_INVALID_ARGUMENT,
        &["num_accepted_tokens[1] = 0"],
        |p, d| {
            p.accepted = Some(Tensor::ints(I32, &[1, 0, 1]));
            d.n = desc(&p.accepted);
        },
    );
    expect_update_rejected(
        SSMK_ERR_INVALID_ARGUMENT,
        &["num_accepted_tokens[2] = 3", "L-W+2 = 2"],
        |p, d| {
            p.accepted = Some(Tensor::ints(I32, &[1, 1, 3]));
            d.n = desc(&p.accepted);
        },
    );
    expect_update_rejected(
        SSMK_ERR_INVALID_ARGUMENT,
        &["num_accepted_tokens.shape[0] = 2"],
        |p, d| {
            p.accepted = Some(Tensor::ints(I32, &[1, 1]));
            d.n = desc(&p.accepted);
        },
    );
    expect_update_rejected(
        SSMK_ERR_INVALID_ARGUMENT,
        &["conv_states.shape[1] = 3", "W-2+Q", "= 4"],
        |p, d| {
            p.states = Tensor::zeros(F16, &[6, 3, 16]);
            d.s = Some(p.states.desc());
        },
    );
    expect_update_rejected(
        SSMK_ERR_INVALID_ARGUMENT,
        &["conv_states.shape[1] = 2", "W-1 = 3"],
        |p, d| {
            p.states = Tensor::zeros(F16, &[6, 2, 16]);
            d.s = Some(p.states.desc());
            d.n = None;
        },
    );
    expect_update_rejected(
        SSMK_ERR_OUT_OF_BOUNDS,
        &["conv_state_indices[0] = 6"],
        |p, d| {
            p.idx = Some(Tensor::ints(I32, &[6, 0, 1]));
            d.i = desc(&p.idx);
        },
    );
    expect_update_rejected(SSMK_ERR_INVALID_ARGUMENT, &["distinct"], |p, d| {
        p.idx = Some(Tensor::ints(I32, &[1, 0, 1]));
        d.i = desc(&p.idx);
    });
    expect_update_rejected(
        SSMK_ERR_INVALID_ARGUMENT,
        &["weight.shape[1] = 9"],
        |p, d| {
            p.weight = Tensor::zeros(F16, &[16, 9]);
            d.w = Some(p.weight.desc());
        },
    );
    expect_update_rejected(
        SSMK_ERR_UNSUPPORTED_DTYPE,
        &["bias.dtype = bfloat16"],
        |p, d| {
            p.bias = Some(Tensor::zeros(BF16, &[16]));
            d.b = desc(&p.bias);
        },
    );
    expect_update_rejected(SSMK_ERR_INVALID_ARGUMENT, &["activation = 7"], |p, _| {
        p.act = 7
    });
    expect_update_rejected(SSMK_ERR_ALIASING, &["conv_states", "x"], |_, d| {
        d.s.as_mut().unwrap().data = d.x.unwrap().data;
        d.s.as_mut().unwrap().shape = SHAPE_1_4_16.as_ptr();
    });
    // A padded sequence's accepted count is ignored.
    let mut s = UpdateSpec::new(2, 2, 16, 4, F32);
    s.slots = Some(vec![-1, 0]);
    let mut u = s.build();
    u.accepted = Some(Tensor::ints(I32, &[0, 2]));
    u.run(&Ctx::new(1), None);
}

/// Rough bandwidth of the performance cases (run with
/// `cargo test --release --test conv perf -- --ignored --nocapture`; `SSMK_PERF_ONLY=<text>` keeps
/// only the cases whose label contains it). Prints the best wall time of several runs and, for one
/// thread, the thread's CPU time (less disturbed by other processes on a shared machine).
#[test]
#[ignore]
fn perf_report() {
    fn cpu_now() -> f64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }
    /// (best wall seconds, best calling-thread CPU seconds)
    fn time(mut f: impl FnMut()) -> (f64, f64) {
        f();
        let (mut wall, mut cpu) = (f64::MAX, f64::MAX);
        for _ in 0..9 {
            let (t, c) = (std::time::Instant::now(), cpu_now());
            f();
            wall = wall.min(t.elapsed().as_secs_f64());
            cpu = cpu.min(cpu_now() - c);
        }
        (wall, cpu)
    }
    let only = std::env::var("SSMK_PERF_ONLY").unwrap_or_default();
    // SSMK_PERF_ACTIVATION=0 measures without silu.
    let act_code: u32 = std::env::var("SSMK_PERF_ACTIVATION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SSMK_ACTIVATION_SILU);
    let report = |label: String, bytes: f64, (wall, cpu): (f64, f64), threads: u32| {
        let cpu_part = if threads == 1 {
            format!(", cpu {:.2} ms = {:.1} GB/s", cpu * 1e3, bytes / cpu / 1e9)
        } else {
            String::new()
        };
        println!(
            "{label}: {:.2} ms = {:.1} GB/s{cpu_part}",
            wall * 1e3,
            bytes / wall / 1e9
        );
    };
    let d = 8192;
    // Large storage filled fast with finite values (the math is data-independent).
    let fill = |t: &mut Tensor| {
        t.storage
            .iter_mut()
            .for_each(|w| *w = 0x3c3c_3c3c_3c3c_3c3c)
    };
    let src = vec![1u8; 64 << 20];
    let mut dst = vec![0u8; 64 << 20];
    let memcpy = time(|| {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    });
    report(
        "memcpy 64 MiB (bytes read + written)".into(),
        (128 << 20) as f64,
        memcpy,
        1,
    );
    for act in DTYPES {
        let size = act.size();
        let cases: [(u32, Option<Isa>); 3] = [(1, None), (2, None), (1, Some(Isa::Scalar))];
        for (threads, isa) in cases {
            let label = format!(
                "fwd {act:?} T=2048 (4x512) D={d} W=4 silu, {threads} thread(s){}",
                if isa.is_some() {
                    " scalar reference"
                } else {
                    ""
                }
            );
            if !label.contains(&only)
                || (isa.is_some()
                    && (act != DType::BF16 || (!only.is_empty() && !only.contains("scalar"))))
            {
                continue;
            }
            let mut s = Spec::new(&[1, 1, 1, 1], 8, 4, act);
            s.init = Some(vec![true, false, true, false]);
            s.extra_slots = 0;
            let mut f = s.build();
            f.x = Tensor::zeros(act, &[2048, d]);
            f.out = Tensor::zeros(act, &[2048, d]);
            f.weight = Tensor::zeros(act, &[d, 4]);
            f.bias = Some(Tensor::zeros(act, &[d]));
            f.states = Some(Tensor::zeros(act, &[4, 3, d]));
            f.qsl = Some(Tensor::ints(DType::I32, &[0, 512, 1024, 1536, 2048]));
            for t in [
                &mut f.x,
                &mut f.out,
                &mut f.weight,
                f.bias.as_mut().unwrap(),
                f.states.as_mut().unwrap(),
            ] {
                fill(t);
            }
            f.act = act_code;
            let ctx = Ctx::new(threads);
            let bytes = (2 * 2048 * d * size + (2 + 4) * 3 * d * size) as f64;
            report(label, bytes, time(|| f.run(&ctx, isa)), threads);
        }
        for threads in [1u32, 2] {
            let label = format!("update {act:?} B=256 D={d} W=4 silu, {threads} thread(s)");
            if !label.contains(&only) {
                continue;
            }
            let mut u = UpdateSpec {
                q: None,
                rows: 3,
                ..UpdateSpec::new(1, 1, 8, 4, act)
            }
            .build();
            u.x = Tensor::zeros(act, &[256, d]);
            u.out = Tensor::zeros(act, &[256, d]);
            u.weight = Tensor::zeros(act, &[d, 4]);
            u.bias = Some(Tensor::zeros(act, &[d]));
            u.states = Tensor::zeros(act, &[256, 3, d]);
            for t in [
                &mut u.x,
                &mut u.out,
                &mut u.weight,
                u.bias.as_mut().unwrap(),
                &mut u.states,
            ] {
                fill(t);
            }
            u.act = act_code;
            let ctx = Ctx::new(threads);
            let bytes = (2 * 256 * d * size + 2 * 256 * 3 * d * size) as f64;
            report(label, bytes, time(|| u.run(&ctx, None)), threads);
        }
    }
}

/// `[B, C]` checkpoint tables (int64 offsets, int32 slots) from each sequence's `(offset, slot)`
/// pairs, rows padded with `(0, -1)` entries (ignored whole).
fn checkpoint_tables(rows: &[Vec<(i64, i64)>]) -> (Tensor, Tensor) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut offsets = Tensor::zeros(DType::I64, &[rows.len(), cols]);
    let mut slots = Tensor::zeros(DType::I32, &[rows.len(), cols]);
    for (b, row) in rows.iter().enumerate() {
        for c in 0..cols {
            let (o, s) = row.get(c).copied().unwrap_or((0, -1));
            offsets.set(&[b, c], o as f64);
            slots.set(&[b, c], s as f64);
        }
    }
    (offsets, slots)
}

/// Per sequence, its checkpoints `(offset, slot)`.
type Rows = Vec<Vec<(i64, i64)>>;

/// A prefill crossing piece boundaries (256 tokens), a decode, a prefill without checkpoints, a
/// two-token one, a padded sequence (its checkpoint ignored) and an empty one; checkpoints at 1,
/// within `W-1` of the start (history rows), at piece boundaries and either side, at `len_b`.
fn conv_checkpoint_batch() -> (Vec<usize>, Vec<i64>, Rows) {
    let lens = vec![300, 1, 40, 2, 5, 0];
    let slots = vec![0, 1, 2, 3, -1, 5];
    let offsets: [&[i64]; 6] = [
        &[1, 2, 3, 7, 255, 256, 257, 299, 300],
        &[1],
        &[],
        &[1, 2],
        &[3],
        &[],
    ];
    let mut slot = 6;
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
    (lens, slots, rows)
}

/// Checks ABI.md §4.10 for the conv call `f` (sequences from `starts`, own `slots`, initial
/// states `init`) with checkpoint `rows` on every ISA: outputs and every slot but the
/// checkpoints' bit-identical to the call without them; rows `0..W-1` of each checkpoint slot
/// bit-identical to the state a call ending at that token stores (its rows `W-1..L` untouched);
/// two and three threads bitwise equal.
fn check_conv_checkpoints(f: &Fwd, rows: &Rows, slots: &[i64], init: &[bool], what: &str) {
    let ctx = Ctx::new(2);
    let starts: Vec<i64> = f
        .qsl
        .as_ref()
        .unwrap()
        .to_vec()
        .iter()
        .map(|&v| v as i64)
        .collect();
    let w = f.width();
    let s0 = f.states.clone().unwrap();
    let with_tables = |f: &Fwd| {
        let mut a = f.clone();
        a.ckpt = Some(checkpoint_tables(rows));
        a
    };
    // Checkpoint slots written (a padded sequence's are ignored: checked unchanged).
    let taken: Vec<usize> = rows
        .iter()
        .zip(slots)
        .filter(|(_, own)| **own != -1)
        .flat_map(|(r, _)| r.iter().map(|&(_, s)| s as usize))
        .collect();
    for isa in Isa::under_test() {
        let what = format!("{what} [{isa:?}]");
        let mut plain = f.clone();
        plain.run(&ctx, Some(isa));
        let mut with = with_tables(f);
        with.run(&ctx, Some(isa));
        assert!(
            plain.out.storage == with.out.storage,
            "{what}: out changed with checkpoints"
        );
        let (ps, ws) = (plain.states.unwrap(), with.states.clone().unwrap());
        let [pool, l, d] = [0, 1, 2].map(|i| ws.shape[i] as usize);
        for s in 0..pool {
            for j in 0..l {
                for c in 0..d {
                    let want = match (taken.contains(&s), j + 1 >= w) {
                        (true, false) => continue,
                        (true, true) => s0.get(&[s, j, c]),
                        (false, _) => ps.get(&[s, j, c]),
                    };
                    assert_eq!(
                        ws.get(&[s, j, c]).to_bits(),
                        want.to_bits(),
                        "{what}: slot {s} row {j} channel {c} changed"
                    );
                }
            }
        }
        for (b, row) in rows.iter().enumerate() {
            if slots[b] == -1 {
                continue;
            }
            for &(o, slot) in row {
                let mut one = f.clone();
                one.qsl = Some(Tensor::ints(DType::I64, &[starts[b], starts[b] + o]));
                one.idx = Some(Tensor::ints(DType::I32, &[slots[b]]));
                one.init = Some(Tensor::ints(DType::U8, &[init[b] as i64]));
                one.run(&ctx, Some(isa));
                let os = one.states.unwrap();
                for j in 0..w - 1 {
                    for c in 0..d {
                        assert_eq!(
                            ws.get(&[slot as usize, j, c]).to_bits(),
                            os.get(&[slots[b] as usize, j, c]).to_bits(),
                            "{what}: checkpoint of sequence {b} at {o} (slot {slot}) row {j} channel {c}"
                        );
                    }
                }
            }
        }
        let mut three = with_tables(f);
        with_every_call_parallel(|| three.run(&Ctx::new(3), Some(isa)));
        assert!(
            three.out.storage == with.out.storage && three.states.unwrap().storage == ws.storage,
            "{what}: three threads differ from two"
        );
    }
}

/// ABI.md §4.10 for the conv on every ISA: every activation and state dtype, widths 2..8, compact,
/// channel-major and gapped pools (see [`check_conv_checkpoints`]).
#[test]
fn every_isa_fwd_checkpoints_equal_calls_ending_there() {
    let (lens, slots, rows) = conv_checkpoint_batch();
    for (i, act) in DTYPES.into_iter().enumerate() {
        let layouts = [Pool::Compact, Pool::ChannelMajor, Pool::Gapped];
        for (k, layout) in layouts.into_iter().enumerate() {
            let w = [4usize, 3, 2, 8][(i + k) % 4];
            let mut s = Spec::new(&lens, 72, w, act);
            s.slots = Some(slots.clone());
            s.extra_slots = 14;
            s.layout = layout;
            s.sdt = if k % 2 == 0 { DType::F32 } else { act };
            s.state_rows = Some(w + k);
            s.silu = k != 1;
            s.seed = 60 + (3 * i + k) as u64;
            let what = format!("act {act:?} state {:?} W {w} {layout:?}", s.sdt);
            check_conv_checkpoints(&s.build(), &rows, &slots, s.init.as_ref().unwrap(), &what);
        }
    }
}
