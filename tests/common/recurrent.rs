//! What the recurrent-kernel tests (`gdn.rs`, `mamba2.rs`) share. Both kernels take the state
//! pool and the sequence arguments (`cu_seqlens`, `state_indices`, `has_initial_state`,
//! `num_accepted_tokens`, `pad_slot_id`) with the same meaning, so the plumbing of their f64
//! references, the checks against them and the tolerances live here; each file keeps its own
//! per-token math.

use std::collections::HashMap;

use half::{bf16, f16};
use ssmk::dtype::{DType, Element};
use ssmk::ffi::context::ssmk_context;
use ssmk::ffi::status::SSMK_OK;
use ssmk::kernels::Path;
use ssmk::runtime::{Isa, with_isa};
use ssmk::tensor::ssmk_tensor;

use super::{Ctx, Rng, Tensor, last_error, sampled};

/// The `pad_slot_id` of every call.
pub const PAD: i64 = -1;

/// `|got - want| <= atol + rtol * |want|`.
#[derive(Clone, Copy, Debug)]
pub struct Tol {
    pub atol: f64,
    pub rtol: f64,
}

/// The tolerance of a value stored in `dtype`: its storage rounding plus f32 accumulation (each
/// test file's header gives the derivation).
pub fn tol(dtype: DType) -> Tol {
    match dtype {
        DType::F32 => Tol {
            atol: 1e-4,
            rtol: 1e-4,
        },
        DType::F16 => Tol {
            atol: 2e-4,
            rtol: 2e-3,
        },
        _ => Tol {
            atol: 1e-3,
            rtol: 8e-3,
        },
    }
}

impl Tol {
    pub fn times(self, k: f64) -> Tol {
        Tol {
            atol: self.atol * k,
            rtol: self.rtol * k,
        }
    }

    pub fn close(self, got: f64, want: f64) -> bool {
        (got - want).abs() <= self.atol + self.rtol * want.abs()
    }

    /// The fraction of the tolerance `|got - want|` uses (> 1: violated; NaN counts as violated).
    pub fn ratio(self, got: f64, want: f64) -> f64 {
        let r = (got - want).abs() / (self.atol + self.rtol * want.abs());
        if r.is_nan() { f64::INFINITY } else { r }
    }
}

/// The worst element of a comparison, to report how much of its bound a case uses.
pub struct Worst {
    pub ratio: f64,
    at: String,
}

impl Worst {
    pub fn new() -> Worst {
        Worst {
            ratio: 0.0,
            at: String::from("(nothing compared)"),
        }
    }

    /// Records an element using `ratio` of its bound; `at` describes it (called only if worst).
    pub fn add(&mut self, ratio: f64, at: impl FnOnce() -> String) {
        if ratio > self.ratio || (ratio.is_infinite() && !self.ratio.is_infinite()) {
            self.ratio = ratio;
            self.at = at();
        }
    }

    pub fn check(&self, what: &str, t: Tol) {
        assert!(
            self.ratio <= 1.0,
            "{what}: {} is {:.3}x the tolerance {t:?}",
            self.at,
            self.ratio
        );
    }
}

/// All elements as f64, row-major; fast for compact tensors.
pub fn values(t: &Tensor) -> Vec<f64> {
    if t.strides.is_some() {
        return t.to_vec();
    }
    let n = t.numel();
    let p = t.base();
    unsafe {
        match t.dtype {
            DType::F32 => std::slice::from_raw_parts(p.cast::<f32>(), n)
                .iter()
                .map(|&x| x as f64)
                .collect(),
            DType::BF16 => std::slice::from_raw_parts(p.cast::<bf16>(), n)
                .iter()
                .map(|&x| x.to_f32() as f64)
                .collect(),
            DType::F16 => std::slice::from_raw_parts(p.cast::<f16>(), n)
                .iter()
                .map(|&x| x.to_f32() as f64)
                .collect(),
            _ => t.to_vec(),
        }
    }
}

/// Fills element `i` (row-major) with `f(i)`, rounded to the dtype; fast for compact tensors.
pub fn fill_with(t: &mut Tensor, mut f: impl FnMut(usize) -> f64) {
    if t.strides.is_none() && t.dtype.is_float() {
        let p = t.base();
        for i in 0..t.numel() {
            let x = f(i) as f32;
            unsafe {
                match t.dtype {
                    DType::F32 => p.cast::<f32>().add(i).write(x),
                    DType::BF16 => p
                        .cast::<bf16>()
                        .add(i)
                        .write(<bf16 as Element>::from_f32(x)),
                    _ => p.cast::<f16>().add(i).write(<f16 as Element>::from_f32(x)),
                }
            }
        }
        return;
    }
    for (i, idx) in t.indices().into_iter().enumerate() {
        let v = f(i);
        t.set(&idx, v);
    }
}

/// Fills every element, row-major, with `f(u)` for the next uniform `u` of `rng`.
pub fn fill(t: &mut Tensor, rng: &mut Rng, f: impl Fn(f64) -> f64) {
    fill_with(t, |_| f(rng.uniform()));
}

/// An optional argument's descriptor as the export takes it (NULL when absent).
pub fn ptr(d: &Option<ssmk_tensor>) -> *const ssmk_tensor {
    d.as_ref().map_or(std::ptr::null(), |d| d as *const _)
}

pub fn ptr_mut(d: &Option<ssmk_tensor>) -> *mut ssmk_tensor {
    ptr(d).cast_mut()
}

/// The arguments both kernels take alike, as the helpers here read them.
pub struct SeqArgs<'a> {
    /// `[T, ...]`.
    pub out: &'a Tensor,
    pub state: &'a Option<Tensor>,
    pub cu: &'a Option<Tensor>,
    pub idx: &'a Option<Tensor>,
    pub init: &'a Option<Tensor>,
}

impl<'a> SeqArgs<'a> {
    pub fn new(
        out: &'a Tensor,
        state: &'a Option<Tensor>,
        cu: &'a Option<Tensor>,
        idx: &'a Option<Tensor>,
        init: &'a Option<Tensor>,
    ) -> SeqArgs<'a> {
        SeqArgs {
            out,
            state,
            cu,
            idx,
            init,
        }
    }

    /// `T`, the tokens of the call.
    pub fn tokens(&self) -> usize {
        self.out.shape[0] as usize
    }
}

/// One call of a recurrent kernel (a test file's problem type).
pub trait RecurrentCall: Clone {
    fn args(&self) -> SeqArgs<'_>;

    /// The export with every descriptor, on this thread's ISA and path.
    fn call(&mut self, ctx: *const ssmk_context) -> i32;

    /// Sets the tables `checkpoint_offsets` and `checkpoint_slots` (`None`: NULL).
    fn set_checkpoints(&mut self, offsets: Option<Tensor>, slots: Option<Tensor>);

    /// Sets `cu_seqlens`, `state_indices` and `has_initial_state`.
    fn set_sequences(&mut self, cu: Tensor, idx: Tensor, init: Tensor);

    /// [`Self::call`] with the kernels of `isa` on `path`.
    fn call_with(&mut self, isa: Isa, path: Path, ctx: *const ssmk_context) -> i32 {
        with_isa(isa, || path.with(|| self.call(ctx)))
    }

    /// [`Self::call`] on `path`, asserting success.
    fn run(&mut self, path: Path, ctx: *const ssmk_context, what: &str) {
        let code = path.with(|| self.call(ctx));
        assert_eq!(code, SSMK_OK, "{what}: {}", last_error());
    }
}

/// Runs a copy of `p` on every level of [`Isa::under_test`] (the SIMD ones on each of
/// `simd_paths`; `Isa::Scalar`, the crate's f64 recurrence, has one path) and checks each with
/// `verify(copy, what)`.
pub fn run_every_isa<P: RecurrentCall>(
    p: &P,
    simd_paths: &[Path],
    what: &str,
    mut verify: impl FnMut(&P, &str),
) {
    for isa in Isa::under_test() {
        let paths = if isa == Isa::Scalar {
            &[Path::Auto][..]
        } else {
            simd_paths
        };
        for &path in paths {
            let mut a = p.clone();
            let code = a.call_with(isa, path, std::ptr::null());
            assert_eq!(code, SSMK_OK, "{what}: {}", last_error());
            verify(&a, &format!("{what} [{isa:?} {path:?}]"));
        }
    }
}

/// The out and state bytes of a call, to check that a rejected call wrote neither.
pub struct Written {
    out: Vec<u8>,
    state: Option<Vec<u8>>,
}

impl Written {
    pub fn of(p: &impl RecurrentCall) -> Written {
        let a = p.args();
        Written {
            out: a.out.bytes(),
            state: a.state.as_ref().map(|s| s.bytes()),
        }
    }

    pub fn assert_kept(&self, p: &impl RecurrentCall, name: &str) {
        let now = Written::of(p);
        assert!(now.out == self.out, "{name}: out was written");
        assert!(now.state == self.state, "{name}: state was written");
    }
}

/// What the reference says one sequence does with the state pool.
#[derive(Clone, Debug)]
pub enum Writes {
    Nothing,
    Final(usize),
    /// Speculative: the state after token `t` goes to `slots[t]` (`None`: a pad entry, not written).
    PerToken(Vec<Option<usize>>),
}

#[derive(Clone, Debug)]
pub struct RefSeq {
    pub start: usize,
    pub len: usize,
    pub padded: bool,
    pub read: Option<usize>,
    pub writes: Writes,
}

/// `cu_seqlens` (i32) of sequences of `lens` tokens packed from token 0.
pub fn cu_seqlens(lens: &[usize]) -> Tensor {
    let mut cu = vec![0i64];
    for &l in lens {
        cu.push(cu.last().unwrap() + l as i64);
    }
    Tensor::ints(DType::I32, &cu)
}

/// `state_indices` and `has_initial_state` of `seqs` sequences over a pool of `slots`: slots
/// reversed (sequence `b` in `slots - 1 - b`), initial states on the even sequences.
pub fn reversed_slots(seqs: usize, slots: usize) -> (Tensor, Tensor) {
    let idx: Vec<i64> = (0..seqs).map(|b| (slots - 1 - b) as i64).collect();
    let init: Vec<i64> = (0..seqs).map(|b| (b % 2 == 0) as i64).collect();
    (
        Tensor::ints(DType::I64, &idx),
        Tensor::ints(DType::Bool, &init),
    )
}

/// `(cu_seqlens, state_indices, has_initial_state)` of one call per sequence of a batch: its token
/// range in the packed input, its slot and its flag.
pub fn one_call_per_sequence(
    lens: &[usize],
    slots: &[i64],
    init: &[i64],
) -> Vec<(Tensor, Tensor, Tensor)> {
    let mut start = 0i64;
    (0..lens.len())
        .map(|b| {
            let cu = Tensor::ints(DType::I32, &[start, start + lens[b] as i64]);
            start += lens[b] as i64;
            (
                cu,
                Tensor::ints(DType::I32, &[slots[b]]),
                Tensor::ints(DType::Bool, &[init[b]]),
            )
        })
        .collect()
}

/// Sequences of an ordinary (non-speculative) call as the ABI defines them.
pub fn plain_seqs(p: &impl RecurrentCall) -> Vec<RefSeq> {
    let a = p.args();
    let cu: Vec<usize> = match a.cu {
        Some(c) => values(c).iter().map(|&x| x as usize).collect(),
        None => vec![0, a.tokens()],
    };
    let b = cu.len() - 1;
    let idx: Vec<i64> = match a.idx {
        Some(i) => values(i).iter().map(|&x| x as i64).collect(),
        None => (0..b as i64).collect(),
    };
    let init: Vec<bool> = match a.init {
        Some(i) => values(i).iter().map(|&x| x != 0.0).collect(),
        None => vec![false; b],
    };
    (0..b)
        .map(|s| {
            let padded = idx[s] == PAD;
            let slot = idx[s] as usize;
            RefSeq {
                start: cu[s],
                len: cu[s + 1] - cu[s],
                padded,
                read: (!padded && init[s]).then_some(slot),
                writes: if padded || a.state.is_none() {
                    Writes::Nothing
                } else {
                    Writes::Final(slot)
                },
            }
        })
        .collect()
}

/// `0..pool` shuffled from `seed`: distinct slots in no particular order.
pub fn shuffled_slots(pool: usize, seed: u64) -> Vec<i64> {
    let mut rng = Rng::new(seed);
    let mut perm: Vec<i64> = (0..pool as i64).collect();
    for i in (1..pool).rev() {
        perm.swap(i, rng.below(i + 1));
    }
    perm
}

/// A speculative `state_indices` `[B, smax]` of `dtype` from the row-major `table`.
pub fn slot_table(dtype: DType, table: &[i64], smax: usize) -> Tensor {
    let mut idx = Tensor::zeros(dtype, &[table.len() / smax, smax]);
    for (i, &s) in table.iter().enumerate() {
        idx.set(&[i / smax, i % smax], s as f64);
    }
    idx
}

/// Sets row `b` of a speculative `state_indices` to `slots`.
pub fn set_slots(idx: &mut Tensor, b: usize, slots: &[i64]) {
    for (c, &s) in slots.iter().enumerate() {
        idx.set(&[b, c], s as f64);
    }
}

/// Sequences of a speculative call from its `[B, smax]` slot `table`: sequence `b` (padded if
/// `table[b][0]` is `PAD`) reads slot `table[b][max(accepted[b] - 1, 0)]` if `init[b]` is set and
/// writes the state after token `t` to `table[b][t]` (not a `PAD` entry; nothing without a pool).
pub fn spec_seqs(
    lens: &[usize],
    accepted: &[i64],
    init: &[i64],
    table: &[i64],
    smax: usize,
    pool: bool,
) -> Vec<RefSeq> {
    let mut start = 0;
    (0..lens.len())
        .map(|b| {
            let row = &table[b * smax..(b + 1) * smax];
            let padded = row[0] == PAD;
            let s = RefSeq {
                start,
                len: lens[b],
                padded,
                read: (!padded && init[b] != 0)
                    .then(|| row[(accepted[b] - 1).max(0) as usize] as usize),
                writes: if padded || !pool {
                    Writes::Nothing
                } else {
                    Writes::PerToken(
                        row[..lens[b]]
                            .iter()
                            .map(|&x| (x != PAD).then_some(x as usize))
                            .collect(),
                    )
                },
            };
            start += lens[b];
            s
        })
        .collect()
}

/// Runs a per-token reference over `seqs` and returns the state of every slot it writes:
/// `token(t, Some(state))` advances a sequence's state (read from `pool`, or zeros) by token `t`;
/// `token(t, None)` is a token of a padded sequence, whose output rows are zeros.
pub fn run_reference(
    seqs: &[RefSeq],
    pool: Option<&[f64]>,
    slot_len: usize,
    mut token: impl FnMut(usize, Option<&mut [f64]>),
) -> HashMap<usize, Vec<f64>> {
    let mut states = HashMap::new();
    for s in seqs {
        let tokens = s.start..s.start + s.len;
        if s.padded {
            tokens.for_each(|t| token(t, None));
            continue;
        }
        let mut state = match s.read {
            Some(slot) => pool.unwrap()[slot * slot_len..(slot + 1) * slot_len].to_vec(),
            None => vec![0.0; slot_len],
        };
        for (i, t) in tokens.enumerate() {
            token(t, Some(&mut state));
            if let Writes::PerToken(slots) = &s.writes
                && let Some(slot) = slots[i]
            {
                states.insert(slot, state.clone());
            }
        }
        if let Writes::Final(slot) = s.writes {
            states.insert(slot, state);
        }
    }
    states
}

/// Checks `after`'s out against the reference `want`: `check(i, got, want)` for every element a
/// sequence owns; the others (None) must keep `before`'s bits. `pos(i)` names element `i`.
pub fn check_out(
    before: &Tensor,
    after: &Tensor,
    want: &[Option<f64>],
    what: &str,
    pos: impl Fn(usize) -> String,
    mut check: impl FnMut(usize, f64, f64),
) {
    let (got, old) = (values(after), values(before));
    for (i, e) in want.iter().enumerate() {
        match e {
            Some(w) => check(i, got[i], *w),
            None => assert_eq!(
                got[i].to_bits(),
                old[i].to_bits(),
                "{what}: {} outside every sequence was written",
                pos(i)
            ),
        }
    }
}

/// Checks a state pool against the reference `states`: `check(slot, i, got, want)` for element
/// `i` of every slot written; every other slot must keep `before`'s bits.
pub fn check_state_pool(
    before: &Tensor,
    after: &Tensor,
    states: &HashMap<usize, Vec<f64>>,
    what: &str,
    mut check: impl FnMut(usize, usize, f64, f64),
) {
    let (ga, gb) = (values(after), values(before));
    let slot_len = after.shape[1..].iter().product::<i64>() as usize;
    for slot in 0..after.shape[0] as usize {
        let range = slot * slot_len..(slot + 1) * slot_len;
        match states.get(&slot) {
            Some(w) => {
                for (i, (g, w)) in ga[range].iter().zip(w).enumerate() {
                    check(slot, i, *g, *w);
                }
            }
            None => assert!(
                ga[range.clone()]
                    .iter()
                    .zip(&gb[range])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{what}: state slot {slot} was written"
            ),
        }
    }
}

/// Checkpoint tables `[B, C]` (int32 offsets, int64 slots) from each sequence's `(offset, slot)`
/// pairs, rows padded with `(0, PAD)` entries (ignored whole, offset included).
pub fn checkpoint_tables(rows: &[Vec<(i64, i64)>]) -> (Tensor, Tensor) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut offsets = Tensor::zeros(DType::I32, &[rows.len(), cols]);
    let mut slots = Tensor::zeros(DType::I64, &[rows.len(), cols]);
    for (b, row) in rows.iter().enumerate() {
        for c in 0..cols {
            let (o, s) = row.get(c).copied().unwrap_or((0, PAD));
            offsets.set(&[b, c], o as f64);
            slots.set(&[b, c], s as f64);
        }
    }
    (offsets, slots)
}

/// The bytes of slot `s` of a compact state pool.
fn slot_bytes(state: &Tensor, s: usize) -> Vec<u8> {
    let bytes = state.bytes();
    let per = bytes.len() / state.shape[0] as usize;
    bytes[s * per..(s + 1) * per].to_vec()
}

/// ABI.md §4.10 for `p` (a call with a compact state pool) and the checkpoints `rows` (per
/// sequence, `(offset, slot)` pairs; `PAD` slots are ignored) on every ISA and `paths`:
/// - `out` and every slot but the checkpoints' are bit-identical to the call without them;
/// - each checkpoint slot holds what a separate call ending at that token stores in its own
///   slot: within `tol` (bit for bit with `tol` zero, and always on `Isa::Scalar`, where both are
///   the f64 recurrence rounded once);
/// - the call is bitwise identical on one and three threads.
pub fn check_checkpoints<P: RecurrentCall>(
    p: &P,
    rows: &[Vec<(i64, i64)>],
    paths: &[Path],
    what: &str,
    tol: Tol,
) {
    let (offsets, slots) = checkpoint_tables(rows);
    let seqs = plain_seqs(p);
    let pool = p.args().state.as_ref().expect("a state pool").shape[0] as usize;
    // Slots the checkpoints write (a padded sequence's write nothing: checked unchanged).
    let taken: Vec<usize> = rows
        .iter()
        .zip(&seqs)
        .filter(|(_, seq)| !seq.padded)
        .flat_map(|(row, _)| row.iter())
        .filter(|&&(_, s)| s != PAD)
        .map(|&(_, s)| s as usize)
        .collect();
    for isa in Isa::under_test() {
        let paths = if isa == Isa::Scalar {
            &[Path::Auto][..]
        } else {
            paths
        };
        for &path in paths {
            let what = format!("{what} [{isa:?} {path:?}]");
            let mut plain = p.clone();
            let mut with = p.clone();
            with.set_checkpoints(Some(offsets.clone()), Some(slots.clone()));
            for (a, name) in [(&mut plain, "without"), (&mut with, "with")] {
                let code = a.call_with(isa, path, std::ptr::null());
                assert_eq!(code, SSMK_OK, "{what} {name} checkpoints: {}", last_error());
            }
            assert!(
                plain.args().out.bytes() == with.args().out.bytes(),
                "{what}: out changed with checkpoints"
            );
            let (ps, ws) = (
                plain.args().state.clone().unwrap(),
                with.args().state.clone().unwrap(),
            );
            for s in (0..pool).filter(|s| !taken.contains(s)) {
                assert!(
                    slot_bytes(&ps, s) == slot_bytes(&ws, s),
                    "{what}: slot {s} (not a checkpoint) changed with checkpoints"
                );
            }
            for (b, row) in rows.iter().enumerate() {
                let seq = &seqs[b];
                // Every third checkpoint of a row in the small-shape mode (each is a call of its own).
                let live = row.iter().filter(|&&(_, s)| s != PAD && !seq.padded);
                for (_, &(o, slot)) in live.enumerate().filter(|(k, _)| sampled(*k as u64, 3)) {
                    let Writes::Final(own) = seq.writes else {
                        panic!("{what}: sequence {b} has no slot of its own");
                    };
                    let mut alone = p.clone();
                    alone.set_sequences(
                        Tensor::ints(DType::I64, &[seq.start as i64, (seq.start as i64) + o]),
                        Tensor::ints(DType::I32, &[own as i64]),
                        Tensor::ints(DType::U8, &[seq.read.is_some() as i64]),
                    );
                    let code = alone.call_with(isa, path, std::ptr::null());
                    assert_eq!(code, SSMK_OK, "{what}: {}", last_error());
                    let alone_state = alone.args().state.clone().unwrap();
                    let at = format!("{what}: checkpoint of sequence {b} at {o} in slot {slot}");
                    if isa == Isa::Scalar || tol.atol == 0.0 {
                        assert!(
                            slot_bytes(&alone_state, own) == slot_bytes(&ws, slot as usize),
                            "{at}: not bit-identical to a call ending there"
                        );
                        continue;
                    }
                    let n = ws.numel() / pool;
                    let (got, want) = (values(&ws), values(&alone_state));
                    let mut worst = Worst::new();
                    for j in 0..n {
                        let (g, w) = (got[slot as usize * n + j], want[own * n + j]);
                        worst.add(tol.ratio(g, w), || format!("element {j}: {g} vs {w}"));
                    }
                    worst.check(&at, tol);
                }
            }
            // Threads: bitwise identical on one and three.
            let mut three = p.clone();
            three.set_checkpoints(Some(offsets.clone()), Some(slots.clone()));
            let ctx = Ctx::new(3);
            let code = three.call_with(isa, path, ctx.0);
            assert_eq!(code, SSMK_OK, "{what}: {}", last_error());
            let mut one = p.clone();
            one.set_checkpoints(Some(offsets.clone()), Some(slots.clone()));
            let ctx = Ctx::new(1);
            let code = one.call_with(isa, path, ctx.0);
            assert_eq!(code, SSMK_OK, "{what}: {}", last_error());
            assert!(
                one.args().out.bytes() == three.args().out.bytes()
                    && one.args().state.as_ref().unwrap().bytes()
                        == three.args().state.as_ref().unwrap().bytes(),
                "{what}: one and three threads differ with checkpoints"
            );
        }
    }
}

/// Every checkpoint error of ABI.md §4.10 that a call with a pool can make, each with nothing
/// written, and the tables that ask for nothing accepted. `p` has at least two sequences, the
/// first live with at least 2 tokens and its own slot `own0`, and a pool with a spare slot
/// `spare` (and `spare + 1`).
pub fn check_checkpoint_errors<P: RecurrentCall>(p: &P, own0: i64, spare: i64) {
    use ssmk::ffi::status::{SSMK_ERR_INVALID_ARGUMENT, SSMK_ERR_OUT_OF_BOUNDS};
    let seqs = plain_seqs(p);
    let (b, len0) = (seqs.len(), seqs[0].len as i64);
    let pool = p.args().state.as_ref().unwrap().shape[0];
    let row = |pairs: Vec<(i64, i64)>| {
        let mut rows = vec![vec![]; b];
        rows[0] = pairs;
        checkpoint_tables(&rows)
    };
    let ints2 = |dtype: DType, r: usize, c: usize| Tensor::zeros(dtype, &[r, c]);
    // (case, offsets, slots, status, message fragment)
    type Case<'a> = (&'a str, Option<Tensor>, Option<Tensor>, i32, &'a str);
    let cases: Vec<Case> = vec![
        {
            let (o, _) = row(vec![(1, spare)]);
            (
                "offsets only",
                Some(o),
                None,
                SSMK_ERR_INVALID_ARGUMENT,
                "checkpoint_slots is NULL",
            )
        },
        {
            let (_, s) = row(vec![(1, spare)]);
            (
                "slots only",
                None,
                Some(s),
                SSMK_ERR_INVALID_ARGUMENT,
                "checkpoint_offsets is NULL",
            )
        },
        (
            "unequal shapes",
            Some(ints2(DType::I32, b, 2)),
            Some(ints2(DType::I64, b, 3)),
            SSMK_ERR_INVALID_ARGUMENT,
            "expected equal shapes",
        ),
        (
            "B + 1 rows",
            Some(ints2(DType::I32, b + 1, 1)),
            Some(ints2(DType::I64, b + 1, 1)),
            SSMK_ERR_INVALID_ARGUMENT,
            "checkpoint_offsets.shape[0]",
        ),
        {
            let (o, s) = row(vec![(0, spare)]);
            (
                "offset 0",
                Some(o),
                Some(s),
                SSMK_ERR_OUT_OF_BOUNDS,
                "checkpoint_offsets[0][0] = 0",
            )
        },
        {
            let (o, s) = row(vec![(len0 + 1, spare)]);
            (
                "offset past len",
                Some(o),
                Some(s),
                SSMK_ERR_OUT_OF_BOUNDS,
                "checkpoint_offsets[0][0]",
            )
        },
        {
            let (o, s) = row(vec![(1, pool)]);
            (
                "slot S",
                Some(o),
                Some(s),
                SSMK_ERR_OUT_OF_BOUNDS,
                "checkpoint_slots[0][0]",
            )
        },
        {
            let (o, s) = row(vec![(1, -2)]);
            (
                "negative slot",
                Some(o),
                Some(s),
                SSMK_ERR_OUT_OF_BOUNDS,
                "checkpoint_slots[0][0] = -2",
            )
        },
        {
            let (o, s) = row(vec![(1, spare), (2, spare)]);
            (
                "same slot twice",
                Some(o),
                Some(s),
                SSMK_ERR_INVALID_ARGUMENT,
                "distinct checkpoint slots",
            )
        },
        {
            let (o, s) = row(vec![(1, own0)]);
            (
                "a sequence's own slot",
                Some(o),
                Some(s),
                SSMK_ERR_INVALID_ARGUMENT,
                "is the slot of sequence 0",
            )
        },
        {
            let (o, _) = row(vec![(1, spare)]);
            let mut f = Tensor::zeros(DType::F32, &[b, 1]);
            f.set(&[0, 0], spare as f64);
            (
                "float slots",
                Some(o),
                Some(f),
                ssmk::ffi::status::SSMK_ERR_UNSUPPORTED_DTYPE,
                "checkpoint_slots",
            )
        },
        (
            "1-D tables",
            Some(Tensor::ints(DType::I32, &vec![1; b])),
            Some(Tensor::ints(DType::I32, &vec![spare; b])),
            SSMK_ERR_INVALID_ARGUMENT,
            "checkpoint_offsets.ndim",
        ),
    ];
    for (name, offsets, slots, status, fragment) in cases {
        let mut a = p.clone();
        let before = Written::of(&a);
        a.set_checkpoints(offsets, slots);
        let code = a.call(std::ptr::null());
        super::assert_error(code, status, &[fragment]);
        before.assert_kept(&a, name);
    }
    // Asking for nothing is accepted wherever NULL is: C = 0, pad slots (offsets unchecked).
    for (name, (o, s)) in [
        ("C = 0", checkpoint_tables(&vec![vec![]; b])),
        ("pad entries", row(vec![(-7, PAD), (len0 + 9, PAD)])),
    ] {
        let mut plain = p.clone();
        let mut a = p.clone();
        assert_eq!(
            plain.call(std::ptr::null()),
            SSMK_OK,
            "{name}: {}",
            last_error()
        );
        a.set_checkpoints(Some(o), Some(s));
        assert_eq!(
            a.call(std::ptr::null()),
            SSMK_OK,
            "{name}: {}",
            last_error()
        );
        assert!(
            Written::of(&a).out == Written::of(&plain).out
                && Written::of(&a).state == Written::of(&plain).state,
            "{name}: differs from no checkpoints"
        );
    }
}
