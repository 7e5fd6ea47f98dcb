//! The sequence arguments every recurrent kernel shares (ABI.md §4 "Common sequence arguments"):
//! `query_start_loc`/`cu_seqlens`, `cache_indices`/`state_indices`, `has_initial_state` and
//! `pad_slot_id`, checked once here so every kernel applies the same rules with the same messages.

use crate::error::Result;
use crate::kernels::{Checkpoint, Sequence, StateWrite};
use crate::tensor::{View, ssmk_tensor};
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

/// Every sequence of a recurrent-kernel call (ABI.md §4.4, shared word for word by §4.9): its
/// tokens, the slot its initial state is read from and where its states go, from `cu_seqlens`,
/// `state_indices` (`[B]`, or `[B, Smax]` with `num_accepted_tokens`: speculative mode),
/// `has_initial_state` and `pad_slot_id`, over a state pool of `num_slots` slots (`None`: no pool).
#[allow(clippy::too_many_arguments)]
pub fn parse_sequences(
    tokens: usize,
    cu_seqlens: Option<&View>,
    state_indices: Option<&View>,
    has_initial_state: Option<&View>,
    num_accepted: Option<&View>,
    pad_slot_id: i64,
    num_slots: Option<usize>,
) -> Result<Vec<Sequence>> {
    let starts = parse_starts("cu_seqlens", cu_seqlens, tokens)?;
    let batch = starts.len() - 1;
    let initial = parse_initial(has_initial_state, batch)?;
    if num_slots.is_none()
        && let Some(b) = initial.iter().position(|&x| x)
    {
        bail!(
            InvalidArgument,
            "has_initial_state[{b}] is true but state is NULL, expected a state pool to read"
        );
    }
    let lens: Vec<usize> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    Ok(match num_accepted {
        None => {
            if let Some(idx) = state_indices {
                ensure!(
                    idx.ndim == 1,
                    InvalidArgument,
                    "state_indices.ndim = {}, expected 1 ([B]) without num_accepted_tokens",
                    idx.ndim
                );
            }
            let slots = parse_slots(
                "state_indices",
                state_indices,
                batch,
                pad_slot_id,
                num_slots,
            )?;
            (0..batch)
                .map(|b| match slots[b] {
                    None => Sequence {
                        start: starts[b],
                        len: lens[b],
                        padded: true,
                        read: None,
                        write: StateWrite::Nothing,
                        checkpoints: Vec::new(),
                    },
                    Some(slot) => Sequence {
                        start: starts[b],
                        len: lens[b],
                        padded: false,
                        read: initial[b].then_some(slot),
                        write: if num_slots.is_some() {
                            StateWrite::Final(slot)
                        } else {
                            StateWrite::Nothing
                        },
                        checkpoints: Vec::new(),
                    },
                })
                .collect()
        }
        Some(accepted) => {
            let accepted = accepted.read_indices(batch, "number of sequences B")?;
            let Some(idx) = state_indices else {
                bail!(
                    NullPointer,
                    "state_indices is NULL, expected a [B, Smax] slot table with num_accepted_tokens"
                );
            };
            idx.expect_ndim(2)?;
            idx.expect_dim(0, batch, "number of sequences B")?;
            speculative_sequences(idx, &starts, &accepted, &initial, pad_slot_id, num_slots)?
        }
    })
}

/// Speculative mode: reads `[B, Smax]` and checks every slot the call will read or write.
fn speculative_sequences(
    idx: &View,
    starts: &[usize],
    accepted: &[i64],
    initial: &[bool],
    pad_slot_id: i64,
    num_slots: Option<usize>,
) -> Result<Vec<Sequence>> {
    let batch = accepted.len();
    let smax = idx.shape[1];
    ensure!(
        smax >= 1 || batch == 0,
        InvalidArgument,
        "state_indices.shape[1] = 0, expected Smax >= 1 slots per sequence"
    );
    let table = idx.read_indices_2d()?;
    let mut sequences = Vec::with_capacity(batch);
    // (slot, sequence, token) of every state the call writes.
    let mut writes: Vec<(usize, usize, usize)> = Vec::new();
    for b in 0..batch {
        let (start, len) = (starts[b], starts[b + 1] - starts[b]);
        let row = &table[b * smax..(b + 1) * smax];
        let n = accepted[b];
        ensure!(
            (0..=smax as i64).contains(&n),
            InvalidArgument,
            "num_accepted_tokens[{b}] = {n}, expected 0 <= n <= Smax = state_indices.shape[1] = {smax}"
        );
        ensure!(
            len <= smax,
            InvalidArgument,
            "sequence {b} has {len} tokens (cu_seqlens[{}] - cu_seqlens[{b}]), expected <= Smax = state_indices.shape[1] = {smax}",
            b + 1
        );
        if row[0] == pad_slot_id {
            sequences.push(Sequence {
                start,
                len,
                padded: true,
                read: None,
                write: StateWrite::Nothing,
                checkpoints: Vec::new(),
            });
            continue;
        }
        let Some(num_slots) = num_slots else {
            sequences.push(Sequence {
                start,
                len,
                padded: false,
                read: None,
                write: StateWrite::Nothing,
                checkpoints: Vec::new(),
            });
            continue;
        };
        // The role is formatted only on failure (this runs per token of every sequence).
        let check = |col: usize, role: &dyn Fn() -> String| -> Result<usize> {
            let s = row[col];
            ensure!(
                s >= 0 && (s as u64) < num_slots as u64,
                OutOfBounds,
                "state_indices[{b}][{col}] = {s} ({}), expected 0 <= slot < {num_slots} (state slots)",
                role()
            );
            Ok(s as usize)
        };
        let read = if initial[b] {
            let col = (n - 1).max(0) as usize;
            Some(check(col, &|| {
                format!("read slot for num_accepted_tokens[{b}] = {n}")
            })?)
        } else {
            None
        };
        let mut slots = Vec::with_capacity(len);
        for t in 0..len {
            // A pad entry among the slots to write: that token's state is not stored.
            if row[t] == pad_slot_id {
                slots.push(None);
                continue;
            }
            let s = check(t, &|| format!("written after token {t}"))?;
            writes.push((s, b, t));
            slots.push(Some(s));
        }
        sequences.push(Sequence {
            start,
            len,
            padded: false,
            read,
            write: StateWrite::PerToken(slots),
            checkpoints: Vec::new(),
        });
    }
    writes.sort_unstable();
    for w in writes.windows(2) {
        if w[0].0 == w[1].0 {
            bail!(
                InvalidArgument,
                "state_indices[{}][{}] = state_indices[{}][{}] = {}, expected distinct slots for the states written",
                w[0].1,
                w[0].2,
                w[1].1,
                w[1].2,
                w[0].0
            );
        }
    }
    for (b, seq) in sequences.iter().enumerate() {
        if let Some(r) = seq.read {
            let first = writes.partition_point(|w| w.0 < r);
            if let Some(&(s, other, t)) = writes.get(first)
                && s == r
                && other != b
            {
                bail!(
                    InvalidArgument,
                    "sequence {b} reads slot {r}, which sequence {other} writes (state_indices[{other}][{t}]), expected distinct slots"
                );
            }
        }
    }
    Ok(sequences)
}

/// The two checkpoint tables of a prefill call (ABI.md §4.10), `[B, C]` each, or NULL.
#[derive(Clone, Copy, Default)]
pub struct CheckpointTables<'a> {
    pub offsets: Option<&'a View>,
    pub slots: Option<&'a View>,
}

/// Sequence `b`'s checkpoints (sorted by offset) from `tables`, for a call whose sequences have
/// `lens` tokens, are padded where `padded`, and own the slots `own_slots` of a pool of
/// `num_slots` slots (`None`: no pool). Entries whose slot is `pad_slot_id`, and every entry of
/// a padded sequence, are ignored whole; any other entry in `speculative` mode, without a pool, at
/// an offset outside `[1, len_b]`, at a slot outside `[0, S)`, at a slot another checkpoint of the
/// call or any sequence of it owns, is an error.
pub fn parse_checkpoints(
    tables: CheckpointTables,
    lens: &[usize],
    padded: &[bool],
    own_slots: &[usize],
    pad_slot_id: i64,
    num_slots: Option<usize>,
    speculative: bool,
) -> Result<Vec<Vec<Checkpoint>>> {
    let batch = lens.len();
    let mut out = vec![Vec::new(); batch];
    let (offsets, slots) = match (tables.offsets, tables.slots) {
        (None, None) => return Ok(out),
        (Some(o), Some(s)) => (o, s),
        (Some(_), None) => bail!(
            InvalidArgument,
            "checkpoint_offsets is given and checkpoint_slots is NULL, expected both or neither"
        ),
        (None, Some(_)) => bail!(
            InvalidArgument,
            "checkpoint_slots is given and checkpoint_offsets is NULL, expected both or neither"
        ),
    };
    for t in [offsets, slots] {
        t.expect_ndim(2)?;
    }
    ensure!(
        offsets.shape[..2] == slots.shape[..2],
        InvalidArgument,
        "checkpoint_offsets.shape = {:?}, checkpoint_slots.shape = {:?}, expected equal shapes [B, C]",
        offsets.dims(),
        slots.dims()
    );
    offsets.expect_dim(0, batch, "number of sequences B")?;
    let cols = offsets.shape[1];
    let (offset_table, slot_table) = (offsets.read_indices_2d()?, slots.read_indices_2d()?);
    // (slot, sequence, column) of every checkpoint written.
    let mut writes: Vec<(usize, usize, usize)> = Vec::new();
    for b in 0..batch {
        if padded[b] {
            continue;
        }
        for c in 0..cols {
            let (o, s) = (offset_table[b * cols + c], slot_table[b * cols + c]);
            if s == pad_slot_id {
                continue;
            }
            ensure!(
                !speculative,
                InvalidArgument,
                "checkpoint_slots[{b}][{c}] = {s} with num_accepted_tokens given, expected no checkpoints in speculative mode (or pad_slot_id = {pad_slot_id})"
            );
            let Some(n) = num_slots else {
                bail!(
                    InvalidArgument,
                    "checkpoint_slots[{b}][{c}] = {s} but the state pool is NULL, expected pad_slot_id = {pad_slot_id} (no state to write)"
                );
            };
            let len = lens[b];
            ensure!(
                o >= 1 && o as u64 <= len as u64,
                OutOfBounds,
                "checkpoint_offsets[{b}][{c}] = {o}, expected 1 <= offset <= {len} (tokens of sequence {b})"
            );
            ensure!(
                s >= 0 && (s as u64) < n as u64,
                OutOfBounds,
                "checkpoint_slots[{b}][{c}] = {s}, expected 0 <= slot < {n} (state slots) or pad_slot_id = {pad_slot_id}"
            );
            writes.push((s as usize, b, c));
            out[b].push(Checkpoint {
                after: o as usize,
                slot: s as usize,
            });
        }
    }
    writes.sort_unstable();
    for w in writes.windows(2) {
        if w[0].0 == w[1].0 {
            bail!(
                InvalidArgument,
                "checkpoint_slots[{}][{}] = checkpoint_slots[{}][{}] = {}, expected distinct checkpoint slots",
                w[0].1,
                w[0].2,
                w[1].1,
                w[1].2,
                w[0].0
            );
        }
    }
    for &(s, b, c) in &writes {
        if let Some(owner) = own_slots.iter().position(|&o| o == s) {
            bail!(
                InvalidArgument,
                "checkpoint_slots[{b}][{c}] = {s} is the slot of sequence {owner}, expected a slot no sequence of the call uses"
            );
        }
    }
    for cps in &mut out {
        cps.sort_unstable();
    }
    Ok(out)
}

/// Attaches the checkpoints of `tables` to the validated `sequences` of a recurrent-kernel call
/// (`speculative`: `num_accepted_tokens` was given).
pub fn attach_checkpoints(
    sequences: &mut [Sequence],
    tables: CheckpointTables,
    pad_slot_id: i64,
    num_slots: Option<usize>,
    speculative: bool,
) -> Result<()> {
    let lens: Vec<usize> = sequences.iter().map(|s| s.len).collect();
    let padded: Vec<bool> = sequences.iter().map(|s| s.padded).collect();
    let own: Vec<usize> = sequences
        .iter()
        .filter_map(|s| match s.write {
            StateWrite::Final(slot) => Some(slot),
            _ => None,
        })
        .collect();
    let cps = parse_checkpoints(
        tables,
        &lens,
        &padded,
        &own,
        pad_slot_id,
        num_slots,
        speculative,
    )?;
    for (seq, cps) in sequences.iter_mut().zip(cps) {
        seq.checkpoints = cps;
    }
    Ok(())
}

/// The sequence arguments of a recurrent export (the delta rule, the DPLR rule, the scan: ABI.md
/// §4.4 and §4.10), read and parsed the one way all three state them.
pub struct SequenceViews {
    pub cu_seqlens: Option<View>,
    pub state_indices: Option<View>,
    pub has_initial_state: Option<View>,
    pub num_accepted: Option<View>,
    pub checkpoint_offsets: Option<View>,
    pub checkpoint_slots: Option<View>,
}

impl SequenceViews {
    /// # Safety
    /// Each pointer is NULL or points to a valid descriptor.
    pub unsafe fn read(
        cu_seqlens: *const ssmk_tensor,
        state_indices: *const ssmk_tensor,
        has_initial_state: *const ssmk_tensor,
        num_accepted_tokens: *const ssmk_tensor,
        checkpoint_offsets: *const ssmk_tensor,
        checkpoint_slots: *const ssmk_tensor,
    ) -> Result<SequenceViews> {
        unsafe {
            Ok(SequenceViews {
                cu_seqlens: View::optional("cu_seqlens", cu_seqlens)?,
                state_indices: View::optional("state_indices", state_indices)?,
                has_initial_state: View::optional("has_initial_state", has_initial_state)?,
                num_accepted: View::optional("num_accepted_tokens", num_accepted_tokens)?,
                checkpoint_offsets: View::optional("checkpoint_offsets", checkpoint_offsets)?,
                checkpoint_slots: View::optional("checkpoint_slots", checkpoint_slots)?,
            })
        }
    }

    /// The tables, as inputs no output may overlap.
    pub fn inputs(&self) -> [Option<&View>; 6] {
        [
            self.cu_seqlens.as_ref(),
            self.state_indices.as_ref(),
            self.has_initial_state.as_ref(),
            self.num_accepted.as_ref(),
            self.checkpoint_offsets.as_ref(),
            self.checkpoint_slots.as_ref(),
        ]
    }

    /// The call's sequences over `tokens`, checkpoints attached, for a pool of `num_slots` slots.
    pub fn parse(
        &self,
        tokens: usize,
        pad_slot_id: i64,
        num_slots: Option<usize>,
    ) -> Result<Vec<Sequence>> {
        let mut sequences = parse_sequences(
            tokens,
            self.cu_seqlens.as_ref(),
            self.state_indices.as_ref(),
            self.has_initial_state.as_ref(),
            self.num_accepted.as_ref(),
            pad_slot_id,
            num_slots,
        )?;
        attach_checkpoints(
            &mut sequences,
            CheckpointTables {
                offsets: self.checkpoint_offsets.as_ref(),
                slots: self.checkpoint_slots.as_ref(),
            },
            pad_slot_id,
            num_slots,
            self.num_accepted.is_some(),
        )?;
        Ok(sequences)
    }
}
