//! The oracle: the per-token recurrence of ABI.md §4.9 in f64, one task per (sequence, head).
//! Slow and simple on purpose; the SIMD paths are tested against it.

use super::{Scan, clamp};
use crate::kernels::StateWrite;
use crate::kernels::simd::LOG_DECAY_FLOOR;
use crate::kernels::strided::{read_f32, write_f32};
use crate::runtime::Context;

/// # Safety
/// As for [`super::mamba2_scan`].
pub unsafe fn mamba2_scan(ctx: &Context, args: &Scan) {
    let heads = args.heads;
    ctx.for_each(args.sequences.len() * heads, |task| {
        // SAFETY: each task owns the output rows and state slots of its (sequence, head).
        unsafe { sequence_head(args, task / heads, task % heads) }
    });
}

/// `log(1 + e^x)`, or `x` above 20 (ABI.md §4.8).
fn softplus(x: f64) -> f64 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// Runs one (sequence, head) token by token.
unsafe fn sequence_head(args: &Scan, b: usize, h: usize) {
    let seq = &args.sequences[b];
    let (pd, nd) = (args.head_dim, args.state_dim);
    let out = &args.out;
    if seq.padded {
        for t in seq.start..seq.start + seq.len {
            for p in 0..pd {
                unsafe { write_f32(out.at(&[t, h, p]), out.dtype, 0.0) };
            }
        }
        return;
    }
    let st = args.state.as_ref();
    let mut s = vec![0f64; pd * nd];
    if let Some(slot) = seq.read {
        let st = st.expect("a state slot without a state tensor");
        for (i, x) in s.iter_mut().enumerate() {
            *x = unsafe { read_f32(st.at(&[slot, h, i / nd, i % nd]), st.dtype) } as f64;
        }
    }
    let store = |slot: usize, s: &[f64]| {
        let st = st.expect("a state slot without a state tensor");
        for (i, &x) in s.iter().enumerate() {
            unsafe { write_f32(st.at(&[slot, h, i / nd, i % nd]), st.dtype, x as f32) };
        }
    };
    let g = args.group(h);
    let a: Vec<f64> = (0..nd).map(|n| args.a_at(h, n) as f64).collect();
    let dskip = args.d[h] as f64;
    let mut decay = vec![0f64; nd];
    for i in 0..seq.len {
        let t = seq.start + i;
        let raw =
            unsafe { read_f32(args.dt.at(&[t, h]), args.dt.dtype) } as f64 + args.dt_bias[h] as f64;
        let d = if args.dt_softplus { softplus(raw) } else { raw };
        let d = clamp(d, args.dt_min as f64, args.dt_max as f64);
        for (e, &a) in decay.iter_mut().zip(&a) {
            // The kernels' clamp (a NaN or -inf exponent acts as `LOG_DECAY_FLOOR`).
            *e = (d * a).max(LOG_DECAY_FLOOR as f64).exp();
        }
        let read = |x: &crate::kernels::strided::Strided, idx: &[usize]| unsafe {
            read_f32(x.at(idx), x.dtype) as f64
        };
        let bt: Vec<f64> = (0..nd).map(|n| read(&args.b, &[t, g, n])).collect();
        let ct: Vec<f64> = (0..nd).map(|n| read(&args.c, &[t, g, n])).collect();
        for p in 0..pd {
            let xp = read(&args.x, &[t, h, p]);
            let row = &mut s[p * nd..(p + 1) * nd];
            let mut y = 0f64;
            for n in 0..nd {
                row[n] = decay[n] * row[n] + d * xp * bt[n];
                y += row[n] * ct[n];
            }
            y += dskip * xp;
            if let Some(z) = &args.z {
                let zp = read(z, &[t, h, p]);
                y *= zp / (1.0 + (-zp).exp());
            }
            unsafe { write_f32(out.at(&[t, h, p]), out.dtype, y as f32) };
        }
        if let StateWrite::PerToken(slots) = &seq.write
            && let Some(slot) = slots[i]
        {
            store(slot, &s);
        }
        for cp in seq.checkpoints_after(i + 1) {
            store(cp.slot, &s);
        }
    }
    if let StateWrite::Final(slot) = seq.write {
        store(slot, &s);
    }
}
