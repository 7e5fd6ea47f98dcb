//! Batched memmove and block zeroing for KV/state caches (ABI.md §4.5–4.6).
//!
//! Both split work into pieces of at most `PIECE_BYTES` and hand groups of pieces to the context's
//! threads. Copies run in parallel only when no entry's destination overlaps another entry's
//! source or destination; otherwise they run in order, exactly like a `memmove` loop.

#[cfg(target_arch = "aarch64")]
mod aarch64;
mod reference;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::runtime::{Context, Isa};

/// Largest piece one task copies or zeroes: big entries are split so both cores share them.
const PIECE_BYTES: usize = 256 << 10;
/// Below this much work per task, handing it to another thread costs more than it saves.
const MIN_BYTES_PER_TASK: usize = 64 << 10;
/// Calls moving less than this run on the caller's thread: waking the pool costs microseconds.
const MIN_PARALLEL_BYTES: usize = 2 << 20;

/// One `memmove(dst, src, len)`. Addresses are plain integers: validated by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy {
    pub dst: usize,
    pub src: usize,
    pub len: usize,
}

/// Zeroes `len` bytes at `dst`; the variant for each ISA must give the same bytes.
pub type ZeroFn = unsafe fn(dst: *mut u8, len: usize);

/// The zeroing routine for `isa` (the best one at or below it).
pub fn zero_fn(isa: Isa) -> ZeroFn {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Bf16 => x86::zero_stream_avx512,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::zero_stream_avx2,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => aarch64::zero_stream_neon,
        _ => reference::zero,
    }
}

/// Runs shorter than this gain nothing from streaming; plain stores keep them cache-resident.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const STREAM_MIN: usize = 4096;

/// Zeroes `[dst, dst+len)`: plain stores up to the first `ALIGN` boundary and for the tail, and
/// `store(ptr)` for each aligned `ALIGN`-byte chunk between. The ISAs' `store` is non-temporal:
/// cache blocks being cleared are not read back soon, so streaming stores skip the
/// read-for-ownership and leave the caches to the running model.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
unsafe fn zero_streaming<const ALIGN: usize>(dst: *mut u8, len: usize, store: impl Fn(*mut u8)) {
    if len < STREAM_MIN {
        return unsafe { std::ptr::write_bytes(dst, 0, len) };
    }
    let head = dst.align_offset(ALIGN).min(len);
    unsafe { std::ptr::write_bytes(dst, 0, head) };
    let body = (len - head) / ALIGN * ALIGN;
    let mut p = unsafe { dst.add(head) };
    let end = unsafe { p.add(body) };
    while p < end {
        store(p);
        p = unsafe { p.add(ALIGN) };
    }
    unsafe { std::ptr::write_bytes(end, 0, len - head - body) };
}

/// True when some entry's destination overlaps a *different* entry's source or destination, so
/// the entries must run in order. Empty entries overlap nothing. O(n log n).
pub fn entries_interfere(copies: &[Copy]) -> bool {
    let mut dsts: Vec<(usize, usize, usize)> = copies
        .iter()
        .enumerate()
        .filter(|(_, c)| c.len > 0)
        .map(|(i, c)| (c.dst, c.dst + c.len, i))
        .collect();
    dsts.sort_unstable();
    if dsts.windows(2).any(|w| w[1].0 < w[0].1) {
        return true;
    }
    // Destinations are now disjoint and sorted, so their ends are sorted too: the destinations a
    // source range meets form one run starting at the first end past the source's start.
    copies
        .iter()
        .enumerate()
        .filter(|(_, c)| c.len > 0)
        .any(|(i, c)| {
            let (lo, hi) = (c.src, c.src + c.len);
            let first = dsts.partition_point(|d| d.1 <= lo);
            dsts[first..]
                .iter()
                .take_while(|d| d.0 < hi)
                .any(|d| d.2 != i)
        })
}

/// A contiguous slice of work: copy `len` bytes (or zero them when `src` is `None`).
#[derive(Clone, Copy)]
struct Piece {
    dst: usize,
    src: Option<usize>,
    len: usize,
}

/// Groups consecutive pieces into tasks of roughly equal bytes, at least `MIN_BYTES_PER_TASK`
/// each and about four per thread, so a thread that finishes early takes another.
fn group(pieces: &[Piece], threads: usize) -> Vec<std::ops::Range<usize>> {
    let total: usize = pieces.iter().map(|p| p.len).sum();
    let target = (total / (threads * 4).max(1)).max(MIN_BYTES_PER_TASK);
    let mut tasks = Vec::new();
    let (mut start, mut acc) = (0, 0);
    for (i, p) in pieces.iter().enumerate() {
        acc += p.len;
        if acc >= target {
            tasks.push(start..i + 1);
            start = i + 1;
            acc = 0;
        }
    }
    if start < pieces.len() {
        tasks.push(start..pieces.len());
    }
    tasks
}

fn run_pieces(ctx: &Context, pieces: &[Piece], zero: ZeroFn) {
    let tasks = group(pieces, ctx.threads());
    ctx.for_each(tasks.len(), |t| {
        for p in &pieces[tasks[t].clone()] {
            // SAFETY: the callers below built pieces over validated, pairwise-disjoint memory.
            unsafe {
                match p.src {
                    Some(src) => std::ptr::copy(src as *const u8, p.dst as *mut u8, p.len),
                    None => zero(p.dst as *mut u8, p.len),
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        x86::store_fence();
    });
}

/// Same result as `for c in copies: memmove(c.dst, c.src, c.len)` in order.
///
/// # Safety
/// Every non-empty entry's `[src, src+len)` must be readable and `[dst, dst+len)` writable.
pub unsafe fn batch_copy(ctx: &Context, copies: &[Copy]) {
    let total: usize = copies.iter().map(|c| c.len).sum();
    if ctx.threads() <= 1 || total < MIN_PARALLEL_BYTES || entries_interfere(copies) {
        for c in copies.iter().filter(|c| c.len > 0) {
            // SAFETY: the caller's contract; ptr::copy is memmove, so self-overlap is fine.
            unsafe { std::ptr::copy(c.src as *const u8, c.dst as *mut u8, c.len) };
        }
        return;
    }
    let mut pieces = Vec::with_capacity(copies.len());
    for c in copies.iter().filter(|c| c.len > 0) {
        let self_overlap = c.src < c.dst + c.len && c.dst < c.src + c.len;
        let step = if self_overlap { c.len } else { PIECE_BYTES };
        let mut off = 0;
        while off < c.len {
            let len = step.min(c.len - off);
            pieces.push(Piece {
                dst: c.dst + off,
                src: Some(c.src + off),
                len,
            });
            off += len;
        }
    }
    run_pieces(ctx, &pieces, reference::zero);
}

/// A strided region to zero: `count` runs of `run_bytes` bytes, the run at multi-index `i` of
/// `outer` (sizes and byte strides, outermost first) starting at `base + sum(i_d * stride_d)`.
#[derive(Clone, Debug)]
pub struct Region {
    pub base: usize,
    pub run_bytes: usize,
    pub outer: Vec<(usize, usize)>,
}

impl Region {
    /// Start of every run, in address order of the multi-index.
    fn runs(&self) -> impl Iterator<Item = usize> + '_ {
        let count: usize = self.outer.iter().map(|o| o.0).product();
        (0..count).map(move |mut flat| {
            let mut addr = self.base;
            for &(n, stride) in self.outer.iter().rev() {
                addr += (flat % n) * stride;
                flat /= n;
            }
            addr
        })
    }

    /// Smallest byte range holding every run.
    pub fn hull(&self) -> (usize, usize) {
        let last: usize = self.outer.iter().map(|&(n, s)| (n - 1) * s).sum();
        (self.base, self.base + last + self.run_bytes)
    }
}

/// Zeroes every region. Regions whose hulls overlap are zeroed by one thread, in order.
///
/// # Safety
/// Every run of every region must be writable; `outer` counts must be non-zero.
pub unsafe fn zero_regions(ctx: &Context, regions: &[Region]) {
    let mut pieces = Vec::new();
    for r in regions.iter().filter(|r| r.run_bytes > 0) {
        for start in r.runs() {
            let mut off = 0;
            while off < r.run_bytes {
                let len = PIECE_BYTES.min(r.run_bytes - off);
                pieces.push(Piece {
                    dst: start + off,
                    src: None,
                    len,
                });
                off += len;
            }
        }
    }
    let mut hulls: Vec<(usize, usize)> = regions
        .iter()
        .filter(|r| r.run_bytes > 0)
        .map(Region::hull)
        .collect();
    hulls.sort_unstable();
    let disjoint = hulls.windows(2).all(|w| w[0].1 <= w[1].0);
    let serial = Context::new(1);
    run_pieces(
        if disjoint { ctx } else { &serial },
        &pieces,
        zero_fn(Isa::dispatch()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interference_detection() {
        let c = |dst, src, len| Copy { dst, src, len };
        assert!(!entries_interfere(&[c(0, 100, 10), c(10, 110, 10)]));
        assert!(
            !entries_interfere(&[c(0, 5, 10)]),
            "an entry may overlap itself"
        );
        assert!(
            entries_interfere(&[c(0, 100, 10), c(5, 200, 10)]),
            "dst/dst"
        );
        assert!(entries_interfere(&[c(0, 100, 10), c(50, 9, 2)]), "dst/src");
        assert!(
            entries_interfere(&[c(50, 9, 2), c(0, 100, 10)]),
            "src/dst, either order"
        );
        assert!(
            !entries_interfere(&[c(0, 100, 10), c(50, 10, 0)]),
            "empty entries are ignored"
        );
        assert!(
            !entries_interfere(&[c(0, 100, 10), c(10, 100, 10)]),
            "sources may be shared"
        );
    }

    #[test]
    fn region_runs_cover_strided_block() {
        let r = Region {
            base: 1000,
            run_bytes: 8,
            outer: vec![(2, 100), (3, 16)],
        };
        let runs: Vec<usize> = r.runs().collect();
        assert_eq!(runs, vec![1000, 1016, 1032, 1100, 1116, 1132]);
        assert_eq!(r.hull(), (1000, 1140));
    }
}
