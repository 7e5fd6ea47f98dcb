//! Batched memmove and block zeroing through the exported C functions.

mod common;

use std::ffi::c_void;
use std::ptr;

use common::{Ctx, Rng, Tensor, assert_error};
use ssmk::dtype::DType;
use ssmk::ffi::context::ssmk_context;
use ssmk::ffi::memory::{ssmk_batch_memcpy, ssmk_zero_blocks, ssmk_zero_blocks_multi};
use ssmk::ffi::status::*;
use ssmk::runtime::{Isa, with_isa};
use ssmk::tensor::ssmk_tensor;

/// (dst offset, src offset, len) within one pool.
type Entry = (usize, usize, usize);

fn serial_memmove(pool: &mut [u8], entries: &[Entry]) {
    for &(d, s, n) in entries {
        pool.copy_within(s..s + n, d);
    }
}

fn run_batch(ctx: *const ssmk_context, pool: &mut [u8], entries: &[Entry]) -> i32 {
    let base = pool.as_mut_ptr();
    let dst: Vec<*mut c_void> = entries
        .iter()
        .map(|e| unsafe { base.add(e.0) }.cast())
        .collect();
    let src: Vec<*const c_void> = entries
        .iter()
        .map(|e| unsafe { base.add(e.1) }.cast_const().cast())
        .collect();
    let sizes: Vec<usize> = entries.iter().map(|e| e.2).collect();
    unsafe {
        ssmk_batch_memcpy(
            ctx,
            dst.as_ptr(),
            src.as_ptr(),
            sizes.as_ptr(),
            entries.len(),
        )
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

fn check_batch(entries: &[Entry], pool_len: usize, seed: u64) {
    let init = pattern(pool_len, seed);
    let mut want = init.clone();
    serial_memmove(&mut want, entries);
    for threads in [1, 2, 3] {
        let ctx = Ctx::new(threads);
        let mut pool = init.clone();
        assert_eq!(
            run_batch(ctx.0, &mut pool, entries),
            SSMK_OK,
            "{}",
            common::last_error()
        );
        assert!(pool == want, "threads={threads} entries={entries:?}");
    }
}

#[test]
fn disjoint_entries_large_and_small() {
    let mut rng = Rng::new(1);
    let pool_len = 8 << 20;
    let mut entries = Vec::new();
    // 1 MiB copies within disjoint halves, then 64 B ones: exercises splitting and grouping.
    for i in 0..3 {
        entries.push((i << 20, (4 << 20) + (i << 20) + 8, (1 << 20) - 16));
    }
    for i in 0..512 {
        entries.push(((3 << 20) + i * 128, (7 << 20) + rng.below(4096), 64));
    }
    check_batch(&entries, pool_len, 2);
}

#[test]
fn adversarial_overlaps_equal_serial_memmove() {
    let pool_len = 1 << 20;
    let cases: Vec<Vec<Entry>> = vec![
        // An entry overlapping itself, forwards and backwards, large enough to be split if allowed.
        vec![(1000, 0, 600_000)],
        vec![(0, 1000, 600_000)],
        // Chain: entry 1 reads what entry 0 wrote.
        vec![(0, 500_000, 300_000), (600_000, 100, 300_000)],
        // Entry 1 overwrites entry 0's source after it ran.
        vec![(300_000, 0, 200_000), (0, 700_000, 250_000)],
        // Same destination twice: the later one wins.
        vec![(0, 400_000, 200_000), (100, 700_000, 200_000)],
        // A swap through overlapping ranges.
        vec![
            (0, 100_000, 200_000),
            (100_000, 0, 200_000),
            (50_000, 150_000, 200_000),
        ],
    ];
    for (i, entries) in cases.iter().enumerate() {
        check_batch(entries, pool_len, 10 + i as u64);
    }
    let mut rng = Rng::new(7);
    for round in 0..40 {
        let n = 1 + rng.below(40);
        let entries: Vec<Entry> = (0..n)
            .map(|_| {
                let len = if rng.below(4) == 0 {
                    rng.below(200_000)
                } else {
                    rng.below(300)
                };
                (rng.below(pool_len - len), rng.below(pool_len - len), len)
            })
            .collect();
        check_batch(&entries, pool_len, 100 + round);
    }
}

#[test]
fn empty_and_null_rules() {
    let ctx = Ctx::new(2);
    assert_eq!(
        unsafe { ssmk_batch_memcpy(ctx.0, ptr::null(), ptr::null(), ptr::null(), 0) },
        SSMK_OK
    );
    let mut buf = [1u8; 16];
    let dst = [ptr::null_mut::<c_void>(), buf.as_mut_ptr().cast()];
    let src = [ptr::null::<c_void>(), buf[8..].as_ptr().cast()];
    let sizes = [0usize, 4];
    assert_eq!(
        unsafe { ssmk_batch_memcpy(ptr::null(), dst.as_ptr(), src.as_ptr(), sizes.as_ptr(), 2) },
        SSMK_OK
    );

    let before = buf;
    let sizes = [4usize, 4];
    let code = unsafe { ssmk_batch_memcpy(ctx.0, dst.as_ptr(), src.as_ptr(), sizes.as_ptr(), 2) };
    assert_error(code, SSMK_ERR_NULL_POINTER, &["dst[0]", "sizes[0] = 4"]);
    assert_eq!(buf, before);
    let code = unsafe { ssmk_batch_memcpy(ctx.0, ptr::null(), src.as_ptr(), sizes.as_ptr(), 2) };
    assert_error(code, SSMK_ERR_NULL_POINTER, &["dst is NULL", "2 entries"]);
    let wrap = [usize::MAX - 2];
    let far = [(usize::MAX - 8) as *mut c_void];
    let code =
        unsafe { ssmk_batch_memcpy(ctx.0, far.as_ptr(), src[1..].as_ptr(), wrap.as_ptr(), 1) };
    assert_error(code, SSMK_ERR_OVERFLOW, &["entry 0"]);
    // A later bad entry stops the call before the valid first entry runs.
    let mut a = [0u8; 8];
    let b = [9u8; 8];
    let dst = [a.as_mut_ptr().cast::<c_void>(), ptr::null_mut()];
    let src = [b.as_ptr().cast::<c_void>(), b.as_ptr().cast()];
    let sizes = [8usize, 1];
    let code = unsafe { ssmk_batch_memcpy(ctx.0, dst.as_ptr(), src.as_ptr(), sizes.as_ptr(), 2) };
    assert_error(code, SSMK_ERR_NULL_POINTER, &["dst[1]"]);
    assert_eq!(a, [0u8; 8]);
}

fn cache(shape: &[usize], strides: Option<&[usize]>, span: usize, seed: u64) -> Tensor {
    let t = Tensor::with_layout(DType::BF16, shape, strides, span);
    let p = pattern(t.storage.len() * 8, seed);
    let bytes = unsafe { std::slice::from_raw_parts_mut(t.base(), t.storage.len() * 8) };
    bytes.copy_from_slice(&p);
    // Avoid zero bytes in the pattern so "zeroed" is unambiguous.
    bytes.iter_mut().for_each(|b| *b |= 1);
    t
}

/// Expected bytes: the cache with `cache[id]` zeroed element by element.
fn expect_zeroed(t: &Tensor, ids: &[i64]) -> Vec<u8> {
    let mut want = t.bytes();
    let strides = t.elem_strides();
    for idx in t.indices() {
        if ids.contains(&(idx[0] as i64)) {
            let off: usize = idx.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>() * 2;
            want[off] = 0;
            want[off + 1] = 0;
        }
    }
    want
}

#[test]
fn every_isa_zero_blocks_contiguous_strided_and_duplicates() {
    // [blocks, tokens, heads, dim] contiguous; the same logical cache with padded rows; and a
    // channel-major view whose innermost stride is not 1.
    let layouts: Vec<(Vec<usize>, Option<Vec<usize>>, usize)> = vec![
        (vec![8, 16, 2, 64], None, 8 * 16 * 2 * 64),
        (
            vec![8, 16, 2, 64],
            Some(vec![16 * 160, 160, 70, 1]),
            8 * 16 * 160,
        ),
        (vec![6, 4, 5], Some(vec![20, 1, 4]), 120),
        // Blocks large enough to be split over threads (smaller in the small-shape mode).
        (
            vec![5, common::sized(300_000, 20_000)],
            None,
            common::sized(1_500_000, 100_000),
        ),
    ];
    for (shape, strides, span) in &layouts {
        for (ids, dtype) in [
            (vec![3i64, 0, 3, 2], DType::I64),
            (vec![1], DType::I32),
            (vec![], DType::I32),
        ] {
            for (isa, threads) in Isa::under_test().into_iter().flat_map(|i| [(i, 1), (i, 2)]) {
                let ctx = Ctx::new(threads);
                let t = cache(shape, strides.as_deref(), *span, 5);
                let want = expect_zeroed(&t, &ids);
                let id_t = Tensor::ints(dtype, &ids);
                let mut d = t.desc();
                let code = with_isa(isa, || unsafe {
                    ssmk_zero_blocks(ctx.0, &mut d, &id_t.desc())
                });
                assert_eq!(code, SSMK_OK, "{}", common::last_error());
                assert!(
                    t.bytes() == want,
                    "{isa:?} shape {shape:?} strides {strides:?} ids {ids:?}"
                );
            }
        }
    }
}

#[test]
fn zero_blocks_rejects_bad_input_without_writing() {
    let ctx = Ctx::new(2);
    let t = cache(&[4, 32], None, 128, 9);
    let before = t.bytes();
    let mut d = t.desc();
    let call =
        |d: &mut ssmk_tensor, ids: &Tensor| unsafe { ssmk_zero_blocks(ctx.0, d, &ids.desc()) };
    assert_error(
        call(&mut d, &Tensor::ints(DType::I64, &[0, 4])),
        SSMK_ERR_OUT_OF_BOUNDS,
        &["block_ids[1] = 4", "< 4"],
    );
    assert_error(
        call(&mut d, &Tensor::ints(DType::I32, &[1, -1])),
        SSMK_ERR_OUT_OF_BOUNDS,
        &["block_ids[1] = -1"],
    );
    assert_error(
        call(&mut d, &Tensor::ints(DType::U8, &[1])),
        SSMK_ERR_UNSUPPORTED_DTYPE,
        &["block_ids.dtype = uint8"],
    );
    let ids2d = {
        let mut t = Tensor::ints(DType::I32, &[0, 1]);
        t.shape = vec![1, 2];
        t
    };
    assert_error(
        call(&mut d, &ids2d),
        SSMK_ERR_INVALID_ARGUMENT,
        &["block_ids.ndim = 2"],
    );
    let code = unsafe {
        ssmk_zero_blocks(
            ctx.0,
            ptr::null_mut(),
            &Tensor::ints(DType::I32, &[0]).desc(),
        )
    };
    assert_error(code, SSMK_ERR_NULL_POINTER, &["cache is NULL"]);
    let code = unsafe { ssmk_zero_blocks(ctx.0, &mut d, ptr::null()) };
    assert_error(code, SSMK_ERR_NULL_POINTER, &["block_ids is NULL"]);
    let mut bad = t.desc();
    bad.device.device_type = 2;
    assert_error(
        call(&mut bad, &Tensor::ints(DType::I32, &[0])),
        SSMK_ERR_UNSUPPORTED_DEVICE,
        &["cache.device"],
    );
    let overlapping_strides = [0i64, 1];
    let mut bad = t.desc();
    bad.strides = overlapping_strides.as_ptr();
    assert_error(
        call(&mut bad, &Tensor::ints(DType::I32, &[0])),
        SSMK_ERR_ALIASING,
        &["cache"],
    );
    assert!(t.bytes() == before);
}

#[test]
fn zero_blocks_multi_checks_every_cache_first() {
    let ctx = Ctx::new(2);
    let k = cache(&[8, 64], None, 512, 1);
    let v = cache(&[8, 64], None, 512, 2);
    let small = cache(&[3, 64], None, 192, 3);
    let (kb, vb, sb) = (k.bytes(), v.bytes(), small.bytes());
    let ids = Tensor::ints(DType::I64, &[1, 5]);
    let mut descs = [k.desc(), v.desc(), small.desc()];
    let ptrs: Vec<*mut ssmk_tensor> = descs.iter_mut().map(|d| d as *mut _).collect();
    let code = unsafe { ssmk_zero_blocks_multi(ctx.0, ptrs.as_ptr(), 3, &ids.desc()) };
    assert_error(
        code,
        SSMK_ERR_OUT_OF_BOUNDS,
        &["caches[2]", "block_ids[1] = 5", "< 3"],
    );
    assert!(
        k.bytes() == kb && v.bytes() == vb && small.bytes() == sb,
        "nothing zeroed on error"
    );

    let null_entry = [ptrs[0], ptr::null_mut()];
    let code = unsafe { ssmk_zero_blocks_multi(ctx.0, null_entry.as_ptr(), 2, &ids.desc()) };
    assert_error(code, SSMK_ERR_NULL_POINTER, &["caches[1] is NULL"]);

    // The same cache twice (two descriptors of one memory) plus another: zeroed once, correctly.
    let want_k = expect_zeroed(&k, &[1, 5]);
    let want_v = expect_zeroed(&v, &[1, 5]);
    let mut again = k.desc();
    let ptrs = [ptrs[0], ptrs[1], &mut again as *mut _];
    let code = unsafe { ssmk_zero_blocks_multi(ctx.0, ptrs.as_ptr(), 3, &ids.desc()) };
    assert_eq!(code, SSMK_OK, "{}", common::last_error());
    assert!(k.bytes() == want_k && v.bytes() == want_v);
    assert_eq!(
        unsafe { ssmk_zero_blocks_multi(ctx.0, ptr::null(), 0, &ids.desc()) },
        SSMK_OK
    );
}

#[test]
fn zero_blocks_multi_partially_overlapping_views() {
    // K and V as interleaved halves of one [blocks, 2, 64] buffer, plus a view of the whole: hulls
    // overlap, so the kernel must fall back to one thread, and the result is still exact.
    let kv = cache(&[6, 2, 64], None, 768, 4);
    let want = expect_zeroed(&kv, &[0, 4]);
    let kview = {
        let mut t = kv.desc();
        t.ndim = 2;
        t
    };
    let shape_kv = [6i64, 64];
    let strides_kv = [128i64, 1];
    let mut k = kview;
    k.shape = shape_kv.as_ptr();
    k.strides = strides_kv.as_ptr();
    let mut v = k;
    v.byte_offset = 128;
    let mut whole = kv.desc();
    let ptrs = [
        &mut k as *mut ssmk_tensor,
        &mut v as *mut _,
        &mut whole as *mut _,
    ];
    let ctx = Ctx::new(2);
    let ids = Tensor::ints(DType::I32, &[4, 0]);
    let code = unsafe { ssmk_zero_blocks_multi(ctx.0, ptrs.as_ptr(), 3, &ids.desc()) };
    assert_eq!(code, SSMK_OK, "{}", common::last_error());
    assert!(kv.bytes() == want);
}

#[test]
fn one_context_shared_by_many_host_threads() {
    let ctx = Ctx::new(2);
    let ctx_ptr = ctx.0 as usize;
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            scope.spawn(move || {
                let ctx = ctx_ptr as *const ssmk_context;
                for round in 0..20 {
                    let pool_len = 4 << 20;
                    let init = pattern(pool_len, t * 100 + round);
                    let entries: Vec<Entry> = (0..8)
                        .map(|i| (i << 19, (i << 19) + 4096, 3 << 17))
                        .collect();
                    let mut want = init.clone();
                    serial_memmove(&mut want, &entries);
                    let mut pool = init;
                    assert_eq!(run_batch(ctx, &mut pool, &entries), SSMK_OK);
                    assert!(pool == want);
                }
            });
        }
    });
}
