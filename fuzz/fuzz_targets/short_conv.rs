//! `ssmk_short_conv`: `out = C * conv(B * x)` over varlen batches with hostile descriptors,
//! bit-exact against the scalar reference.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ssmk::dtype::DType;
use ssmk_fuzz::batch::Batch;
use ssmk_fuzz::call::{Call, Cmp, FLOATS, Fill, Role};
use ssmk_fuzz::exports::ShortConv;
use ssmk_fuzz::input::Input;

fuzz_target!(|data: &[u8]| {
    let input = &mut Input::new(data);
    let mut call = Call::new(input);
    let batch = Batch::decode(input, 6, 40);
    let act = input.pick(&FLOATS);
    let dim = input.range(1, 24);
    let columns = if call.hostile && input.chance(24) {
        3 * dim + input.range(1, 2)
    } else {
        3 * dim
    };
    let width = if call.hostile && input.chance(24) {
        input.below(12)
    } else {
        input.range(2, 8)
    };
    let act_or_f32 = |input: &mut Input| if input.chance(64) { DType::F32 } else { act };
    let t = batch.tokens;
    let bcx = call.tensor(
        input,
        "bcx",
        Role::Input,
        act,
        &[t, columns],
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
        128,
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
    let out = call.tensor(
        input,
        "out",
        Role::Output(Cmp::Exact),
        act,
        &[t, dim],
        Fill::Floats(-9.0, 9.0),
    );
    let checkpoints = batch.checkpoints(&mut call, input, batch.num_slots);
    let args = ShortConv {
        bcx,
        weight,
        bias,
        conv_states,
        query_start_loc: seqs.starts,
        cache_indices: seqs.slots,
        has_initial_state: seqs.initial,
        pad_slot_id: batch.pad_slot_id,
        out,
        checkpoints,
    };
    call.run(ShortConv::NAMES, &|c, ctx| args.invoke(c, ctx));
});
