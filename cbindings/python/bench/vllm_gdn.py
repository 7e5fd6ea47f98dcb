"""ssmk's Gated DeltaNet against vLLM's CPU GDN ops, side by side in one process (run locally, not in CI).

The rows of vLLM's CPU GDN layer (``gdn_attention.py``), Qwen3-Next / Qwen3.5 heads (16 q/k heads,
32 v heads of 128), q/k/v bf16, state f32:

* prefill 1x2048 and 4x512 from existing states: ``torch.ops._C.chunk_gated_delta_rule_cpu``
  (vLLM's gates from ``fused_gdn_gating_cpu``, q/k l2-normalised in the kernel) against
  ``ssmk.torch.gated_delta_rule`` on the same gates;
* decode B = 64 (and B = 1): ``torch.ops._C.fused_sigmoid_gating_delta_rule_update_cpu`` (gates
  fused) against ``ssmk.torch.gdn_gating`` + ``gated_delta_rule``, beside a same-run in-place
  read-modify-write pass over the same state bytes (the bound of an in-place update);
* KDA (Kimi Linear heads), which vLLM has no CPU op for: prefill 1x512 and decode B = 64 against
  the torch forms transformers runs (its "vLLM" column is that peer);

outputs and final states compared (max abs difference), then timed: best of ``--reps`` rounds,
the contenders in turn, each timed call after an untimed one (see ``vllm_mamba2.best_ms``), for
each thread count of ``--threads`` (torch's OpenMP pool and ssmk's context alike).

Setup as in ``vllm_mamba2.py`` (vLLM's ``_C_AVX2.abi3.so`` by default; ``--vllm-lib default``
loads ``_C.abi3.so``, which needs AVX512-BF16)::

    SSMK_LIBRARY=target/release/libssmk.so /tmp/vllmenv/bin/python cbindings/python/bench/vllm_gdn.py
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# First: vllm_mamba2 sizes torch's OpenMP pool from --threads before torch starts it.
from vllm_mamba2 import TABLE_HEADER, best_ms, cpu_model, load_vllm, table_row  # noqa: E402

import torch  # noqa: E402

import ssmk  # noqa: E402
import ssmk.torch as st  # noqa: E402

H, HV, D = 16, 32, 128


def inputs(lens, seed):
    """q, k [T,H,D], v [T,HV,D], the raw gates a, b [T,HV] and A_log, dt_bias [HV] bf16; a state pool
    of len(lens)+1 slots [S,HV,D,D] f32 (slot b holds sequence b's state); cu_seqlens, indices."""
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    r = lambda *s, scale=1.0: torch.randn(*s, generator=g) * scale
    q, k, v = r(T, H, D).bfloat16(), r(T, H, D).bfloat16(), r(T, HV, D, scale=0.5).bfloat16()
    a, b = r(T, HV).bfloat16(), r(T, HV).bfloat16()
    A_log, dt_bias = (torch.rand(HV, generator=g) * 2 - 1).bfloat16(), r(HV, scale=0.5).bfloat16()
    pool = r(len(lens) + 1, HV, D, D, scale=0.05)
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)
    idx = torch.arange(len(lens), dtype=torch.int32)
    return q, k, v, a, b, A_log, dt_bias, pool, cu, idx


def max_diff(x, y):
    return (x.double() - y.double()).abs().max().item()


def prefill_row(lens, threads, reps, seed):
    q, k, v, a, b, A_log, dt_bias, pool0, cu, idx = inputs(lens, seed)
    g, beta = torch.ops._C.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    g, beta = g.reshape(-1, HV), beta.reshape(-1, HV)
    pools = {"vllm": pool0.clone(), "ssmk": pool0.clone()}
    has = torch.ones(len(lens), dtype=torch.bool)

    def vllm():
        out, _ = torch.ops._C.chunk_gated_delta_rule_cpu(
            q[None], k[None], v[None], g[None], beta[None], pools["vllm"], True, cu, False, True,
            idx, 1e-6)
        return out

    def ssmk_():
        return st.gated_delta_rule(q, k, v, g, beta, None, pools["ssmk"], cu, idx, has,
                                   qk_l2norm=True, num_threads=threads)

    o_v, o_s = vllm().reshape(-1, HV, D), ssmk_()
    diffs = (max_diff(o_s, o_v), max_diff(pools["ssmk"], pools["vllm"]))
    times = best_ms({"vllm": vllm, "ssmk": ssmk_}, reps)
    return times, diffs, None


def decode_row(batch, threads, reps, seed):
    q, k, v, a, b, A_log, dt_bias, pool0, cu, idx = inputs([1] * batch, seed)
    pools = {"vllm": pool0.clone(), "ssmk": pool0.clone(), "rmw": pool0.clone()}
    has = torch.ones(batch, dtype=torch.bool)
    live = pools["rmw"][:batch]

    def vllm():
        return torch.ops._C.fused_sigmoid_gating_delta_rule_update_cpu(
            A_log, dt_bias, q[None], k[None], v[None], a, b, pools["vllm"], idx, cu, True,
            1.0, 20.0)

    def ssmk_():
        g, beta = st.gdn_gating(A_log, a, b, dt_bias, num_threads=threads)
        return st.gated_delta_rule(q, k, v, g, beta, None, pools["ssmk"], cu, idx, has,
                                   qk_l2norm=True, num_threads=threads)

    def rmw():
        live.mul_(0.999)  # reads and writes each state byte once, in place

    o_v, o_s = vllm().reshape(-1, HV, D), ssmk_()
    diffs = (max_diff(o_s, o_v), max_diff(pools["ssmk"], pools["vllm"]))
    times = best_ms({"vllm": vllm, "ssmk": ssmk_, "rmw": rmw}, reps)
    return times, diffs, times["rmw"]


def kda_row(lens, threads, reps, seed):
    """KDA (Kimi Linear: H = HV = 32, per-channel log-decay g [T,HV,K] f32), where vLLM has no CPU
    op: against the torch forms transformers runs on CPU (``chunk_kimi_delta_attention``, chunks
    of 64, for a prefill; ``recurrent_kimi_delta_attention`` for a decode of one token per
    sequence), q/k l2-normalised in the kernel, from existing states."""
    from transformers.models.kimi_linear import modeling_kimi_linear as kimi
    g_ = torch.Generator().manual_seed(seed)
    T, n, heads = sum(lens), len(lens), 32
    r = lambda *s, scale=1.0: torch.randn(*s, generator=g_) * scale
    q, k, v = r(T, heads, D).bfloat16(), r(T, heads, D).bfloat16(), r(T, heads, D, scale=0.5).bfloat16()
    g = -torch.rand(T, heads, D, generator=g_) * 0.1 - 1e-3
    beta = torch.rand(T, heads, generator=g_).bfloat16()
    pool0 = r(n, heads, D, D, scale=0.05)
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(n)], dtype=torch.int32)
    idx, has = torch.arange(n, dtype=torch.int32), torch.ones(n, dtype=torch.bool)
    pools = {"vllm": pool0.clone(), "ssmk": pool0.clone()}
    decode = T == n

    def torch_form():
        if decode:  # one token per sequence: batch of n
            out, state = kimi.recurrent_kimi_delta_attention(
                q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], pools["vllm"], True,
                use_qk_l2norm_in_kernel=True)
        else:
            out, state = kimi.chunk_kimi_delta_attention(
                q[None], k[None], v[None], g[None], beta[None], initial_state=pools["vllm"],
                output_final_state=True, use_qk_l2norm_in_kernel=True)
        pools["vllm"].copy_(state)
        return out.reshape(T, heads, D)

    def ssmk_():
        return st.gated_delta_rule(q, k, v, g, beta, None, pools["ssmk"], cu, idx, has,
                                   qk_l2norm=True, num_threads=threads)

    o_t, o_s = torch_form(), ssmk_()
    diffs = (max_diff(o_s, o_t), max_diff(pools["ssmk"], pools["vllm"]))
    fns = {"vllm": torch_form, "ssmk": ssmk_}
    if decode:
        live = pool0.clone()
        fns["rmw"] = lambda: live.mul_(0.999)
    times = best_ms(fns, reps)
    return times, diffs, times.get("rmw")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm-lib", default="avx2")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    path = load_vllm(args.vllm_lib)
    print(f"cpu: {cpu_model()}; torch {torch.__version__}; vllm lib {os.path.basename(path)}; "
          f"ssmk {ssmk.version()} isa {ssmk.active_isa()}")
    print(TABLE_HEADER)
    load0 = os.getloadavg()[0]
    # As vLLM runs models: no autograd, so ssmk.torch calls the library directly.
    torch.set_grad_enabled(False)
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        rows = [("GDN prefill 1x2048", prefill_row, [2048]), ("GDN prefill 4x512", prefill_row, [512] * 4),
                ("GDN decode B=64", decode_row, 64), ("GDN decode B=1", decode_row, 1),
                ("KDA prefill 1x512 (peer: transformers' torch chunked form)", kda_row, [512]),
                ("KDA decode B=64 (peer: transformers' torch recurrence)", kda_row, [1] * 64)]
        for i, (name, fn, shape) in enumerate(rows):
            times, diffs, bound = fn(shape, threads, args.reps, seed=i)
            print(table_row(name, threads, times, diffs, bound), flush=True)
    load1 = os.getloadavg()[0]
    print(f"\nload average (1 min) at start {load0:.2f}, at end {load1:.2f}")


if __name__ == "__main__":
    main()
