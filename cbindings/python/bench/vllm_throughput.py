"""vLLM offline throughput with and without the ssmk plugin.

Random-weight models of realistic layer sizes, built locally (tests_vllm/tiny_models.py):

* ``qwen3_5``: hidden 2048, Gated DeltaNet 16 q/k heads and 32 v heads of 128, conv width 4,
  3 GDN layers : 1 attention layer, 4 layers (bf16);
* ``lfm2``: hidden 2048, ShortConv and attention layers alternating, ``conv_L_cache`` 3 (f32);
* ``nemotron_h``: hidden 2048, Mamba-2 64 heads of 64, state 128, 8 groups, ``M*M-`` (f32).

Measures prompt tokens/s (``max_tokens=1`` on ``--prompt-len`` token prompts), output tokens/s
(``--out-len`` tokens after a 16-token prompt, decode time only) and the median time of one
recurrent layer's decode step (the seam the plugin replaces, timed in place) at each batch size and
thread count, each in a fresh process, with the plugin (``SSMK_VLLM=1``) and without
(``SSMK_VLLM=0``): the fastest of ``--prefill-reps`` prefills after an untimed one of the same
length, and the fastest of ``--decode-reps`` decode runs less the fastest of as many runs of the
prompt alone; ``--passes N`` runs every row N times, its columns alternating, and prints medians
with the range of the per-pass ratios. ``--same-process`` times both paths in one process on one
engine instead, switched by :func:`ssmk.vllm.serve` between ``generate`` calls in alternating
order: the same weights, KV and state pools and memory placement for both, so the ratio does not
carry the +-10% by which two processes' GEMMs differ on a shared VM. ``--pool-decode`` adds a
third run per row with ssmk's private pool and the plugin's decode calls on it
(``SSMK_POOL=ssmk SSMK_VLLM_DECODE_THREADS=0``; the default runs them on torch's OpenMP threads).

``--vllm-isa avx2`` (default) makes vLLM pick its AVX2 build (``_C_AVX2.abi3.so``) and its AVX2
code paths on an AVX-512 machine, by answering False to torch's AVX-512/AMX capability queries
before vLLM reads them; ssmk is capped the same way (``SSMK_MAX_ISA=avx2``). ``native`` leaves both
alone. Run with the venv of ``.ci/vllm-lane``::

    target/py-vllm/bin/python cbindings/python/bench/vllm_throughput.py --families qwen3_5 \\
        --threads 1,2 --batches 1,16
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

# The installed ssmk (the wheel, with its library, as vLLM's plugin loader finds it) is imported;
# the package's source tree only lends the tiny models of the vLLM lane.
TESTS_VLLM = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests_vllm")

SHAPES = {
    "qwen3_5": dict(hidden=2048, layers=4, k_heads=16, v_heads=32, head=128, attn_head=128,
                    max_position_embeddings=4096),
    "lfm2": dict(hidden=2048, layers=4, attn_heads=32, kv_heads=8, max_position_embeddings=4096),
    "nemotron_h": dict(hidden=2048, pattern="M*M-", heads=64, head=64, state=128, groups=8,
                       expand=2, attn_heads=16, kv_heads=8, attn_head=128,
                       max_position_embeddings=4096),
}


def child(args):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    import torch

    if args.vllm_isa == "avx2":
        torch.cpu._is_avx512_supported = lambda: False
        torch.cpu._is_avx512_bf16_supported = lambda: False
        torch.cpu._is_amx_tile_supported = lambda: False
    torch.set_num_threads(args.threads)
    if args.ssmk_threads:
        import ssmk.torch

        ssmk.torch.set_num_threads(args.ssmk_threads)
    sys.path.insert(0, TESTS_VLLM)
    import tiny_models

    kw = dict(SHAPES[args.family])
    path, dtype = tiny_models.build(args.family, args.models, **kw)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(path, dtype=str(dtype).split(".")[1], enforce_eager=True,
              max_model_len=args.prompt_len + 128, max_num_seqs=max(args.batch, 1),
              max_num_batched_tokens=args.prompt_len * args.batch, enable_prefix_caching=False,
              seed=0)
    import random

    rng = random.Random(args.batch)

    def prompts(n):
        return [TokensPrompt(prompt_token_ids=[rng.randrange(3, 256) for _ in range(n)])
                for _ in range(args.batch)]

    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    many = SamplingParams(max_tokens=args.out_len, temperature=0.0, ignore_eos=True)
    import ssmk.vllm as sv

    # The paths this process times: the one its SSMK_VLLM chose, or with --same-process both,
    # switched by ssmk.vllm.serve between generate calls, in alternating order.
    paths = ["1", "0"] if args.same_process else [os.environ.get("SSMK_VLLM", "1")]
    # (phase, path) -> seconds of each call of the recurrent layer step, and the current key.
    steps = {(phase, path): [] for phase in ("warm-up", "prefill", "decode") for path in paths}
    current = ["warm-up", paths[0]]
    layer_step_times(llm, args.family, steps, current)

    def each_path(rep):
        for path in paths if rep % 2 == 0 else paths[::-1]:
            current[1] = path
            if args.same_process:
                sv.serve(path == "1")
            yield path

    # Warm-up at the timed length: oneDNN builds its GEMM primitives for a shape on first use.
    for _ in each_path(0):
        llm.generate(prompts(args.prompt_len), one, use_tqdm=False)
    prefill_s = {path: [] for path in paths}
    current[0] = "prefill"
    for rep in range(args.prefill_reps):
        for path in each_path(rep):
            t = time.perf_counter()
            llm.generate(prompts(args.prompt_len), one, use_tqdm=False)
            prefill_s[path].append(time.perf_counter() - t)
    current[0] = "decode"
    # A 2-thread decode of one sequence varies by +-10% from run to run on a shared VM: the
    # fastest of the runs counts, less the fastest of as many runs of the prompt alone.
    many_s = {path: [] for path in paths}
    one_s = {path: [] for path in paths}
    for rep in range(args.decode_reps):
        for path in each_path(rep):
            for params, times in ((many, many_s), (one, one_s)):
                t = time.perf_counter()
                llm.generate(prompts(16), params, use_tqdm=False)
                times[path].append(time.perf_counter() - t)
    sv.serve(True)
    result = {}
    for path in paths:
        result[path] = {
            "prefill_tok_s": args.batch * args.prompt_len / min(prefill_s[path]),
            "decode_tok_s": args.batch * (args.out_len - 1)
            / (min(many_s[path]) - min(one_s[path])),
            "layer_step_us": median_us(steps["decode", path]),
            "layer_prefill_us": median_us(steps["prefill", path]),
            "calls": sv.calls()}
    print(json.dumps(result))


def median_us(seconds):
    return 1e6 * sorted(seconds)[len(seconds) // 2] if seconds else None


def layer_step_times(llm, family, steps, current):
    """From now on, appends the seconds of every call of the family's recurrent layer step to
    ``steps[tuple(current)]``, whichever implementation serves it (vLLM's, or the plugin's): Gated
    DeltaNet's ``_cpu_gdn_attention_nonspec``, ShortConv's ``forward_native`` less its two
    projections, MambaMixer2's ``conv_ssm_forward``. Their median over the decode runs is the
    layer's decode step (over the prefills, its prefill step), in the same process as the
    throughput and without the GEMMs' run-to-run noise."""

    def timed(f, less=lambda: 0.0):
        def step(*a, **k):
            t = time.perf_counter()
            r = f(*a, **k)
            steps[tuple(current)].append(time.perf_counter() - t - less())
            return r

        return step

    if family == "qwen3_5":
        from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as ga

        ga._cpu_gdn_attention_nonspec = timed(ga._cpu_gdn_attention_nonspec)
        return
    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    if family == "lfm2":
        from vllm.model_executor.layers.mamba.short_conv import ShortConv

        for m in model.modules():
            if isinstance(m, ShortConv):
                proj = []
                for sub in (m.in_proj, m.out_proj):
                    sub.register_forward_pre_hook(
                        lambda mod, inp: setattr(mod, "_ssmk_t0", time.perf_counter()))
                    sub.register_forward_hook(
                        lambda mod, inp, out, proj=proj: proj.append(
                            time.perf_counter() - mod._ssmk_t0))

                def less(proj=proj):
                    spent = sum(proj)
                    proj.clear()
                    return spent

                m.forward_native = timed(m.forward_native, less)
    elif family == "nemotron_h":
        from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

        for m in model.modules():
            if isinstance(m, MambaMixer2):
                m.conv_ssm_forward = timed(m.conv_ssm_forward)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="qwen3_5,lfm2,nemotron_h")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--out-len", type=int, default=64)
    ap.add_argument("--decode-reps", type=int, default=3,
                    help="decode runs per process; the fastest counts")
    ap.add_argument("--prefill-reps", type=int, default=2,
                    help="timed prefills per process, after an untimed one; the fastest counts")
    ap.add_argument("--vllm-isa", default="avx2", choices=["avx2", "native"])
    ap.add_argument("--models", default="/tmp/ssmk-vllm-bench-models")
    ap.add_argument("--ssmk-threads", type=int, default=0,
                    help="threads of ssmk's calls (default: torch.get_num_threads() at each call)")
    ap.add_argument("--pool-decode", action="store_true",
                    help="also run the plugin with SSMK_VLLM_DECODE_THREADS=0 (column 'pool')")
    ap.add_argument("--passes", type=int, default=1,
                    help="processes per row and column, alternating the columns; medians shown, "
                         "and the range of the per-pass ratios (a 2-thread ratio moves by about "
                         "+-10%% between processes on a shared VM)")
    ap.add_argument("--same-process", action="store_true",
                    help="time vLLM's path and the plugin's in one process on one engine, "
                         "switched by ssmk.vllm.serve between generate calls in alternating "
                         "order (the same weights, pools and memory placement for both)")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--family")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--json")
    args, _ = ap.parse_known_args()
    if args.child:
        args.threads = int(args.threads)
        return child(args)
    rows = []
    pool = args.pool_decode
    print("| family | threads | batch | prompt tok/s vLLM | + ssmk | ratio | output tok/s vLLM "
          "| + ssmk | ratio | layer prefill step µs vLLM | + ssmk | layer decode step µs vLLM "
          "| + ssmk |"
          + (" + ssmk, decode on its pool | ratio |" if pool else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if pool else ""))
    for family in args.families.split(","):
        for threads in args.threads.split(","):
            for batch in args.batches.split(","):
                passes = []
                for _ in range(args.passes):
                    passes.append(run_row(args, family, threads, batch, pool))
                res = {plugin: median_result([p[plugin] for p in passes]) for plugin in passes[0]}
                base, mine = res["0"], res["1"]
                row = dict(family=family, threads=int(threads), batch=int(batch),
                           prefill=(base["prefill_tok_s"], mine["prefill_tok_s"]),
                           decode=(base["decode_tok_s"], mine["decode_tok_s"]),
                           layer_prefill_us=(base["layer_prefill_us"], mine["layer_prefill_us"]),
                           layer_step_us=(base["layer_step_us"], mine["layer_step_us"]),
                           calls=mine["calls"])
                rows.append(row)
                p, d = row["prefill"], row["decode"]

                def spread(key):
                    if len(passes) == 1:
                        return ""
                    ratios = [q["1"][key] / q["0"][key] for q in passes]
                    row[key + "_ratios"] = ratios
                    return f" ({min(ratios):.2f}-{max(ratios):.2f})"

                extra = ""
                if pool:
                    row["decode_pool"] = res["pool"]["decode_tok_s"]
                    extra = f" {row['decode_pool']:.1f} | {row['decode_pool'] / d[0]:.2f}x |"
                steps = " | ".join("-" if us is None else f"{us:.0f}"
                                   for us in row["layer_prefill_us"] + row["layer_step_us"])
                print(f"| {family} | {threads} | {batch} | {p[0]:.0f} | {p[1]:.0f} | "
                      f"{p[1] / p[0]:.2f}x{spread('prefill_tok_s')} | {d[0]:.1f} | {d[1]:.1f} | "
                      f"{d[1] / d[0]:.2f}x{spread('decode_tok_s')} | {steps} |" + extra,
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def median_result(results):
    """Per key, the median over passes of each number (the calls of the first)."""
    def median(values):
        values = sorted(v for v in values if v is not None)
        return values[len(values) // 2] if values else None

    out = dict(results[0])
    for key in ("prefill_tok_s", "decode_tok_s", "layer_prefill_us", "layer_step_us"):
        out[key] = median([r[key] for r in results])
    return out


def run_row(args, family, threads, batch, pool):
    """The row's columns (vLLM alone "0", + ssmk "1"[, + ssmk on its pool "pool"]): one process
    per column, or with ``--same-process`` "0" and "1" from one process and one engine."""
    res = {}
    columns = ["1"] if args.same_process else ["0", "1"]
    for column in columns + (["pool"] if pool else []):
        env = dict(os.environ, SSMK_VLLM="0" if column == "0" else "1",
                   OMP_NUM_THREADS=threads, SSMK_NUM_THREADS=threads)
        if column == "pool":
            env.update(SSMK_POOL="ssmk", SSMK_VLLM_DECODE_THREADS="0")
        if args.vllm_isa == "avx2":
            env["SSMK_MAX_ISA"] = "avx2"
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--family",
               family, "--threads", threads, "--batch", batch, "--prompt-len",
               str(args.prompt_len), "--out-len", str(args.out_len), "--decode-reps",
               str(args.decode_reps), "--prefill-reps", str(args.prefill_reps),
               "--vllm-isa",
               args.vllm_isa, "--models", args.models, "--ssmk-threads",
               str(args.ssmk_threads)] + (["--same-process"] if column != "pool"
                                          and args.same_process else [])
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if out.returncode != 0 or not line:
            print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"{family} threads={threads} batch={batch} "
                             f"column {column} failed")
        got = json.loads(line[-1])
        if column == "pool":
            res["pool"] = got["1"]
        else:
            res.update(got)
    return res


if __name__ == "__main__":
    main()
