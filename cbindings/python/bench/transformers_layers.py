"""One recurrent layer of realistic size through transformers, with and without ssmk.transformers.

The layer is transformers' own module class (random weights, no download), called as its decoder
layer calls it, with a ``DynamicCache``: a prefill of ``--prefill`` tokens (batch ``--batch``), then
``--decode`` single-token decode steps. "torch" = transformers 5.24's torch reference kernels (what
runs on CPU today); "ssmk" = the same module with ``ssmk.transformers.enable()``: its conv and scan
kernel functions go to ssmk, every other op (projections, gates, norms) stays torch. Both at 1 and
2 threads (``torch.set_num_threads``, which ssmk follows). Each figure is the best of
``--repeats`` runs (the machine may be shared), torch and ssmk runs interleaved.

Layers (``--layers``; default ``qwen3_next,lfm2``):

* ``qwen3_next``: ``Qwen3NextGatedDeltaNet``, Qwen3-Next-80B-A3B's linear attention: hidden 2048,
  16 q/k heads, 32 v heads, head dim 128, conv width 4 (Qwen3.5 uses the same layer shape);
* ``lfm2``: ``Lfm2ShortConv``, LFM2's ShortConv at hidden 1024, conv width 3 (LFM2-350M);
* ``kimi_linear``: ``KimiLinearDeltaAttention``, Kimi-Linear-48B-A3B's KDA: hidden 2304, 32 heads
  of dim 128, conv width 4;
* ``nemotron_h``: ``NemotronHMamba2Mixer``, Nemotron-H-8B's Mamba-2: hidden 4096, 128 heads of dim 64,
  state 128, 8 groups, conv width 4, chunk 128.

Run from the repository root (install-free)::

    SSMK_LIBRARY=target/release/libssmk.so python cbindings/python/bench/transformers_layers.py
    ... --layers qwen3_next,lfm2,kimi_linear,nemotron_h --dtype float32,bfloat16 --repeats 5
"""

import argparse
import importlib
import math
import os
import sys
import time
import warnings

# Install-free from the repository: the parent directory holds the ssmk package; the library is
# $SSMK_LIBRARY, else target/release/libssmk.so when built, else the package's own search.
_PACKAGE_SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _PACKAGE_SOURCE)
_LIB = os.path.join(_PACKAGE_SOURCE, "..", "..", "target", "release", "libssmk.so")
if "SSMK_LIBRARY" not in os.environ and os.path.exists(_LIB):
    os.environ["SSMK_LIBRARY"] = os.path.abspath(_LIB)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers as T  # noqa: E402
from transformers import DynamicCache  # noqa: E402

import ssmk  # noqa: E402
import ssmk.transformers as st  # noqa: E402


def qwen3_next():
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    cfg = T.Qwen3NextConfig(
        hidden_size=2048, num_hidden_layers=1, layer_types=["linear_attention"],
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, num_attention_heads=16, num_key_value_heads=2, head_dim=256)
    return cfg, Qwen3NextGatedDeltaNet(cfg, layer_idx=0), "GDN 16/32 heads x 128, W=4"


def lfm2():
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    cfg = T.Lfm2Config(hidden_size=1024, num_hidden_layers=1, layer_types=["conv"], conv_L_cache=3,
                       num_attention_heads=16, num_key_value_heads=8)
    return cfg, Lfm2ShortConv(cfg, layer_idx=0), "ShortConv hidden 1024, W=3"


def kimi_linear():
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

    cfg = T.KimiLinearConfig(
        hidden_size=2304, num_hidden_layers=1, layer_types=["linear_attention"], mlp_layer_types=["dense"],
        linear_num_heads=32, linear_head_dim=128, linear_conv_kernel_dim=4, num_attention_heads=32,
        num_key_value_heads=32)
    return cfg, KimiLinearDeltaAttention(cfg, layer_idx=0), "KDA 32 heads x 128, W=4"


def nemotron_h():
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    cfg = T.NemotronHConfig(
        hidden_size=4096, layers_block_type=["linear_attention"], mamba_num_heads=128, mamba_head_dim=64,
        ssm_state_size=128, n_groups=8, conv_kernel=4, chunk_size=128, num_attention_heads=32,
        num_key_value_heads=8)
    return cfg, NemotronHMamba2Mixer(cfg, layer_idx=0), "Mamba-2 128 heads x 64, N=128, G=8, W=4"


LAYERS = {"qwen3_next": qwen3_next, "lfm2": lfm2, "kimi_linear": kimi_linear, "nemotron_h": nemotron_h}


def init_recurrent_parameters(layer):
    """What the model's ``_init_weights`` gives the parameters a bare layer leaves uninitialised
    (``torch.empty``): A_log = log U(1, 16), dt_bias = softplus^-1(dt) with dt log-uniform in
    [1e-3, 1e-1], D = 1. Linear and conv weights keep torch's default init."""
    with torch.no_grad():
        for name, p in layer.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "A_log":
                p.copy_(torch.empty_like(p).uniform_(1.0, 16.0).log())
            elif leaf == "dt_bias":
                dt = torch.empty_like(p).uniform_(math.log(1e-3), math.log(1e-1)).exp().clamp_min(1e-4)
                p.copy_(dt + torch.log(-torch.expm1(-dt)))
            elif leaf == "D":
                p.fill_(1.0)


class KernelTimer:
    """Accumulates the wall time spent in the family's kernel functions (whichever they are now:
    transformers' torch references or ssmk's replacements) while active."""

    def __init__(self, family):
        self.module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        self.names = st.FAMILIES[family]
        self.seconds = 0.0

    def _wrap(self, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        return timed

    def __enter__(self):
        self.saved = {n: getattr(self.module, n) for n in self.names}
        for n, fn in self.saved.items():
            setattr(self.module, n, self._wrap(fn))
        return self

    def __exit__(self, *exc):
        for n, fn in self.saved.items():
            setattr(self.module, n, fn)

    def take(self):
        s, self.seconds = self.seconds, 0.0
        return s


def run(cfg, layer, x_prefill, x_decode, timer):
    """Seconds for (prefill, its kernels, one decode step, its kernels) and the outputs."""
    steps = max(x_decode.shape[1], 1)
    cache = DynamicCache(config=cfg)
    timer.take()
    t0 = time.perf_counter()
    y_prefill = layer(x_prefill, cache=cache)
    t1 = time.perf_counter()
    k_prefill = timer.take()
    ys = []
    for i in range(x_decode.shape[1]):
        ys.append(layer(x_decode[:, i:i + 1], cache=cache))
    t2 = time.perf_counter()
    k_decode = timer.take() / steps
    return (t1 - t0, k_prefill, (t2 - t1) / steps, k_decode), (y_prefill, torch.cat(ys, 1) if ys else None)


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="qwen3_next,lfm2")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--dtype", default="float32", help="comma list of float32, bfloat16")
    p.add_argument("--prefill", type=int, default=2048)
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    print(f"transformers {T.__version__}, torch {torch.__version__}, ssmk {ssmk.version()} ({ssmk.active_isa()}), "
          f"batch {args.batch}, prefill {args.prefill} tokens, {args.decode} decode steps, best of {args.repeats}")
    rows = []
    print("times in ms: layer torch, ssmk, speed-up (the same for the kernel functions alone)")
    header = (f"{'layer':12s} {'dtype':8s} {'thr':>3s} | {'prefill: layer':>26s} {'(kernels)':>26s} | "
              f"{'decode step: layer':>21s} {'(kernels)':>22s} | {'rel diff':>8s}")
    print(header)
    print("-" * len(header))
    for name in args.layers.split(","):
        for dtype_name in args.dtype.split(","):
            dtype = getattr(torch, dtype_name)
            torch.manual_seed(0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cfg, layer, desc = LAYERS[name]()
            init_recurrent_parameters(layer)
            layer = layer.eval().to(dtype)
            hidden = cfg.hidden_size
            g = torch.Generator().manual_seed(1)
            x_prefill = torch.randn(args.batch, args.prefill, hidden, generator=g).to(dtype)
            x_decode = torch.randn(args.batch, args.decode, hidden, generator=g).to(dtype)
            thread_counts = [int(t) for t in args.threads.split(",")]
            best = {(n, mode): [float("inf")] * 4 for n in thread_counts for mode in ("torch", "ssmk")}
            outs = {}
            with torch.inference_mode():
                # Repetitions outermost, thread counts and torch/ssmk interleaved inside: a burst of
                # load from other processes hits every configuration alike; the first pass warms up.
                for rep in range(args.repeats + 1):
                    for threads in thread_counts:
                        torch.set_num_threads(threads)
                        for mode in ("torch", "ssmk"):
                            if mode == "ssmk":
                                st.enable([name])
                            try:
                                with KernelTimer(name) as timer:
                                    times, out = run(cfg, layer, x_prefill, x_decode, timer)
                            finally:
                                st.disable()
                            outs[mode] = out
                            if rep:
                                best[threads, mode] = [min(b, t) for b, t in zip(best[threads, mode], times)]
            diff = max(rel(outs["ssmk"][0], outs["torch"][0]),
                       rel(outs["ssmk"][1], outs["torch"][1]) if args.decode else 0.0)
            for threads in thread_counts:
                row = (name, dtype_name, threads, best[threads, "torch"], best[threads, "ssmk"], diff, desc)
                rows.append(row)
                print(line(*row[:6]), flush=True)
    print()
    print("layer = the whole module forward (projections, gates and norms included); kernels = the time inside the "
          "replaced kernel functions")
    print()
    print("| layer | dtype | threads | prefill: torch | ssmk | speed-up (kernels) | decode step: torch | ssmk | "
          "speed-up (kernels) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, dtype_name, threads, (pt, kpt, dt, kdt), (ps, kps, ds, kds), diff, desc in rows:
        print(f"| {name} ({desc}) | {dtype_name} | {threads} | {pt * 1e3:.1f} ms | {ps * 1e3:.1f} ms | "
              f"{pt / ps:.2f}x ({kpt / kps:.1f}x) | {dt * 1e3:.2f} ms | {ds * 1e3:.2f} ms | "
              f"{dt / ds:.2f}x ({kdt / kds:.1f}x) |")


def line(name, dtype_name, threads, t, s, diff):
    (pt, kpt, dt, kdt), (ps, kps, ds, kds) = t, s
    return (f"{name:12s} {dtype_name:8s} {threads:3d} | {pt * 1e3:9.1f} {ps * 1e3:8.1f} {pt / ps:5.2f}x "
            f"({kpt * 1e3:8.1f} {kps * 1e3:7.1f} {kpt / kps:5.1f}x) | {dt * 1e3:7.2f} {ds * 1e3:6.2f} {dt / ds:5.2f}x "
            f"({kdt * 1e3:6.2f} {kds * 1e3:5.2f} {kdt / kds:5.1f}x) | {diff:8.1e}")


if __name__ == "__main__":
    main()
