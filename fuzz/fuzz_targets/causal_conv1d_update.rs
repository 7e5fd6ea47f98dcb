//! `ssmk_causal_conv1d_update`: decode `[B, D]`, multi-token `[B, Q, D]` and speculative
//! (rolling buffer) steps, slots `[B]` or vLLM's `[B, 1]`, with hostile descriptors, against the
//! scalar reference (bit-exact without activation, one unit of the output with silu).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ssmk::dtype::DType;
use ssmk_fuzz::call::{Call, Cmp, FLOATS, Fill, INDEX, Role};
use ssmk_fuzz::exports::CausalConv1dUpdate;
use ssmk_fuzz::input::Input;

fuzz_target!(|data: &[u8]| {
    let input = &mut Input::new(data);
    let mut call = Call::new(input);
    let act = input.pick(&FLOATS);
    let (b, dim) = (input.range(0, 6), input.range(1, 40));
    let q = input.range(1, 6);
    let three_d = q > 1 || input.chance(64);
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
    let speculative = input.chance(96);
    let min_rows = if speculative {
        width.saturating_sub(2) + q
    } else {
        width.saturating_sub(1)
    };
    let rows = min_rows + input.below(3);
    let num_slots = b + input.below(4);
    let pad_slot_id = input.pick(&[-1, -1, i64::MIN, 3]);
    let mut slots: Vec<i64> = (0..num_slots as i64).collect();
    for i in (1..slots.len()).rev() {
        slots.swap(i, input.below(i + 1));
    }
    slots.truncate(b);
    if b > 0 && input.chance(64) {
        let i = input.below(b);
        slots[i] = match input.below(3) {
            0 => pad_slot_id,
            1 => slots[input.below(b)],
            _ => input.hostile_i64(),
        };
    }
    let mut accepted: Vec<i64> = (0..b).map(|_| input.range(1, q) as i64).collect();
    if b > 0 && input.chance(24) {
        accepted[input.below(b)] = input.pick(&[0, q as i64 + 1, -1, i64::MAX]);
    }
    let act_or_f32 = |input: &mut Input| if input.chance(64) { DType::F32 } else { act };
    let x_shape: Vec<usize> = if three_d {
        vec![b, q, dim]
    } else {
        vec![b, dim]
    };
    let x = call.tensor(
        input,
        "x",
        Role::Input,
        act,
        &x_shape,
        Fill::Floats(-2.0, 2.0),
    );
    let sdt = act_or_f32(input);
    let conv_states = call.required(
        input,
        "conv_states",
        Role::Output(Cmp::Exact),
        sdt,
        &[num_slots, rows, dim],
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
    // Slots `[B]`, or vLLM's one-column block table `[B, 1]` (sometimes wider: refused).
    let table_columns = match input.byte() {
        0..=159 => None,
        160..=239 => Some(1),
        _ => Some(input.range(0, 3)),
    };
    let idx_shape: Vec<usize> = table_columns.map_or(vec![b], |k| vec![b, k]);
    let idt = input.pick(&INDEX);
    let conv_state_indices = call.optional(
        input,
        220,
        "conv_state_indices",
        Role::Input,
        idt,
        &idx_shape,
        Fill::Ints(slots),
    );
    let ndt = input.pick(&INDEX);
    let num_accepted_tokens = if speculative {
        Some(call.tensor(
            input,
            "num_accepted_tokens",
            Role::Input,
            ndt,
            &[b],
            Fill::Ints(accepted),
        ))
    } else {
        None
    };
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
        &x_shape,
        Fill::Floats(-9.0, 9.0),
    );
    let args = CausalConv1dUpdate {
        x,
        conv_states,
        weight,
        bias,
        conv_state_indices,
        num_accepted_tokens,
        activation,
        pad_slot_id,
        out,
    };
    call.run(CausalConv1dUpdate::NAMES, &|c, ctx| args.invoke(c, ctx));
});
