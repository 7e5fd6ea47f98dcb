"""An ssmk call right after a torch GEMM: on the calling thread against on ssmk's pool.

A script, not a test: the pattern of a vLLM step, whose OpenMP workers keep spinning on the
other cores after each GEMM while the recurrent layer's ssmk call wants those cores for its own
workers. This is what ``ssmk.vllm`` decides its decode calls' ``num_threads`` from
(``SSMK_VLLM_DECODE_THREADS``, docs/vllm.md).

Each row: the median (and mean) time of one call over interleaved repetitions of
``torch.mm`` (``[16, 2048] x [2048, 6144]`` f32 on ``torch.get_num_threads()`` threads) then the
ssmk call with ``num_threads=1`` or ``num_threads=N`` (N = ``--threads``), at realistic layer
sizes: Qwen3.5's Gated DeltaNet (32 v-heads, K = V = 128), Nemotron-H's Mamba-2 (64 heads of 64,
N 128, 8 groups), LFM2's ShortConv (D 2048); decodes at batch 1 and 16 and single-sequence
prefills. Run with any venv holding torch and ssmk::

    OMP_NUM_THREADS=2 python cbindings/python/bench/pool_handoff.py --threads 2
"""

import argparse
import statistics
import time

import torch

import ssmk.torch as st


def gdn(b, t):
    hv, k = 32, 128
    n = b * t
    q = torch.randn(n, 16, k, dtype=torch.bfloat16)
    kk = torch.randn(n, 16, k, dtype=torch.bfloat16)
    v = torch.randn(n, hv, k, dtype=torch.bfloat16)
    g, beta = -0.1 * torch.rand(n, hv), torch.rand(n, hv, dtype=torch.bfloat16)
    pool = torch.zeros(b + 1, hv, k, k)
    qsl = torch.arange(0, n + 1, t, dtype=torch.int32)
    idx = torch.arange(1, b + 1, dtype=torch.int32)
    his = torch.ones(b, dtype=torch.bool)
    return lambda nt: st.gated_delta_rule(q, kk, v, g, beta, state=pool, cu_seqlens=qsl,
                                          state_indices=idx, has_initial_state=his,
                                          qk_l2norm=True, num_threads=nt)


def mamba2(b, t):
    nh, p, ns, g = 64, 64, 128, 8
    n = b * t
    x, dt = torch.randn(n, nh, p), torch.rand(n, nh)
    a, d, bias = -torch.rand(nh), torch.rand(nh), torch.rand(nh)
    bb, cc = torch.randn(n, g, ns), torch.randn(n, g, ns)
    pool = torch.zeros(b + 1, nh, p, ns)
    qsl = torch.arange(0, n + 1, t, dtype=torch.int32)
    idx = torch.arange(1, b + 1, dtype=torch.int32)
    his = torch.ones(b, dtype=torch.bool)
    return lambda nt: st.mamba2_scan(x, dt, a, bb, cc, d, None, bias, dt_softplus=True,
                                     state=pool, cu_seqlens=qsl, state_indices=idx,
                                     has_initial_state=his, num_threads=nt)


def short_conv(b, t):
    dim, n = 2048, b * t
    bcx, w = torch.randn(n, 3 * dim), torch.randn(dim, 3)
    states = torch.zeros(b + 1, 2, dim)
    qsl = torch.arange(0, n + 1, t, dtype=torch.int32)
    idx = torch.arange(1, b + 1, dtype=torch.int32)
    his = torch.ones(b, dtype=torch.bool)
    return lambda nt: st.short_conv(bcx, w, None, states, qsl, idx, his, num_threads=nt)


CASES = [("Gated DeltaNet", gdn), ("Mamba-2", mamba2), ("ShortConv", short_conv)]
SHAPES = [("decode", 1, 1), ("decode", 16, 1), ("prefill", 1, 64), ("prefill", 1, 256),
          ("prefill", 1, 1024)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    torch.manual_seed(0)
    w, h = torch.randn(2048, 6144), torch.randn(16, 2048)
    n = args.threads
    print(f"torch threads {torch.get_num_threads()}, ssmk pool {n} threads")
    print(f"| layer | call | batch x tokens | 1 thread: median (mean) us | {n} threads: median "
          "(mean) us |")
    print("|---|---|---|---|---|")
    for name, make in CASES:
        for kind, b, t in SHAPES:
            call = make(b, t)
            call(1)
            call(n)
            times = {1: [], n: []}
            for i in range(max(6, args.reps * 16 // (b * t + 15))):
                for nt in ((1, n) if i % 2 else (n, 1)):
                    torch.mm(h, w)  # the OpenMP workers spin on after this
                    t0 = time.perf_counter()
                    call(nt)
                    times[nt].append(time.perf_counter() - t0)

            def fmt(xs):
                return f"{statistics.median(xs) * 1e6:.0f} ({statistics.mean(xs) * 1e6:.0f})"

            print(f"| {name} | {kind} | {b} x {t} | {fmt(times[1])} | {fmt(times[n])} |",
                  flush=True)


if __name__ == "__main__":
    main()
