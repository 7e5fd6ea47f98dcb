//! Portable reference: one sequence, one channel at a time, straight from the definition. It is the
//! oracle for the vector kernels (same fused multiply-add order, so they agree bit for bit except
//! through silu's `exp`) and the path for strided channels.

use super::{MAX_WIDTH, Problem, StateUpdate, load_f32, store_f32};
use crate::dtype::DType;

/// `v` rounded to the precision of `dtype` (what storing and reloading it gives).
pub fn round_to(dtype: DType, v: f32) -> f32 {
    let mut cell = [0u8; 4];
    unsafe {
        store_f32(cell.as_mut_ptr(), dtype, 0, v);
        load_f32(cell.as_ptr(), dtype, 0)
    }
}

/// `x / (1 + e^-x)`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `bias + sum_k weight[k] * window[k]`, accumulated tap by tap with fused multiply-adds (the
/// order every variant uses), then the activation.
#[inline(always)]
pub fn output(weight: &[f32], window: &[f32], bias: f32, use_silu: bool) -> f32 {
    let mut acc = bias;
    for (w, x) in weight.iter().zip(window) {
        acc = w.mul_add(*x, acc);
    }
    if use_silu { silu(acc) } else { acc }
}

/// Computes sequence `b`'s outputs and updates its slot.
///
/// # Safety
/// `p` is validated: every address it implies lies in caller memory, and no other thread touches
/// sequence `b`'s output rows or slot.
pub unsafe fn sequence(p: &Problem, b: usize) {
    let s = &p.seqs[b];
    let w = p.width;
    let out_at = |t: usize, c: usize| (t * p.out_tok + c * p.out_ch, s.out);
    for c in 0..p.channels {
        if s.pad {
            for t in 0..s.len {
                let (i, ptr) = out_at(t, c);
                unsafe { store_f32(ptr, p.act, i, 0.0) };
            }
            continue;
        }
        // Element of token t, channel c, `back` elements before x (B and C precede x in bcx).
        let at = |t: usize, back: usize| unsafe {
            load_f32(
                s.x.wrapping_sub(back * p.act.size()),
                p.act,
                t * p.x_tok + c * p.x_ch,
            )
        };
        // The conv's input: x, or ShortConv's `B * x` as the activation dtype stores it.
        let x = |t: usize| match p.gates {
            None => at(t, 0),
            Some(g) => round_to(p.act, at(t, g.b_back) * at(t, 0)),
        };
        let first_row = match s.update {
            StateUpdate::Append => 0,
            StateUpdate::Rolling { accepted } => accepted - 1,
        };
        let slot = |row: usize| row * p.state_row + c * p.state_ch;
        // history[j] = input at relative time j - (W-1), j in 0..W-1.
        let mut history = [0f32; MAX_WIDTH];
        if let (Some(st), true) = (s.state, s.read_state) {
            for (j, h) in history.iter_mut().enumerate().take(w - 1) {
                *h = unsafe { load_f32(st, p.state_dtype, slot(first_row + j)) };
            }
        }
        let mut weight = [0f32; MAX_WIDTH];
        for (k, wk) in weight.iter_mut().enumerate().take(w) {
            *wk = unsafe { p.weight.get(c, k) };
        }
        let bias = p.bias.map_or(0.0, |m| unsafe { m.get(c, 0) });
        // Input at relative time i (negative: history).
        let input = |i: isize| {
            if i < 0 {
                history[(w as isize - 1 + i) as usize]
            } else {
                x(i as usize)
            }
        };
        let mut window = [0f32; MAX_WIDTH];
        for t in 0..s.len {
            for (k, v) in window.iter_mut().enumerate().take(w) {
                *v = input(t as isize + k as isize - (w as isize - 1));
            }
            let (i, ptr) = out_at(t, c);
            let mut y = output(&weight[..w], &window[..w], bias, p.silu);
            if let Some(g) = p.gates {
                y = at(t, g.c_back) * round_to(p.act, y);
            }
            unsafe { store_f32(ptr, p.act, i, y) };
        }
        let Some(st) = s.state else { continue };
        match s.update {
            StateUpdate::Append => {
                // Row j := input at relative time len - (W-1) + j. Read all before writing.
                let mut rows = [0f32; MAX_WIDTH];
                for (j, r) in rows.iter_mut().enumerate().take(w - 1) {
                    *r = input(s.len as isize - (w as isize - 1) + j as isize);
                }
                for (j, &v) in rows.iter().enumerate().take(w - 1) {
                    unsafe { store_f32(st, p.state_dtype, slot(j), v) };
                }
            }
            StateUpdate::Rolling { accepted } => {
                let keep = w - 2;
                for r in 0..keep {
                    let v = unsafe { load_f32(st, p.state_dtype, slot(r + accepted)) };
                    unsafe { store_f32(st, p.state_dtype, slot(r), v) };
                }
                for q in 0..s.len {
                    unsafe { store_f32(st, p.state_dtype, slot(keep + q), x(q)) };
                }
            }
        }
    }
}
