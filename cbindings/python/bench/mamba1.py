"""A Mamba-1 layer through transformers' torch path against ssmk.transformers.

Side by side (not CI): a Falcon-Mamba-7B-sized Mamba-1 layer (hidden 4096, d_inner 8192,
N 16, dt_rank 256, conv 4) through transformers' torch path ("slow path": what runs on CPU without
mamba_ssm / causal_conv1d) and through ``ssmk.transformers``, batch 1, one thread by default.

Rows:

* ``scan``: ``mamba_selective_scan`` alone on the layer's own tensors (captured from a prefill:
  channel-major ``u``/``dt``, ``z`` and ``B``/``C`` strided views of the projections), the torch
  reference (per-token loop over precomputed ``exp(dt A)`` and ``dt B u`` tensors) against the
  ssmk replacement (one ``ssmk_mamba2_scan`` call with ``A [8192, 16]``);
* ``state update``: ``mamba_selective_state_update`` alone (one decode token);
* ``layer prefill`` / ``layer decode``: the whole mixer (projections, conv, scan) with and without
  the hook.

Run::

    SSMK_LIBRARY=target/release/libssmk.so python cbindings/python/bench/mamba1.py \
        [--threads 1] [--tokens 2048] [--ref-tokens 512] [--repeat 3]

The torch reference materialises ``[B, d_inner, L, N]`` f32 tensors (1 GiB each at L = 2048) and
loops over tokens in Python; ``--ref-tokens`` times it on a shorter prefill (its cost is linear in
L: the per-token loop and the materialised tensors both are), and the ratio is reported per
token. Same-run ratios; best of ``--repeat``.
"""

import argparse
import os
import sys
import time
import warnings

import torch

try:
    import ssmk
except ImportError:
    # The package's source, cbindings/python.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import ssmk
import ssmk.transformers as st
import transformers as T
import transformers.models.falcon_mamba.modeling_falcon_mamba as fm


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--ref-tokens", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--decode-steps", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    config = T.FalconMambaConfig(hidden_size=4096, state_size=16, expand=2, conv_kernel=4, time_step_rank=256,
                                 num_hidden_layers=1, vocab_size=16)
    # (constructed without its own init, which in 5.24 runs before the mixer's norms exist)
    mixer = fm.FalconMambaMixer(config, layer_idx=0, initialize_mixer_weights=False).eval()
    mixer.init_falcon_mamba_weights()
    with torch.no_grad():
        for p in mixer.parameters():  # scaled random weights (no checkpoint downloads)
            if p.dim() > 1:
                p.normal_(0, p.shape[-1] ** -0.5)
    d_inner, N = mixer.intermediate_size, mixer.ssm_state_size
    print(f"torch {torch.__version__}, transformers {T.__version__}, ssmk {ssmk.version()} ({ssmk.active_isa()}), "
          f"{args.threads} thread(s); Falcon-Mamba-7B layer: hidden {config.hidden_size}, d_inner {d_inner}, "
          f"N {N}, dt_rank {mixer.time_step_rank}, conv {mixer.conv_kernel_size}; f32, batch 1")

    # Capture the scan's and the state update's arguments from real calls of the mixer.
    captured = {}

    def capture(name, original):
        def fn(*a, **k):
            captured[name] = (a, k)
            return original(*a, **k)
        return fn

    scan_ref, update_ref = fm.mamba_selective_scan, fm.mamba_selective_state_update

    def layer_inputs(L, seed):
        return torch.randn(1, L, config.hidden_size, generator=torch.Generator().manual_seed(seed))

    rows = []
    with torch.inference_mode():
        for L in sorted({args.ref_tokens, args.tokens}):
            fm.mamba_selective_scan = capture(f"scan{L}", scan_ref)
            try:
                mixer(layer_inputs(L, 1))
            finally:
                fm.mamba_selective_scan = scan_ref
        cache = T.DynamicCache(config=config)
        mixer(layer_inputs(8, 2), cache=cache)
        fm.mamba_selective_state_update = capture("update", update_ref)
        try:
            mixer(layer_inputs(1, 3), cache=cache)
        finally:
            fm.mamba_selective_state_update = update_ref

        st.enable(["falcon_mamba"])
        scan_ssmk, update_ssmk = fm.mamba_selective_scan, fm.mamba_selective_state_update
        st.disable()

        # Correctness of what is timed: ssmk against the reference on the same captured inputs.
        a, k = captured[f"scan{args.ref_tokens}"]
        want, got = scan_ref(*a, **k), scan_ssmk(*a, **k)
        e = ((got.float() - want.float()).abs().max() / want.abs().max()).item()
        print(f"scan check (L = {args.ref_tokens}): max |ssmk - torch| / max |torch| = {e:.1e}")

        # scan alone
        t_ref = best(lambda: scan_ref(*a, **k), max(1, args.repeat - 1)) / args.ref_tokens
        times = {}
        for L in sorted({args.ref_tokens, args.tokens}):
            aa, kk = captured[f"scan{L}"]
            times[L] = best(lambda: scan_ssmk(*aa, **kk), args.repeat) / L
        t_ssmk = times[args.tokens]
        rows.append((f"scan, prefill 1x{args.tokens} (torch at 1x{args.ref_tokens})", t_ref * 1e6, t_ssmk * 1e6,
                     "us/token"))

        # state update alone, on a copy of the cache's state (updated in place, step after step).
        (state, *rest), k = captured["update"]
        state = state.clone()
        steps = range(args.decode_steps)
        t_ref = best(lambda: [update_ref(state, *rest, **k) for _ in steps], args.repeat) / args.decode_steps
        t_ssmk = best(lambda: [update_ssmk(state, *rest, **k) for _ in steps], args.repeat) / args.decode_steps
        rows.append(("state update, decode 1 token", t_ref * 1e6, t_ssmk * 1e6, "us/step"))

        # whole layer
        x = layer_inputs(args.ref_tokens, 4)
        t_ref = best(lambda: mixer(x), max(1, args.repeat - 1)) / args.ref_tokens
        with st.enabled(["falcon_mamba"]):
            xs = layer_inputs(args.tokens, 4)
            t_ssmk = best(lambda: mixer(xs), args.repeat) / args.tokens
        rows.append((f"layer prefill 1x{args.tokens} (torch at 1x{args.ref_tokens})", t_ref * 1e6, t_ssmk * 1e6,
                     "us/token"))

        def decode_run():
            c = T.DynamicCache(config=config)
            mixer(layer_inputs(8, 5), cache=c)
            step = layer_inputs(1, 6)
            t0 = time.perf_counter()
            for _ in range(args.decode_steps):
                mixer(step, cache=c)
            return (time.perf_counter() - t0) / args.decode_steps

        t_ref = min(decode_run() for _ in range(args.repeat))
        with st.enabled(["falcon_mamba"]):
            t_ssmk = min(decode_run() for _ in range(args.repeat))
        rows.append(("layer decode step", t_ref * 1e6, t_ssmk * 1e6, "us/step"))

    print(f"{'':52s} {'torch':>12s} {'ssmk':>12s} {'speed-up':>9s}")
    for name, r, s, unit in rows:
        print(f"{name:52s} {r:9.2f} {unit.split('/')[0]:2s} {s:9.2f} {unit.split('/')[0]:2s} {r / s:8.1f}x  ({unit})")


if __name__ == "__main__":
    main()
