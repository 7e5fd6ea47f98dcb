//! Models of the cache-maintenance exports (ABI.md §4.5–4.6), exact to the byte: the harness's
//! generic checks cover refusals and stray writes, these say what an accepted call must leave.

use ssmk::dtype::DType;

use crate::call::{Call, Id, read_value};

/// The block ids as the call reads them from `bytes` (int32/int64, one dimension), else `None`.
pub fn block_ids(call: &Call, bytes: &[u8], ids: Id) -> Option<Vec<i64>> {
    let dtype = call.dtype(ids)?;
    if !call.is_valid(ids)
        || call.shape(ids).len() != 1
        || !matches!(dtype, DType::I32 | DType::I64)
    {
        return None;
    }
    Some(
        call.elems(ids)
            .iter()
            .map(|&o| unsafe { read_value(bytes.as_ptr().add(o), dtype) } as i64)
            .collect(),
    )
}

/// Whether every id addresses a block of every cache (valid caches of at least one dimension).
pub fn ids_in_range(call: &Call, caches: &[Id], ids: &[i64]) -> bool {
    caches.iter().all(|&c| {
        !call.is_valid(c)
            || call.shape(c).is_empty()
            || ids
                .iter()
                .all(|&id| id >= 0 && (id as u64) < call.shape(c)[0] as u64)
    })
}

/// `before` with every element of `cache[id]` zeroed, for each cache and id.
pub fn zeroed(call: &Call, before: &[u8], caches: &[Id], ids: &[i64]) -> Vec<u8> {
    let mut want = before.to_vec();
    for &c in caches {
        let shape = call.shape(c);
        let per_block: usize = shape[1..].iter().product();
        let size = call.elem_size(c);
        for &id in ids {
            let block = &call.elems(c)[id as usize * per_block..(id as usize + 1) * per_block];
            for &o in block {
                want[o..o + size].fill(0);
            }
        }
    }
    want
}
