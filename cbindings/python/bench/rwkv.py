"""One RWKV-7 (x070) time-mix of BlinkDL's ``rwkv`` package: its CPU torch path against ssmk.rwkv.

Side by side (not CI): one layer of 32 heads of 64 (n_embd 2048, LoRA ranks 96/96/64/256: RWKV-LM's
rules for that width, as in RWKV-7 1.5B), random weights, f32, same process. Rows:

* ``recurrence prefill``: the package's per-token loop of ``RWKV_x070_TMix_seq`` (its code, as a
  TorchScript function of its own here) against one ``ssmk_dplr_delta_rule`` call, on the same
  ``r, w, k, v, kk, a`` and state;
* ``recurrence decode``: the same for one token (``RWKV_x070_TMix_one``'s four lines), B = 1;
* ``time-mix prefill`` / ``time-mix decode``: the whole function (projections, LoRAs, GroupNorm,
  output projection included), the package's against the one ``ssmk.rwkv.enable()`` installs.

Run::

    SSMK_LIBRARY=target/release/libssmk.so python cbindings/python/bench/rwkv.py \
        [--threads 1] [--tokens 2048] [--ref-tokens 256] [--repeat 3]

The package's loop costs the same per token at any length (a ``[64, 64] @ [64, 64]`` matmul per
head and token); ``--ref-tokens`` times it on a shorter prefill and the ratio is per token.
Best of ``--repeat``.
"""

import argparse
import os
import sys
import time

os.environ["RWKV_V7_ON"] = "1"
os.environ["RWKV_CUDA_ON"] = "0"
# Run as a script, this file's directory comes first on sys.path and its name shadows the package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p) != _HERE]

import torch

try:
    import ssmk
except ImportError:
    # The package's source, cbindings/python.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import ssmk
import rwkv.model
import ssmk.rwkv
import ssmk.torch as st

H, N = 32, 64
C = H * N
RANKS = {"w": 96, "a": 96, "v": 64, "g": 256}


@torch.jit.script
def package_loop(state, r, w, k, v, kk, a, H: int, N: int):
    """The recurrence of the package's ``RWKV_x070_TMix_seq`` (0.8.32), verbatim."""
    T = r.shape[0]
    xx = torch.empty_like(r)
    for t in range(T):
        r_, w_, k_, v_, kk_, a_ = r[t], w[t], k[t], v[t], kk[t], a[t]
        vk = v_.view(H, N, 1) @ k_.view(H, 1, N)
        ab = (-kk_).view(H, N, 1) @ (kk_*a_).view(H, 1, N)
        state = state * w_.view(H, 1, N) + state @ ab.float() + vk.float()
        xx[t] = (state.to(dtype=r.dtype) @ r_.view(H, N, 1)).view(H*N)
    return xx, state


_TRUE = torch.ones(1, dtype=torch.bool)


def ssmk_recurrence(state, r, w, k, v, kk, a):
    shape = (-1, H, N)
    return st.dplr_delta_rule(r.view(shape), w.view(shape), k.view(shape), v.view(shape),
                              (-kk).view(shape), (kk * a).view(shape),
                              state=state.unsqueeze(0).transpose(2, 3), has_initial_state=_TRUE,
                              w_linear=True)


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def layer_weights(g):
    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g) * std

    w = {name: torch.rand(C, generator=g) for name in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g")}
    w["w0"], w["a0"], w["v0"] = -6 + 8 * torch.rand(C, generator=g), randn(C), randn(C)
    for lora, rank in RANKS.items():
        w[lora + "1"], w[lora + "2"] = randn(C, rank, std=C ** -0.5), randn(rank, C, std=rank ** -0.5)
    w["k_k"], w["k_a"], w["r_k"] = 0.5 + torch.rand(C, generator=g), torch.rand(C, generator=g), randn(C, std=0.1)
    for proj in ("R_", "K_", "V_", "O_"):
        w[proj] = randn(C, C, std=C ** -0.5)
    w["ln_w"], w["ln_b"] = 1 + randn(C, std=0.1), randn(C, std=0.1)
    return w


def time_mix_args(weights, x, state):
    w = weights
    return (1, H, N, x, torch.zeros(C), torch.randn(x.shape), state, w["x_r"], w["x_w"], w["x_k"],
            w["x_v"], w["x_a"], w["x_g"], w["w0"], w["w1"], w["w2"], w["a0"], w["a1"], w["a2"], w["v0"],
            w["v1"], w["v2"], w["g1"], w["g2"], w["k_k"], w["k_a"], w["r_k"], w["R_"], w["K_"], w["V_"],
            w["O_"], w["ln_w"], w["ln_b"])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--ref-tokens", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    T, T_ref = args.tokens, min(args.ref_tokens, args.tokens)

    r, k, v = (torch.randn(T, C, generator=g) * 0.5 for _ in range(3))
    w = torch.exp(-0.606531 * torch.sigmoid(torch.randn(T, C, generator=g)))
    kk = torch.nn.functional.normalize(torch.randn(T, H, N, generator=g), dim=-1).view(T, C)
    a = torch.rand(T, C, generator=g)
    state0 = torch.randn(H, N, N, generator=g) * 0.1

    print(f"rwkv x070 time-mix, {H} heads of {N}, f32, {args.threads} thread(s), ssmk {ssmk.version()} "
          f"({ssmk.active_isa()}), torch {torch.__version__}")
    rows = []
    with torch.no_grad():
        s = state0.clone()
        ref = lambda: package_loop(state0.clone(), r[:T_ref], w[:T_ref], k[:T_ref], v[:T_ref], kk[:T_ref], a[:T_ref], H, N)
        ref()  # TorchScript's profiling runs
        ref()
        t_ref = best(ref, args.repeat) / T_ref
        t_ssmk = best(lambda: ssmk_recurrence(s.copy_(state0), r, w, k, v, kk, a), args.repeat) / T
        rows.append(("recurrence prefill", T, t_ref, t_ssmk))

        one = [x[:1] for x in (r, w, k, v, kk, a)]
        steps = 200
        ref_one = lambda: [package_loop(state0, *one, H, N) for _ in range(steps)]
        ref_one()
        t_ref = best(ref_one, args.repeat) / steps
        t_ssmk = best(lambda: [ssmk_recurrence(s, *one) for _ in range(steps)], args.repeat) / steps
        rows.append(("recurrence decode", 1, t_ref, t_ssmk))

        weights = layer_weights(g)
        original_seq, original_one = rwkv.model.RWKV_x070_TMix_seq, rwkv.model.RWKV_x070_TMix_one
        ssmk.rwkv.enable()
        routed_seq, routed_one = rwkv.model.RWKV_x070_TMix_seq, rwkv.model.RWKV_x070_TMix_one
        x = torch.randn(T, C, generator=g)
        seq_ref = lambda: original_seq(*time_mix_args(weights, x[:T_ref], state0.clone()))
        seq_ref()
        seq_ref()
        t_ref = best(seq_ref, args.repeat) / T_ref
        seq_ssmk = lambda: routed_seq(*time_mix_args(weights, x, state0.clone()))
        seq_ssmk()
        t_ssmk = best(seq_ssmk, args.repeat) / T
        rows.append(("time-mix prefill", T, t_ref, t_ssmk))

        one_args = time_mix_args(weights, x[0], state0.clone())
        for name, fn in (("ref", original_one), ("ssmk", routed_one)):
            fn(*one_args)
            fn(*one_args)
        t_ref = best(lambda: [original_one(*one_args) for _ in range(steps)], args.repeat) / steps
        t_ssmk = best(lambda: [routed_one(*one_args) for _ in range(steps)], args.repeat) / steps
        rows.append(("time-mix decode", 1, t_ref, t_ssmk))
        ssmk.rwkv.disable()

    print(f"{'':20} {'tokens':>6} {'package us/tok':>15} {'ssmk us/tok':>12} {'ratio':>7}")
    for name, tokens, t_ref, t_ssmk in rows:
        print(f"{name:20} {tokens:>6} {t_ref * 1e6:>15.1f} {t_ssmk * 1e6:>12.2f} {t_ref / t_ssmk:>6.1f}x")


if __name__ == "__main__":
    main()
