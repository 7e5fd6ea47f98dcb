//! `ssmk_zero_blocks`: any dtype, rank and strides, hostile block ids; an accepted call zeroes
//! exactly the elements of the named blocks (the cache may even overlap the ids it reads).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ssmk::dtype::DType;
use ssmk_fuzz::call::{Call, Cmp, Fill, INDEX, Role};
use ssmk_fuzz::exports::ZeroBlocks;
use ssmk_fuzz::input::Input;
use ssmk_fuzz::memory;

const DTYPES: [DType; 7] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::I64,
    DType::Bool,
    DType::U8,
];

fuzz_target!(|data: &[u8]| {
    let input = &mut Input::new(data);
    let mut call = Call::new(input);
    call.exclusive_outputs = false;
    let rank = input.range(1, 4);
    let shape: Vec<usize> = (0..rank)
        .map(|d| {
            if d == 0 {
                input.range(0, 6)
            } else {
                input.range(0, 5)
            }
        })
        .collect();
    let blocks = shape[0] as i64;
    let ids: Vec<i64> = (0..input.range(0, 8))
        .map(|_| {
            if input.chance(16) {
                input.hostile_i64()
            } else {
                input.below(blocks.max(1) as usize) as i64
            }
        })
        .collect();
    let dtype = input.pick(&DTYPES);
    let cache = call.required(
        input,
        "cache",
        Role::Output(Cmp::Exact),
        dtype,
        &shape,
        Fill::Floats(-9.0, 9.0),
    );
    let idt = input.pick(&INDEX);
    let block_ids = call.required(
        input,
        "block_ids",
        Role::Input,
        idt,
        &[ids.len()],
        Fill::Ints(ids),
    );
    let args = ZeroBlocks { cache, block_ids };
    let outcome = call.run(ZeroBlocks::NAMES, &|c, ctx| args.invoke(c, ctx));
    let (Some(cache), Some(block_ids)) = (cache, block_ids) else {
        return;
    };
    if call.any_invalid() {
        return;
    }
    let Some(ids) = memory::block_ids(&call, &outcome.before, block_ids) else {
        return;
    };
    if !memory::ids_in_range(&call, &[cache], &ids) {
        assert_ne!(
            outcome.status, 0,
            "accepted an id outside the blocks: {ids:?}"
        );
    } else if outcome.status == 0 {
        assert!(
            outcome.after == memory::zeroed(&call, &outcome.before, &[cache], &ids),
            "blocks {ids:?} not zeroed exactly"
        );
    }
});
