//! The sequence arguments the recurrent exports share (ABI.md §4, "Common sequence arguments"):
//! packed sequences, their slots, `has_initial_state` and `pad_slot_id`, decoded once for every
//! target. Values are mostly meaningful (so calls reach the kernels) and sometimes hostile:
//! decreasing or out-of-range offsets, slots out of range, negative, duplicated or padded.

use crate::call::{Call, Fill, INDEX, Id, MASKS, Role};
use crate::input::Input;

/// One call's batch: sequence `b` owns tokens `starts[b]..starts[b+1]` of `tokens`.
#[derive(Clone, Debug)]
pub struct Batch {
    pub tokens: usize,
    /// `[B+1]` offsets, as passed (possibly hostile).
    pub starts: Vec<i64>,
    /// `[B]` slots, as passed.
    pub slots: Vec<i64>,
    /// `[B]` has_initial_state values (non-zero = true).
    pub initial: Vec<i64>,
    pub pad_slot_id: i64,
    /// Slots in the state pool.
    pub num_slots: usize,
    /// False: the offsets descriptor is NULL (one sequence of all tokens).
    pub explicit_starts: bool,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Up to `max_seqs` sequences of up to `max_len` tokens each.
    pub fn decode(input: &mut Input, max_seqs: usize, max_len: usize) -> Batch {
        let explicit_starts = input.byte() >= 48;
        let (starts, tokens) = if explicit_starts {
            let count = input.range(0, max_seqs);
            let mut starts = vec![input.below(3) as i64];
            for _ in 0..count {
                let len = match input.byte() {
                    0..=95 => 1,
                    96..=127 => 0,
                    _ => input.range(1, max_len),
                };
                starts.push(starts.last().unwrap() + len as i64);
            }
            let tokens = *starts.last().unwrap() as usize + input.below(3);
            (starts, tokens)
        } else {
            let tokens = input.range(0, max_len);
            (vec![0, tokens as i64], tokens)
        };
        let batch = starts.len() - 1;
        let pad_slot_id = input.pick(&[-1, -1, -1, i64::MIN, 1 << 40, 0]);
        let num_slots = batch + input.below(4);
        // A shuffled choice of distinct slots, then a few pads and hostile entries.
        let mut pool: Vec<i64> = (0..num_slots as i64).collect();
        for i in (1..pool.len()).rev() {
            pool.swap(i, input.below(i + 1));
        }
        let mut slots: Vec<i64> = pool[..batch].to_vec();
        let mut initial: Vec<i64> = (0..batch).map(|_| input.below(2) as i64).collect();
        let mut starts = starts;
        let hostile = input.byte();
        if hostile >= 160 && batch > 0 {
            let b = input.below(batch);
            match hostile % 8 {
                0 | 1 => slots[b] = pad_slot_id,
                2 => slots[b] = input.hostile_i64(),
                3 => slots[b] = num_slots as i64 + input.below(3) as i64,
                4 => slots[b] = slots[input.below(batch)],
                5 => starts[b] = input.hostile_i64(),
                6 => initial[b] = input.pick(&[2, 255, -1, i64::MIN]),
                _ => starts[b + 1] = tokens as i64 + 1 + input.below(2) as i64,
            }
        }
        Batch {
            tokens,
            starts,
            slots,
            initial,
            pad_slot_id,
            num_slots,
            explicit_starts,
        }
    }

    /// Speculative mode's `[B, Smax]` slot table and `[B]` accepted counts: each row a distinct
    /// run of slots of a pool of `B * Smax + extra` (returned), with pads and hostile entries.
    pub fn speculative(&self, input: &mut Input, smax: usize) -> (Vec<i64>, Vec<i64>, usize) {
        let batch = self.len();
        let num_slots = batch * smax + input.below(3);
        let mut pool: Vec<i64> = (0..num_slots as i64).collect();
        for i in (1..pool.len()).rev() {
            pool.swap(i, input.below(i + 1));
        }
        let mut table = pool[..batch * smax].to_vec();
        let mut accepted: Vec<i64> = (0..batch).map(|_| input.range(0, smax) as i64).collect();
        for _ in 0..input.below(3) {
            if table.is_empty() {
                break;
            }
            let i = input.below(table.len());
            table[i] = match input.below(4) {
                0 | 1 => self.pad_slot_id,
                2 => table[input.below(table.len())],
                _ => input.hostile_i64(),
            };
        }
        if batch > 0 && input.chance(16) {
            accepted[input.below(batch)] = input.hostile_i64();
        }
        (table, accepted, num_slots)
    }
}

/// The descriptors of a batch: the offsets (`[B+1]`, NULL when the batch is one implicit
/// sequence), the slots (`[B]`, or NULL) and `has_initial_state` (`[B]`, or NULL).
pub struct BatchArgs {
    pub starts: Option<Id>,
    pub slots: Option<Id>,
    pub initial: Option<Id>,
}

impl Batch {
    /// Declares the batch's descriptors under the export's names for them (`with_slots` false:
    /// the caller declares its own slot table).
    pub fn tensors(
        &self,
        call: &mut Call,
        input: &mut Input,
        names: [&'static str; 3],
        with_slots: bool,
    ) -> BatchArgs {
        let b = self.len();
        let starts = self.explicit_starts.then(|| {
            let dtype = input.pick(&INDEX);
            call.tensor(
                input,
                names[0],
                Role::Input,
                dtype,
                &[b + 1],
                Fill::Ints(self.starts.clone()),
            )
        });
        let dtype = input.pick(&INDEX);
        let slots = if with_slots {
            call.optional(
                input,
                200,
                names[1],
                Role::Input,
                dtype,
                &[b],
                Fill::Ints(self.slots.clone()),
            )
        } else {
            None
        };
        let dtype = input.pick(&MASKS);
        let initial = call.optional(
            input,
            200,
            names[2],
            Role::Input,
            dtype,
            &[b],
            Fill::Ints(self.initial.clone()),
        );
        BatchArgs {
            starts,
            slots,
            initial,
        }
    }
}

/// ABI.md §4.10's checkpoint tables of a prefill call (`[B, C]` each), or NULL.
#[derive(Clone, Copy, Default)]
pub struct Checkpoints {
    pub offsets: Option<Id>,
    pub slots: Option<Id>,
}

impl Batch {
    /// Checkpoint tables for this batch over a pool of `num_slots`: usually none; else offsets
    /// mostly inside each sequence and slots mostly the pool's spare ones or `pad_slot_id`, with
    /// hostile entries (outside the sequence or pool, a sequence's own slot, repeated slots) and
    /// sometimes only one table or unequal shapes.
    pub fn checkpoints(&self, call: &mut Call, input: &mut Input, num_slots: usize) -> Checkpoints {
        if input.byte() < 128 {
            return Checkpoints::default();
        }
        let (b, cols) = (self.len(), input.below(4));
        let spare: Vec<i64> = (0..num_slots as i64)
            .filter(|s| !self.slots.contains(s))
            .collect();
        let (mut offsets, mut slots) = (Vec::new(), Vec::new());
        for s in 0..b {
            let len = (self.starts[s + 1].saturating_sub(self.starts[s])).max(0) as usize;
            for _ in 0..cols {
                offsets.push(match input.byte() {
                    0..=15 => input.hostile_i64(),
                    16..=31 => (len as i64).wrapping_add(input.below(2) as i64),
                    _ => input.range(1, len.max(1)) as i64,
                });
                slots.push(match input.byte() {
                    0..=15 => input.hostile_i64(),
                    16..=31 => self.slots[s],
                    32..=79 => self.pad_slot_id,
                    _ if spare.is_empty() => self.pad_slot_id,
                    _ => spare[input.below(spare.len())],
                });
            }
        }
        let table = |call: &mut Call, input: &mut Input, name, values: Vec<i64>, rows: usize| {
            let dtype = input.pick(&INDEX);
            call.tensor(
                input,
                name,
                Role::Input,
                dtype,
                &[rows, cols],
                Fill::Ints(values),
            )
        };
        let offsets = table(call, input, "checkpoint_offsets", offsets, b);
        let rows = if input.chance(16) { b + 1 } else { b };
        let slots = table(call, input, "checkpoint_slots", slots, rows);
        match input.below(16) {
            0 => Checkpoints {
                offsets: Some(offsets),
                slots: None,
            },
            1 => Checkpoints {
                offsets: None,
                slots: Some(slots),
            },
            _ => Checkpoints {
                offsets: Some(offsets),
                slots: Some(slots),
            },
        }
    }
}
