//! LFM2 ShortConv (ABI.md §4.7): the fused `C * conv(B * x)` against the same-run memcpy and
//! against the three-pass composition (`B*x`, `ssmk_causal_conv1d_fwd`, `C*y`), plus LFM2-like
//! layer steps (chunked prefill, a decode step) against the portable reference kernels.

use half::bf16;
use ssmk::dtype::DType;
use ssmk::ffi::conv::{SSMK_ACTIVATION_NONE, ssmk_causal_conv1d_fwd};
use ssmk::ffi::short_conv::ssmk_short_conv;
use ssmk::runtime::{Isa, with_isa};

use crate::buffers::Buf;
use crate::harness::{Config, Ctx, Report, Row, Work, ok, time};
use crate::layers::Seqs;
use crate::simulate;

/// One ShortConv call's tensors: `lens` sequences in slots `0..`, continuing iff `initial`.
struct Step {
    bcx: Buf,
    weight: Buf,
    bias: Buf,
    states: Buf,
    out: Buf,
    seqs: Seqs,
    dim: usize,
}

impl Step {
    fn new(lens: &[usize], initial: bool, dim: usize, width: usize) -> Step {
        let tokens: usize = lens.iter().sum();
        Step {
            bcx: Buf::random(DType::BF16, &[tokens, 3 * dim], 21, 1.0),
            weight: Buf::random(DType::BF16, &[dim, width], 22, 0.5),
            bias: Buf::random(DType::BF16, &[dim], 23, 0.1),
            states: Buf::random(DType::BF16, &[lens.len(), width - 1, dim], 24, 1.0),
            out: Buf::zeros(DType::BF16, &[tokens, dim]),
            seqs: Seqs::new(lens, initial),
            dim,
        }
    }

    fn call(&self, isa: Isa, ctx: &Ctx) {
        let (bcx, w, b) = (self.bcx.desc(), self.weight.desc(), self.bias.desc());
        let (q, i, h) = self.seqs.descs();
        let (mut s, mut o) = (self.states.desc(), self.out.desc());
        ok(unsafe {
            with_isa(isa, || {
                ssmk_short_conv(
                    ctx.0,
                    &bcx,
                    &w,
                    &b,
                    &mut s,
                    &q,
                    &i,
                    &h,
                    -1,
                    &mut o,
                    std::ptr::null(),
                    std::ptr::null(),
                )
            })
        });
    }

    /// The unfused composition: `B*x` into a bf16 buffer, the conv, then `C*y` into `out`.
    fn composed(&self, ctx: &Ctx, bx: &Buf, y: &Buf) {
        let d = self.dim;
        let rows = self.out.shape[0] as usize;
        let bcx =
            unsafe { std::slice::from_raw_parts(self.bcx.as_ptr().cast::<bf16>(), rows * 3 * d) };
        let bxs = unsafe { std::slice::from_raw_parts_mut(bx.as_ptr().cast::<bf16>(), rows * d) };
        for (r, row) in bcx.chunks_exact(3 * d).enumerate() {
            for c in 0..d {
                bxs[r * d + c] = bf16::from_f32(row[c].to_f32() * row[2 * d + c].to_f32());
            }
        }
        let (xd, w, b) = (bx.desc(), self.weight.desc(), self.bias.desc());
        let (q, i, h) = self.seqs.descs();
        let (mut s, mut yd) = (self.states.desc(), y.desc());
        ok(unsafe {
            ssmk_causal_conv1d_fwd(
                ctx.0,
                &xd,
                &w,
                &b,
                &mut s,
                &q,
                &i,
                &h,
                SSMK_ACTIVATION_NONE,
                -1,
                &mut yd,
                std::ptr::null(),
                std::ptr::null(),
            )
        });
        let ys = unsafe { std::slice::from_raw_parts(y.as_ptr().cast::<bf16>(), rows * d) };
        let out =
            unsafe { std::slice::from_raw_parts_mut(self.out.as_ptr().cast::<bf16>(), rows * d) };
        for (r, row) in bcx.chunks_exact(3 * d).enumerate() {
            for c in 0..d {
                out[r * d + c] = bf16::from_f32(row[d + c].to_f32() * ys[r * d + c].to_f32());
            }
        }
    }
}

/// The kernel alone: T = 4 x 512, D = 1024, W = 3.
fn kernel(cfg: &Config, report: &mut Report) {
    let (dim, len) = (1024, cfg.pick(512, 128));
    let step = Step::new(&[len; 4], false, dim, 3);
    let tokens = 4 * len;
    let (bx, y) = (
        Buf::zeros(DType::BF16, &[tokens, dim]),
        Buf::zeros(DType::BF16, &[tokens, dim]),
    );
    let bytes = (tokens * 4 * dim + 4 * 2 * dim * 2) * 2;
    let shape = format!("T={tokens} (4x{len}) D={dim} W=3");
    if cfg.simulating() {
        let call_active = |ctx: &Ctx| step.call(Isa::active(), ctx);
        return simulate::row(cfg, report, "short_conv", shape, bytes as f64, call_active);
    }
    let reference = time(cfg, || step.call(Isa::Scalar, &Ctx::new(1)));
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let (t, memcpy) = report
            .memcpy
            .time_beside(cfg, || step.call(Isa::active(), &ctx));
        let composed = time(cfg, || step.composed(&ctx, &bx, &y));
        let note = format!("{:.2}x faster than B*x, conv, C*y passes", composed / t);
        let mut r = Row::new(
            "short_conv",
            shape.clone(),
            "bf16",
            threads,
            t,
            Work::Bytes(bytes as f64),
            note,
        );
        r.vs_reference = Some(reference / t);
        report.push_against(r, "memcpy", memcpy);
    }
}

/// LFM2-like layer steps: (a) 4 prompts x 512 tokens prefilled in 128-token chunks (timed per
/// chunk step), (b) one decode step of 64 sequences.
fn layer_steps(cfg: &Config, report: &mut Report) {
    let dim = 1024;
    let chunk = Step::new(&[128; 4], true, dim, 3);
    let decode = Step::new(&[1; 64], true, dim, 3);
    for (name, step, tokens) in [
        ("(a) prefill chunk 4x128", &chunk, 512usize),
        ("(b) decode B=64", &decode, 64),
    ] {
        let reference = time(cfg, || step.call(Isa::Scalar, &Ctx::new(1)));
        for &threads in &cfg.threads {
            let ctx = Ctx::new(threads);
            let t = time(cfg, || step.call(Isa::active(), &ctx));
            let note = format!("{:.0} tokens/s", tokens as f64 / t);
            let mut r = Row::new(
                "LFM2 layer step",
                format!("{name} D={dim} W=3"),
                "bf16",
                threads,
                t,
                Work::Bytes((tokens * 4 * dim * 2) as f64),
                note,
            );
            r.vs_reference = Some(reference / t);
            report.push(r);
        }
    }
}

pub fn run(cfg: &Config, report: &mut Report) {
    kernel(cfg, report);
    if !cfg.simulating() {
        layer_steps(cfg, report);
    }
}
