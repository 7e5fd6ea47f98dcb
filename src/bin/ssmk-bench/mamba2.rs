//! Mamba-2's selective-state scan (ABI.md §4.9) on a Nemotron-H layer (NH = 128 heads of P = 64,
//! G = 8 groups of N = 128): chunked prefill as GFLOP/s against the same-run FMA peak, decode as
//! bandwidth over the state bytes against the same-run memcpy, and a layer step (causal conv over
//! x|B|C → scan on head views of the conv output, through the C ABI) against the portable
//! reference kernels.

use ssmk::dtype::DType;
use ssmk::ffi::conv::{SSMK_ACTIVATION_SILU, ssmk_causal_conv1d_fwd};
use ssmk::ffi::mamba2::{SSMK_MAMBA2_DT_SOFTPLUS, ssmk_mamba2_scan};
use ssmk::runtime::{Isa, with_isa};
use ssmk::tensor::ssmk_tensor;

use crate::buffers::Buf;
use crate::harness::{Config, Ctx, Report, Row, Work, ok, time, time_slow};

const NH: usize = 128;
const P: usize = 64;
const G: usize = 8;
const N: usize = 128;
const WIDTH: usize = 4;
/// Conv channels of the layer: x (NH*P), B and C (G*N each), in that order.
const CONV_DIM: usize = NH * P + 2 * G * N;
const HEADS: &str = "NH=128 P=64 G=8 N=128";

fn offsets(lens: &[usize]) -> Vec<i64> {
    let mut acc = 0i64;
    std::iter::once(0)
        .chain(lens.iter().map(|&l| {
            acc += l as i64;
            acc
        }))
        .collect()
}

/// A `[T, heads, dim]` view of the columns from `col0` of a `[T, row]` buffer.
fn head_view(
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

/// One scan call: x, B, C as head views of one `[T, CONV_DIM]` buffer (the conv output, as the
/// model lays it out), dt, the per-head constants, a state pool with a slot per sequence and the
/// output. Like Nemotron-H, the gate `z` is left to the gated RMSNorm after the scan.
struct Scan {
    xbc: Buf,
    dt: Buf,
    a: Buf,
    d: Buf,
    dt_bias: Buf,
    state: Buf,
    out: Buf,
    starts: Buf,
    slots: Buf,
    initial: Buf,
}

impl Scan {
    fn new(lens: &[usize], dtype: DType, initial: bool) -> Scan {
        let t: usize = lens.iter().sum();
        let b = lens.len();
        Scan {
            xbc: Buf::random(dtype, &[t, CONV_DIM], 41, 1.0),
            dt: Buf::random(dtype, &[t, NH], 42, 0.5),
            // A = -exp(A_log), A_log in [0, ln 16); dt_bias = softplus^-1 of steps in ~[1e-3, 0.1].
            a: Buf::uniform(DType::F32, &[NH], 43, -16.0, -1.0),
            d: Buf::random(DType::F32, &[NH], 44, 1.0),
            dt_bias: Buf::uniform(DType::F32, &[NH], 45, -6.9, -2.25),
            state: Buf::random(DType::F32, &[b, NH, P, N], 46, 0.1),
            out: Buf::zeros(dtype, &[t, NH, P]),
            starts: Buf::ints(&offsets(lens)),
            slots: Buf::ints(&(0..b as i64).collect::<Vec<_>>()),
            initial: Buf::mask(&vec![initial; b]),
        }
    }

    fn tokens(&self) -> usize {
        self.xbc.shape[0] as usize
    }

    /// The scan over `xbc` (a conv output of the same shape may be passed instead).
    fn call_on(&self, xbc: &Buf, isa: Isa, ctx: &Ctx) {
        let mut dims = [[[0i64; 3]; 2]; 3];
        let [dx, db, dc] = &mut dims;
        let x = head_view(xbc, 0, NH, P, dx);
        let b = head_view(xbc, NH * P, G, N, db);
        let c = head_view(xbc, NH * P + G * N, G, N, dc);
        let (dt, a, d, bias) = (
            self.dt.desc(),
            self.a.desc(),
            self.d.desc(),
            self.dt_bias.desc(),
        );
        let (mut state, mut out) = (self.state.desc(), self.out.desc());
        let (cu, idx, init) = (self.starts.desc(), self.slots.desc(), self.initial.desc());
        ok(unsafe {
            with_isa(isa, || {
                ssmk_mamba2_scan(
                    ctx.0,
                    &x,
                    &dt,
                    &a,
                    &b,
                    &c,
                    &d,
                    std::ptr::null(),
                    &bias,
                    f32::NEG_INFINITY,
                    f32::INFINITY,
                    SSMK_MAMBA2_DT_SOFTPLUS,
                    &mut state,
                    &cu,
                    &idx,
                    &init,
                    std::ptr::null(),
                    -1,
                    &mut out,
                )
            })
        });
    }

    fn call(&self, isa: Isa, ctx: &Ctx) {
        self.call_on(&self.xbc, isa, ctx)
    }
}

/// FLOPs of the chunked SSD form with chunk C = 64, the count the targets use:
/// `T NH (4 P N + C P) + 2 T G C N` — per head and token `2 P N` for the state's output term
/// `C h^T`, `2 P N` for the state update `B^T (d x)`, `C P` for the lower-triangular
/// `(C B^T o L) (d x)`; per group `2 C N` for `C B^T`.
fn prefill_flops(tokens: usize) -> f64 {
    let (t, c) = (tokens as f64, 64.0);
    let (nh, p, g, n) = (NH as f64, P as f64, G as f64, N as f64);
    t * nh * (4.0 * p * n + c * p) + 2.0 * t * g * c * n
}

fn prefill(cfg: &Config, report: &mut Report, lens: &[usize]) {
    let call = Scan::new(lens, DType::BF16, false);
    let tokens = call.tokens();
    // The f64 reference costs seconds per call here: time it on 64 tokens and scale per token.
    let small = Scan::new(&[64], DType::BF16, false);
    let reference = time_slow(cfg, || small.call(Isa::Scalar, &Ctx::new(1))) * tokens as f64 / 64.0;
    let flops = prefill_flops(tokens);
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let t = time(cfg, || call.call(Isa::active(), &ctx));
        let mut r = Row::new(
            "mamba2_scan prefill",
            format!("{}x{} {HEADS}", lens.len(), lens[0]),
            "bf16 in/f32 state",
            threads,
            t,
            Work::Flops(flops),
            "D, dt_bias, softplus; ref timed on 64 tokens, scaled".into(),
        );
        r.vs_reference = Some(reference / t);
        let peak = report.fma_peak_gflops;
        report.push_against(r, "f32 FMA peak 1t", peak);
    }
}

fn decode(cfg: &Config, report: &mut Report, batch: usize) {
    let call = Scan::new(&vec![1; batch], DType::BF16, true);
    let state_bytes = 2.0 * call.state.bytes() as f64;
    let reference = time_slow(cfg, || call.call(Isa::Scalar, &Ctx::new(1)));
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let (t, memcpy) = report
            .memcpy
            .time_beside(cfg, || call.call(Isa::active(), &ctx));
        let mut r = Row::new(
            "mamba2_scan decode",
            format!("B={batch} {HEADS}"),
            "bf16 in/f32 state",
            threads,
            t,
            Work::Bytes(state_bytes),
            "state bytes read + written".into(),
        );
        r.vs_reference = Some(reference / t);
        report.push_against(r, "memcpy", memcpy);
    }
}

/// One Nemotron-H Mamba-2 layer step on `lens` (decodes are length-1 sequences continuing from
/// state): causal conv (W = 4, silu) over the projected x|B|C, then the scan on head views of the
/// conv output. Projections and the gated RMSNorm are outside ssmk.
struct LayerStep {
    scan: Scan,
    conv_out: Buf,
    conv_weight: Buf,
    conv_bias: Buf,
    conv_states: Buf,
}

impl LayerStep {
    fn new(lens: &[usize]) -> LayerStep {
        let scan = Scan::new(lens, DType::BF16, true);
        let t = scan.tokens();
        LayerStep {
            conv_out: Buf::zeros(DType::BF16, &[t, CONV_DIM]),
            conv_weight: Buf::random(DType::BF16, &[CONV_DIM, WIDTH], 51, 0.5),
            conv_bias: Buf::random(DType::BF16, &[CONV_DIM], 52, 0.1),
            conv_states: Buf::random(DType::BF16, &[lens.len(), WIDTH - 1, CONV_DIM], 53, 1.0),
            scan,
        }
    }

    fn run(&self, isa: Isa, ctx: &Ctx) {
        let s = &self.scan;
        let (x, w, bias) = (s.xbc.desc(), self.conv_weight.desc(), self.conv_bias.desc());
        let (mut states, mut out) = (self.conv_states.desc(), self.conv_out.desc());
        let (q, idx, init) = (s.starts.desc(), s.slots.desc(), s.initial.desc());
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
                )
            })
        });
        s.call_on(&self.conv_out, isa, ctx);
    }
}

fn layer_steps(cfg: &Config, report: &mut Report) {
    let chunk = cfg.pick(128, 32);
    let batch = cfg.pick(64, 8);
    let mut mixed = vec![1usize; batch];
    mixed.push(chunk);
    let steps: [(String, Vec<usize>); 3] = [
        (format!("(a) prefill chunk 4x{chunk}"), vec![chunk; 4]),
        (format!("(b) decode B={batch}"), vec![1; batch]),
        (format!("(c) {batch} decodes + 1x{chunk} chunk"), mixed),
    ];
    for (name, lens) in steps {
        let step = LayerStep::new(&lens);
        let tokens = step.scan.tokens();
        let reference = time_slow(cfg, || step.run(Isa::Scalar, &Ctx::new(1)));
        for &threads in &cfg.threads {
            let ctx = Ctx::new(threads);
            let t = time(cfg, || step.run(Isa::active(), &ctx));
            let mut r = Row::new(
                "Nemotron-H Mamba-2 layer step",
                format!("{name} conv D={CONV_DIM}"),
                "bf16/f32 state",
                threads,
                t,
                Work::Flops(prefill_flops(tokens)),
                format!("{:.0} tokens/s", tokens as f64 / t),
            );
            r.vs_reference = Some(reference / t);
            report.push(r);
        }
    }
}

pub fn run(cfg: &Config, report: &mut Report) {
    let (long, short) = (cfg.pick(2048, 128), cfg.pick(512, 32));
    prefill(cfg, report, &[long]);
    prefill(cfg, report, &[short; 4]);
    decode(cfg, report, cfg.pick(64, 8));
    layer_steps(cfg, report);
}
