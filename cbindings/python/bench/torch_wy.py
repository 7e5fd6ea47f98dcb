"""ssmk_gated_delta_rule against a PyTorch chunked WY prefill in the same process, one thread each.

The torch side is what a user's fallback would run: the chunked WY form (chunk 64) with GQA
expansion, l2-normalised q/k, the triangular solve for T = (I + A)^-1 and the chunk loop, all in
f32 on torch's CPU kernels (MKL/oneDNN GEMMs). Both take the same bf16 inputs, f32 state.

    python3 cbindings/python/bench/torch_wy.py [--tokens 2048] [--kda]   # needs torch; not part of CI
"""
import argparse
import time

import torch

import ssmk


def torch_chunked_wy(q, k, v, g, beta, chunk=64):
    """o [T,HV,V], S [HV,K,V]; q,k [T,H,K], v [T,HV,V], g [T,HV] (or [T,HV,K]), beta [T,HV]."""
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    f = lambda x: x.float().transpose(0, 1).reshape(HV, T // chunk, chunk, *x.shape[2:])
    norm = lambda x: x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)
    q = f(norm(q.float()).repeat_interleave(HV // H, 1)) * K**-0.5
    k = f(norm(k.float()).repeat_interleave(HV // H, 1))
    v, beta, g = f(v), f(beta), f(g).cumsum(2)
    per_channel = g.dim() == 4
    lower = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    if per_channel:  # exp(G_i - G_j) per channel: the pairwise [C, C, K] form (no exp(+G)).
        diff = g[..., :, None, :] - g[..., None, :, :]
        decay = diff.masked_fill(~lower[..., None], -float("inf")).exp()
        kk = torch.einsum("hnik,hnjk,hnijk->hnij", k, k, decay)
        qk = torch.einsum("hnik,hnjk,hnijk->hnij", q, k, decay)
        eg, glast = g.exp(), g[:, :, -1:, :]
    else:
        decay = (g[..., :, None] - g[..., None, :]).masked_fill(~lower, -float("inf")).exp()
        kk, qk = k @ k.transpose(-1, -2) * decay, q @ k.transpose(-1, -2) * decay
        eg, glast = g.exp()[..., None], g[:, :, -1:, None]
    a = (kk * beta[..., None]).tril(-1)
    eye = torch.eye(chunk)
    tinv = torch.linalg.solve_triangular(eye + a, eye.expand_as(a), upper=False)
    u = tinv @ (v * beta[..., None])
    w = tinv @ (k * beta[..., None] * eg)
    p = qk.tril()
    s = torch.zeros(HV, K, V)
    out = torch.empty_like(v)
    for c in range(T // chunk):
        vn = u[:, c] - w[:, c] @ s
        out[:, c] = (q[:, c] * eg[:, c]) @ s + p[:, c] @ vn
        gc = g[:, c] if per_channel else g[:, c, :, None]
        kdec = k[:, c] * (glast[:, c] - gc).exp()
        sdec = glast[:, c, 0].exp()  # [HV, K] or [HV, 1]
        s = s * sdec[..., None] + kdec.transpose(-1, -2) @ vn
    return out.reshape(HV, T, V).transpose(0, 1), s


def best_of(n, f):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--kda", action="store_true", help="per-channel decay, H = HV = 32")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    T, K, V = args.tokens, 128, 128
    H, HV = (32, 32) if args.kda else (16, 32)
    gen = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=gen)
    q, k, v = (rnd(T, H, K).bfloat16(), rnd(T, H, K).bfloat16(), rnd(T, HV, V).bfloat16())
    g = -0.2 * torch.rand(*((T, HV, K) if args.kda else (T, HV)), generator=gen) - 0.001
    beta = (0.05 + 0.9 * torch.rand(T, HV, generator=gen)).bfloat16()
    state = torch.zeros(1, HV, K, V)
    out = torch.empty(T, HV, V, dtype=torch.bfloat16)
    ctx = ssmk.Context(1)

    def run_ssmk():
        ssmk.gated_delta_rule(q, k, v, g, beta, out, state=state, flags=ssmk.GDN_QK_L2NORM,
                              l2norm_eps=1e-6, ctx=ctx)

    with torch.no_grad():
        ref, ref_state = torch_chunked_wy(q, k, v, g, beta.float())
        run_ssmk()
        err = (out.float() - ref).abs().max().item() / ref.abs().max().item()
        serr = (state[0] - ref_state).abs().max().item() / ref_state.abs().max().item()
        t_torch = best_of(args.reps, lambda: torch_chunked_wy(q, k, v, g, beta.float()))
    t_ssmk = best_of(args.reps, run_ssmk)
    kind = "KDA" if args.kda else "GDN"
    print(f"{kind} 1x{T} H={H} HV={HV} K=V=128, 1 thread: torch chunked WY {t_torch * 1e3:.1f} ms, "
          f"ssmk {t_ssmk * 1e3:.1f} ms, ssmk {t_torch / t_ssmk:.2f}x faster "
          f"(max rel diff out {err:.1e}, state {serr:.1e}; torch {torch.__version__})")


if __name__ == "__main__":
    main()
