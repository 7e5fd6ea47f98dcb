//! Every finding of the fuzz targets (`fuzz/`, docs/testing.md), kept as a test of the normal
//! suite so it stays fixed without a nightly toolchain.

mod common;

use std::ptr::{null, null_mut};

use common::{Ctx, Tensor, assert_error};
use ssmk::dtype::DType;
use ssmk::ffi::gdn::{ssmk_gated_delta_rule, ssmk_kda_gating};
use ssmk::ffi::mamba2::ssmk_mamba2_scan;
use ssmk::ffi::status::*;
use ssmk::runtime::{Isa, with_isa};
use ssmk::tensor::ssmk_tensor;

/// A one-dimensional int32 descriptor of `len` entries at byte `offset` of `t`'s storage.
fn ints_inside(t: &Tensor, offset: usize, shape: &[i64; 1]) -> ssmk_tensor {
    ssmk_tensor::cpu(
        unsafe { t.base().add(offset) }.cast(),
        DType::I32,
        shape,
        None,
    )
}

/// Which sequence argument overlaps an output.
#[derive(Clone, Copy, Debug)]
enum Table {
    CuSeqlens,
    StateIndices,
    HasInitialState,
    NumAccepted,
}

const TABLES: [Table; 4] = [
    Table::CuSeqlens,
    Table::StateIndices,
    Table::HasInitialState,
    Table::NumAccepted,
];

/// The four sequence descriptors of a one-sequence call of `tokens` tokens (speculative with
/// `num_accepted_tokens`), with `table` placed at the start of `host` (an output's storage,
/// all zeros: slot 0, no initial state, ...) and the others in their own memory.
struct Sequences {
    /// The tables not placed in the output, kept alive for the descriptors.
    _own: Vec<Tensor>,
    descs: [Option<ssmk_tensor>; 4],
}

static ONE: [i64; 1] = [1];
static TWO: [i64; 1] = [2];
static ONE_BY_ONE: [i64; 2] = [1, 1];

impl Sequences {
    fn new(host: &Tensor, table: Table, tokens: i64) -> Sequences {
        let speculative = matches!(table, Table::NumAccepted);
        let mut own = vec![
            Tensor::ints(DType::I32, &[0, tokens]),
            Tensor::ints(DType::I32, &[0]),
            Tensor::ints(DType::I32, &[0]),
            Tensor::ints(DType::I32, &[1]),
        ];
        if speculative {
            own[1].shape = vec![1, 1];
        }
        let mut descs: [Option<ssmk_tensor>; 4] = std::array::from_fn(|i| Some(own[i].desc()));
        let i = table as usize;
        descs[i] = Some(match table {
            // cu_seqlens = [0, 0] read from the output: one empty sequence, still accepted before.
            Table::CuSeqlens => ints_inside(host, 0, &TWO),
            Table::StateIndices if speculative => unreachable!(),
            Table::StateIndices | Table::HasInitialState => ints_inside(host, 0, &ONE),
            Table::NumAccepted => ints_inside(host, 0, &ONE),
        });
        if speculative {
            descs[1].as_mut().unwrap().shape = ONE_BY_ONE.as_ptr();
            descs[1].as_mut().unwrap().ndim = 2;
        } else {
            descs[3] = None;
        }
        Sequences { _own: own, descs }
    }

    fn ptr(&self, i: usize) -> *const ssmk_tensor {
        self.descs[i].as_ref().map_or(null(), |d| d as *const _)
    }
}

/// The two recurrent exports over zero inputs of `t` tokens and one head: the delta rule with
/// K = V = 4 (`out [t, 1, 4]`, `state [2, 1, 4, 4]`), the scan with P = 2, N = 4 (`out [t, 1, 2]`,
/// `state [2, 1, 2, 4]`).
#[derive(Clone, Copy, Debug)]
enum Export {
    DeltaRule,
    Scan,
}

impl Export {
    /// Zero `out` and `state` of a call of `t` tokens.
    fn outputs(self, t: usize) -> (Tensor, Tensor) {
        let (p, n) = match self {
            Export::DeltaRule => (4, 4),
            Export::Scan => (2, 4),
        };
        let zeros = |shape: &[usize]| Tensor::zeros(DType::F32, shape);
        match self {
            Export::DeltaRule => (zeros(&[t, 1, p]), zeros(&[2, 1, n, p])),
            Export::Scan => (zeros(&[t, 1, p]), zeros(&[2, 1, p, n])),
        }
    }

    /// The call writing `out` and `state` (from [`Export::outputs`]) with the sequence tables
    /// `seqs` (`cu_seqlens`, `state_indices`, `has_initial_state`, `num_accepted_tokens`) and the
    /// checkpoint tables.
    fn call(
        self,
        out: &Tensor,
        state: &Tensor,
        seqs: [*const ssmk_tensor; 4],
        checkpoints: [*const ssmk_tensor; 2],
    ) -> i32 {
        let t = out.shape[0] as usize;
        let zeros = |shape: &[usize]| Tensor::zeros(DType::F32, shape);
        let (mut od, mut sd) = (out.desc(), state.desc());
        let [cu, idx, init, accepted] = seqs;
        let [offsets, slots] = checkpoints;
        match self {
            Export::DeltaRule => {
                let (qk, v, g) = (zeros(&[t, 1, 4]), zeros(&[t, 1, 4]), zeros(&[t, 1]));
                unsafe {
                    ssmk_gated_delta_rule(
                        Ctx::new(1).0,
                        &qk.desc(),
                        &qk.desc(),
                        &v.desc(),
                        &g.desc(),
                        &g.desc(),
                        0.0,
                        &mut sd,
                        cu,
                        idx,
                        init,
                        accepted,
                        0,
                        0.0,
                        -1,
                        &mut od,
                        offsets,
                        slots,
                    )
                }
            }
            Export::Scan => {
                let (x, dt, a, bc) = (
                    zeros(&[t, 1, 2]),
                    zeros(&[t, 1]),
                    zeros(&[1]),
                    zeros(&[t, 1, 4]),
                );
                unsafe {
                    ssmk_mamba2_scan(
                        Ctx::new(1).0,
                        &x.desc(),
                        &dt.desc(),
                        &a.desc(),
                        &bc.desc(),
                        &bc.desc(),
                        null(),
                        null(),
                        null(),
                        f32::NEG_INFINITY,
                        f32::INFINITY,
                        0,
                        &mut sd,
                        cu,
                        idx,
                        init,
                        accepted,
                        -1,
                        &mut od,
                        offsets,
                        slots,
                    )
                }
            }
        }
    }
}

/// Found by `delta_rule_gdn` and `delta_rule_kda`, then by `mamba2_scan` (the same fix): `out`
/// (or the state pool) over a sequence table was accepted, although the headers promise
/// SSMK_ERR_ALIASING for an output overlapping any input. Now every sequence table is checked,
/// for both outputs.
#[test]
fn outputs_must_not_overlap_sequence_tables() {
    for export in [Export::DeltaRule, Export::Scan] {
        for table in TABLES {
            for over_state in [false, true] {
                let (out, state) = export.outputs(1);
                let host = if over_state { &state } else { &out };
                let seqs = Sequences::new(host, table, 1);
                let (o, s) = (out.bytes(), state.bytes());
                let tables = std::array::from_fn(|i| seqs.ptr(i));
                let code = export.call(&out, &state, tables, [null(), null()]);
                let output = if over_state { "state" } else { "out" };
                assert_error(code, SSMK_ERR_ALIASING, &[output, "overlap"]);
                let what = format!("{export:?} {table:?}");
                assert!(out.bytes() == o && state.bytes() == s, "{what}: written");
            }
        }
    }
}

/// Found by `kda_gating`: on AVX2/AVX-512 a NaN gate argument (a NaN in `a`, or
/// `exp(A_log) = inf` times `a + dt_bias = 0`) gave a finite gate (the vector `exp` clamps its
/// argument), where the scalar reference gives NaN. Every ISA now gives NaN exactly there, in
/// both gate forms and at every lane position of a vector (K = 19: a full vector and a tail).
#[test]
fn every_isa_kda_gates_keep_nan() {
    let (n, hv, k) = (2usize, 2, 19);
    let mut a_log = Tensor::zeros(DType::F32, &[hv]);
    a_log.set(&[1], f64::INFINITY);
    let mut a = Tensor::zeros(DType::F32, &[n, hv, k]);
    a.fill_random(5, 2.0);
    let nan_at = [[0, 0, 0], [0, 0, 17], [1, 0, 9]];
    for i in nan_at {
        a.set(&i, f64::NAN);
    }
    for c in 0..k {
        a.set(&[1, 1, c], 0.0); // exp(A_log) * 0 = inf * 0
    }
    for lower_bound in [0.0f32, -5.0] {
        let run = |isa: Isa| {
            let g = Tensor::zeros(DType::F32, &[n, hv, k]);
            let mut gd = g.desc();
            let code = with_isa(isa, || unsafe {
                ssmk_kda_gating(
                    Ctx::new(1).0,
                    &a_log.desc(),
                    &a.desc(),
                    null(),
                    lower_bound,
                    null(),
                    &mut gd,
                    null_mut(),
                )
            });
            assert_eq!(code, SSMK_OK, "{}", common::last_error());
            g.to_vec()
        };
        let want = run(Isa::Scalar);
        for i in nan_at {
            assert!(want[(i[0] * hv + i[1]) * k + i[2]].is_nan());
        }
        for isa in Isa::under_test() {
            let got = run(isa);
            for (j, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= 1e-6 + 1e-5 * w.abs(),
                    "{isa:?} lower_bound {lower_bound}: g[{j}] = {g}, scalar reference {w}"
                );
            }
        }
    }
}

/// Found by `kda_gating`: with no v-head (`a` `[N, 0, K]`, no element) `K` is bounded by no
/// memory, and the AVX2/AVX-512 path allocated a row of `K` floats per row anyway (ASan:
/// allocation-size-too-big at K = 2^40). A call without elements now does nothing, on every ISA.
#[test]
fn every_isa_kda_gating_without_heads_allocates_nothing() {
    let a_log = Tensor::zeros(DType::F32, &[0]);
    let a = Tensor::zeros(DType::F32, &[3, 0, 1]);
    let g = Tensor::zeros(DType::F32, &[3, 0, 1]);
    let huge: [i64; 3] = [3, 0, 1 << 40];
    let desc = |t: &Tensor| ssmk_tensor::cpu(t.base().cast(), DType::F32, &huge, None);
    for isa in Isa::under_test() {
        let mut gd = desc(&g);
        let code = with_isa(isa, || unsafe {
            ssmk_kda_gating(
                Ctx::new(1).0,
                &a_log.desc(),
                &desc(&a),
                null(),
                0.0,
                null(),
                &mut gd,
                null_mut(),
            )
        });
        assert_eq!(code, SSMK_OK, "{isa:?}: {}", common::last_error());
    }
}

/// Found by `delta_rule_gdn` and `mamba2_scan` once they fuzzed checkpoint tables: `state` (or
/// `out`) over `checkpoint_offsets` or `checkpoint_slots` was accepted. Both tables are now
/// inputs every output must not overlap.
#[test]
fn outputs_must_not_overlap_checkpoint_tables() {
    static ONE_BY_ONE: [i64; 2] = [1, 1];
    let cu = Tensor::ints(DType::I32, &[0, 2]);
    let own = Tensor::ints(DType::I32, &[1]);
    let cu_desc = cu.desc();
    for export in [Export::DeltaRule, Export::Scan] {
        for (over_state, slots_inside) in
            [(false, false), (false, true), (true, false), (true, true)]
        {
            let (out, state) = export.outputs(2);
            let host = if over_state { &state } else { &out };
            let inside = ssmk_tensor::cpu(host.base().cast(), DType::I32, &ONE_BY_ONE, None);
            let mut tables = [own.desc(), inside];
            if !slots_inside {
                tables.swap(0, 1);
            }
            let (o, s) = (out.bytes(), state.bytes());
            let seqs = [&cu_desc as *const ssmk_tensor, null(), null(), null()];
            let code = export.call(&out, &state, seqs, [&tables[0], &tables[1]]);
            assert_error(code, SSMK_ERR_ALIASING, &["overlap"]);
            assert!(
                out.bytes() == o && state.bytes() == s,
                "{export:?}: written"
            );
        }
    }
}
