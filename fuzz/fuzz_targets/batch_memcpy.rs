//! `ssmk_batch_memcpy`: entries overlapping each other and themselves, empty entries with any
//! pointer, NULL pointers with sizes, ranges wrapping the address space, NULL or misaligned
//! arrays; an accepted call leaves exactly what a serial `memmove` loop leaves.
#![no_main]

use std::ffi::c_void;

use libfuzzer_sys::fuzz_target;
use ssmk_fuzz::call::Call;
use ssmk_fuzz::exports::BatchMemcpy;
use ssmk_fuzz::input::Input;

/// An entry as decoded: offsets into the pool, or a hostile pointer.
#[derive(Clone, Copy)]
enum Ptr {
    Pool(usize),
    Null,
    /// Near the top of the address space: `[p, p + size)` wraps or leaves it.
    Top(usize),
    /// Garbage that an empty entry may carry.
    Garbage(usize),
}

fuzz_target!(|data: &[u8]| {
    let input = &mut Input::new(data);
    let mut call = Call::new(input);
    call.exclusive_outputs = false;
    let pool_len = input.range(1, 64) * 64;
    let pool = call.raw_region("pool", pool_len);
    let mut entries = Vec::new();
    let mut must_refuse = false;
    for _ in 0..input.range(0, 8) {
        let a = input.u32() as usize % pool_len;
        let b = input.u32() as usize % pool_len;
        let mut size = input.u32() as usize % (pool_len - a.max(b) + 1);
        let (mut dst, mut src) = (Ptr::Pool(a), Ptr::Pool(b));
        if call.hostile && input.chance(48) {
            let hostile = match input.below(4) {
                0 => Ptr::Null,
                1 => {
                    // Always past the top: a size that fits below it would be a real copy there.
                    let k = input.byte() as usize;
                    size = k + 1 + input.below(4);
                    Ptr::Top(k)
                }
                _ => {
                    size = 0;
                    Ptr::Garbage(input.u64() as usize)
                }
            };
            if input.chance(128) {
                dst = hostile
            } else {
                src = hostile
            }
            if size > 0 {
                must_refuse |= matches!(hostile, Ptr::Null | Ptr::Top(_));
            }
        }
        entries.push((dst, src, size));
    }
    call.layout();
    let base = call.raw(pool) as usize;
    let address = |p: Ptr| match p {
        Ptr::Pool(off) => base + off,
        Ptr::Null => 0,
        Ptr::Top(k) => isize::MAX as usize - k,
        Ptr::Garbage(v) => v,
    };
    let mut dst: Vec<*mut c_void> = entries
        .iter()
        .map(|e| address(e.0) as *mut c_void)
        .collect();
    let mut src: Vec<*const c_void> = entries
        .iter()
        .map(|e| address(e.1) as *const c_void)
        .collect();
    let mut sizes: Vec<usize> = entries.iter().map(|e| e.2).collect();
    let n = entries.len();
    // A hostile array: NULL, or one byte off its alignment (the entries copied unaligned).
    let mut unaligned = vec![0u8; 8 * n + 9];
    let array = if call.hostile && n > 0 {
        input.below(8)
    } else {
        7
    };
    let mut dst_p = dst.as_mut_ptr() as *const *mut c_void;
    let mut src_p = src.as_mut_ptr() as *const *const c_void;
    let mut sizes_p = sizes.as_mut_ptr() as *const usize;
    match array {
        0 => dst_p = std::ptr::null(),
        1 => src_p = std::ptr::null(),
        2 => sizes_p = std::ptr::null(),
        3 => {
            let p = unaligned.as_mut_ptr();
            let p = unsafe { p.add((p as usize).is_multiple_of(8) as usize) };
            unsafe { std::ptr::copy_nonoverlapping(sizes.as_ptr().cast::<u8>(), p, 8 * n) };
            sizes_p = p as *const usize;
        }
        _ => {}
    }
    must_refuse |= array < 4;
    let args = BatchMemcpy {
        dst: dst_p,
        src: src_p,
        sizes: sizes_p,
        n,
    };
    let outcome = call.run(BatchMemcpy::NAMES, &|_, ctx| args.invoke(ctx));
    if must_refuse {
        assert_ne!(
            outcome.status, 0,
            "accepted a NULL or wrapping entry or a bad array"
        );
        return;
    }
    assert_eq!(outcome.status, 0, "refused valid entries");
    let mut want = outcome.before.clone();
    let start = base - call.arena_base();
    for &(d, s, size) in &entries {
        if let (Ptr::Pool(d), Ptr::Pool(s)) = (d, s) {
            want.copy_within(start + s..start + s + size, start + d);
        }
    }
    assert!(outcome.after == want, "differs from a serial memmove loop");
});
