//! The oracle: the per-token recurrence of ABI.md §4.11 in f64, one task per (sequence, head).
//! Slow and simple on purpose; the SIMD recurrence is tested against it.

use super::DplrRule;
use crate::kernels::StateWrite;
use crate::kernels::strided::{Strided, load_row, read_f32, write_f32};
use crate::runtime::Context;

/// # Safety
/// As for [`super::dplr_delta_rule`].
pub unsafe fn dplr_delta_rule(ctx: &Context, args: &DplrRule) {
    let heads = args.heads;
    ctx.for_each(args.sequences.len() * heads, |task| {
        // SAFETY: each task owns the output rows and state slots of its (sequence, head).
        unsafe { sequence_head(args, task / heads, task % heads) }
    });
}

/// Reads `[K, V]` of a state slot as f64 (`store` false) or writes it (`store` true).
unsafe fn transfer(args: &DplrRule, slot: usize, h: usize, s: &mut [f64], store: bool) {
    let st = args
        .state
        .as_ref()
        .expect("a state slot without a state tensor");
    let (kd, vd) = (args.k_dim, args.v_dim);
    for i in 0..kd {
        for j in 0..vd {
            let p = st.at(&[slot, h, i, j]);
            unsafe {
                match store {
                    true => write_f32(p, st.dtype, s[i * vd + j] as f32),
                    false => s[i * vd + j] = read_f32(p, st.dtype) as f64,
                }
            }
        }
    }
}

/// Row `[token, h, ..]` of `t` as f64.
unsafe fn row(t: &Strided, token: usize, h: usize, out: &mut [f64]) {
    let mut f = vec![0f32; out.len()];
    unsafe { load_row(t.at(&[token, h]), t.dtype, t.strides[2], &mut f) };
    for (o, x) in out.iter_mut().zip(f) {
        *o = x as f64;
    }
}

unsafe fn sequence_head(args: &DplrRule, b: usize, h: usize) {
    let seq = &args.sequences[b];
    let (kd, vd) = (args.k_dim, args.v_dim);
    let out = &args.out;
    if seq.padded {
        for t in seq.start..seq.start + seq.len {
            for j in 0..vd {
                unsafe { write_f32(out.at(&[t, h, j]), out.dtype, 0.0) };
            }
        }
        return;
    }
    let mut s = vec![0f64; kd * vd];
    if let Some(slot) = seq.read {
        unsafe { transfer(args, slot, h, &mut s, false) };
    }
    let [mut r, mut w, mut k, mut a, mut bb] = std::array::from_fn(|_| vec![0f64; kd]);
    let (mut v, mut sa) = (vec![0f64; vd], vec![0f64; vd]);
    for (i, t) in (seq.start..seq.start + seq.len).enumerate() {
        unsafe {
            row(&args.r, t, h, &mut r);
            row(&args.w, t, h, &mut w);
            row(&args.k, t, h, &mut k);
            row(&args.a, t, h, &mut a);
            row(&args.b, t, h, &mut bb);
            row(&args.v, t, h, &mut v);
        }
        sa.fill(0.0);
        for x in 0..kd {
            for j in 0..vd {
                sa[j] += a[x] * s[x * vd + j];
            }
        }
        for x in 0..kd {
            let d = args.decay(w[x] as f32);
            for j in 0..vd {
                s[x * vd + j] = d * s[x * vd + j] + bb[x] * sa[j] + k[x] * v[j];
            }
        }
        for j in 0..vd {
            let o: f64 = (0..kd).map(|x| r[x] * s[x * vd + j]).sum();
            unsafe {
                write_f32(
                    out.at(&[t, h, j]),
                    out.dtype,
                    (o * args.scale as f64) as f32,
                )
            };
        }
        if let StateWrite::PerToken(slots) = &seq.write
            && let Some(slot) = slots[i]
        {
            unsafe { transfer(args, slot, h, &mut s, true) };
        }
        for cp in seq.checkpoints_after(i + 1) {
            unsafe { transfer(args, cp.slot, h, &mut s, true) };
        }
    }
    if let StateWrite::Final(slot) = seq.write {
        unsafe { transfer(args, slot, h, &mut s, true) };
    }
}
