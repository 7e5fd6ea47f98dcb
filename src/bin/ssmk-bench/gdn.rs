//! Gated DeltaNet (ABI.md §4.3–4.4): chunked prefill as GFLOP/s against the same-run FMA peak,
//! decode as bandwidth over the state bytes against the same-run memcpy, and Qwen3-Next-like layer
//! steps (conv → gating → delta rule through the C ABI) against the portable reference kernels.

use ssmk::dtype::DType;
use ssmk::ffi::conv::{SSMK_ACTIVATION_SILU, ssmk_causal_conv1d_fwd};
use ssmk::ffi::gdn::{SSMK_GDN_QK_L2NORM, ssmk_gated_delta_rule, ssmk_gdn_gating};
use ssmk::runtime::{Isa, with_isa};
use ssmk::tensor::ssmk_tensor;

use crate::buffers::Buf;
use crate::harness::{Config, Ctx, Report, Row, Work, ok, time, time_slow};

const H: usize = 16;
const HV: usize = 32;
const K: usize = 128;
const V: usize = 128;
/// Conv channels of the layer: q and k (H*K each) and v (HV*V).
const CONV_DIM: usize = 2 * H * K + HV * V;
const WIDTH: usize = 4;

fn offsets(lens: &[usize]) -> Vec<i64> {
    let mut acc = 0i64;
    std::iter::once(0)
        .chain(lens.iter().map(|&l| {
            acc += l as i64;
            acc
        }))
        .collect()
}

/// A `[T, heads, dim]` view of `cols` columns starting at column `col0` of a `[T, row]` buffer.
fn head_view(
    buf: &Buf,
    col0: usize,
    heads: usize,
    dim: usize,
    shape: &mut [i64; 3],
    strides: &mut [i64; 3],
) -> ssmk_tensor {
    let row = buf.shape[1];
    *shape = [buf.shape[0], heads as i64, dim as i64];
    *strides = [row, dim as i64, 1];
    let mut d = buf.desc();
    d.ndim = 3;
    d.shape = shape.as_ptr();
    d.strides = strides.as_ptr();
    d.byte_offset = (col0 * buf.dtype.size()) as u64;
    d
}

/// One delta-rule call: q, k, v as head views of one projected `[T, CONV_DIM]` buffer (as the
/// model lays them out), gates, a state pool with a slot per sequence, and the output.
struct DeltaRule {
    qkv: Buf,
    g: Buf,
    beta: Buf,
    state: Buf,
    out: Buf,
    starts: Buf,
    slots: Buf,
    initial: Buf,
}

impl DeltaRule {
    fn new(lens: &[usize], dtype: DType, initial: bool) -> DeltaRule {
        let t: usize = lens.iter().sum();
        let b = lens.len();
        DeltaRule {
            qkv: Buf::random(dtype, &[t, CONV_DIM], 11, 1.0),
            g: Buf::uniform(DType::F32, &[t, HV], 14, -0.2, -0.001),
            beta: Buf::uniform(dtype, &[t, HV], 15, 0.05, 0.95),
            state: Buf::random(DType::F32, &[b, HV, K, V], 16, 0.1),
            out: Buf::zeros(dtype, &[t, HV, V]),
            starts: Buf::ints(&offsets(lens)),
            slots: Buf::ints(&(0..b as i64).collect::<Vec<_>>()),
            initial: Buf::mask(&vec![initial; b]),
        }
    }

    fn tokens(&self) -> usize {
        self.qkv.shape[0] as usize
    }

    /// The delta rule over `qkv` (a conv output of the same shape may be passed instead).
    fn call_on(&self, qkv: &Buf, isa: Isa, ctx: &Ctx) {
        let (mut s, mut st) = ([[0i64; 3]; 3], [[0i64; 3]; 3]);
        let [s0, s1, s2] = &mut s;
        let [t0, t1, t2] = &mut st;
        let q = head_view(qkv, 0, H, K, s0, t0);
        let k = head_view(qkv, H * K, H, K, s1, t1);
        let v = head_view(qkv, 2 * H * K, HV, V, s2, t2);
        let (g, beta) = (self.g.desc(), self.beta.desc());
        let (mut state, mut out) = (self.state.desc(), self.out.desc());
        let (cu, idx, init) = (self.starts.desc(), self.slots.desc(), self.initial.desc());
        ok(unsafe {
            with_isa(isa, || {
                ssmk_gated_delta_rule(
                    ctx.0,
                    &q,
                    &k,
                    &v,
                    &g,
                    &beta,
                    0.0,
                    &mut state,
                    &cu,
                    &idx,
                    &init,
                    std::ptr::null(),
                    SSMK_GDN_QK_L2NORM,
                    1e-6,
                    -1,
                    &mut out,
                )
            })
        });
    }

    fn call(&self, isa: Isa, ctx: &Ctx) {
        self.call_on(&self.qkv, isa, ctx)
    }
}

/// FLOPs of the chunked form with chunk C = 64, the count the targets use.
fn prefill_flops(tokens: usize) -> f64 {
    let (c, k, v) = (64.0, K as f64, V as f64);
    2.0 * tokens as f64 * HV as f64 * (3.0 * k * v + 2.0 * c * k + 2.0 * c * v)
}

fn prefill(cfg: &Config, report: &mut Report, lens: &[usize], dtype: DType) {
    let call = DeltaRule::new(lens, dtype, false);
    let tokens = call.tokens();
    // The f64 reference costs seconds per call here: time it on 64 tokens and scale per token.
    let small = DeltaRule::new(&[64], dtype, false);
    let reference = time_slow(cfg, || small.call(Isa::Scalar, &Ctx::new(1))) * tokens as f64 / 64.0;
    let name = if dtype == DType::BF16 {
        "bf16 in/f32 state"
    } else {
        "f32 in/f32 state"
    };
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let t = time(cfg, || call.call(Isa::active(), &ctx));
        let mut r = Row::new(
            "gated_delta_rule prefill",
            format!("{}x{} H=16 HV=32 K=V=128", lens.len(), lens[0]),
            name,
            threads,
            t,
            Work::Flops(prefill_flops(tokens)),
            "l2norm; ref timed on 64 tokens, scaled".into(),
        );
        r.vs_reference = Some(reference / t);
        let peak = report.fma_peak_gflops;
        report.push_against(r, "f32 FMA peak 1t", peak);
    }
}

fn decode(cfg: &Config, report: &mut Report, batch: usize) {
    let call = DeltaRule::new(&vec![1; batch], DType::BF16, true);
    let state_bytes = 2.0 * call.state.bytes() as f64;
    let reference = time_slow(cfg, || call.call(Isa::Scalar, &Ctx::new(1)));
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let (t, memcpy) = report
            .memcpy
            .time_beside(cfg, || call.call(Isa::active(), &ctx));
        let mut r = Row::new(
            "gated_delta_rule decode",
            format!("B={batch} H=16 HV=32 K=V=128"),
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

/// One Qwen3-Next-like linear-attention layer step on `lens` (decodes are length-1 sequences
/// continuing from state): causal conv (W = 4, silu) over the projected q|k|v, gating, then the
/// delta rule on head views of the conv output. In/out projections are GEMMs outside ssmk.
struct LayerStep {
    rule: DeltaRule,
    conv_out: Buf,
    conv_weight: Buf,
    conv_bias: Buf,
    conv_states: Buf,
    a_log: Buf,
    a: Buf,
    b: Buf,
    dt_bias: Buf,
}

impl LayerStep {
    fn new(lens: &[usize], initial: bool) -> LayerStep {
        let rule = DeltaRule::new(lens, DType::BF16, initial);
        let t = rule.tokens();
        LayerStep {
            conv_out: Buf::zeros(DType::BF16, &[t, CONV_DIM]),
            conv_weight: Buf::random(DType::BF16, &[CONV_DIM, WIDTH], 31, 0.5),
            conv_bias: Buf::random(DType::BF16, &[CONV_DIM], 32, 0.1),
            conv_states: Buf::random(DType::BF16, &[lens.len(), WIDTH - 1, CONV_DIM], 33, 1.0),
            a_log: Buf::uniform(DType::F32, &[HV], 34, -1.0, 0.5),
            a: Buf::random(DType::BF16, &[t, HV], 35, 1.0),
            b: Buf::random(DType::BF16, &[t, HV], 36, 1.0),
            dt_bias: Buf::random(DType::F32, &[HV], 37, 0.5),
            rule,
        }
    }

    fn run(&self, isa: Isa, ctx: &Ctx) {
        let r = &self.rule;
        let (x, w, bias) = (r.qkv.desc(), self.conv_weight.desc(), self.conv_bias.desc());
        let (mut states, mut out) = (self.conv_states.desc(), self.conv_out.desc());
        let (q, idx, init) = (r.starts.desc(), r.slots.desc(), r.initial.desc());
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
        let (a_log, a, b, dt) = (
            self.a_log.desc(),
            self.a.desc(),
            self.b.desc(),
            self.dt_bias.desc(),
        );
        let (mut g, mut beta) = (r.g.desc(), r.beta.desc());
        ok(unsafe { ssmk_gdn_gating(ctx.0, &a_log, &a, &b, &dt, 1.0, 20.0, &mut g, &mut beta) });
        r.call_on(&self.conv_out, isa, ctx);
    }
}

fn layer_steps(cfg: &Config, report: &mut Report) {
    let chunk = cfg.pick(128, 32);
    let mut mixed = vec![1usize; 64];
    mixed.push(chunk);
    let steps: [(String, Vec<usize>); 3] = [
        (format!("(a) prefill chunk 4x{chunk}"), vec![chunk; 4]),
        ("(b) decode B=64".into(), vec![1; 64]),
        (format!("(c) 64 decodes + 1x{chunk} chunk"), mixed),
    ];
    for (name, lens) in steps {
        let step = LayerStep::new(&lens, true);
        let tokens = step.rule.tokens();
        let reference = time_slow(cfg, || step.run(Isa::Scalar, &Ctx::new(1)));
        for &threads in &cfg.threads {
            let ctx = Ctx::new(threads);
            let t = time(cfg, || step.run(Isa::active(), &ctx));
            let mut r = Row::new(
                "Qwen3-Next GDN layer step",
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
    prefill(cfg, report, &[long], DType::BF16);
    prefill(cfg, report, &[short; 4], DType::BF16);
    prefill(cfg, report, &[long], DType::F32);
    decode(cfg, report, cfg.pick(64, 8));
    layer_steps(cfg, report);
}
