//! RWKV-7's generalized delta rule (ABI.md §4.11), through `ssmk_dplr_delta_rule` at RWKV-7's
//! head size (64; 32 heads, a 2048-wide layer as in RWKV7-G1 1.5B): prefill as GFLOP/s against
//! the same-run FMA peak (counting the recurrence's 9 K V FLOPs per token and head), decode as
//! bandwidth over the state bytes against the same-run memcpy, each with the state in `[k][v]`
//! order and in ggml's `[v][k]` order (a strided view), against the f64 reference.

use ssmk::dtype::DType;
use ssmk::ffi::dplr::ssmk_dplr_delta_rule;
use ssmk::runtime::{Isa, with_isa};
use ssmk::tensor::ssmk_tensor;

use crate::buffers::Buf;
use crate::harness::{Config, Ctx, Report, Row, Work, ok, time_beside_peak, time_slow};
use crate::layers::{self, Seqs};
use crate::simulate;

const HEADS: usize = 32;
const K: usize = 64;
const V: usize = 64;

/// One call's tensors: inputs in a stable range (decays in [0.55, 0.97], a low-rank part of
/// norm below 0.03), so the state neither grows nor goes subnormal over a long prefill.
struct Call {
    r: Buf,
    w: Buf,
    k: Buf,
    v: Buf,
    a: Buf,
    b: Buf,
    state: Buf,
    /// The state pool as ggml keeps it (`[S, H, V, K]` memory viewed as `[S, H, K, V]`).
    value_major: bool,
    out: Buf,
    seqs: Seqs,
}

impl Call {
    fn new(lens: &[usize], dtype: DType, value_major: bool, initial: bool) -> Call {
        let t: usize = lens.iter().sum();
        let row = |seed, scale| Buf::random(dtype, &[t, HEADS, K], seed, scale);
        Call {
            r: row(81, 0.2),
            w: Buf::uniform(DType::F32, &[t, HEADS, K], 82, -0.6065, -0.03),
            k: row(83, 0.2),
            v: Buf::random(dtype, &[t, HEADS, V], 84, 1.0),
            a: row(85, 0.02),
            b: row(86, 0.02),
            state: Buf::random(DType::F32, &[lens.len(), HEADS, K, V], 87, 0.1),
            value_major,
            out: Buf::zeros(dtype, &[t, HEADS, V]),
            seqs: Seqs::new(lens, initial),
        }
    }

    fn tokens(&self) -> usize {
        self.r.shape[0] as usize
    }

    /// What the call must move: the six inputs and `out` once, the states read and written.
    fn bytes(&self) -> f64 {
        let once: usize = [
            &self.r, &self.w, &self.k, &self.v, &self.a, &self.b, &self.out,
        ]
        .iter()
        .map(|b| b.bytes())
        .sum();
        (once + 2 * self.state.bytes()) as f64
    }

    fn layout(&self) -> &'static str {
        match self.value_major {
            true => "state [v][k]",
            false => "state [k][v]",
        }
    }

    fn call(&self, isa: Isa, ctx: &Ctx) {
        let [r, w, k, v, a, b] =
            [&self.r, &self.w, &self.k, &self.v, &self.a, &self.b].map(Buf::desc);
        let strides = [(HEADS * K * V) as i64, (K * V) as i64, 1, K as i64];
        let mut state = match self.value_major {
            true => ssmk_tensor::cpu(
                self.state.as_ptr().cast(),
                DType::F32,
                &self.state.shape,
                Some(&strides),
            ),
            false => self.state.desc(),
        };
        let mut out = self.out.desc();
        let (cu, idx, init) = self.seqs.descs();
        ok(unsafe {
            with_isa(isa, || {
                ssmk_dplr_delta_rule(
                    ctx.0,
                    &r,
                    &w,
                    &k,
                    &v,
                    &a,
                    &b,
                    1.0,
                    &mut state,
                    &cu,
                    &idx,
                    &init,
                    std::ptr::null(),
                    0,
                    -1,
                    &mut out,
                    std::ptr::null(),
                    std::ptr::null(),
                )
            })
        });
    }
}

/// The recurrence's FLOPs: `sa = a^T S` (2KV), the update (5KV), `S^T r` (2KV) per token and head.
fn prefill_flops(tokens: usize) -> f64 {
    9.0 * (K * V * HEADS * tokens) as f64
}

fn prefill(cfg: &Config, report: &mut Report, lens: &[usize], dtype: DType, value_major: bool) {
    let call = Call::new(lens, dtype, value_major, true);
    let op = "dplr_delta_rule prefill";
    let shape = format!(
        "{}x{} H={HEADS} K=V=64 {}",
        lens.len(),
        lens[0],
        call.layout()
    );
    if cfg.simulating() {
        let call_active = |ctx: &Ctx| call.call(Isa::active(), ctx);
        return simulate::row(cfg, report, op, shape, call.bytes(), call_active);
    }
    // The f64 reference costs seconds per call here: time it on 64 tokens and scale per token.
    let small = Call::new(&[64], dtype, value_major, true);
    let reference =
        time_slow(cfg, || small.call(Isa::Scalar, &Ctx::new(1))) * call.tokens() as f64 / 64.0;
    let name = match dtype {
        DType::BF16 => "bf16 in/f32 state",
        _ => "f32 in/f32 state",
    };
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let (t, peak) = time_beside_peak(cfg, || call.call(Isa::active(), &ctx));
        let mut r = Row::new(
            op,
            shape.clone(),
            name,
            threads,
            t,
            Work::Flops(prefill_flops(call.tokens())),
            format!(
                "9KV FLOPs/token/head; {:.2} ms; ref timed on 64 tokens, scaled",
                t * 1e3
            ),
        );
        r.vs_reference = Some(reference / t);
        report.push_against(r, "f32 FMA peak 1t", peak);
    }
}

fn decode(cfg: &Config, report: &mut Report, batch: usize, value_major: bool) {
    let call = Call::new(&vec![1; batch], DType::BF16, value_major, true);
    layers::decode_rows(
        cfg,
        report,
        "dplr_delta_rule decode",
        format!("B={batch} H={HEADS} K=V=64 {}", call.layout()),
        "bf16 in/f32 state",
        2.0 * call.state.bytes() as f64,
        call.bytes(),
        |isa, ctx| call.call(isa, ctx),
    );
}

pub fn run(cfg: &Config, report: &mut Report) {
    let (long, short) = (cfg.pick(2048, 128), cfg.pick(512, 32));
    let batch = cfg.pick(64, 8);
    if cfg.simulating() {
        prefill(cfg, report, &[long], DType::BF16, false);
        prefill(cfg, report, &[short; 4], DType::BF16, false);
        decode(cfg, report, batch, false);
        decode(cfg, report, 1, false);
        return;
    }
    for value_major in [false, true] {
        prefill(cfg, report, &[long], DType::F32, value_major);
    }
    prefill(cfg, report, &[long], DType::BF16, false);
    prefill(cfg, report, &[short; 4], DType::BF16, false);
    for value_major in [false, true] {
        decode(cfg, report, batch, value_major);
    }
    decode(cfg, report, 1, false);
}
