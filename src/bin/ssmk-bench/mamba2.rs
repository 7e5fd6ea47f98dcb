//! Mamba-2's selective-state scan (ABI.md §4.9) on a Nemotron-H layer (NH = 128 heads of P = 64,
//! G = 8 groups of N = 128): chunked prefill as GFLOP/s against the same-run FMA peak, decode as
//! bandwidth over the state bytes against the same-run memcpy, and a layer step (causal conv over
//! x|B|C → scan on head views of the conv output, through the C ABI) against the portable
//! reference kernels.

use ssmk::dtype::DType;
use ssmk::ffi::mamba2::{SSMK_MAMBA2_DT_SOFTPLUS, ssmk_mamba2_scan};
use ssmk::runtime::{Isa, with_isa};
use ssmk::tensor::ssmk_tensor;

use crate::buffers::Buf;
use crate::harness::{Config, Ctx, Report, Row, Work, ok, time_beside_peak, time_slow};
use crate::layers::{self, LayerConv, Seqs, head_view};
use crate::simulate;

const NH: usize = 128;
const P: usize = 64;
const G: usize = 8;
const N: usize = 128;
/// Conv channels of the layer: x (NH*P), B and C (G*N each), in that order.
const CONV_DIM: usize = NH * P + 2 * G * N;
const HEADS: &str = "NH=128 P=64 G=8 N=128";

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
    seqs: Seqs,
    /// Checkpoint tables (ABI.md §4.10), if the call stores states inside its prefill.
    checkpoints: Option<(Buf, Buf)>,
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
            seqs: Seqs::new(lens, initial),
            checkpoints: None,
        }
    }

    /// The same call (one sequence) also storing the state at every
    /// [`layers::CHECKPOINT_EVERY`]th token, in slots `1..` of a pool grown to fit them.
    fn with_checkpoints(mut self) -> Scan {
        let (offsets, slots, n) = layers::checkpoint_tables(self.tokens(), 1);
        self.state = Buf::random(DType::F32, &[1 + n, NH, P, N], 46, 0.1);
        self.checkpoints = Some((offsets, slots));
        self
    }

    fn tokens(&self) -> usize {
        self.xbc.shape[0] as usize
    }

    /// What the call must move: x, B, C, dt and `out` once, the states read and written.
    fn bytes(&self) -> f64 {
        (self.xbc.bytes() + self.dt.bytes() + self.out.bytes() + 2 * self.state.bytes()) as f64
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
        let (cu, idx, init) = self.seqs.descs();
        let tables = self.checkpoints.as_ref().map(|(o, s)| (o.desc(), s.desc()));
        let (co, cs) = tables
            .as_ref()
            .map_or((std::ptr::null(), std::ptr::null()), |(o, s)| {
                (o as *const ssmk_tensor, s as *const ssmk_tensor)
            });
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
                    co,
                    cs,
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
    let shape = format!("{}x{} {HEADS}", lens.len(), lens[0]);
    if cfg.simulating() {
        let call_active = |ctx: &Ctx| call.call(Isa::active(), ctx);
        let op = "mamba2_scan prefill";
        return simulate::row(cfg, report, op, shape, call.bytes(), call_active);
    }
    // The f64 reference costs seconds per call here: time it on 64 tokens and scale per token.
    let small = Scan::new(&[64], DType::BF16, false);
    let reference = time_slow(cfg, || small.call(Isa::Scalar, &Ctx::new(1))) * tokens as f64 / 64.0;
    let flops = prefill_flops(tokens);
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let (t, peak) = time_beside_peak(cfg, || call.call(Isa::active(), &ctx));
        let mut r = Row::new(
            "mamba2_scan prefill",
            shape.clone(),
            "bf16 in/f32 state",
            threads,
            t,
            Work::Flops(flops),
            "D, dt_bias, softplus; ref timed on 64 tokens, scaled".into(),
        );
        r.vs_reference = Some(reference / t);
        report.push_against(r, "f32 FMA peak 1t", peak);
    }
}

fn decode(cfg: &Config, report: &mut Report, batch: usize) {
    let call = Scan::new(&vec![1; batch], DType::BF16, true);
    let state_bytes = 2.0 * call.state.bytes() as f64;
    let shape = format!("B={batch} {HEADS}");
    layers::decode_rows(
        cfg,
        report,
        "mamba2_scan decode",
        shape,
        "bf16 in/f32 state",
        state_bytes,
        call.bytes(),
        |isa, ctx| call.call(isa, ctx),
    );
}

/// One Nemotron-H Mamba-2 layer step on `lens` (decodes are length-1 sequences continuing from
/// state): causal conv (W = 4, silu) over the projected x|B|C, then the scan on head views of the
/// conv output. Projections and the gated RMSNorm are outside ssmk.
struct LayerStep {
    scan: Scan,
    conv: LayerConv,
}

impl LayerStep {
    fn new(lens: &[usize]) -> LayerStep {
        LayerStep {
            scan: Scan::new(lens, DType::BF16, true),
            conv: LayerConv::new(lens, CONV_DIM, 51),
        }
    }
}

impl layers::LayerStep for LayerStep {
    fn tokens(&self) -> usize {
        self.scan.tokens()
    }

    fn flops(&self) -> f64 {
        prefill_flops(self.tokens())
    }

    fn run(&self, isa: Isa, ctx: &Ctx) {
        let s = &self.scan;
        self.conv.run(&s.xbc, &s.seqs, isa, ctx);
        s.call_on(&self.conv.out, isa, ctx);
    }
}

/// The prefill of one `len`-token sequence storing its state at every 128th token (vLLM's CPU
/// block size), timed beside the same prefill without checkpoints.
pub fn prefill_checkpoints(cfg: &Config, report: &mut Report, len: usize) {
    let plain = Scan::new(&[len], DType::BF16, false);
    let with = Scan::new(&[len], DType::BF16, false).with_checkpoints();
    layers::checkpoint_rows(
        cfg,
        report,
        "mamba2_scan prefill + checkpoints",
        format!("1x{len} {HEADS}"),
        "bf16 in/f32 state",
        Work::Flops(prefill_flops(len)),
        |ctx| with.call(Isa::active(), ctx),
        |ctx| plain.call(Isa::active(), ctx),
    );
}

pub fn run(cfg: &Config, report: &mut Report) {
    let (long, short) = (cfg.pick(2048, 128), cfg.pick(512, 32));
    if cfg.simulating() {
        prefill(cfg, report, &[long]);
        prefill(cfg, report, &[short; 4]);
        decode(cfg, report, cfg.pick(64, 8));
        decode(cfg, report, 1);
        return;
    }
    prefill(cfg, report, &[long]);
    prefill(cfg, report, &[short; 4]);
    decode(cfg, report, cfg.pick(64, 8));
    decode(cfg, report, 1);
    let op = "Nemotron-H Mamba-2 layer step";
    layers::layer_steps(cfg, report, op, CONV_DIM, cfg.pick(64, 8), LayerStep::new);
}
