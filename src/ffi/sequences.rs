//! The sequence arguments every recurrent kernel shares (ABI.md §4 "Common sequence arguments"):
//! `query_start_loc`/`cu_seqlens`, `cache_indices`/`state_indices`, `has_initial_state` and
//! `pad_slot_id`, checked once here so every kernel applies the same rules with the same messages.

use crate::error::Result;
use crate::tensor::View;
use crate::{bail, ensure};

/// A validated batch: sequence `b` owns tokens `starts[b]..starts[b+1]`, its state lives in
/// `slots[b]` (`None` = padded sequence: zero output, no state touched), and it continues from
/// that state iff `initial[b]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub starts: Vec<usize>,
    pub slots: Vec<Option<usize>>,
    pub initial: Vec<bool>,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn tokens(&self, b: usize) -> std::ops::Range<usize> {
        self.starts[b]..self.starts[b + 1]
    }
}

/// Sequence boundaries `[B+1]` over `total` tokens: `0 <= q[0] <= .. <= q[B] <= total`.
/// NULL → one sequence covering all tokens.
pub fn parse_starts(name: &str, starts: Option<&View>, total: usize) -> Result<Vec<usize>> {
    let Some(v) = starts else {
        return Ok(vec![0, total]);
    };
    v.expect_ndim(1)?;
    ensure!(
        v.shape[0] >= 1,
        InvalidArgument,
        "{name}.shape[0] = 0, expected B + 1 >= 1 entries"
    );
    let raw = v.read_indices(v.shape[0], "B + 1")?;
    let mut out = Vec::with_capacity(raw.len());
    for (i, &q) in raw.iter().enumerate() {
        ensure!(
            q >= 0 && q as u64 <= total as u64,
            OutOfBounds,
            "{name}[{i}] = {q}, expected 0 <= offset <= {total} (tokens)"
        );
        if let Some(&prev) = out.last() {
            ensure!(
                q as usize >= prev,
                InvalidArgument,
                "{name}[{i}] = {q} < {name}[{}] = {prev}, expected non-decreasing offsets",
                i - 1
            );
        }
        out.push(q as usize);
    }
    Ok(out)
}

/// Slot of each of `batch` sequences from `indices` (`[batch]`, NULL → sequence `b` uses slot `b`).
/// `pad_slot_id` marks padding; other slots must lie in `[0, num_slots)` and be distinct. With no
/// state pool (`num_slots == None`) only padding is recognised.
pub fn parse_slots(
    name: &str,
    indices: Option<&View>,
    batch: usize,
    pad_slot_id: i64,
    num_slots: Option<usize>,
) -> Result<Vec<Option<usize>>> {
    let raw: Vec<i64> = match indices {
        Some(v) => v.read_indices(batch, "number of sequences B")?,
        None => (0..batch as i64).collect(),
    };
    let mut slots = Vec::with_capacity(batch);
    for (b, &s) in raw.iter().enumerate() {
        if s == pad_slot_id {
            slots.push(None);
            continue;
        }
        // Named only on failure: formatting per sequence showed up in decode-sized calls.
        let what = || match indices {
            Some(_) => format!("{name}[{b}]"),
            None => format!("implicit slot of sequence {b} ({name} is NULL)"),
        };
        if let Some(n) = num_slots {
            ensure!(
                s >= 0 && (s as u64) < n as u64,
                OutOfBounds,
                "{} = {s}, expected 0 <= slot < {n} (state slots) or pad_slot_id = {pad_slot_id}",
                what()
            );
        } else {
            ensure!(
                s >= 0,
                OutOfBounds,
                "{} = {s}, expected a slot >= 0 or pad_slot_id = {pad_slot_id}",
                what()
            );
        }
        slots.push(Some(s as usize));
    }
    if num_slots.is_some() {
        check_distinct(name, &slots)?;
    }
    Ok(slots)
}

/// Two live sequences sharing a slot would race on its state.
pub fn check_distinct(name: &str, slots: &[Option<usize>]) -> Result<()> {
    let mut seen: Vec<(usize, usize)> = slots
        .iter()
        .enumerate()
        .filter_map(|(b, s)| s.map(|s| (s, b)))
        .collect();
    seen.sort_unstable();
    for w in seen.windows(2) {
        if w[0].0 == w[1].0 {
            bail!(
                InvalidArgument,
                "{name}[{}] = {name}[{}] = {}, expected distinct slots for non-padded sequences",
                w[0].1,
                w[1].1,
                w[0].0
            );
        }
    }
    Ok(())
}

/// `has_initial_state` `[batch]` (bool/uint8/int32/int64, non-zero = true); NULL → all false.
pub fn parse_initial(has_initial_state: Option<&View>, batch: usize) -> Result<Vec<bool>> {
    match has_initial_state {
        Some(v) => v.read_mask(batch, "number of sequences B"),
        None => Ok(vec![false; batch]),
    }
}

/// All three, for kernels whose batch is defined by `query_start_loc`.
pub fn parse_batch(
    names: [&str; 3],
    starts: Option<&View>,
    total_tokens: usize,
    indices: Option<&View>,
    has_initial_state: Option<&View>,
    pad_slot_id: i64,
    num_slots: Option<usize>,
) -> Result<Batch> {
    let starts = parse_starts(names[0], starts, total_tokens)?;
    let batch = starts.len() - 1;
    let slots = parse_slots(names[1], indices, batch, pad_slot_id, num_slots)?;
    let initial = parse_initial(has_initial_state, batch)?;
    Ok(Batch {
        starts,
        slots,
        initial,
    })
}
