//! Gated DeltaNet (ABI.md §4.3–4.4): chunked prefill as GFLOP/s against the same-run FMA peak, and
//! decode as bandwidth over the state bytes against the same-run memcpy.

use ssmk::dtype::DType;
use ssmk::ffi::gdn::{SSMK_GDN_QK_L2NORM, ssmk_gated_delta_rule};

use crate::buffers::Buf;
use crate::harness::{Config, Ctx, Report, Row, Work, ok, time};

/// Model shape of Qwen3-Next / Qwen3.5 linear-attention layers.
pub struct Heads {
    pub h: usize,
    pub hv: usize,
    pub k: usize,
    pub v: usize,
}

pub const QWEN: Heads = Heads { h: 16, hv: 32, k: 128, v: 128 };

/// The inputs of one delta-rule call over `lens` sequences (state slots `0..lens.len()`).
pub struct Inputs {
    pub q: Buf,
    pub k: Buf,
    pub v: Buf,
    pub g: Buf,
    pub beta: Buf,
    pub out: Buf,
    pub state: Buf,
    pub starts: Buf,
    pub slots: Buf,
    pub initial: Buf,
}

impl Inputs {
    pub fn new(heads: &Heads, lens: &[usize], dtype: DType, initial: bool) -> Inputs {
        let t: usize = lens.iter().sum();
        let b = lens.len();
        let mut acc = 0i64;
        let starts: Vec<i64> = std::iter::once(0).chain(lens.iter().map(|&l| {
            acc += l as i64;
            acc
        }))
        .collect();
        Inputs {
            q: Buf::random(dtype, &[t, heads.h, heads.k], 11, 1.0),
            k: Buf::random(dtype, &[t, heads.h, heads.k], 12, 1.0),
            v: Buf::random(dtype, &[t, heads.hv, heads.v], 13, 1.0),
            g: Buf::uniform(DType::F32, &[t, heads.hv], 14, -0.2, -0.001),
            beta: Buf::uniform(dtype, &[t, heads.hv], 15, 0.05, 0.95),
            out: Buf::zeros(dtype, &[t, heads.hv, heads.v]),
            state: Buf::random(DType::F32, &[b, heads.hv, heads.k, heads.v], 16, 0.1),
            starts: Buf::ints(&starts),
            slots: Buf::ints(&(0..b as i64).collect::<Vec<_>>()),
            initial: Buf::mask(&vec![initial; b]),
        }
    }

    /// One call through the C ABI.
    pub fn call(&self, ctx: &Ctx) {
        let (q, k, v, g, beta) = (self.q.desc(), self.k.desc(), self.v.desc(), self.g.desc(), self.beta.desc());
        let (mut state, mut out) = (self.state.desc(), self.out.desc());
        let (cu, idx, init) = (self.starts.desc(), self.slots.desc(), self.initial.desc());
        ok(unsafe {
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
        });
    }
}

/// FLOPs of the chunked form, the count the targets use.
fn prefill_flops(heads: &Heads, tokens: usize) -> f64 {
    let c = 64.0;
    let (k, v) = (heads.k as f64, heads.v as f64);
    2.0 * tokens as f64 * heads.hv as f64 * (3.0 * k * v + 2.0 * c * k + 2.0 * c * v)
}

fn prefill(cfg: &Config, report: &mut Report, lens: &[usize], dtype: DType) {
    let inputs = Inputs::new(&QWEN, lens, dtype, false);
    let tokens: usize = lens.iter().sum();
    let flops = prefill_flops(&QWEN, tokens);
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let t = time(cfg, || inputs.call(&ctx));
        let row = Row {
            op: "gated_delta_rule prefill".into(),
            shape: format!("{}x{} H=16 HV=32 K=V=128", lens.len(), lens[0]),
            dtype: format!("{}/f32 state", if dtype == DType::BF16 { "bf16" } else { "f32" }),
            threads,
            seconds: t,
            work: Work::Flops(flops),
            baseline: None,
            vs_reference: None,
            note: "l2norm".into(),
        };
        let rate = row.rate().0;
        report.push(Row { baseline: Some(("FMA peak 1t".into(), rate / report.fma_peak_gflops)), ..row });
    }
}

fn decode(cfg: &Config, report: &mut Report, batch: usize) {
    let inputs = Inputs::new(&QWEN, &vec![1; batch], DType::BF16, true);
    let state_bytes = 2.0 * inputs.state.bytes() as f64;
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let t = time(cfg, || inputs.call(&ctx));
        let row = Row {
            op: "gated_delta_rule decode".into(),
            shape: format!("B={batch} H=16 HV=32 K=V=128"),
            dtype: "bf16/f32 state".into(),
            threads,
            seconds: t,
            work: Work::Bytes(state_bytes),
            baseline: None,
            vs_reference: None,
            note: "state bytes r+w".into(),
        };
        let rate = row.rate().0;
        report.push(Row { baseline: Some(("memcpy".into(), rate / report.memcpy_gbps)), ..row });
    }
}

pub fn run(cfg: &Config, report: &mut Report) {
    let long = cfg.pick(2048, 256);
    let short = cfg.pick(512, 64);
    prefill(cfg, report, &[long], DType::BF16);
    prefill(cfg, report, &[short; 4], DType::BF16);
    prefill(cfg, report, &[long], DType::F32);
    decode(cfg, report, cfg.pick(64, 8));
}
