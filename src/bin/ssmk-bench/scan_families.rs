//! The scan's other families (ABI.md §4.9), through `ssmk_mamba2_scan`:
//! - Mamba-1 on a Falcon-Mamba-7B layer (d_inner = 8192 channels as heads of P = 1, N = 16, `A`
//!   `[NH, N]`, D, z, dt_bias, softplus): prefill against a same-run memcpy of the bytes the call
//!   moves (its cost is the `T d_inner N` exponentials, so this ratio says how far from streaming
//!   it runs), decode against a memcpy of the state bytes, both against the f64 reference; the
//!   prefill also with x, dt, z and out channel-major (`[d_inner, T]`, vLLM's layout).
//! - Fixed-decay linear attention (MiniMax-like: H = 64, dk = dv = 128, `dt` ones as a stride-0
//!   view) as a fraction of the FMA peak, its state in vLLM's `[S, H, dk, dv]` order (a strided
//!   `[S, NH, P, N]` view), and the same call on a contiguous state beside it.

use ssmk::dtype::DType;
use ssmk::ffi::mamba2::{SSMK_MAMBA2_DT_SOFTPLUS, ssmk_mamba2_scan};
use ssmk::runtime::{Isa, with_isa};
use ssmk::tensor::ssmk_tensor;

use crate::buffers::Buf;
use crate::harness::{Config, Ctx, Report, Row, Work, ok, time_beside_peak, time_slow};
use crate::layers::{self, Seqs};
use crate::simulate;

/// Falcon-Mamba-7B's mixer: d_inner channels, state size N.
const D_INNER: usize = 8192;
const MAMBA1_N: usize = 16;
/// MiniMax-Text-01-like lightning attention heads.
const LIGHTNING_H: usize = 64;
const LIGHTNING_DK: usize = 128;

/// A tensor given to the call: its buffer and the logical shape and strides it is viewed with.
struct View {
    buf: Buf,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
}

impl View {
    fn compact(buf: Buf) -> View {
        let shape = buf.shape.clone();
        View {
            buf,
            shape,
            strides: None,
        }
    }

    fn desc(&self) -> ssmk_tensor {
        ssmk_tensor::cpu(
            self.buf.as_ptr().cast(),
            self.buf.dtype,
            &self.shape,
            self.strides.as_deref(),
        )
    }
}

/// `[T, C, 1]` over a buffer laid out `[C, T]` (tokens contiguous per channel).
fn channel_major(dtype: DType, t: usize, c: usize, seed: u64, scale: f32) -> View {
    View {
        buf: Buf::random(dtype, &[c, t], seed, scale),
        shape: vec![t as i64, c as i64, 1],
        strides: Some(vec![1, t as i64, 1]),
    }
}

/// One `ssmk_mamba2_scan` call's tensors.
struct Call {
    x: View,
    dt: View,
    a: Buf,
    b: Buf,
    c: Buf,
    d: Option<Buf>,
    z: Option<View>,
    dt_bias: Option<Buf>,
    flags: u32,
    state: View,
    out: View,
    seqs: Seqs,
}

impl Call {
    /// A Falcon-Mamba-7B layer over `lens`, token-major or channel-major.
    fn mamba1(lens: &[usize], channel_major_views: bool, initial: bool) -> Call {
        let (t, nh, n) = (lens.iter().sum(), D_INNER, MAMBA1_N);
        let act = |seed, scale| match channel_major_views {
            true => channel_major(DType::BF16, t, nh, seed, scale),
            false => View::compact(Buf::random(DType::BF16, &[t, nh, 1], seed, scale)),
        };
        let mut dt = act(62, 0.5);
        dt.shape.pop();
        if let Some(s) = dt.strides.as_mut() {
            s.pop();
        }
        let out = match channel_major_views {
            true => View {
                buf: Buf::zeros(DType::BF16, &[nh, t]),
                shape: vec![t as i64, nh as i64, 1],
                strides: Some(vec![1, t as i64, 1]),
            },
            false => View::compact(Buf::zeros(DType::BF16, &[t, nh, 1])),
        };
        Call {
            x: act(61, 1.0),
            dt,
            // A = -exp(A_log): Mamba-1 starts from -(n + 1); trained checkpoints spread it.
            a: Buf::uniform(DType::F32, &[nh, n], 63, -16.0, -0.5),
            b: Buf::random(DType::BF16, &[t, 1, n], 64, 1.0),
            c: Buf::random(DType::BF16, &[t, 1, n], 65, 1.0),
            d: Some(Buf::random(DType::F32, &[nh], 66, 1.0)),
            z: Some(act(67, 3.0)),
            dt_bias: Some(Buf::uniform(DType::F32, &[nh], 68, -6.9, -2.25)),
            flags: SSMK_MAMBA2_DT_SOFTPLUS,
            state: View::compact(Buf::random(DType::F32, &[lens.len(), nh, 1, n], 69, 0.1)),
            out,
            seqs: Seqs::new(lens, initial),
        }
    }

    /// Lightning attention over `lens`: `x = v`, `B = k`, `C = q`, a group per head, `dt` ones
    /// (stride 0 over tokens), `A[h] = -s_h`; the state `[S, H, dk, dv]` (vLLM) as a strided
    /// `[S, NH, P, N]` view, or contiguous `[S, NH, P, N]`.
    fn lightning(lens: &[usize], vllm_state: bool) -> Call {
        let (t, h, k) = (lens.iter().sum::<usize>(), LIGHTNING_H, LIGHTNING_DK);
        let qkv = |seed| Buf::random(DType::BF16, &[t, h, k], seed, 1.0);
        let slopes: Vec<f32> = (0..h)
            .map(|i| -(2f32).powf(-8.0 * (i + 1) as f32 / h as f32))
            .collect();
        let a = Buf::zeros(DType::F32, &[h]);
        // SAFETY: `h` f32 fit the buffer.
        unsafe { std::ptr::copy_nonoverlapping(slopes.as_ptr(), a.as_ptr().cast(), h) };
        let shape = vec![lens.len() as i64, h as i64, k as i64, k as i64];
        let state = match vllm_state {
            true => View {
                buf: Buf::random(DType::F32, &[lens.len(), h, k, k], 76, 0.1),
                strides: Some(vec![(h * k * k) as i64, (k * k) as i64, 1, k as i64]),
                shape,
            },
            false => View::compact(Buf::random(DType::F32, &[lens.len(), h, k, k], 76, 0.1)),
        };
        Call {
            x: View::compact(qkv(71)),
            dt: View {
                buf: Buf::uniform(DType::F32, &[h], 72, 1.0, 1.0),
                shape: vec![t as i64, h as i64],
                strides: Some(vec![0, 1]),
            },
            a,
            b: qkv(73),
            c: qkv(74),
            d: None,
            z: None,
            dt_bias: None,
            flags: 0,
            state,
            out: View::compact(Buf::zeros(DType::BF16, &[t, h, k])),
            seqs: Seqs::new(lens, false),
        }
    }

    fn tokens(&self) -> usize {
        self.x.shape[0] as usize
    }

    /// Bytes a call reads and writes once: x, dt, z, out, B, C and the state read and written.
    fn bytes(&self) -> f64 {
        let dt_bytes = match &self.dt.strides {
            Some(s) if s[0] == 0 => 0,
            _ => self.dt.buf.bytes(),
        };
        let z = self.z.as_ref().map_or(0, |z| z.buf.bytes());
        (self.x.buf.bytes()
            + dt_bytes
            + z
            + self.out.buf.bytes()
            + self.b.bytes()
            + self.c.bytes()
            + 2 * self.state.buf.bytes()) as f64
    }

    fn call(&self, isa: Isa, ctx: &Ctx) {
        let opt = |b: &Option<Buf>| b.as_ref().map(Buf::desc);
        let (d, bias) = (opt(&self.d), opt(&self.dt_bias));
        let z = self.z.as_ref().map(View::desc);
        let ptr = |d: &Option<ssmk_tensor>| d.as_ref().map_or(std::ptr::null(), |d| d as *const _);
        let (x, dt, a, b, c) = (
            self.x.desc(),
            self.dt.desc(),
            self.a.desc(),
            self.b.desc(),
            self.c.desc(),
        );
        let (mut state, mut out) = (self.state.desc(), self.out.desc());
        let (cu, idx, init) = self.seqs.descs();
        ok(unsafe {
            with_isa(isa, || {
                ssmk_mamba2_scan(
                    ctx.0,
                    &x,
                    &dt,
                    &a,
                    &b,
                    &c,
                    ptr(&d),
                    ptr(&z),
                    ptr(&bias),
                    f32::NEG_INFINITY,
                    f32::INFINITY,
                    self.flags,
                    &mut state,
                    &cu,
                    &idx,
                    &init,
                    std::ptr::null(),
                    -1,
                    &mut out,
                    std::ptr::null(),
                    std::ptr::null(),
                )
            })
        });
    }
}

fn mamba1_prefill(cfg: &Config, report: &mut Report, lens: &[usize], channel_major: bool) {
    let call = Call::mamba1(lens, channel_major, false);
    let layout = if channel_major {
        "[d_inner,T] views"
    } else {
        "[T,d_inner]"
    };
    let shape = format!("{}x{} d_inner=8192 N=16 {layout}", lens.len(), lens[0]);
    if cfg.simulating() {
        let call_active = |ctx: &Ctx| call.call(Isa::active(), ctx);
        let op = "mamba1_scan prefill";
        return simulate::row(cfg, report, op, shape, call.bytes(), call_active);
    }
    let small = Call::mamba1(&[32], channel_major, false);
    let per_token = time_slow(cfg, || small.call(Isa::Scalar, &Ctx::new(1))) / 32.0;
    let reference = per_token * call.tokens() as f64;
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let (t, memcpy) = report
            .memcpy
            .time_beside(cfg, || call.call(Isa::active(), &ctx));
        let mut r = Row::new(
            "mamba1_scan prefill",
            shape.clone(),
            "bf16 in/f32 state",
            threads,
            t,
            Work::Bytes(call.bytes()),
            "A [NH,N], D, z, dt_bias, softplus; bytes moved; ref timed on 32 tokens, scaled".into(),
        );
        r.vs_reference = Some(reference / t);
        report.push_against(r, "memcpy", memcpy);
    }
}

/// FLOPs of the chunked SSD form with chunk 64 at a group per head, as `mamba2`'s prefill rows
/// count them: `T NH (4 P N + 64 P) + 2 T NH 64 N`.
fn lightning_flops(tokens: usize) -> f64 {
    let (t, h, k) = (tokens as f64, LIGHTNING_H as f64, LIGHTNING_DK as f64);
    t * h * (4.0 * k * k + 64.0 * k) + 2.0 * t * h * 64.0 * k
}

fn lightning_prefill(cfg: &Config, report: &mut Report, lens: &[usize]) {
    let (vllm, contiguous) = (Call::lightning(lens, true), Call::lightning(lens, false));
    if cfg.simulating() {
        let op = "lightning_attn prefill";
        let shape = format!(
            "{}x{} H=64 dk=dv=128 [S,H,dk,dv] state",
            lens.len(),
            lens[0]
        );
        let call_active = |ctx: &Ctx| vllm.call(Isa::active(), ctx);
        return simulate::row(cfg, report, op, shape, vllm.bytes(), call_active);
    }
    let small = Call::lightning(&[64], true);
    let reference =
        time_slow(cfg, || small.call(Isa::Scalar, &Ctx::new(1))) * vllm.tokens() as f64 / 64.0;
    let flops = lightning_flops(vllm.tokens());
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        for (call, state) in [
            (&vllm, "[S,H,dk,dv] state"),
            (&contiguous, "contiguous state"),
        ] {
            let (t, peak) = time_beside_peak(cfg, || call.call(Isa::active(), &ctx));
            let mut r = Row::new(
                "lightning_attn prefill",
                format!("{}x{} H=64 dk=dv=128 {state}", lens.len(), lens[0]),
                "bf16 in/f32 state",
                threads,
                t,
                Work::Flops(flops),
                "dt ones (stride 0), no D/z; ref timed on 64 tokens, scaled".into(),
            );
            r.vs_reference = Some(reference / t);
            report.push_against(r, "f32 FMA peak 1t", peak);
        }
    }
}

pub fn run(cfg: &Config, report: &mut Report) {
    let (long, short) = (cfg.pick(2048, 128), cfg.pick(512, 32));
    mamba1_prefill(cfg, report, &[long], false);
    if !cfg.simulating() {
        mamba1_prefill(cfg, report, &[long], true);
    }
    mamba1_prefill(cfg, report, &[short; 4], false);
    let batch = cfg.pick(64, 8);
    let decode = Call::mamba1(&vec![1; batch], false, true);
    layers::decode_rows(
        cfg,
        report,
        "mamba1_scan decode",
        format!("B={batch} d_inner=8192 N=16"),
        "bf16 in/f32 state",
        2.0 * decode.state.buf.bytes() as f64,
        decode.bytes(),
        |isa, ctx| decode.call(isa, ctx),
    );
    lightning_prefill(cfg, report, &[cfg.pick(2048, 128)]);
}
