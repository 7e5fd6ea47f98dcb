//! Causal conv1d (ABI.md §4.1–4.2): varlen prefill with states and the decode update, as
//! bandwidth against the same-run memcpy over the bytes each call must move, and as speed-up over
//! the portable reference run through the same entry point.

use ssmk::dtype::DType;
use ssmk::ffi::conv::{SSMK_ACTIVATION_SILU, ssmk_causal_conv1d_fwd, ssmk_causal_conv1d_update};
use ssmk::runtime::{Isa, with_isa};
use ssmk::tensor::ssmk_tensor;

use crate::buffers::Buf;
use crate::harness::{Config, Ctx, Report, Row, Work, ok, time};
use crate::layers;
use crate::simulate;

pub fn short(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => "?",
    }
}

/// Times `call(isa, ctx)` with the active kernels at each thread count and with the portable
/// reference at one thread, and pushes one row per thread count. Returns seconds per byte at 1 thread.
fn measure(
    cfg: &Config,
    report: &mut Report,
    template: Row,
    bytes: usize,
    mut call: impl FnMut(Isa, &Ctx) -> i32,
) -> f64 {
    if cfg.simulating() {
        let (op, shape) = (template.op.as_str(), template.shape.clone());
        let call_active = |ctx: &Ctx| ok(call(Isa::active(), ctx));
        simulate::row(cfg, report, op, shape, bytes as f64, call_active);
        return f64::NAN;
    }
    let reference = time(cfg, || ok(call(Isa::Scalar, &Ctx::new(1))));
    let mut per_byte = f64::NAN;
    for &threads in &cfg.threads {
        let ctx = Ctx::new(threads);
        let (t, memcpy) = report
            .memcpy
            .time_beside(cfg, || ok(call(Isa::active(), &ctx)));
        if threads == 1 {
            per_byte = t / bytes as f64;
        }
        let row = Row {
            threads,
            seconds: t,
            work: Work::Bytes(bytes as f64),
            vs_reference: Some(reference / t),
            ..template.clone()
        };
        report.push_against(row, "memcpy", memcpy);
    }
    per_byte
}

/// Prefill: `seqs` sequences of `len` tokens, the first half continuing from a saved state.
fn fwd(
    cfg: &Config,
    report: &mut Report,
    dtype: DType,
    seqs: usize,
    len: usize,
    dim: usize,
    width: usize,
) -> f64 {
    let tokens = seqs * len;
    let x = Buf::random(dtype, &[tokens, dim], 1, 1.0);
    let out = Buf::zeros(dtype, &[tokens, dim]);
    let weight = Buf::random(dtype, &[dim, width], 2, 0.5);
    let bias = Buf::random(dtype, &[dim], 3, 0.1);
    let states = Buf::random(dtype, &[seqs, width - 1, dim], 4, 1.0);
    let starts = Buf::ints(&(0..=seqs).map(|s| (s * len) as i64).collect::<Vec<_>>());
    let slots = Buf::ints(&(0..seqs as i64).collect::<Vec<_>>());
    let initial = Buf::mask(&(0..seqs).map(|s| s < seqs / 2).collect::<Vec<_>>());
    let (xd, wd, bd, qd, id, hd) = (
        x.desc(),
        weight.desc(),
        bias.desc(),
        starts.desc(),
        slots.desc(),
        initial.desc(),
    );
    let (mut sd, mut od) = (states.desc(), out.desc());
    let state_bytes = (width - 1) * dim * dtype.size();
    // x read, out written, weights, the states read (half) and written (all).
    let bytes = 2 * x.bytes() + weight.bytes() + bias.bytes() + (seqs / 2 + seqs) * state_bytes;
    let template = Row::new(
        "causal_conv1d_fwd",
        format!("T={tokens} ({seqs}x{len}) D={dim} W={width}"),
        short(dtype),
        1,
        0.0,
        Work::Bytes(0.0),
        "silu, bias, 2 of 4 with state".into(),
    );
    measure(cfg, report, template, bytes, |isa, ctx| unsafe {
        with_isa(isa, || {
            ssmk_causal_conv1d_fwd(
                ctx.0,
                &xd,
                &wd,
                &bd,
                &mut sd,
                &qd,
                &id,
                &hd,
                SSMK_ACTIVATION_SILU,
                -1,
                &mut od,
                std::ptr::null(),
                std::ptr::null(),
            )
        })
    })
}

/// The prefill of one `len`-token sequence storing its state at every 128th token (ABI.md
/// §4.10, vLLM's CPU block size) in slots `1..`, timed beside the same prefill without them.
pub fn fwd_checkpoints(cfg: &Config, report: &mut Report, dtype: DType, len: usize, dim: usize) {
    let width = 4;
    let x = Buf::random(dtype, &[len, dim], 1, 1.0);
    let out = Buf::zeros(dtype, &[len, dim]);
    let weight = Buf::random(dtype, &[dim, width], 2, 0.5);
    let (offsets, slots, n) = layers::checkpoint_tables(len, 1);
    let states = Buf::random(dtype, &[1 + n, width - 1, dim], 4, 1.0);
    let (xd, wd, od, sd) = (x.desc(), weight.desc(), out.desc(), states.desc());
    let (cod, csd) = (offsets.desc(), slots.desc());
    let call = |ctx: &Ctx, checkpoints: bool| {
        let (mut s, mut o) = (sd, od);
        let (co, cs) = match checkpoints {
            true => (&cod as *const ssmk_tensor, &csd as *const ssmk_tensor),
            false => (std::ptr::null(), std::ptr::null()),
        };
        ok(unsafe {
            ssmk_causal_conv1d_fwd(
                ctx.0,
                &xd,
                &wd,
                std::ptr::null(),
                &mut s,
                std::ptr::null(),
                std::ptr::null(),
                std::ptr::null(),
                SSMK_ACTIVATION_SILU,
                -1,
                &mut o,
                co,
                cs,
            )
        })
    };
    let bytes = 2 * x.bytes() + weight.bytes() + (width - 1) * dim * dtype.size();
    layers::checkpoint_rows(
        cfg,
        report,
        "causal_conv1d_fwd + checkpoints",
        format!("T={len} (1x{len}) D={dim} W={width}"),
        short(dtype),
        Work::Bytes(bytes as f64),
        |ctx| call(ctx, true),
        |ctx| call(ctx, false),
    );
}

/// Decode: one token for each of `batch` sequences, slots in reverse order.
fn update(cfg: &Config, report: &mut Report, dtype: DType, batch: usize, dim: usize, width: usize) {
    let x = Buf::random(dtype, &[batch, dim], 5, 1.0);
    let out = Buf::zeros(dtype, &[batch, dim]);
    let weight = Buf::random(dtype, &[dim, width], 6, 0.5);
    let bias = Buf::random(dtype, &[dim], 7, 0.1);
    let states = Buf::random(dtype, &[batch, width - 1, dim], 8, 1.0);
    let slots = Buf::ints(&(0..batch as i64).rev().collect::<Vec<_>>());
    let (xd, wd, bd, id) = (x.desc(), weight.desc(), bias.desc(), slots.desc());
    let (mut sd, mut od) = (states.desc(), out.desc());
    let bytes = 2 * x.bytes() + 2 * states.bytes() + weight.bytes() + bias.bytes();
    let template = Row::new(
        "causal_conv1d_update",
        format!("B={batch} D={dim} W={width}"),
        short(dtype),
        1,
        0.0,
        Work::Bytes(0.0),
        "silu, bias".into(),
    );
    let mut call = |isa, ctx: &Ctx| unsafe {
        with_isa(isa, || {
            ssmk_causal_conv1d_update(
                ctx.0,
                &xd,
                &mut sd,
                &wd,
                &bd,
                &id,
                std::ptr::null(),
                SSMK_ACTIVATION_SILU,
                -1,
                &mut od,
            )
        })
    };
    measure(cfg, report, template, bytes, &mut call);
    if cfg.simulating() {
        return;
    }
    // Against the bound of an in-place update of the same state bytes, as the other decodes.
    let call = std::cell::RefCell::new(call);
    layers::decode_rows(
        cfg,
        report,
        "causal_conv1d_update",
        format!("B={batch} D={dim} W={width} state"),
        short(dtype),
        2.0 * states.bytes() as f64,
        bytes as f64,
        |isa, ctx| ok(call.borrow_mut()(isa, ctx)),
    );
}

pub fn run(cfg: &Config, report: &mut Report) {
    let (len, dim) = (cfg.pick(512, 128), cfg.pick(8192, 2048));
    if cfg.simulating() {
        fwd(cfg, report, DType::BF16, 4, len, dim, 4);
        fwd(cfg, report, DType::BF16, 1, 4 * len, dim, 4);
        update(cfg, report, DType::BF16, cfg.pick(256, 64), dim, 4);
        return;
    }
    let bf16 = fwd(cfg, report, DType::BF16, 4, len, dim, 4);
    for dtype in [DType::F32, DType::F16] {
        let other = fwd(cfg, report, dtype, 4, len, dim, 4);
        report.fact(
            &format!("conv_fwd_{}_time_per_byte_vs_bf16_1t", short(dtype)),
            format!("{:.2}", other / bf16),
        );
    }
    for batch in [1, cfg.pick(64, 8), cfg.pick(256, 64)] {
        update(cfg, report, DType::BF16, batch, dim, 4);
    }
}
