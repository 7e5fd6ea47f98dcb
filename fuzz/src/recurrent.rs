//! The recurrent exports, whose sequence arguments follow ABI.md §4.4 word for word
//! (`cu_seqlens`, `state_indices` `[B]` or speculative `[B, Smax]` with `num_accepted_tokens`,
//! `has_initial_state`, a state pool `[S, ...]`): the delta rule (one body for the scalar-gate
//! and the per-channel-gate targets), RWKV-7's generalized delta rule and the Mamba-2 scan.

use ssmk::dtype::DType;
use ssmk::ffi::dplr::SSMK_DPLR_W_LINEAR;
use ssmk::ffi::gdn::{SSMK_GDN_GQA_TILED, SSMK_GDN_QK_L2NORM};
use ssmk::ffi::mamba2::SSMK_MAMBA2_DT_SOFTPLUS;

use crate::batch::Batch;
use crate::call::{Call, Cmp, FLOATS, Fill, INDEX, Id, Role};
use crate::exports::{DplrDeltaRule, GatedDeltaRule, Mamba2Scan};
use crate::input::Input;

/// f32 accumulation-order differences allowed between a variant (chunked or recurrent, any
/// ISA) and the scalar recurrence, relative to the output's magnitude.
const F32_RTOL: f64 = 1e-3;

/// A recurrent call's sequence arguments and the number of slots its pool needs.
struct Sequences {
    cu_seqlens: Option<Id>,
    state_indices: Option<Id>,
    has_initial_state: Option<Id>,
    num_accepted_tokens: Option<Id>,
    num_slots: usize,
    pad_slot_id: i64,
}

fn sequences(call: &mut Call, input: &mut Input, batch: &Batch) -> Sequences {
    let b = batch.len();
    let speculative = input.chance(64);
    let names = ["cu_seqlens", "state_indices", "has_initial_state"];
    let seqs = batch.tensors(call, input, names, !speculative);
    if !speculative {
        return Sequences {
            cu_seqlens: seqs.starts,
            state_indices: seqs.slots,
            has_initial_state: seqs.initial,
            num_accepted_tokens: None,
            num_slots: batch.num_slots,
            pad_slot_id: batch.pad_slot_id,
        };
    }
    // Speculative mode: replace the slots by a `[B, Smax]` table.
    let longest = batch
        .starts
        .windows(2)
        .map(|w| (w[1] - w[0]).max(0) as usize)
        .max()
        .unwrap_or(0);
    let smax = longest.min(8) + input.below(2);
    let (table, accepted, num_slots) = batch.speculative(input, smax);
    let dtype = input.pick(&INDEX);
    let state_indices = Some(call.tensor(
        input,
        "state_indices",
        Role::Input,
        dtype,
        &[b, smax],
        Fill::Ints(table),
    ));
    let dtype = input.pick(&INDEX);
    let num_accepted_tokens = Some(call.tensor(
        input,
        "num_accepted_tokens",
        Role::Input,
        dtype,
        &[b],
        Fill::Ints(accepted),
    ));
    Sequences {
        cu_seqlens: seqs.starts,
        state_indices,
        has_initial_state: seqs.initial,
        num_accepted_tokens,
        num_slots,
        pad_slot_id: batch.pad_slot_id,
    }
}

fn float(input: &mut Input) -> DType {
    input.pick(&FLOATS)
}

/// `ssmk_gated_delta_rule` with `g` `[T, HV]` (Gated DeltaNet) or `[T, HV, K]` (KDA), either GQA
/// order, l2-norm or not, any mode, against the scalar recurrence.
pub fn delta_rule(data: &[u8], per_channel: bool) {
    let input = &mut Input::new(data);
    let mut call = Call::new(input);
    let batch = Batch::decode(input, 4, 40);
    let (h, groups) = (input.range(1, 3), input.range(1, 3));
    let hv = call.dim(input, h * groups);
    let (kd, vd) = (input.range(1, 20), input.range(1, 20));
    let t = batch.tokens;
    let key = 1.0 / (kd as f32).sqrt();
    let dt = float(input);
    let q = call.tensor(
        input,
        "q",
        Role::Input,
        dt,
        &[t, h, kd],
        Fill::Floats(-1.0, 1.0),
    );
    let dt = float(input);
    let k_heads = call.dim(input, h);
    let k = call.tensor(
        input,
        "k",
        Role::Input,
        dt,
        &[t, k_heads, kd],
        Fill::Floats(-key, key),
    );
    let dt = float(input);
    let v = call.tensor(
        input,
        "v",
        Role::Input,
        dt,
        &[t, hv, vd],
        Fill::Floats(-1.0, 1.0),
    );
    let decay = if per_channel && input.chance(64) {
        -25.0
    } else {
        -4.0
    };
    let g_shape: Vec<usize> = if per_channel {
        vec![t, hv, kd]
    } else {
        vec![t, hv]
    };
    let g = call.tensor(
        input,
        "g",
        Role::Input,
        DType::F32,
        &g_shape,
        Fill::Floats(decay, 0.0),
    );
    let dt = float(input);
    let beta = call.tensor(
        input,
        "beta",
        Role::Input,
        dt,
        &[t, hv],
        Fill::Floats(0.0, 1.0),
    );
    let seqs = sequences(&mut call, input, &batch);
    let dt = float(input);
    let state_k = call.dim(input, kd);
    let state = call.optional(
        input,
        220,
        "state",
        Role::Output(Cmp::rounding(dt, F32_RTOL)),
        dt,
        &[seqs.num_slots, hv, state_k, vd],
        Fill::Floats(-1.0, 1.0),
    );
    let dt = float(input);
    let out = call.tensor(
        input,
        "out",
        Role::Output(Cmp::rounding(dt, F32_RTOL)),
        dt,
        &[t, hv, vd],
        Fill::Floats(-9.0, 9.0),
    );
    let flags = if call.hostile && input.chance(16) {
        input.u32()
    } else {
        input.below(4) as u32 & (SSMK_GDN_QK_L2NORM | SSMK_GDN_GQA_TILED)
    };
    let checkpoints = batch.checkpoints(&mut call, input, seqs.num_slots);
    let args = GatedDeltaRule {
        q,
        k,
        v,
        g,
        beta,
        scale: call.scalar(input, &[0.0, 0.0, 0.5, -1.0]),
        state,
        cu_seqlens: seqs.cu_seqlens,
        state_indices: seqs.state_indices,
        has_initial_state: seqs.has_initial_state,
        num_accepted_tokens: seqs.num_accepted_tokens,
        flags,
        l2norm_eps: call.scalar(input, &[1e-6, 1e-5, 0.0]),
        pad_slot_id: seqs.pad_slot_id,
        out,
        checkpoints,
    };
    call.run(GatedDeltaRule::NAMES, &|c, ctx| args.invoke(c, ctx));
}

/// `ssmk_dplr_delta_rule` (RWKV-7) with `w` as log-decays (now and then far below -87, where
/// the clamp acts) or as factors (`SSMK_DPLR_W_LINEAR`), any mode, against the scalar
/// recurrence. `a` and `b` stay small enough (`|a| |b| <= 1/4`) that the state grows slowly.
pub fn dplr_delta_rule(data: &[u8]) {
    let input = &mut Input::new(data);
    let mut call = Call::new(input);
    let batch = Batch::decode(input, 4, 40);
    let h = input.range(1, 4);
    let (kd, vd) = (input.range(1, 20), input.range(1, 20));
    let t = batch.tokens;
    let key = 1.0 / (kd as f32).sqrt();
    let linear = input.chance(64);
    let flags = if call.hostile && input.chance(16) {
        input.u32()
    } else {
        linear as u32 * SSMK_DPLR_W_LINEAR
    };
    let decays = match (linear, input.chance(32)) {
        (true, _) => (0.01, 1.0),
        (false, true) => (-200.0, 0.0),
        (false, false) => (-4.0, 0.0),
    };
    let row = |call: &mut Call, input: &mut Input, name: &'static str, lo: f32, hi: f32| {
        let dt = float(input);
        let heads = call.dim(input, h);
        let k_dim = call.dim(input, kd);
        call.tensor(
            input,
            name,
            Role::Input,
            dt,
            &[t, heads, k_dim],
            Fill::Floats(lo, hi),
        )
    };
    let r = row(&mut call, input, "r", -1.0, 1.0);
    let k = row(&mut call, input, "k", -key, key);
    let a = row(&mut call, input, "a", -0.5 * key, 0.5 * key);
    let b = row(&mut call, input, "b", -0.5 * key, 0.5 * key);
    let w = call.tensor(
        input,
        "w",
        Role::Input,
        DType::F32,
        &[t, h, kd],
        Fill::Floats(decays.0, decays.1),
    );
    let dtv = float(input);
    let v_heads = call.dim(input, h);
    let v = call.tensor(
        input,
        "v",
        Role::Input,
        dtv,
        &[t, v_heads, vd],
        Fill::Floats(-1.0, 1.0),
    );
    let seqs = sequences(&mut call, input, &batch);
    let dt = float(input);
    let state_k = call.dim(input, kd);
    let state = call.optional(
        input,
        220,
        "state",
        Role::Output(Cmp::rounding(dt, F32_RTOL)),
        dt,
        &[seqs.num_slots, h, state_k, vd],
        Fill::Floats(-1.0, 1.0),
    );
    let dt_out = if call.hostile && input.chance(16) {
        float(input)
    } else {
        dtv
    };
    let out = call.tensor(
        input,
        "out",
        Role::Output(Cmp::rounding(dt_out, F32_RTOL)),
        dt_out,
        &[t, h, vd],
        Fill::Floats(-9.0, 9.0),
    );
    let checkpoints = batch.checkpoints(&mut call, input, seqs.num_slots);
    let args = DplrDeltaRule {
        r,
        w,
        k,
        v,
        a,
        b,
        scale: call.scalar(input, &[0.0, 1.0, 0.5, -1.0]),
        state,
        cu_seqlens: seqs.cu_seqlens,
        state_indices: seqs.state_indices,
        has_initial_state: seqs.has_initial_state,
        num_accepted_tokens: seqs.num_accepted_tokens,
        flags,
        pad_slot_id: seqs.pad_slot_id,
        out,
        checkpoints,
    };
    call.run(DplrDeltaRule::NAMES, &|c, ctx| args.invoke(c, ctx));
}

/// `ssmk_mamba2_scan` with `A` per head, optional `D`, `z`, `dt_bias`, the softplus flag and
/// limits, any mode, against the scalar recurrence.
#[allow(non_snake_case)]
pub fn mamba2_scan(data: &[u8]) {
    let input = &mut Input::new(data);
    let mut call = Call::new(input);
    let batch = Batch::decode(input, 4, 40);
    let (groups, per_group) = (input.range(1, 2), input.range(1, 3));
    let nh = groups * per_group;
    let (p, n) = (input.range(1, 8), input.range(1, 16));
    let t = batch.tokens;
    let softplus = input.chance(128);
    let flags = if call.hostile && input.chance(16) {
        input.u32()
    } else {
        softplus as u32 * SSMK_MAMBA2_DT_SOFTPLUS
    };
    let dtx = float(input);
    let x = call.tensor(
        input,
        "x",
        Role::Input,
        dtx,
        &[t, nh, p],
        Fill::Floats(-1.0, 1.0),
    );
    let dt_range = if softplus { (-4.0, 1.0) } else { (0.001, 0.3) };
    let dt = float(input);
    let dt = call.tensor(
        input,
        "dt",
        Role::Input,
        dt,
        &[t, nh],
        Fill::Floats(dt_range.0, dt_range.1),
    );
    let a_heads = call.dim(input, nh);
    let A = call.tensor(
        input,
        "A",
        Role::Input,
        DType::F32,
        &[a_heads],
        Fill::Floats(-8.0, -0.05),
    );
    let dt_b = float(input);
    let b_groups = call.dim(input, groups);
    let B = call.tensor(
        input,
        "B",
        Role::Input,
        dt_b,
        &[t, b_groups, n],
        Fill::Floats(-1.0, 1.0),
    );
    let dt_c = float(input);
    let C = call.tensor(
        input,
        "C",
        Role::Input,
        dt_c,
        &[t, groups, n],
        Fill::Floats(-1.0, 1.0),
    );
    let D = call.optional(
        input,
        128,
        "D",
        Role::Input,
        DType::F32,
        &[nh],
        Fill::Floats(-1.0, 1.0),
    );
    let dt_z = float(input);
    let z = call.optional(
        input,
        128,
        "z",
        Role::Input,
        dt_z,
        &[t, nh, p],
        Fill::Floats(-3.0, 3.0),
    );
    let bias_range = if softplus { (-1.0, 0.5) } else { (0.0, 0.1) };
    let dt_bias = call.optional(
        input,
        128,
        "dt_bias",
        Role::Input,
        DType::F32,
        &[nh],
        Fill::Floats(bias_range.0, bias_range.1),
    );
    let (dt_min, dt_max) = match input.below(4) {
        0 => (0.0, 0.05),
        1 => (0.001, 0.1),
        2 => (0.0, f32::INFINITY),
        _ => (f32::NEG_INFINITY, f32::INFINITY),
    };
    let seqs = sequences(&mut call, input, &batch);
    let dt_state = float(input);
    let state_n = call.dim(input, n);
    let state = call.optional(
        input,
        220,
        "state",
        Role::Output(Cmp::rounding(dt_state, F32_RTOL)),
        dt_state,
        &[seqs.num_slots, nh, p, state_n],
        Fill::Floats(-0.5, 0.5),
    );
    let dt_out = if call.hostile && input.chance(16) {
        float(input)
    } else {
        dtx
    };
    let out = call.tensor(
        input,
        "out",
        Role::Output(Cmp::rounding(dt_out, F32_RTOL)),
        dt_out,
        &[t, nh, p],
        Fill::Floats(-9.0, 9.0),
    );
    let checkpoints = batch.checkpoints(&mut call, input, seqs.num_slots);
    let args = Mamba2Scan {
        x,
        dt,
        A,
        B,
        C,
        D,
        z,
        dt_bias,
        dt_min: call.scalar(input, &[dt_min]),
        dt_max: call.scalar(input, &[dt_max]),
        flags,
        state,
        cu_seqlens: seqs.cu_seqlens,
        state_indices: seqs.state_indices,
        has_initial_state: seqs.has_initial_state,
        num_accepted_tokens: seqs.num_accepted_tokens,
        pad_slot_id: seqs.pad_slot_id,
        out,
        checkpoints,
    };
    call.run(Mamba2Scan::NAMES, &|c, ctx| args.invoke(c, ctx));
}
