//! `ssmk_zero_blocks_multi`: several caches (any dtype, rank and strides, the same memory
//! twice, NULL entries, a NULL array) sharing hostile block ids; an accepted call zeroes exactly
//! the elements of the named blocks of every cache.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ssmk::dtype::DType;
use ssmk::tensor::ssmk_tensor;
use ssmk_fuzz::call::{Call, Cmp, Fill, INDEX, Role};
use ssmk_fuzz::exports::ZeroBlocksMulti;
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
    let blocks = input.range(0, 6);
    let ids: Vec<i64> = (0..input.range(0, 8))
        .map(|_| {
            if input.chance(16) {
                input.hostile_i64()
            } else {
                input.below(blocks.max(1)) as i64
            }
        })
        .collect();
    let mut caches = Vec::new();
    for _ in 0..input.range(0, 4) {
        let rank = input.range(1, 4);
        let shape: Vec<usize> = (0..rank)
            .map(|d| if d == 0 { blocks } else { input.range(0, 5) })
            .collect();
        let dtype = input.pick(&DTYPES);
        caches.push(call.tensor(
            input,
            "cache",
            Role::Output(Cmp::Exact),
            dtype,
            &shape,
            Fill::Floats(-9.0, 9.0),
        ));
    }
    let idt = input.pick(&INDEX);
    let block_ids = call.required(
        input,
        "block_ids",
        Role::Input,
        idt,
        &[ids.len()],
        Fill::Ints(ids),
    );
    // The array: each cache once, sometimes one twice or a NULL entry; NULL itself in a
    // hostile call.
    let mut entries: Vec<*mut ssmk_tensor> = caches.iter().map(|&c| call.desc(Some(c))).collect();
    if !caches.is_empty() && input.chance(48) {
        entries.push(call.desc(Some(caches[input.below(caches.len())])));
    }
    let null_entry = call.hostile && input.chance(24);
    if null_entry {
        entries.insert(input.below(entries.len() + 1), std::ptr::null_mut());
    }
    let null_array = call.hostile && !entries.is_empty() && input.chance(16);
    let args = ZeroBlocksMulti {
        caches: if null_array {
            std::ptr::null()
        } else {
            entries.as_ptr()
        },
        n_caches: entries.len(),
        block_ids,
    };
    let outcome = call.run(ZeroBlocksMulti::NAMES, &|c, ctx| args.invoke(c, ctx));
    let Some(block_ids) = block_ids else { return };
    if call.any_invalid() {
        return;
    }
    if null_entry || null_array {
        assert_ne!(outcome.status, 0, "accepted a NULL cache entry or array");
        return;
    }
    let Some(ids) = memory::block_ids(&call, &outcome.before, block_ids) else {
        return;
    };
    if !memory::ids_in_range(&call, &caches, &ids) {
        assert_ne!(
            outcome.status, 0,
            "accepted an id outside some cache's blocks: {ids:?}"
        );
    } else if outcome.status == 0 {
        assert!(
            outcome.after == memory::zeroed(&call, &outcome.before, &caches, &ids),
            "blocks {ids:?} not zeroed exactly in every cache"
        );
    }
});
