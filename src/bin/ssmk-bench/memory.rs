//! Cache maintenance: batched memmove (scattered KV-block copies) and block zeroing, each against a
//! libc loop over exactly the same entries, measured in the same run.

use std::ffi::c_void;

use ssmk::dtype::DType;
use ssmk::ffi::memory::{ssmk_batch_memcpy, ssmk_zero_blocks};

use crate::buffers::Buf;
use crate::harness::{Config, Ctx, Report, Row, Work, ok, time};

/// A zero-initialised, pre-faulted allocation (so timing never includes first-touch faults).
fn pool(bytes: usize) -> Vec<u8> {
    let mut v = vec![0u8; bytes];
    for i in (0..bytes).step_by(4096) {
        v[i] = 1;
    }
    v
}

/// Deterministic permutation of `0..n` (xorshift-driven Fisher–Yates).
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut s = seed | 1;
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p.swap(i, (s % (i as u64 + 1)) as usize);
    }
    p
}

fn bench_copies(cfg: &Config, report: &mut Report, count: usize, size: usize, pool_bytes: usize) {
    let src = pool(pool_bytes);
    let mut dst = pool(pool_bytes);
    let slots = pool_bytes / size;
    let (ps, pd) = (permutation(slots, 7), permutation(slots, 11));
    let dsts: Vec<*mut c_void> = (0..count)
        .map(|i| unsafe { dst.as_mut_ptr().add(pd[i] * size) }.cast())
        .collect();
    let srcs: Vec<*const c_void> = (0..count)
        .map(|i| unsafe { src.as_ptr().add(ps[i] * size) }.cast())
        .collect();
    let sizes = vec![size; count];
    let libc_loop = time(cfg, || {
        for i in 0..count {
            unsafe { libc::memmove(dsts[i], srcs[i], size) };
        }
    });
    let shape = format!(
        "{count} x {} in {} MiB pools",
        human(size),
        pool_bytes >> 20
    );
    let bytes = 2.0 * (count * size) as f64;
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let t = time(cfg, || {
            ok(unsafe {
                ssmk_batch_memcpy(ctx.0, dsts.as_ptr(), srcs.as_ptr(), sizes.as_ptr(), count)
            })
        });
        report.push(Row {
            op: "batch_memcpy".into(),
            shape: shape.clone(),
            dtype: "bytes".into(),
            threads,
            seconds: t,
            work: Work::Bytes(bytes),
            baseline: Some(("libc memmove loop".into(), libc_loop / t)),
            baseline_rate: Some(bytes / libc_loop / 1e9),
            vs_reference: None,
            note: format!(
                "{:.1} ns/entry (libc loop {:.1})",
                t / count as f64 * 1e9,
                libc_loop / count as f64 * 1e9
            ),
        });
    }
}

fn human(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

fn bench_zero(
    cfg: &Config,
    report: &mut Report,
    blocks: usize,
    block_bytes: usize,
    cache_bytes: usize,
) {
    let num_blocks = cache_bytes / block_bytes;
    // Successive calls zero different blocks, so each call meets cold memory as a runtime
    // freeing long-idle blocks does (rather than re-zeroing lines still in L3).
    let order = permutation(num_blocks, 5);
    let sets: Vec<Vec<i64>> = order
        .chunks_exact(blocks)
        .map(|c| c.iter().map(|&b| b as i64).collect())
        .collect();
    let next = std::cell::Cell::new(0usize);
    let take = || {
        let i = next.get();
        next.set((i + 1) % sets.len());
        &sets[i]
    };
    let cache = Buf::zeros(DType::BF16, &[num_blocks, block_bytes / 2]);
    let mut cache_desc = cache.desc();
    let id_buf = Buf::ints(&sets[0]);
    let mut id_desc = id_buf.desc();
    let base = cache.as_ptr();
    let memset_loop = time(cfg, || {
        for &id in take() {
            unsafe { libc::memset(base.add(id as usize * block_bytes).cast(), 0, block_bytes) };
        }
    });
    let shape = format!(
        "{blocks} x {} in {} MiB cache",
        human(block_bytes),
        cache_bytes >> 20
    );
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let t = time(cfg, || {
            id_desc.data = take().as_ptr().cast_mut().cast();
            ok(unsafe { ssmk_zero_blocks(ctx.0, &mut cache_desc, &id_desc) })
        });
        report.push(Row {
            op: "zero_blocks".into(),
            shape: shape.clone(),
            dtype: "bf16".into(),
            threads,
            seconds: t,
            work: Work::Bytes((blocks * block_bytes) as f64),
            baseline: Some(("libc memset loop".into(), memset_loop / t)),
            baseline_rate: Some((blocks * block_bytes) as f64 / memset_loop / 1e9),
            vs_reference: None,
            note: String::new(),
        });
    }
}

pub fn run(cfg: &Config, report: &mut Report) {
    let pool_bytes = cfg.pick(256 << 20, 32 << 20);
    bench_copies(cfg, report, cfg.pick(4096, 1024), 16 << 10, pool_bytes);
    bench_copies(cfg, report, cfg.pick(64, 16), 1 << 20, pool_bytes);
    bench_copies(cfg, report, 4096, 64, pool_bytes);
    bench_zero(
        cfg,
        report,
        cfg.pick(512, 128),
        64 << 10,
        cfg.pick(1 << 30, 64 << 20),
    );
}
