//! Gated DeltaNet and Kimi Delta Attention (ABI.md §4.3–4.4, §4.8): chunked prefill as GFLOP/s
//! against the same-run FMA peak (KDA also against GDN at its shape), decode as bandwidth over the
//! state bytes against the same-run memcpy, and Qwen3-Next-like and Kimi-Linear-like layer steps
//! (conv → gating → delta rule through the C ABI) against the portable reference kernels.

use ssmk::dtype::DType;
use ssmk::ffi::gdn::{SSMK_GDN_QK_L2NORM, ssmk_gated_delta_rule, ssmk_gdn_gating, ssmk_kda_gating};
use ssmk::runtime::{Isa, with_isa};
use ssmk::tensor::ssmk_tensor;

use crate::buffers::Buf;
use crate::harness::{
    Config, Ctx, Report, Row, Work, ok, time_beside_peak, time_beside_peak_and, time_slow,
};
use crate::layers::{self, LayerConv, Seqs, head_view};
use crate::simulate;

const K: usize = 128;
const V: usize = 128;

/// The heads of a linear-attention layer and its kind of decay.
#[derive(Clone, Copy)]
struct Heads {
    h: usize,
    hv: usize,
    /// `g` `[T, HV, K]` (KDA) rather than `[T, HV]` (GDN).
    per_channel: bool,
}

/// Qwen3-Next's Gated DeltaNet layer.
const GDN: Heads = Heads {
    h: 16,
    hv: 32,
    per_channel: false,
};
/// Kimi Linear's KDA layer.
const KDA: Heads = Heads {
    h: 32,
    hv: 32,
    per_channel: true,
};

impl Heads {
    /// Conv channels of the layer: q and k (H*K each) and v (HV*V).
    fn conv_dim(&self) -> usize {
        2 * self.h * K + self.hv * V
    }

    fn describe(&self) -> String {
        format!("H={} HV={} K=V=128", self.h, self.hv)
    }

    /// The same heads with the other kind of decay.
    fn with_per_channel(self, per_channel: bool) -> Heads {
        Heads {
            per_channel,
            ..self
        }
    }
}

/// One delta-rule call: q, k, v as head views of one projected `[T, CONV_DIM]` buffer (as the
/// model lays them out), gates, a state pool with a slot per sequence, and the output.
struct DeltaRule {
    heads: Heads,
    qkv: Buf,
    g: Buf,
    beta: Buf,
    state: Buf,
    out: Buf,
    seqs: Seqs,
    /// Checkpoint tables (ABI.md §4.10), if the call stores states inside its prefill.
    checkpoints: Option<(Buf, Buf)>,
    /// The pool is passed as a `[v][k]` view (k contiguous, llama.cpp's layout).
    k_contiguous: bool,
}

impl DeltaRule {
    fn new(heads: Heads, lens: &[usize], dtype: DType, initial: bool) -> DeltaRule {
        let t: usize = lens.iter().sum();
        let (b, hv) = (lens.len(), heads.hv);
        let g_shape: &[usize] = if heads.per_channel {
            &[t, hv, K]
        } else {
            &[t, hv]
        };
        DeltaRule {
            heads,
            qkv: Buf::random(dtype, &[t, heads.conv_dim()], 11, 1.0),
            g: Buf::uniform(DType::F32, g_shape, 14, -0.2, -0.001),
            beta: Buf::uniform(dtype, &[t, hv], 15, 0.05, 0.95),
            state: Buf::random(DType::F32, &[b, hv, K, V], 16, 0.1),
            out: Buf::zeros(dtype, &[t, hv, V]),
            seqs: Seqs::new(lens, initial),
            checkpoints: None,
            k_contiguous: false,
        }
    }

    /// The same call (one sequence) also storing the state at every
    /// [`layers::CHECKPOINT_EVERY`]th token, in slots `1..` of a pool grown to fit them.
    fn with_checkpoints(mut self) -> DeltaRule {
        let (offsets, slots, n) = layers::checkpoint_tables(self.tokens(), 1);
        self.state = Buf::random(DType::F32, &[1 + n, self.heads.hv, K, V], 16, 0.1);
        self.checkpoints = Some((offsets, slots));
        self
    }

    fn tokens(&self) -> usize {
        self.qkv.shape[0] as usize
    }

    /// What the call must move: q, k, v, gates and `out` once, the states read and written.
    fn bytes(&self) -> f64 {
        let once = self.qkv.bytes() + self.g.bytes() + self.beta.bytes() + self.out.bytes();
        (once + 2 * self.state.bytes()) as f64
    }

    /// The delta rule over `qkv` (a conv output of the same shape may be passed instead).
    fn call_on(&self, qkv: &Buf, isa: Isa, ctx: &Ctx) {
        let mut dims = [[[0i64; 3]; 2]; 3];
        let [dq, dk, dv] = &mut dims;
        let Heads { h, hv, .. } = self.heads;
        let q = head_view(qkv, 0, h, K, dq);
        let k = head_view(qkv, h * K, h, K, dk);
        let v = head_view(qkv, 2 * h * K, hv, V, dv);
        let (g, beta) = (self.g.desc(), self.beta.desc());
        let (mut state, mut out) = (self.state.desc(), self.out.desc());
        let k_major = [(hv * K * V) as i64, (K * V) as i64, 1, K as i64];
        if self.k_contiguous {
            state.strides = k_major.as_ptr();
        }
        let (cu, idx, init) = self.seqs.descs();
        let tables = self.checkpoints.as_ref().map(|(o, s)| (o.desc(), s.desc()));
        let (co, cs) = tables
            .as_ref()
            .map_or((std::ptr::null(), std::ptr::null()), |(o, s)| {
                (o as *const ssmk_tensor, s as *const ssmk_tensor)
            });
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
                    co,
                    cs,
                )
            })
        });
    }

    fn call(&self, isa: Isa, ctx: &Ctx) {
        self.call_on(&self.qkv, isa, ctx)
    }
}

/// FLOPs of the chunked form with chunk C = 64, the count the targets use:
/// `2 T HV (3KV + 2CK + 2CV)`. It is a fixed measure of the work, so the rate compares times: the
/// kernel's chunks are 16 tokens, which take fewer FLOPs (about `2 T HV (3KV + CV + CK)`). KDA
/// is counted the same: its decay products and per-v-head `k k^T` (not shared across a GQA group)
/// are extra work, not counted.
fn prefill_flops(tokens: usize, v_heads: usize) -> f64 {
    let (c, k, v) = (64.0, K as f64, V as f64);
    2.0 * tokens as f64 * v_heads as f64 * (3.0 * k * v + 2.0 * c * k + 2.0 * c * v)
}

fn prefill(cfg: &Config, report: &mut Report, heads: Heads, lens: &[usize], dtype: DType) {
    let call = DeltaRule::new(heads, lens, dtype, false);
    let tokens = call.tokens();
    let op = match heads.per_channel {
        true => "KDA delta rule prefill",
        false => "gated_delta_rule prefill",
    };
    let shape = format!("{}x{} {}", lens.len(), lens[0], heads.describe());
    if cfg.simulating() {
        let call_active = |ctx: &Ctx| call.call(Isa::active(), ctx);
        return simulate::row(cfg, report, op, shape, call.bytes(), call_active);
    }
    // KDA is also compared with GDN (per-head decay) at the same heads, timed beside it.
    let per_head = heads
        .per_channel
        .then(|| DeltaRule::new(heads.with_per_channel(false), lens, dtype, false));
    // The f64 reference costs seconds per call here: time it on 64 tokens and scale per token.
    let small = DeltaRule::new(heads, &[64], dtype, false);
    let reference = time_slow(cfg, || small.call(Isa::Scalar, &Ctx::new(1))) * tokens as f64 / 64.0;
    let name = if dtype == DType::BF16 {
        "bf16 in/f32 state"
    } else {
        "f32 in/f32 state"
    };
    let flops = prefill_flops(tokens, heads.hv);
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let kernel = || call.call(Isa::active(), &ctx);
        let mut note = String::from("l2norm; ref timed on 64 tokens, scaled");
        let (t, peak) = match &per_head {
            Some(gdn) => {
                let (t, peak, t_gdn) =
                    time_beside_peak_and(cfg, kernel, || gdn.call(Isa::active(), &ctx));
                note += &format!(
                    "; GDN same heads {:.1} GFLOP/s, KDA/GDN {:.2}",
                    flops / t_gdn / 1e9,
                    t_gdn / t
                );
                (t, peak)
            }
            None => time_beside_peak(cfg, kernel),
        };
        let mut r = Row::new(
            op,
            shape.clone(),
            name,
            threads,
            t,
            Work::Flops(flops),
            note,
        );
        r.vs_reference = Some(reference / t);
        report.push_against(r, "f32 FMA peak 1t", peak);
    }
}

/// The prefill of one `len`-token sequence storing its state at every 128th token (vLLM's CPU
/// block size), timed beside the same prefill without checkpoints.
fn prefill_checkpoints(cfg: &Config, report: &mut Report, heads: Heads, len: usize) {
    let plain = DeltaRule::new(heads, &[len], DType::BF16, false);
    let with = DeltaRule::new(heads, &[len], DType::BF16, false).with_checkpoints();
    let op = match heads.per_channel {
        true => "KDA delta rule prefill + checkpoints",
        false => "gated_delta_rule prefill + checkpoints",
    };
    layers::checkpoint_rows(
        cfg,
        report,
        op,
        format!("1x{len} {}", heads.describe()),
        "bf16 in/f32 state",
        Work::Flops(prefill_flops(len, heads.hv)),
        |ctx| with.call(Isa::active(), ctx),
        |ctx| plain.call(Isa::active(), ctx),
    );
}

/// Decode rows of `batch` sequences; `k_contiguous` passes the pool as a `[v][k]` view.
fn decode(cfg: &Config, report: &mut Report, heads: Heads, batch: usize, k_contiguous: bool) {
    let call = DeltaRule {
        k_contiguous,
        ..DeltaRule::new(heads, &vec![1; batch], DType::BF16, true)
    };
    let state_bytes = 2.0 * call.state.bytes() as f64;
    let op = match heads.per_channel {
        true => "KDA delta rule decode",
        false => "gated_delta_rule decode",
    };
    let layout = if k_contiguous { " [v][k] state" } else { "" };
    let shape = format!("B={batch} {}{layout}", heads.describe());
    layers::decode_rows(
        cfg,
        report,
        op,
        shape,
        "bf16 in/f32 state",
        state_bytes,
        call.bytes(),
        |isa, ctx| call.call(isa, ctx),
    );
}

/// One linear-attention layer step on `lens` (decodes are length-1 sequences continuing from
/// state): causal conv (W = 4, silu) over the projected q|k|v, gating (Qwen3-Next's
/// `ssmk_gdn_gating`, or Kimi Linear's per-channel `ssmk_kda_gating`), then the delta rule on head
/// views of the conv output. In/out projections are GEMMs outside ssmk.
struct LayerStep {
    rule: DeltaRule,
    conv: LayerConv,
    a_log: Buf,
    a: Buf,
    b: Buf,
    dt_bias: Buf,
}

impl LayerStep {
    fn new(heads: Heads, lens: &[usize], initial: bool) -> LayerStep {
        let rule = DeltaRule::new(heads, lens, DType::BF16, initial);
        let (t, hv, d) = (rule.tokens(), heads.hv, heads.conv_dim());
        // Per-channel gates: a `[T, HV, K]`, dt_bias `[HV, K]`.
        let channels: &[usize] = if heads.per_channel { &[K] } else { &[] };
        LayerStep {
            conv: LayerConv::new(lens, d, 31),
            a_log: Buf::uniform(DType::F32, &[hv], 34, -1.0, 0.5),
            a: Buf::random(DType::BF16, &[&[t, hv][..], channels].concat(), 35, 1.0),
            b: Buf::random(DType::BF16, &[t, hv], 36, 1.0),
            dt_bias: Buf::random(DType::F32, &[&[hv][..], channels].concat(), 37, 0.5),
            rule,
        }
    }
}

impl layers::LayerStep for LayerStep {
    fn tokens(&self) -> usize {
        self.rule.tokens()
    }

    fn flops(&self) -> f64 {
        prefill_flops(self.tokens(), self.rule.heads.hv)
    }

    fn run(&self, isa: Isa, ctx: &Ctx) {
        let r = &self.rule;
        self.conv.run(&r.qkv, &r.seqs, isa, ctx);
        let (a_log, a, b, dt) = (
            self.a_log.desc(),
            self.a.desc(),
            self.b.desc(),
            self.dt_bias.desc(),
        );
        let (mut g, mut beta) = (r.g.desc(), r.beta.desc());
        ok(unsafe {
            match r.heads.per_channel {
                true => ssmk_kda_gating(ctx.0, &a_log, &a, &dt, 0.0, &b, &mut g, &mut beta),
                false => ssmk_gdn_gating(ctx.0, &a_log, &a, &b, &dt, 1.0, 20.0, &mut g, &mut beta),
            }
        });
        r.call_on(&self.conv.out, isa, ctx);
    }
}

fn layer_steps(cfg: &Config, report: &mut Report, heads: Heads) {
    let op = match heads.per_channel {
        true => "Kimi Linear KDA layer step",
        false => "Qwen3-Next GDN layer step",
    };
    layers::layer_steps(cfg, report, op, heads.conv_dim(), 64, |lens| {
        LayerStep::new(heads, lens, true)
    });
}

pub fn run(cfg: &Config, report: &mut Report) {
    let (long, short) = (cfg.pick(2048, 128), cfg.pick(512, 32));
    if cfg.simulating() {
        for heads in [GDN, KDA] {
            prefill(cfg, report, heads, &[long], DType::BF16);
            prefill(cfg, report, heads, &[short; 4], DType::BF16);
            decode(cfg, report, heads, cfg.pick(64, 8), false);
            decode(cfg, report, heads, 1, false);
        }
        return;
    }
    prefill(cfg, report, GDN, &[long], DType::BF16);
    prefill(cfg, report, GDN, &[short; 4], DType::BF16);
    prefill(cfg, report, GDN, &[long], DType::F32);
    // Both state layouts the ABI requires fast (§4.4): v-contiguous and llama.cpp's `[v][k]`.
    for k_contiguous in [false, true] {
        decode(cfg, report, GDN, cfg.pick(64, 8), k_contiguous);
        decode(cfg, report, GDN, 1, k_contiguous);
    }
    prefill(cfg, report, KDA, &[long], DType::BF16);
    prefill(cfg, report, KDA, &[short; 4], DType::BF16);
    // Per-channel decays at the Gated DeltaNet heads (GQA: q/k loads shared, k k^T not).
    prefill(
        cfg,
        report,
        GDN.with_per_channel(true),
        &[long],
        DType::BF16,
    );
    for k_contiguous in [false, true] {
        decode(cfg, report, KDA, cfg.pick(64, 8), k_contiguous);
        decode(cfg, report, KDA, 1, k_contiguous);
    }
    layer_steps(cfg, report, GDN);
    layer_steps(cfg, report, KDA);
}

/// The delta rule's checkpoint rows (Gated DeltaNet, KDA): the `checkpoints` suite.
pub fn checkpoints(cfg: &Config, report: &mut Report) {
    let long = cfg.pick(2048, 128);
    prefill_checkpoints(cfg, report, GDN, long);
    prefill_checkpoints(cfg, report, KDA, long);
}
