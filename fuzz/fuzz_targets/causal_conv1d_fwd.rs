//! `ssmk_causal_conv1d_fwd`: varlen prefill / decode batches with hostile descriptors, against
//! the scalar reference (bit-exact without activation, one unit of the output with silu).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ssmk::dtype::DType;
use ssmk_fuzz::batch::Batch;
use ssmk_fuzz::call::{Call, Cmp, FLOATS, Fill, Role};
use ssmk_fuzz::exports::CausalConv1dFwd;
use ssmk_fuzz::input::Input;

fuzz_target!(|data: &[u8]| {
    let input = &mut Input::new(data);
    let mut call = Call::new(input);
    let batch = Batch::decode(input, 6, 40);
    let act = input.pick(&FLOATS);
    let dim = input.range(1, 40);
    let width = if call.hostile && input.chance(24) {
        input.below(12)
    } else {
        input.range(2, 8)
    };
    let activation = if call.hostile && input.chance(16) {
        input.u32()
    } else {
        input.below(2) as u32
    };
    let act_or_f32 = |input: &mut Input| if input.chance(64) { DType::F32 } else { act };
    let t = batch.tokens;
    let x = call.tensor(
        input,
        "x",
        Role::Input,
        act,
        &[t, dim],
        Fill::Floats(-2.0, 2.0),
    );
    let wdt = act_or_f32(input);
    let weight = call.tensor(
        input,
        "weight",
        Role::Input,
        wdt,
        &[dim, width],
        Fill::Floats(-1.0, 1.0),
    );
    let bdt = act_or_f32(input);
    let bias = call.optional(
        input,
        160,
        "bias",
        Role::Input,
        bdt,
        &[dim],
        Fill::Floats(-1.0, 1.0),
    );
    let rows = width.saturating_sub(1) + input.below(3);
    let sdt = act_or_f32(input);
    let conv_states = call.optional(
        input,
        220,
        "conv_states",
        Role::Output(Cmp::Exact),
        sdt,
        &[batch.num_slots, rows, dim],
        Fill::Floats(-2.0, 2.0),
    );
    let seqs = batch.tensors(
        &mut call,
        input,
        ["query_start_loc", "cache_indices", "has_initial_state"],
        true,
    );
    let out_cmp = if activation == 1 {
        Cmp::rounding(act, 1e-6)
    } else {
        Cmp::Exact
    };
    let out = call.tensor(
        input,
        "out",
        Role::Output(out_cmp),
        act,
        &[t, dim],
        Fill::Floats(-9.0, 9.0),
    );
    let checkpoints = batch.checkpoints(&mut call, input, batch.num_slots);
    let args = CausalConv1dFwd {
        x,
        weight,
        bias,
        conv_states,
        query_start_loc: seqs.starts,
        cache_indices: seqs.slots,
        has_initial_state: seqs.initial,
        activation,
        pad_slot_id: batch.pad_slot_id,
        out,
        checkpoints,
    };
    call.run(CausalConv1dFwd::NAMES, &|c, ctx| args.invoke(c, ctx));
});
