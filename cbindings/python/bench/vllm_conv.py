"""ssmk's causal conv against vLLM's CPU conv paths, side by side in one process (run locally, not in CI).

The conv rows of vLLM's CPU GDN layer (``gdn_attention.py``), Qwen3-Next's conv (D = 8192, width
4, bias, silu), x and the conv-state pool bf16 (vLLM's ``[S, L, D]`` pool seen as ``[S, D, L]``):

* prefill 4x512 from existing states;
* decode B = 64 and B = 256, beside a same-run in-place read-modify-write pass over the same state
  bytes (the bound of an in-place update).

vLLM takes one of two paths, as its GDN layer picks them: on a CPU with AVX512-BF16 its C++ ops
``torch.ops._C.causal_conv1d_fwd_cpu`` / ``causal_conv1d_update_cpu`` on the weight packed by
``causal_conv1d_weight_pack`` (``--vllm-lib default`` loads the ``_C.abi3.so`` that has them);
elsewhere ``causal_conv1d_fn_cpu`` (a torch ``conv1d`` per sequence) and
``causal_conv1d_update_cpu`` (``_C.causal_conv1d_update_cpu_vec``). The header line says which ran.
Outputs and states are compared (max abs difference), then timed as ``vllm_gdn.py`` times them::

    SSMK_LIBRARY=target/release/libssmk.so /tmp/vllmenv/bin/python cbindings/python/bench/vllm_conv.py --threads 1,2
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

D, W = 8192, 4


def inputs(lens, seed):
    """x [T,D], weight [D,W], bias [D] bf16; a pool of len(lens)+1 slots [S,W-1,D] bf16 (slot b+1
    holds sequence b's window: vLLM keeps slot 0 as its null block); cu_seqlens and slots int32."""
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).bfloat16()
    x, weight, bias = r(T, D), r(D, W, scale=0.5), r(D, scale=0.1)
    pool = r(len(lens) + 1, W - 1, D)
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)
    idx = torch.arange(1, len(lens) + 1, dtype=torch.int32)
    return x, weight, bias, pool, cu, idx


def max_diff(x, y):
    return (x.double() - y.double()).abs().max().item()


def vllm_ops(packed):
    """vLLM's conv prefill and update as its GDN layer calls them on this CPU: ``(fwd, update)``
    taking ``(x, weight, bias, pool, cu, idx)`` / ``(x, weight, bias, pool, idx)``."""
    if packed:
        def fwd(x, w, b, pool, cu, idx):
            has = torch.ones(idx.numel(), dtype=torch.bool)
            return torch.ops._C.causal_conv1d_fwd_cpu(
                x.t(), w, b, pool.transpose(1, 2), cu, idx, has, True, -1, True).t()

        def update(x, w, b, pool, idx):
            return torch.ops._C.causal_conv1d_update_cpu(
                x, pool.transpose(1, 2), w, b, True, None, idx, -1, True)
        return fwd, update

    from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import (
        causal_conv1d_fn_cpu, causal_conv1d_update_cpu)

    def fwd(x, w, b, pool, cu, idx):
        has = torch.ones(idx.numel(), dtype=torch.bool)
        return causal_conv1d_fn_cpu(x.t(), w, b, pool.transpose(1, 2), cu, idx, has, "silu").t()

    def update(x, w, b, pool, idx):
        return causal_conv1d_update_cpu(x, pool.transpose(1, 2), w, b, "silu", idx)
    return fwd, update


def row(lens, decode, threads, reps, packed, seed):
    x, weight, bias, pool0, cu, idx = inputs(lens, seed)
    fwd, update = vllm_ops(packed)
    w_vllm = torch.ops._C.causal_conv1d_weight_pack(weight) if packed else weight
    pools = {"vllm": pool0.clone(), "ssmk": pool0.clone(), "rmw": pool0.clone()}
    live = pools["rmw"][1:]
    has = torch.ones(len(lens), dtype=torch.bool)

    if decode:
        def vllm():
            return update(x, w_vllm, bias, pools["vllm"], idx)

        def ssmk_():
            return st.causal_conv1d_update(x, pools["ssmk"], weight, bias, idx,
                                           activation="silu", num_threads=threads)
    else:
        def vllm():
            return fwd(x, w_vllm, bias, pools["vllm"], cu, idx)

        def ssmk_():
            return st.causal_conv1d_fwd(x, weight, bias, pools["ssmk"], cu, idx, has,
                                        activation="silu", num_threads=threads)

    def rmw():
        live.mul_(0.999)  # reads and writes each state byte once, in place

    o_v, o_s = vllm(), ssmk_()
    diffs = (max_diff(o_s, o_v), max_diff(pools["ssmk"], pools["vllm"]))
    fns = {"vllm": vllm, "ssmk": ssmk_}
    if decode:
        fns["rmw"] = rmw
    times = best_ms(fns, reps)
    return times, diffs, times.get("rmw")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm-lib", default="avx2")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    path = load_vllm(args.vllm_lib)
    packed = torch.cpu._is_avx512_bf16_supported() and hasattr(torch.ops._C, "causal_conv1d_fwd_cpu")
    path_name = ("_C.causal_conv1d_fwd_cpu / _C.causal_conv1d_update_cpu, packed weight" if packed
                 else "causal_conv1d_fn_cpu (torch) / _C.causal_conv1d_update_cpu_vec")
    print(f"cpu: {cpu_model()}; torch {torch.__version__}; vllm lib {os.path.basename(path)} "
          f"({path_name}); ssmk {ssmk.version()} isa {ssmk.active_isa()}")
    print(TABLE_HEADER)
    load0 = os.getloadavg()[0]
    torch.set_grad_enabled(False)
    rows = [("conv prefill 4x512", [512] * 4, False), ("conv decode B=64", [1] * 64, True),
            ("conv decode B=256", [1] * 256, True)]
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for i, (name, lens, decode) in enumerate(rows):
            times, diffs, bound = row(lens, decode, threads, args.reps, packed, seed=i)
            print(table_row(name, threads, times, diffs, bound), flush=True)
    load1 = os.getloadavg()[0]
    print(f"\nload average (1 min) at start {load0:.2f}, at end {load1:.2f}")


if __name__ == "__main__":
    main()
