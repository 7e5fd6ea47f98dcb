"""llama.cpp's Mamba-1 scan (ggml_ssm_scan) against ssmk_mamba2_scan on the same data.

Side by side (not CI): llama.cpp's Mamba-1 scan (``ggml_ssm_scan`` with ``A {d_state, d_inner}``,
through ``ggml-python``, which builds ggml from its PyPI sdist with ``-march=native``) against
``ssmk_mamba2_scan`` with ``A [d_inner, N]`` on the same data, a Falcon-Mamba-7B layer (d_inner
8192, N 16), f32, one thread by default.

The same work on both sides: ggml's op applies softplus to ``dt`` and has no D skip, no z gate
and no dt bias (llama.cpp computes those around it), so ssmk runs with the softplus flag and
NULL D, z and dt_bias; both start from a given state (ggml always does; ssmk with
``has_initial_state``) and write the final state. The outputs are compared before timing.

ggml-python is not in the torch venv: make a venv of its own, e.g.::

    python3 -m venv /tmp/ggml-venv && /tmp/ggml-venv/bin/pip install scikit-build-core cmake ninja numpy
    /tmp/ggml-venv/bin/pip install --no-build-isolation --no-binary ggml-python ggml-python==0.0.45
    SSMK_LIBRARY=target/release/libssmk.so /tmp/ggml-venv/bin/python cbindings/python/bench/mamba1_ggml.py

(the ssmk side is the ctypes package, which needs no torch).
"""

import argparse
import ctypes
import os
import sys
import time

import numpy as np

import ggml
import ggml.utils

try:
    import ssmk
except ImportError:
    # The package's source, cbindings/python.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import ssmk


def best(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def case(d_inner, N, L, seqs, threads, repeat, rng):
    """(ggml seconds, ssmk seconds, max relative difference) for ``seqs`` sequences of L tokens."""
    x = rng.standard_normal((seqs, L, d_inner), dtype=np.float32)
    dt = rng.standard_normal((seqs, L, d_inner), dtype=np.float32) - 3.0
    A = -(np.arange(1, N + 1, dtype=np.float32) * (1 + 0.5 * rng.random((d_inner, N), dtype=np.float32)))
    B = rng.standard_normal((seqs, L, 1, N), dtype=np.float32)
    C = rng.standard_normal((seqs, L, 1, N), dtype=np.float32)
    s0 = 0.5 * rng.standard_normal((seqs, d_inner, 1, N), dtype=np.float32)

    # ggml: ne = {innermost, ...}; numpy views of the tensors' memory (outermost first).
    size = 4 * (3 * x.size + 2 * B.size + 2 * s0.size + A.size) + (64 << 20)
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=size, mem_buffer=None, no_alloc=False))
    F32 = ggml.GGML_TYPE_F32
    gs = ggml.ggml_new_tensor_4d(ctx, F32, N, 1, d_inner, seqs)
    gx = ggml.ggml_new_tensor_4d(ctx, F32, 1, d_inner, L, seqs)
    gdt = ggml.ggml_new_tensor_3d(ctx, F32, d_inner, L, seqs)
    gA = ggml.ggml_new_tensor_2d(ctx, F32, N, d_inner)
    gB = ggml.ggml_new_tensor_4d(ctx, F32, N, 1, L, seqs)
    gC = ggml.ggml_new_tensor_4d(ctx, F32, N, 1, L, seqs)
    gids = ggml.ggml_new_tensor_1d(ctx, ggml.GGML_TYPE_I32, seqs)
    for t, v in ((gs, s0), (gx, x), (gdt, dt), (gA, A), (gB, B), (gC, C)):
        ggml.utils.to_numpy(t)[...] = v.reshape(ggml.utils.to_numpy(t).shape)
    ggml.utils.to_numpy(gids)[...] = np.arange(seqs, dtype=np.int32)
    res = ggml.ggml_ssm_scan(ctx, gs, gx, gdt, gA, gB, gC, gids)
    gf = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(gf, res)

    def run_ggml():
        ggml.ggml_graph_compute_with_ctx(ctx, gf, threads)

    t_ggml = best(run_ggml, repeat)
    flat = ggml.utils.to_numpy(res)
    y_ggml = flat[:x.size].reshape(x.shape)
    s_ggml = flat[x.size:].reshape(s0.shape)

    # ssmk on the same arrays: x, dt [T, d_inner(, 1)], B/C [T, 1, N], state [S, d_inner, 1, N].
    T = seqs * L
    out = np.empty((T, d_inner, 1), dtype=np.float32)
    state = s0.copy()
    cu = np.arange(seqs + 1, dtype=np.int32) * L
    init = np.ones(seqs, dtype=np.uint8)
    c = ssmk.Context(threads)
    args = [ssmk.tensor(x.reshape(T, d_inner, 1)), ssmk.tensor(dt.reshape(T, d_inner)), ssmk.tensor(A),
            ssmk.tensor(B.reshape(T, 1, N)), ssmk.tensor(C.reshape(T, 1, N)), ssmk.tensor(out)]
    kw = dict(flags=ssmk.MAMBA2_DT_SOFTPLUS, state=ssmk.tensor(state), cu_seqlens=ssmk.tensor(cu),
              has_initial_state=ssmk.tensor(init), ctx=c)

    def run_ssmk():
        ssmk.mamba2_scan(*args, **kw)

    run_ssmk()  # from s0, as ggml's run
    diff = max(np.abs(out.reshape(y_ggml.shape) - y_ggml).max() / np.abs(y_ggml).max(),
               np.abs(state - s_ggml).max() / np.abs(s_ggml).max())
    # Timed runs continue from the state they leave (in place, as a runtime's pool), at the same cost;
    # ggml reads its source state and writes the result's copy every run.
    t_ssmk = best(run_ssmk, repeat)
    ggml.ggml_free(ctx)
    return t_ggml, t_ssmk, diff


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--d-inner", type=int, default=8192)
    ap.add_argument("--state", type=int, default=16)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"ggml-python {getattr(ggml, '__version__', '?')}, ssmk {ssmk.version()} ({ssmk.active_isa()}), "
          f"{args.threads} thread(s); Mamba-1 scan, d_inner {args.d_inner}, N {args.state}, f32")
    print(f"{'':28s} {'ggml':>12s} {'ssmk':>12s} {'speed-up':>9s} {'max rel diff':>13s}")
    for name, L, seqs in (("prefill 1x2048", 2048, 1), ("prefill 4x512", 512, 4), ("decode B=1", 1, 1),
                          ("decode B=64", 1, 64)):
        g, s, d = case(args.d_inner, args.state, L, seqs, args.threads, args.repeat, rng)
        unit, scale = ("us/token", 1e6 / (L * seqs)) if L > 1 else ("us/step", 1e6)
        print(f"{name:28s} {g * scale:9.2f} us {s * scale:9.2f} us {g / s:8.1f}x {d:13.1e}  ({unit})", flush=True)


if __name__ == "__main__":
    main()
