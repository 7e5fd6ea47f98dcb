//! Exports for cache maintenance: batched memmove and block zeroing (ABI.md §4.5–4.6).

use std::ffi::c_void;

use super::context::{resolve, ssmk_context};
use super::guard::{guard, slice_arg};
use crate::error::Result;
use crate::kernels::memory::{self, Copy, Region};
use crate::tensor::{View, ssmk_tensor};
use crate::{bail, ensure};

/// Copies `n` byte ranges: the same result as `for i in 0..n: memmove(dst[i], src[i], sizes[i])`
/// run in order, including when entries overlap each other or themselves.
///
/// Entries run in parallel on the context's threads only when no entry's destination overlaps
/// another entry's source or destination; otherwise they run in order on one thread. Every
/// pointer and size is checked before the first byte moves.
///
/// @param ctx     context (threads), or NULL for the process default.
/// @param dst     `n` destination pointers; may be NULL only when `n == 0`.
/// @param src     `n` source pointers; may be NULL only when `n == 0`.
/// @param sizes   `n` sizes in bytes; may be NULL only when `n == 0`.
/// @param n       number of entries.
/// `dst[i]` / `src[i]` may be NULL only when `sizes[i] == 0`. The arrays are only read during the
/// call. Thread-safe: concurrent calls must not write memory another call reads or writes.
/// @retval SSMK_OK                   all entries copied.
/// @retval SSMK_ERR_NULL_POINTER     an array is NULL with `n > 0`, or a pointer is NULL with a size > 0.
/// @retval SSMK_ERR_INVALID_ARGUMENT an array is misaligned for its element type.
/// @retval SSMK_ERR_OVERFLOW         a range `[p, p + size)` wraps the address space.
/// @retval SSMK_ERR_PANIC            internal error; nothing was copied.
///
/// # Safety
/// Each non-empty `[src[i], src[i]+sizes[i])` must be readable and `[dst[i], dst[i]+sizes[i])`
/// writable; the arrays must hold `n` entries.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ssmk_batch_memcpy(
    ctx: *const ssmk_context,
    dst: *const *mut c_void,
    src: *const *const c_void,
    sizes: *const usize,
    n: usize,
) -> i32 {
    guard(|| {
        let ctx = unsafe { resolve(ctx) };
        let dst = slice_arg!(dst, n, "dst");
        let src = slice_arg!(src, n, "src");
        let sizes = slice_arg!(sizes, n, "sizes");
        let mut copies = Vec::with_capacity(n);
        for i in 0..n {
            let (d, s, len) = (dst[i] as usize, src[i] as usize, sizes[i]);
            if len == 0 {
                continue;
            }
            ensure!(
                d != 0,
                NullPointer,
                "dst[{i}] is NULL with sizes[{i}] = {len}, expected a pointer"
            );
            ensure!(
                s != 0,
                NullPointer,
                "src[{i}] is NULL with sizes[{i}] = {len}, expected a pointer"
            );
            let limit = isize::MAX as usize;
            ensure!(
                d.checked_add(len).is_some_and(|e| e <= limit)
                    && s.checked_add(len).is_some_and(|e| e <= limit),
                Overflow,
                "entry {i}: dst = {d:#x} / src = {s:#x} + sizes[{i}] = {len} wraps the address space"
            );
            copies.push(Copy {
                dst: d,
                src: s,
                len,
            });
        }
        // SAFETY: every range is non-empty, non-NULL, non-wrapping, and the caller vouches for it.
        unsafe { memory::batch_copy(ctx, &copies) };
        Ok(())
    })
}

/// The region of `cache[id]` for each id, after checking the ids.
fn block_regions(cache: &View, ids: &[i64]) -> Result<Vec<Region>> {
    ensure!(
        cache.ndim >= 1,
        InvalidArgument,
        "{}.ndim = 0, expected >= 1 (dim 0 = blocks)",
        cache.name
    );
    cache.expect_no_self_overlap()?;
    let blocks = cache.shape[0];
    for (i, &id) in ids.iter().enumerate() {
        if id < 0 || id as u64 >= blocks as u64 {
            bail!(
                OutOfBounds,
                "block_ids[{i}] = {id}, expected 0 <= id < {blocks} ({}.shape[0])",
                cache.name
            );
        }
    }
    let size = cache.dtype.size();
    // Zeroing order is free, so walk a block's dimensions largest stride first and fold the
    // contiguous innermost ones into one run.
    let mut dims: Vec<(usize, usize)> = (1..cache.ndim)
        .map(|d| (cache.shape[d], cache.strides[d] * size))
        .filter(|&(n, _)| n != 1)
        .collect();
    if dims.iter().any(|&(n, _)| n == 0) || cache.is_empty() {
        return Ok(Vec::new());
    }
    dims.sort_by_key(|d| std::cmp::Reverse(d.1));
    let mut run_bytes = size;
    while let Some(&(n, stride)) = dims.last() {
        if stride != run_bytes {
            break;
        }
        run_bytes *= n;
        dims.pop();
    }
    let block_stride = cache.strides[0] * size;
    Ok(ids
        .iter()
        .map(|&id| Region {
            base: cache.lo + id as usize * block_stride,
            run_bytes,
            outer: dims.clone(),
        })
        .collect())
}

/// The block ids, as given (duplicates included).
fn read_block_ids(block_ids: *const ssmk_tensor) -> Result<Vec<i64>> {
    let ids = unsafe { View::required("block_ids", block_ids) }?;
    ids.expect_ndim(1)?;
    ids.read_indices(ids.shape[0], "number of ids")
}

/// Sets every byte of `cache[id]` (the whole, possibly strided, sub-tensor) to zero for each id.
///
/// Ids are checked first: any id outside `[0, cache.shape[0])` fails before anything is zeroed.
/// Duplicate ids are fine. Blocks are zeroed in parallel on the context's threads, with streaming
/// stores for large contiguous runs.
///
/// @param ctx       context, or NULL for the process default.
/// @param cache     any dtype, ndim >= 1, dim 0 = blocks; written. Must not overlap itself.
/// @param block_ids `[N]` int32 or int64 block ids; read only. `N == 0` does nothing.
/// @retval SSMK_OK                      the blocks are zero.
/// @retval SSMK_ERR_NULL_POINTER        `cache` or `block_ids` is NULL, or a non-empty tensor has NULL data.
/// @retval SSMK_ERR_INVALID_ARGUMENT    bad ndim, shape, stride or alignment.
/// @retval SSMK_ERR_UNSUPPORTED_DTYPE   `block_ids` is not int32/int64, or an unknown dtype.
/// @retval SSMK_ERR_OUT_OF_BOUNDS       an id is outside `[0, cache.shape[0])`.
/// @retval SSMK_ERR_OVERFLOW            the descriptor's extent overflows.
/// @retval SSMK_ERR_ALIASING            `cache`'s strides make distinct elements share memory.
/// @retval SSMK_ERR_UNSUPPORTED_DEVICE  not CPU memory.
///
/// # Safety
/// The descriptors must be valid and describe memory the caller owns for the call's duration.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ssmk_zero_blocks(
    ctx: *const ssmk_context,
    cache: *mut ssmk_tensor,
    block_ids: *const ssmk_tensor,
) -> i32 {
    guard(|| {
        let ctx = unsafe { resolve(ctx) };
        let cache = unsafe { View::required("cache", cache) }?;
        let ids = read_block_ids(block_ids)?;
        let mut regions = block_regions(&cache, &ids)?;
        regions.sort_by_key(|r| r.base);
        regions.dedup_by_key(|r| r.base);
        // SAFETY: every region lies inside the validated cache.
        unsafe { memory::zero_regions(ctx, &regions) };
        Ok(())
    })
}

/// `ssmk_zero_blocks` over several caches sharing one block table (e.g. every layer's K and V
/// cache), in one parallel pass. Every id is checked against every cache before anything is
/// zeroed; descriptors viewing the same memory are zeroed once.
///
/// @param ctx       context, or NULL for the process default.
/// @param caches    `n_caches` non-NULL cache descriptors; the array may be NULL only when `n_caches == 0`.
/// @param n_caches  number of caches.
/// @param block_ids `[N]` int32 or int64 block ids.
/// @retval SSMK_OK and the error codes of ssmk_zero_blocks; messages name `caches[i]`.
///
/// # Safety
/// As for `ssmk_zero_blocks`, for every cache.
#[must_use]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ssmk_zero_blocks_multi(
    ctx: *const ssmk_context,
    caches: *const *mut ssmk_tensor,
    n_caches: usize,
    block_ids: *const ssmk_tensor,
) -> i32 {
    guard(|| {
        let ctx = unsafe { resolve(ctx) };
        let caches = slice_arg!(caches, n_caches, "caches");
        let ids = read_block_ids(block_ids)?;
        let mut regions = Vec::new();
        for (i, &c) in caches.iter().enumerate() {
            ensure!(
                !c.is_null(),
                NullPointer,
                "caches[{i}] is NULL, expected a tensor descriptor"
            );
            let cache = unsafe { View::required("cache", c) }.map_err(|mut e| {
                e.message = format!("caches[{i}]: {}", e.message);
                e
            })?;
            regions.extend(block_regions(&cache, &ids).map_err(|mut e| {
                e.message = format!("caches[{i}]: {}", e.message);
                e
            })?);
        }
        regions
            .sort_by(|a, b| (a.base, a.run_bytes, &a.outer).cmp(&(b.base, b.run_bytes, &b.outer)));
        regions
            .dedup_by(|a, b| a.base == b.base && a.run_bytes == b.run_bytes && a.outer == b.outer);
        // SAFETY: every region lies inside a validated cache.
        unsafe { memory::zero_regions(ctx, &regions) };
        Ok(())
    })
}
