//! The oracle: the per-token recurrence of ABI.md §4.4 in f64, one task per (sequence, v-head),
//! with one decay per v-head or per key channel.
//! Slow and simple on purpose; the SIMD paths are tested against it.

use super::{DeltaRule, StateWrite, load_row, read_f32, write_f32};
use crate::dtype::DType;
use crate::kernels::simd::LOG_DECAY_FLOOR;
use crate::runtime::Context;

/// # Safety
/// As for [`super::gated_delta_rule`].
pub unsafe fn gated_delta_rule(ctx: &Context, args: &DeltaRule) {
    let hv_count = args.v_heads;
    ctx.for_each(args.sequences.len() * hv_count, |task| {
        // SAFETY: each task owns the output rows and state slots of its (sequence, v-head).
        unsafe { sequence_head(args, task / hv_count, task % hv_count) }
    });
}

/// Reads `[K, V]` of a state slot as f64.
unsafe fn load_state(args: &DeltaRule, slot: usize, hv: usize, s: &mut [f64]) {
    let st = args
        .state
        .as_ref()
        .expect("a state slot without a state tensor");
    let (kd, vd) = (args.k_dim, args.v_dim);
    for i in 0..kd {
        for j in 0..vd {
            s[i * vd + j] = unsafe { read_f32(st.at(&[slot, hv, i, j]), st.dtype) } as f64;
        }
    }
}

unsafe fn store_state(args: &DeltaRule, slot: usize, hv: usize, s: &[f64]) {
    let st = args
        .state
        .as_ref()
        .expect("a state slot without a state tensor");
    let (kd, vd) = (args.k_dim, args.v_dim);
    for i in 0..kd {
        for j in 0..vd {
            unsafe { write_f32(st.at(&[slot, hv, i, j]), st.dtype, s[i * vd + j] as f32) };
        }
    }
}

/// Loads a `[.., K]` row as f64, l2-normalised (with eps) when asked.
unsafe fn load_normalised(
    p: *const u8,
    dtype: DType,
    stride: usize,
    eps: Option<f32>,
    out: &mut [f64],
) {
    let mut row = vec![0f32; out.len()];
    unsafe { load_row(p, dtype, stride, &mut row) };
    let norm = match eps {
        Some(eps) => {
            1.0 / (row.iter().map(|&x| x as f64 * x as f64).sum::<f64>() + eps as f64).sqrt()
        }
        None => 1.0,
    };
    for (o, &x) in out.iter_mut().zip(&row) {
        *o = x as f64 * norm;
    }
}

unsafe fn sequence_head(args: &DeltaRule, b: usize, hv: usize) {
    let seq = &args.sequences[b];
    let (kd, vd) = (args.k_dim, args.v_dim);
    let out = &args.out;
    if seq.padded {
        for t in seq.start..seq.start + seq.len {
            for j in 0..vd {
                unsafe { write_f32(out.at(&[t, hv, j]), out.dtype, 0.0) };
            }
        }
        return;
    }
    let h = args.qk_head(hv);
    let mut s = vec![0f64; kd * vd];
    if let Some(slot) = seq.read {
        unsafe { load_state(args, slot, hv, &mut s) };
    }
    let (mut q, mut k, mut vrow) = (vec![0f64; kd], vec![0f64; kd], vec![0f32; vd]);
    let mut kv = vec![0f64; vd];
    // Log-decay of each state row (the one per-head value repeated without `per_channel`).
    let mut g_row = vec![0f32; kd];
    for (i, t) in (seq.start..seq.start + seq.len).enumerate() {
        unsafe {
            load_normalised(
                args.q.at(&[t, h]),
                args.q.dtype,
                args.q.strides[2],
                args.l2norm_eps,
                &mut q,
            );
            load_normalised(
                args.k.at(&[t, h]),
                args.k.dtype,
                args.k.strides[2],
                args.l2norm_eps,
                &mut k,
            );
            load_row(
                args.v.at(&[t, hv]),
                args.v.dtype,
                args.v.strides[2],
                &mut vrow,
            );
        }
        let (g, beta) = unsafe { args.gate(t, hv) };
        if args.per_channel {
            unsafe { args.log_decays(t, hv, &mut g_row) };
        } else {
            g_row.iter_mut().for_each(|x| *x = g);
        }
        kv.iter_mut().for_each(|x| *x = 0.0);
        for r in 0..kd {
            // The kernels' clamp (NaN and -inf act as `LOG_DECAY_FLOOR`), so every path agrees.
            let decay = (g_row[r].max(LOG_DECAY_FLOOR) as f64).exp();
            for j in 0..vd {
                s[r * vd + j] *= decay;
                kv[j] += s[r * vd + j] * k[r];
            }
        }
        for j in 0..vd {
            let delta = beta as f64 * (vrow[j] as f64 - kv[j]);
            let mut o = 0f64;
            for r in 0..kd {
                s[r * vd + j] += k[r] * delta;
                o += s[r * vd + j] * q[r];
            }
            unsafe {
                write_f32(
                    out.at(&[t, hv, j]),
                    out.dtype,
                    (o * args.scale as f64) as f32,
                )
            };
        }
        if let StateWrite::PerToken(slots) = &seq.write
            && let Some(slot) = slots[i]
        {
            unsafe { store_state(args, slot, hv, &s) };
        }
        for cp in seq.checkpoints_after(i + 1) {
            unsafe { store_state(args, cp.slot, hv, &s) };
        }
    }
    if let StateWrite::Final(slot) = seq.write {
        unsafe { store_state(args, slot, hv, &s) };
    }
}
