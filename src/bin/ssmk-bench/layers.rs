//! What the recurrent layers' benchmarks (Mamba-2, GDN/KDA) share: a batch's sequence arguments,
//! head views of a projected buffer, the causal conv a layer step runs first, and the layer-step
//! rows.

use ssmk::dtype::DType;
use ssmk::ffi::conv::{SSMK_ACTIVATION_SILU, ssmk_causal_conv1d_fwd};
use ssmk::runtime::{Isa, with_isa};
use ssmk::tensor::ssmk_tensor;

use crate::buffers::Buf;
use crate::harness::{
    Config, Ctx, Report, Rmw, Row, Work, ok, time, time_ab, time_cold, time_slow,
};
use crate::simulate;

/// The layers' causal conv width.
const WIDTH: usize = 4;

/// `cu_seqlens` of sequences of `lens` tokens, packed in order.
pub fn offsets(lens: &[usize]) -> Vec<i64> {
    let mut acc = 0i64;
    std::iter::once(0)
        .chain(lens.iter().map(|&l| {
            acc += l as i64;
            acc
        }))
        .collect()
}

/// The sequence arguments of a batch with a state slot per sequence: `cu_seqlens`,
/// `state_indices` `0..B` and `has_initial_state`.
pub struct Seqs {
    starts: Buf,
    slots: Buf,
    initial: Buf,
}

impl Seqs {
    /// `lens` sequences in slots `0..`, continuing from their states iff `initial`.
    pub fn new(lens: &[usize], initial: bool) -> Seqs {
        let b = lens.len();
        Seqs {
            starts: Buf::ints(&offsets(lens)),
            slots: Buf::ints(&(0..b as i64).collect::<Vec<_>>()),
            initial: Buf::mask(&vec![initial; b]),
        }
    }

    /// Descriptors of `cu_seqlens`, `state_indices` and `has_initial_state`, in that order.
    pub fn descs(&self) -> (ssmk_tensor, ssmk_tensor, ssmk_tensor) {
        (self.starts.desc(), self.slots.desc(), self.initial.desc())
    }
}

/// A `[T, heads, dim]` view of the columns from `col0` of a `[T, row]` buffer; `dims` holds the
/// view's shape and strides, so it must outlive the descriptor.
pub fn head_view(
    buf: &Buf,
    col0: usize,
    heads: usize,
    dim: usize,
    dims: &mut [[i64; 3]; 2],
) -> ssmk_tensor {
    dims[0] = [buf.shape[0], heads as i64, dim as i64];
    dims[1] = [buf.shape[1], dim as i64, 1];
    let mut d = buf.desc();
    d.ndim = 3;
    d.shape = dims[0].as_ptr();
    d.strides = dims[1].as_ptr();
    d.byte_offset = (col0 * buf.dtype.size()) as u64;
    d
}

/// The causal conv (W = 4, silu, bf16) a layer step runs over its projected `[T, dim]` input
/// before the recurrence, with a conv state per sequence; the recurrence reads `out`.
pub struct LayerConv {
    pub out: Buf,
    weight: Buf,
    bias: Buf,
    states: Buf,
}

impl LayerConv {
    /// Random weights, bias and conv states from seeds `seed..seed + 3`.
    pub fn new(lens: &[usize], dim: usize, seed: u64) -> LayerConv {
        let t: usize = lens.iter().sum();
        LayerConv {
            out: Buf::zeros(DType::BF16, &[t, dim]),
            weight: Buf::random(DType::BF16, &[dim, WIDTH], seed, 0.5),
            bias: Buf::random(DType::BF16, &[dim], seed + 1, 0.1),
            states: Buf::random(DType::BF16, &[lens.len(), WIDTH - 1, dim], seed + 2, 1.0),
        }
    }

    /// The conv of `x` into `out`, over the batch `seqs`.
    pub fn run(&self, x: &Buf, seqs: &Seqs, isa: Isa, ctx: &Ctx) {
        let (x, w, bias) = (x.desc(), self.weight.desc(), self.bias.desc());
        let (mut states, mut out) = (self.states.desc(), self.out.desc());
        let (q, idx, init) = seqs.descs();
        ok(unsafe {
            with_isa(isa, || {
                ssmk_causal_conv1d_fwd(
                    ctx.0,
                    &x,
                    &w,
                    &bias,
                    &mut states,
                    &q,
                    &idx,
                    &init,
                    SSMK_ACTIVATION_SILU,
                    -1,
                    &mut out,
                    std::ptr::null(),
                    std::ptr::null(),
                )
            })
        });
    }
}

/// One step of a model layer through the C ABI, as [`layer_steps`] times it.
pub trait LayerStep {
    fn tokens(&self) -> usize;
    /// The FLOPs the layer's prefill count gives its tokens (the rate column).
    fn flops(&self) -> f64;
    fn run(&self, isa: Isa, ctx: &Ctx);
}

/// The layer-step rows of `op`: (a) a 4-sequence prefill chunk, (b) `decodes` decodes, (c) those
/// decodes beside one chunk, each from `new(lens)` (decodes are length-1 sequences continuing from
/// state), against the portable reference kernels.
pub fn layer_steps<S: LayerStep>(
    cfg: &Config,
    report: &mut Report,
    op: &str,
    conv_dim: usize,
    decodes: usize,
    new: impl Fn(&[usize]) -> S,
) {
    let chunk = cfg.pick(128, 32);
    let mut mixed = vec![1usize; decodes];
    mixed.push(chunk);
    let steps: [(String, Vec<usize>); 3] = [
        (format!("(a) prefill chunk 4x{chunk}"), vec![chunk; 4]),
        (format!("(b) decode B={decodes}"), vec![1; decodes]),
        (format!("(c) {decodes} decodes + 1x{chunk} chunk"), mixed),
    ];
    for (name, lens) in steps {
        let step = new(&lens);
        let tokens = step.tokens();
        let reference = time_slow(cfg, || step.run(Isa::Scalar, &Ctx::new(1)));
        for &threads in &cfg.threads {
            let ctx = Ctx::new(threads);
            let t = time(cfg, || step.run(Isa::active(), &ctx));
            let mut r = Row::new(
                op,
                format!("{name} conv D={conv_dim}"),
                "bf16/f32 state",
                threads,
                t,
                Work::Flops(step.flops()),
                format!("{:.0} tokens/s", tokens as f64 / t),
            );
            r.vs_reference = Some(reference / t);
            report.push(r);
        }
    }
}

/// The decode rows of `op`: `call` at every thread count as bandwidth over `state_bytes` (read +
/// written), against the same-run bound of an in-place update (a read-modify-write pass over as
/// many bytes on as many threads, [`Rmw`]; the note gives the same-run memcpy too) and the
/// portable reference kernels; or, when simulating, its replay (`call_bytes`: everything the call
/// moves).
#[allow(clippy::too_many_arguments)]
pub fn decode_rows(
    cfg: &Config,
    report: &mut Report,
    op: &str,
    shape: String,
    dtype: &str,
    state_bytes: f64,
    call_bytes: f64,
    call: impl Fn(Isa, &Ctx),
) {
    if cfg.simulating() {
        let call_active = |ctx: &Ctx| call(Isa::active(), ctx);
        return simulate::row(cfg, report, op, shape, call_bytes, call_active);
    }
    let reference = time_slow(cfg, || call(Isa::Scalar, &Ctx::new(1)));
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let mut rmw = Rmw::new((state_bytes / 2.0) as usize, threads);
        let (t, memcpy, rmw_gbps) = report
            .memcpy
            .time_beside_rmw(cfg, &mut rmw, || call(Isa::active(), &ctx));
        let rate = state_bytes / t / 1e9;
        let mut r = Row::new(
            op,
            shape.clone(),
            dtype,
            threads,
            t,
            Work::Bytes(state_bytes),
            format!(
                "state bytes read + written; {:.2}x memcpy ({memcpy:.2} GB/s)",
                rate / memcpy
            ),
        );
        r.vs_reference = Some(reference / t);
        report.push_against(r, "in-place rmw", rmw_gbps);
    }
    // A state that fits in the caches is timed again from memory, the helpers asleep.
    if state_bytes > COLD_ROW_MAX_STATE_BYTES {
        return;
    }
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let t = time_cold(cfg, || call(Isa::active(), &ctx));
        report.push(Row::new(
            op,
            format!("{shape} cold"),
            dtype,
            threads,
            t,
            Work::Bytes(state_bytes),
            "state from memory, helpers asleep (caches overwritten before each call)".into(),
        ));
    }
}

/// Decode rows whose state (read + written) is at most this also get a cold row: larger ones
/// stream from memory in the timed row already.
const COLD_ROW_MAX_STATE_BYTES: f64 = 32e6;

/// Where prefix caching stores states (ABI.md §4.10): every this many tokens (vLLM's CPU block).
pub const CHECKPOINT_EVERY: usize = 128;

/// Checkpoint tables `[1, n]` of one `len`-token sequence: the state after every
/// [`CHECKPOINT_EVERY`]th token (its last included) into slots `first_slot..`. Returns them and n.
pub fn checkpoint_tables(len: usize, first_slot: usize) -> (Buf, Buf, usize) {
    let n = len / CHECKPOINT_EVERY;
    let mut offsets = Buf::ints(
        &(1..=n)
            .map(|i| (i * CHECKPOINT_EVERY) as i64)
            .collect::<Vec<_>>(),
    );
    let mut slots = Buf::ints(&(0..n).map(|i| (first_slot + i) as i64).collect::<Vec<_>>());
    offsets.shape = vec![1, n as i64];
    slots.shape = vec![1, n as i64];
    (offsets, slots, n)
}

/// Rows of a prefill with checkpoints at every [`CHECKPOINT_EVERY`]th token (`with`), timed in
/// interleaved pairs with the same prefill without them (`without`, [`time_ab`]): the note gives
/// the median ratio with/without and its quartiles, and the row's baseline is the call without
/// checkpoints.
#[allow(clippy::too_many_arguments)]
pub fn checkpoint_rows(
    cfg: &Config,
    report: &mut Report,
    op: &str,
    shape: String,
    dtype: &str,
    work: Work,
    with: impl Fn(&Ctx),
    without: impl Fn(&Ctx),
) {
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let ab = time_ab(cfg, || with(&ctx), || without(&ctx));
        let (t, t_without) = (ab.a, ab.b);
        let row = Row::new(
            op,
            shape.clone(),
            dtype,
            threads,
            t,
            work,
            format!(
                "checkpoints at every {CHECKPOINT_EVERY}th token; time with/without {:.3} \
                 (median of {} interleaved pairs, quartiles {:.3}-{:.3})",
                ab.ratio, ab.pairs, ab.ratio_quartiles.0, ab.ratio_quartiles.1
            ),
        );
        let (rate, _) = Row::new(
            op,
            String::new(),
            dtype,
            threads,
            t_without,
            work,
            String::new(),
        )
        .rate();
        report.push_against(row, "same prefill without checkpoints", rate);
    }
}
