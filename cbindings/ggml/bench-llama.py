#!/usr/bin/env python3
"""llama.cpp end to end, with and without ssmk's ggml backend: ``llama-bench`` pp512 and tg128.

Not a test. Builds what it needs with ``build.sh`` (the pinned llama.cpp, ``llama-quantize``
included), writes random-weight GGUFs of realistic layer sizes with the patched
``test-llama-archs -o`` (``SSMK_ARCHS_*`` sizes, see ``test-llama-archs.patch``), in f32 and
quantized to Q8_0, then runs the same ``llama-bench`` binary with the backend loaded and
switched off (``SSMK_GGML_OPS=none``: same binary, same splits as without it) and on, alternating,
and keeps each cell's best of ``--reps``. Shapes (``--models`` picks some):

* ``qwen35``: Qwen3-Next's layers (hidden 2048; Gated DeltaNet with 16 q/k and 32 v heads of
  128; 3 GDN layers to 1 attention layer), a dense FFN of 6144 standing in for the MoE's active
  experts (10 of 512 experts of 512, plus a shared one, move about as many weights per token);
* ``mamba2``: Nemotron-H's Mamba-2 layers (hidden 2048, 64 heads of 64, N 128, 8 groups; no
  attention or FFN layers: the architecture has none);
* ``mamba``: Falcon-Mamba's Mamba-1 layers (hidden 4096, d_inner 8192, N 16, dt rank 256);
* ``rwkv7``: RWKV-7 1.5B's layers (hidden 2048, 32 heads of 64, FFN 8192).

Every model has a vocabulary of 128 tokens, so the output layer costs nothing; a real model's
would add to both columns alike. Run::

    python3 cbindings/ggml/bench-llama.py [--models qwen35,rwkv7] [--threads 1,2] [--reps 3]
"""

import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = {
    "qwen35": ("qwen35", 8, {"N_EMBD": 2048, "N_HEAD": 16, "N_FF": 6144, "FULL_ATTENTION_INTERVAL": 4,
                             "SSM_INNER": 4096, "SSM_STATE": 128, "SSM_DT_RANK": 32, "SSM_GROUPS": 16}),
    "mamba2": ("mamba2", 8, {"N_EMBD": 2048, "N_HEAD": 16, "SSM_INNER": 4096, "SSM_STATE": 128,
                             "SSM_DT_RANK": 64, "SSM_GROUPS": 8}),
    "mamba": ("mamba", 4, {"N_EMBD": 4096, "N_HEAD": 16, "SSM_INNER": 8192, "SSM_STATE": 16,
                           "SSM_DT_RANK": 256}),
    "rwkv7": ("rwkv7", 8, {"N_EMBD": 2048, "N_HEAD": 32, "N_FF": 8192}),
}


def build(llama_dir):
    env = dict(os.environ, SSMK_LLAMA_DIR=llama_dir,
               SSMK_LLAMA_TARGETS="ggml ggml-base ggml-cpu llama test-llama-archs llama-bench llama-quantize")
    out = subprocess.run([os.path.join(ROOT, "cbindings/ggml/build.sh")], env=env, check=True,
                         capture_output=True, text=True).stdout
    return dict(re.findall(r"^(LLAMA_BIN|SSMK_GGML_LIB)=(.*)$", out, re.M))


def write_models(paths, name, out_dir):
    arch, layers, sizes = SHAPES[name]
    f32 = os.path.join(out_dir, f"{name}-f32.gguf")
    q8 = os.path.join(out_dir, f"{name}-q8_0.gguf")
    env = dict(os.environ, LD_LIBRARY_PATH=paths["LLAMA_BIN"], SSMK_ARCHS_N_LAYER=str(layers),
               **{f"SSMK_ARCHS_{k}": str(v) for k, v in sizes.items()})
    if not os.path.exists(f32):
        tmp = os.path.join(out_dir, "tmp")
        os.makedirs(tmp, exist_ok=True)
        # Weights' stdev 0.02, as initialised models have: activations stay finite over 8 layers.
        subprocess.run([os.path.join(paths["LLAMA_BIN"], "test-llama-archs"), "-a", f"^{arch}$", "-s", "1",
                        "-d", "0.02", "-o", tmp], env=env, check=True, capture_output=True)
        os.replace(os.path.join(tmp, f"{arch}-dense.gguf"), f32)
    if not os.path.exists(q8):
        subprocess.run([os.path.join(paths["LLAMA_BIN"], "llama-quantize"), f32, q8, "Q8_0"], env=env,
                       check=True, capture_output=True)
    return {"f32": f32, "Q8_0": q8}


def bench(paths, model, threads, ssmk_on):
    """Tokens per second of pp512 and tg128, one llama-bench run."""
    env = dict(os.environ, LD_LIBRARY_PATH=paths["LLAMA_BIN"], GGML_BACKEND_PATH=paths["SSMK_GGML_LIB"])
    if not ssmk_on:
        env["SSMK_GGML_OPS"] = "none"
    out = subprocess.run([os.path.join(paths["LLAMA_BIN"], "llama-bench"), "-m", model, "-p", "512", "-n", "128",
                          "-t", str(threads), "-r", "1", "-o", "jsonl"], env=env, check=True,
                         capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert all("SSMK" in r["backends"] for r in rows), "the backend did not load"
    return {("pp512" if r["n_prompt"] else "tg128"): r["avg_ts"] for r in rows}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(SHAPES))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--llama-dir", default=os.environ.get("SSMK_LLAMA_DIR", os.path.join(ROOT, "target/llama-cpp")))
    args = p.parse_args()
    paths = build(args.llama_dir)
    out_dir = os.path.join(args.llama_dir, "bench-models")
    os.makedirs(out_dir, exist_ok=True)
    print("| model | weights | threads | pp512 CPU / SSMK (t/s) | pp ratio | tg128 CPU / SSMK (t/s) | tg ratio |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for dtype, model in write_models(paths, name, out_dir).items():
            for threads in map(int, args.threads.split(",")):
                best = {False: {}, True: {}}
                for _ in range(args.reps):
                    for on in (False, True):
                        for test, ts in bench(paths, model, threads, on).items():
                            best[on][test] = max(best[on].get(test, 0.0), ts)
                cells = []
                for test in ("pp512", "tg128"):
                    cpu, ssmk = best[False][test], best[True][test]
                    cells += [f"{cpu:.1f} / {ssmk:.1f}", f"{ssmk / cpu:.2f}x"]
                print(f"| {name} | {dtype} | {threads} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
