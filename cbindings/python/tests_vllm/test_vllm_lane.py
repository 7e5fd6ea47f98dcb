"""End-to-end check of the ssmk vLLM plugin (the CI lane ``.ci/vllm-lane`` runs this file).

For every family vLLM's CPU backend serves (Qwen3.5 and Qwen3-Next: Gated DeltaNet; LFM2:
ShortConv; Nemotron-H: Mamba-2), and Jamba (Mamba-1), which it serves only through the plugin,
it builds a tiny random-weight checkpoint locally and runs vLLM
offline generation (``enforce_eager``, greedy, logprobs and prompt logprobs), one engine per
process, each engine serving several scenarios:

* ``full``: a batch of prompts of mixed lengths, full prefill + 16 decode tokens, and the
  longest prompt extended;
* ``chunked``: the same with ``max_num_batched_tokens`` below the shortest prompt, so that every
  prefill is cut;
* ``spec`` (Qwen3.5 in float32 and Nemotron-H): the ``full`` batch, and prompts that repeat a
  pattern, with speculative decoding by vLLM's ``ngram`` drafter (2 draft tokens, accepted and
  rejected ones), which must give the tokens of ``full`` and its logprobs within rounding;
  ``mtp`` (Qwen3.5) the same with drafts from the model's own multi-token-prediction layer;
* ``tp2`` (Qwen3.5 and Nemotron-H): the ``full`` batch with ``tensor_parallel_size=2``, one core
  per rank, equal to ``full`` within rounding, every rank's seams on ssmk;
* in the engine that runs with prefix caching (``PREFIX_CACHING``: the chunked one, or for
  Nemotron-H the full one, whose prefills need state checkpoints inside them) the extended
  prompt again (a cache hit) and a prompt extending it (a hit on its prefix); the other engine's
  runs are cold.

Checks: every run equals Hugging Face transformers teacher-forced on the same tokens (float32
reference on the same weights; tolerance per model dtype below), chunked equals full, a hit
equals the cold run, the hit really hit (``num_cached_tokens``), and every seam the family
reaches was called and ran ssmk (``ssmk.vllm.calls()``, no fallbacks). A family where vLLM's own
layers outside ssmk's are wrong is compared against vLLM without the plugin as well.

Run: ``python test_vllm_lane.py [--families qwen3_5,lfm2] [--work DIR]``; exit status 0 = pass.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

FAMILIES = ["qwen3_5", "qwen3_next", "lfm2", "nemotron_h", "jamba"]
# Seams each family must reach (with ssmk), by scenario engine.
SEAMS = {
    "qwen3_5": {"full": {"gdn", "zero_blocks"}, "chunked": {"gdn", "batch_memcpy", "zero_blocks"}},
    "qwen3_next": {"full": {"gdn", "zero_blocks"},
                   "chunked": {"gdn", "batch_memcpy", "zero_blocks"}},
    "lfm2": {"full": {"short_conv", "zero_blocks"},
             "chunked": {"short_conv", "batch_memcpy", "zero_blocks"}},
    "nemotron_h": {"full": {"mamba2", "batch_memcpy", "zero_blocks"}, "chunked": {"mamba2"}},
    "jamba": {"full": {"mamba1", "batch_memcpy", "zero_blocks"}, "chunked": {"mamba1"}},
}
# The engine that runs with prefix caching (and so serves a repeated prompt, ``hit``, from the
# cache). Nemotron-H: the full engine, because only a prefill longer than a block gets a state
# checkpoint inside it (vLLM's "align" mode: the state at the prompt's last block boundary, which
# the plugin has ssmk write straight into its cache block; vLLM's CPU path crashes there); its
# chunked engine (prefix caching off) gives the cold runs the hits are compared with. Jamba the
# same, for symmetry with Nemotron-H (vLLM's scheduler cuts its prefills at the last block).
PREFIX_CACHING = {"qwen3_5": "chunked", "qwen3_next": "chunked", "lfm2": "chunked",
                  "nemotron_h": "full", "jamba": "full"}
# Families whose vLLM layer asks for the state at a token inside a prefill (a checkpoint).
PREFILL_CHECKPOINTS = {"nemotron_h"}

# Families whose vLLM layers outside ssmk's are wrong on this vLLM build (compared with vLLM
# without the plugin instead of Hugging Face; the HF deviation is still printed).
# LFM2: vLLM's CPU rotary_embedding (torch.ops._C.rotary_embedding, AVX2 and AVX-512 builds)
# rotates a 3-D [T, H, D] query with H > 1 wrongly; LFM2's attention passes exactly that.
VLLM_WRONG = {"lfm2"}
# vLLM's own GDN chunk kernel takes head dims 64 and 128 only; the Qwen3.5 model uses 32.
# Engines vLLM without the plugin fails, with the message that says why (ssmk serves them).
# Nemotron-H with prefix caching: vLLM's CPU scan returns final states only where the "align"
# checkpoint wants the state at a chunk end (issue 31: mamba_mixer2.py:880), so Nemotron-H is
# also run without the plugin and without prefix caching (chunked-noplugin) for the comparison.
# Speculative decoding: the engines of each family that run it, and their drafters: vLLM's
# ngram drafter, and Qwen3.5's MTP layer (tiny_models adds one).
SPEC = {"qwen3_5": ["spec", "mtp"], "nemotron_h": ["spec"]}
SPEC_CONFIGS = {"spec": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2,
                         "prompt_lookup_min": 1},
                "mtp": {"method": "mtp", "num_speculative_tokens": 2}}
# Families also run with tensor parallelism (engine ``tp2``: 2 ranks, one core each).
TENSOR_PARALLEL = {"qwen3_5", "nemotron_h"}
NOPLUGIN_REFUSES = {("qwen3_5", "full-noplugin"): ("CPU GDN attention requires BF16.",),
                    ("nemotron_h", "full-noplugin"): (
                        'mamba_mixer2.py", line 880, in conv_ssm_forward',
                        "IndexError: index ", "is out of bounds for dimension 0"),
                    # Jamba: vLLM's Mamba-1 mixer has no CPU path (the CUDA selective scan).
                    ("jamba", "full-noplugin"): (
                        'mamba_mixer.py", line 336, in forward_impl',
                        "object has no attribute 'selective_scan_fwd'")}
NOPLUGIN_MODES = {"lfm2": ["full-noplugin", "chunked-noplugin"],
                  "nemotron_h": ["full-noplugin", "chunked-noplugin"]}
# Engines that also run the batch with ssmk.vllm.serve(False) (every seam handing its calls to
# vLLM's own code), compared with the same engine configuration without the plugin.
SERVE_OFF = {"lfm2": "full", "nemotron_h": "chunked"}

PROMPT_LENS = [41, 66, 97, 140]
EXTENSION = 37
LONG, SHARED = 400, 381
MAX_TOKENS = 16
# The repeated-pattern prompts' completions: long enough for a random model's greedy output to
# fall into a cycle, whose tokens the ngram drafter then proposes and the model accepts.
LONG_GEN = 96
BLOCK = 32
CHUNK = 32  # max_num_batched_tokens of the chunked engine: below every prompt length

# |logprob(vLLM) - logprob(HF f32)| bounds per token (max, mean), HF run in float32 on the same
# weights. These random models have sharp output distributions (logits of several units), so
# small differences in hidden states show. f32 models: vLLM without ssmk already deviates by up
# to 3e-2 (Nemotron-H: its attention/MLP/norm sums in another order than HF's), ssmk's layers
# add nothing measurable. bf16 models: vLLM rounds every activation to bf16 (relative 2^-9 per
# rounding) through 4 layers while the reference keeps f32: up to 1.6 (mean 0.10) observed for
# vLLM without ssmk on Qwen3-Next; the bound (2, 0.15) still catches a wrong layer (LFM2's wrong
# rotary embedding moves the mean by 1.3-3). The sharper test: where vLLM without ssmk runs,
# ssmk's mean deviation must not exceed its own by more than 25% + SELF_MARGIN, i.e. ssmk is at
# least as exact as vLLM's kernels.
TOL = {"float32": (0.05, 5e-3), "bfloat16": (2.0, 0.15)}
SELF_MARGIN = {"float32": 1e-4, "bfloat16": 5e-3}
# Same engine dtype, different batching / chunking / cache hit: the same roundings in a
# different order (bf16: a rounding flip early in a sequence moves later logprobs).
TOL_SELF = {"float32": (2e-3, 5e-4), "bfloat16": (0.25, 0.03)}


def prompts():
    import random

    rng = random.Random(1234)
    batch = [[rng.randrange(3, 256) for _ in range(n)] for n in PROMPT_LENS]
    extension = batch[-1] + [rng.randrange(3, 256) for _ in range(EXTENSION)]
    long = [rng.randrange(3, 256) for _ in range(LONG)]
    share = long[:SHARED] + [rng.randrange(3, 256) for _ in range(LONG - SHARED)]
    # A pattern repeated: the ngram drafter proposes its continuation from the first copy.
    repeats = [pattern * 3 for pattern in ([rng.randrange(3, 256) for _ in range(n)]
                                           for n in (7, 12))]
    return batch, extension, long, share, repeats


# ------------------------------------------------------------------------------ engine process


def run_engine(args):
    mode, _, variant = args.mode.partition("-")
    if variant == "noplugin":
        os.environ["SSMK_VLLM"] = "0"
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import tiny_models

    path, dtype = tiny_models.build(args.family, args.models)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    chunked = mode == "chunked"
    prefix = PREFIX_CACHING[args.family] == mode
    probe = install_probe()
    t0 = time.time()
    extra = {}
    if mode in SPEC_CONFIGS:
        extra["speculative_config"] = SPEC_CONFIGS[mode]
    if mode == "tp2":
        # vLLM's CPU ranks: one OpenMP team each, pinned to its own core.
        cores = sorted(os.sched_getaffinity(0))[:2]
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(c) for c in cores)
        # collective_rpc(rank_report) sends a function to the ranks (pickled).
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        extra["tensor_parallel_size"] = 2
    llm = LLM(path, dtype=str(dtype).split(".")[1], enforce_eager=True, max_model_len=512,
              max_num_seqs=8, seed=0, block_size=BLOCK, enable_prefix_caching=prefix,
              enable_chunked_prefill=True,
              max_num_batched_tokens=CHUNK if chunked else 1024, **extra)
    started = time.time() - t0
    sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0, prompt_logprobs=0,
                        ignore_eos=True)
    # vLLM serves no cache hit to a request that wants prompt logprobs.
    sp_hit = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=0, ignore_eos=True)
    batch, extension, long, share, repeats = prompts()
    runs = {}

    def gen(name, toks, params=sp, into=runs):
        outs = llm.generate([TokensPrompt(prompt_token_ids=t) for t in toks], params,
                            use_tqdm=False)
        for i, o in enumerate(outs):
            c = o.outputs[0]
            plp = o.prompt_logprobs
            into[f"{name}{i}"] = {
                "prompt": list(o.prompt_token_ids),
                "tokens": list(c.token_ids),
                "logprobs": [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids)],
                "prompt_logprobs": None if plp is None else [None] + [
                    lp[t].logprob for lp, t in zip(plp[1:], o.prompt_token_ids[1:])],
                "cached": o.num_cached_tokens or 0,
            }

    t1 = time.time()
    gen("batch", batch)
    if mode == "tp2":
        _write_result(args, probe, runs, {}, dtype, started, t1, llm.collective_rpc(rank_report))
        return
    if mode in ["full"] + SPEC.get(args.family, []):
        gen("rep", repeats, SamplingParams(max_tokens=LONG_GEN, temperature=0.0, logprobs=0,
                                           prompt_logprobs=0, ignore_eos=True))
    if mode in SPEC_CONFIGS:
        _write_result(args, probe, runs, {}, dtype, started, t1)
        return
    gen("cold", [extension], sp_hit)  # with prefix caching: stores the extension's blocks ...
    if prefix:
        gen("hit", [extension], sp_hit)  # ... which this repeat reads
    gen("ext", [extension + batch[0]], sp_hit)  # a prompt extending it: a hit on its prefix
    if prefix and mode == "full":
        # Issue 32's case: a prompt sharing 381 tokens with an earlier one. "align" mode keeps
        # the earlier prompt's state at its last block boundary (384) only, so nothing is hit
        # (vLLM 0.32 has no mode keeping every block boundary; docs/vllm.md). Reported.
        gen("long", [long], sp_hit)
        gen("share", [share], sp_hit)
    import ssmk.vllm as sv

    served_off = {}
    if SERVE_OFF.get(args.family) == mode and variant != "noplugin":
        before = sv.calls()
        was = sv.serve(False)
        gen("batch", batch, into=served_off)
        sv.serve(was)
        served_off["ssmk_calls"] = {k: v - before.get(k, 0) for k, v in sv.calls().items()
                                    if v != before.get(k, 0)}
    _write_result(args, probe, runs, served_off, dtype, started, t1)


def rank_report(worker):
    """Runs in each tensor-parallel rank (``LLM.collective_rpc``): its rank and its plugin's
    counters."""
    import torch.distributed as dist

    import ssmk.vllm as sv

    return {"rank": dist.get_rank(), "patched": sv.patched(), "calls": sv.calls(),
            "fallbacks": sv.fallbacks()}


def _write_result(args, probe, runs, served_off, dtype, started, t1, ranks=None):
    import ssmk.vllm as sv

    elapsed = time.time() - t1
    result = {"runs": runs, "patched": sv.patched(), "calls": sv.calls(), "probe": probe,
              "fallbacks": sv.fallbacks(), "dtype": str(dtype).split(".")[1],
              "engine_s": started, "generate_s": elapsed, "served_off": served_off,
              "ranks": ranks}
    with open(args.out, "w") as f:
        json.dump(result, f)


def install_probe():
    """Counts, per libssmk kernel the plugin calls: the calls, the largest token count of one call,
    the calls in which a prefill (a sequence of more than one token) continued its state
    (``has_initial_state`` true) and the state checkpoints asked for (non-pad entries of
    ``checkpoint_slots``): evidence that ssmk ran, that the chunked engine cut prefills, that
    cache hits resumed from stored states and where these came from."""
    import inspect

    import ssmk.torch as st

    probe = {}
    for name in ("causal_conv1d_fwd", "short_conv", "gated_delta_rule", "mamba2_scan"):
        fn = getattr(st, name)
        sig = inspect.signature(fn)

        def wrapped(*a, _fn=fn, _name=name, _sig=sig, **kw):
            bound = _sig.bind(*a, **kw).arguments
            rec = probe.setdefault(_name, {"calls": 0, "max_tokens": 0, "continued_prefill": 0,
                                           "checkpoints": 0, "speculative": 0})
            rec["calls"] += 1
            qsl = bound.get("query_start_loc", bound.get("cu_seqlens"))
            if bound.get("num_accepted_tokens") is not None:
                # A speculative call, and its longest sequence (1 + the drafts verified).
                rec["speculative"] += 1
                lens = qsl[1:] - qsl[:-1]
                rec["verified"] = max(rec.get("verified", 0), int(lens.max()) if len(lens) else 0)
                # The most tokens of one step a next step kept (drafts accepted + 1).
                accepted = bound["num_accepted_tokens"]
                rec["accepted"] = max(rec.get("accepted", 0),
                                      int(accepted.max()) if len(accepted) else 0)
            rec["max_tokens"] = max(rec["max_tokens"], int(a[0].shape[0]))
            his = bound.get("has_initial_state")
            qsl = bound.get("query_start_loc", bound.get("cu_seqlens"))
            slots = bound.get("checkpoint_slots")
            if slots is not None:
                rec["checkpoints"] += int((slots != bound.get("pad_slot_id", -1)).sum())
            if his is not None and qsl is not None:
                if bool(((qsl[1:] - qsl[:-1] > 1) & his.bool()).any()):
                    rec["continued_prefill"] += 1
            return _fn(*a, **kw)

        setattr(st, name, wrapped)
    return probe


# ------------------------------------------------------------------------------ checks


def hf_logprobs(path, seqs):
    """Teacher-forced log-probabilities of every token after the first, f32 reference."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    out = []
    with torch.no_grad():
        for s in seqs:
            logits = model(torch.tensor([s])).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1)
            out.append([lp[i, s[i + 1]].item() for i in range(len(s) - 1)])
    return out


def seq_logprobs(run):
    """A run's logprobs of tokens 1.. of prompt + completion (index i = token i+1)."""
    return run["prompt_logprobs"][1:] + run["logprobs"]


class Checker:
    def __init__(self):
        self.failures = []
        self.lines = []

    def close(self, what, a, b, tol, hard=True):
        """``hard=False``: reported (``info``/``over``), not a failure."""
        worst, mean_bound = tol
        diffs = [abs(x - y) for x, y in zip(a, b)]
        ok = len(a) == len(b) and max(diffs) <= worst and sum(diffs) / len(diffs) <= mean_bound
        tag = ("ok " if ok else "FAIL") if hard else ("info" if ok else "over")
        self.lines.append(f"  {tag} {what}: max |dlogprob| {max(diffs):.2e}, "
                          f"mean {sum(diffs) / len(diffs):.2e} (bounds {worst:g}, {mean_bound:g})")
        if hard and not ok:
            self.failures.append(what)

    def true(self, what, cond, detail=""):
        self.lines.append(f"  {'ok ' if cond else 'FAIL'} {what}{': ' + detail if detail else ''}")
        if not cond:
            self.failures.append(what)


MAIN_KERNEL = {"qwen3_5": "gated_delta_rule", "qwen3_next": "gated_delta_rule",
               "lfm2": "short_conv", "nemotron_h": "mamba2_scan", "jamba": "mamba2_scan"}


def check_family(family, results, models, chk):
    full, chunked = results["full"], results["chunked"]
    dtype = full["dtype"]
    path = os.path.join(models, family)
    wrong = family in VLLM_WRONG
    for mode, res in (("full", full), ("chunked", chunked)):
        need = SEAMS[family][mode]
        got = {k for k, v in res["calls"].items() if v > 0}
        chk.true(f"{family}/{mode}: seams called with ssmk", need <= got,
                 f"calls {res['calls']}, needed {sorted(need)}")
        chk.true(f"{family}/{mode}: no fallbacks to vLLM's own kernels", not res["fallbacks"],
                 str(res["fallbacks"]))
    kernel = MAIN_KERNEL[family]
    pf, pc = full["probe"].get(kernel, {}), chunked["probe"].get(kernel, {})
    if PREFIX_CACHING[family] == "full":
        # Cache hits resume from stored states (cold0 shares batch3's first 128 tokens, hit0 and
        # ext0 the extension's first 160), stored by checkpoints inside full prefills (Mamba-2;
        # for Mamba-1, whose vLLM cache spec has no checkpoint block, vLLM's scheduler ends a
        # step at the prompt's last block boundary instead).
        ckpt = family in PREFILL_CHECKPOINTS
        chk.true(f"{family}/full: prefills batched, hits resumed"
                 + (" from checkpoints inside prefills" if ckpt else ""),
                 pf.get("max_tokens", 0) >= sum(PROMPT_LENS)
                 and pf.get("continued_prefill", 0) > 0
                 and (pf.get("checkpoints", 0) > 0) == ckpt, f"ssmk {kernel}: {pf}")
    else:
        chk.true(f"{family}/full: prefills in one step",
                 pf.get("max_tokens", 0) >= sum(PROMPT_LENS)
                 and pf.get("continued_prefill", 0) == 0, f"ssmk {kernel}: {pf}")
    chk.true(f"{family}/chunked: every step at most {CHUNK} tokens, prefills continued",
             0 < pc.get("max_tokens", 0) <= CHUNK and pc.get("continued_prefill", 0) > 0,
             f"ssmk {kernel}: {pc}")
    for mode in ("full-noplugin", "chunked-noplugin"):
        bare = results.get(mode)
        if bare is not None:
            chk.true(f"{family}/{mode}: nothing patched, no ssmk call",
                     not bare["patched"] and not bare["calls"],
                     f"{bare['patched']} {bare['calls']}")
    if family in SERVE_OFF:
        # serve(False) in a running engine: vLLM's own code, as in an engine without the plugin.
        mode = SERVE_OFF[family]
        off = dict(results[mode]["served_off"])
        calls = off.pop("ssmk_calls", None)
        chk.true(f"{family}/{mode}/serve(False): no ssmk call", calls == {}, str(calls))
        for name, run in sorted(off.items()):
            b = results[f"{mode}-noplugin"]["runs"][name]
            chk.true(f"{family}/{mode}/serve(False)/{name}: same tokens as vLLM without ssmk",
                     run["tokens"] == b["tokens"])
            chk.close(f"{family}/{mode}/serve(False)/{name} vs vLLM without ssmk",
                      seq_logprobs(run), seq_logprobs(b), TOL_SELF[dtype])

    for mode in SPEC.get(family, []):
        check_spec(family, mode, full, results.get(mode), chk)
    if family in TENSOR_PARALLEL:
        check_tensor_parallel(family, full, results.get("tp2"), chk)
    names = sorted(full["runs"])
    ref = dict(zip(names, hf_logprobs(path, [full["runs"][n]["prompt"] + full["runs"][n]["tokens"]
                                             for n in names])))
    # vLLM without the plugin on the same prompts (its full engine, or, where that one refuses,
    # its chunked one: the same tokens, compared only where it generated the same tokens).
    bare = results.get("full-noplugin") or results.get("chunked-noplugin")
    for name in names:
        run, hf = full["runs"][name], ref[name]
        mine = seq_logprobs(run) if run["prompt_logprobs"] else run["logprobs"]
        theirs = hf if run["prompt_logprobs"] else hf[-len(run["tokens"]):]
        what = "prompt+completion" if run["prompt_logprobs"] else "completion"
        chk.close(f"{family}/full/{name} ({len(run['prompt'])}+{len(run['tokens'])}) {what} "
                  "vs HF f32",
                  mine, theirs, TOL[dtype], hard=not wrong)
        b = bare["runs"].get(name) if bare is not None else None
        if b is not None and b["tokens"] == run["tokens"]:
            own = seq_logprobs(b) if b["prompt_logprobs"] else b["logprobs"]
            chk.close(f"{family}/noplugin/{name} (vLLM without ssmk) vs HF f32", own,
                      theirs, TOL[dtype], hard=False)
            if not wrong:
                m_ssmk = sum(abs(x - y) for x, y in zip(mine, theirs)) / len(mine)
                m_own = sum(abs(x - y) for x, y in zip(own, theirs)) / len(own)
                chk.true(f"{family}/full/{name}: ssmk at least as close to HF as vLLM's kernels",
                         m_ssmk <= 1.25 * m_own + SELF_MARGIN[dtype],
                         f"mean |dlogprob| {m_ssmk:.2e} vs {m_own:.2e}")
    if wrong:
        # vLLM is wrong outside ssmk's layers: every run must equal vLLM without the plugin run
        # through the same engine configuration and request sequence.
        for mode in ("full", "chunked"):
            for name, run in sorted(results[mode]["runs"].items()):
                b = results[f"{mode}-noplugin"]["runs"][name]
                chk.true(f"{family}/{mode}/{name}: same tokens as vLLM without ssmk",
                         run["tokens"] == b["tokens"])
                chk.close(f"{family}/{mode}/{name} vs vLLM without ssmk", seq_logprobs(run)
                          if run["prompt_logprobs"] else run["logprobs"], seq_logprobs(b)
                          if b["prompt_logprobs"] else b["logprobs"], TOL_SELF[dtype])
        return
    for name, run in sorted(chunked["runs"].items()):
        twin = full["runs"][name if name in full["runs"] else "cold0"]  # hit0: a cold run
        chk.true(f"{family}/chunked/{name}: same tokens as full", run["tokens"] == twin["tokens"])
        chk.close(f"{family}/chunked/{name} vs full",
                  seq_logprobs(run) if run["prompt_logprobs"] else run["logprobs"],
                  seq_logprobs(twin) if run["prompt_logprobs"] else twin["logprobs"],
                  TOL_SELF[dtype])
    mode = PREFIX_CACHING[family]
    for name in ("hit0", "ext0"):
        run = results[mode]["runs"][name]
        chk.true(f"{family}/{mode}/{name}: served from the prefix cache", run["cached"] > 0,
                 f"num_cached_tokens {run['cached']} of {len(run['prompt'])}")
    share = results[mode]["runs"].get("share0")
    if share is not None:
        chk.lines.append(f"  info {family}/{mode}/share0: a prompt sharing {SHARED} tokens with an "
                         f"earlier {LONG}-token one: num_cached_tokens "
                         f"{share['cached']} (mamba_cache_mode 'align')")
    if mode == "full":
        # The chunked engine ran without prefix caching: its cold0 is a cold run.
        hit, cold = full["runs"]["hit0"], chunked["runs"]["cold0"]
        chk.true(f"{family}/full/hit0: same tokens as a cold run", hit["tokens"] == cold["tokens"])
        chk.close(f"{family}/full/hit0 vs chunked/cold0 (a cache hit vs a cold run)",
                  hit["logprobs"], cold["logprobs"], TOL_SELF[dtype])


def check_spec(family, mode, full, spec, chk):
    """A speculative engine: every seam on ssmk (its speculative mode ran), the tokens of the
    engine without drafts and its logprobs within the rounding of a different batching."""
    chk.true(f"{family}/{mode}: engine run", spec is not None)
    if spec is None:
        return
    kernel = MAIN_KERNEL[family]
    chk.true(f"{family}/{mode}: no fallbacks to vLLM's own kernels", not spec["fallbacks"],
             str(spec["fallbacks"]))
    probe = spec["probe"].get(kernel, {})
    chk.true(f"{family}/{mode}: ssmk's speculative mode verified drafts",
             probe.get("speculative", 0) > 0 and probe.get("verified", 0) > 1,
             f"ssmk {kernel}: {probe}")
    dtype = full["dtype"]
    for name, run in sorted(spec["runs"].items()):
        twin = full["runs"][name]
        chk.true(f"{family}/{mode}/{name}: same tokens as without drafts",
                 run["tokens"] == twin["tokens"], f"{run['tokens']} vs {twin['tokens']}")
        chk.close(f"{family}/{mode}/{name} vs full", seq_logprobs(run), seq_logprobs(twin),
                  TOL_SELF[dtype])


def check_tensor_parallel(family, full, tp, chk):
    """The 2-rank engine: each rank ran its share of every recurrent layer on ssmk (no fallback),
    and the batch equals the 1-rank engine's within rounding (the ranks' partial sums are added
    in another order)."""
    chk.true(f"{family}/tp2: engine run", tp is not None)
    if tp is None:
        return
    ranks = tp["ranks"] or []
    need = SEAMS[family]["full"] - {"batch_memcpy"}
    chk.true(f"{family}/tp2: 2 ranks, each calling {sorted(need)} with ssmk, no fallbacks",
             sorted(r["rank"] for r in ranks) == [0, 1]
             and all(need <= {k for k, v in r["calls"].items() if v > 0} and not r["fallbacks"]
                     for r in ranks), str(ranks))
    for name, run in sorted(tp["runs"].items()):
        twin = full["runs"][name]
        chk.true(f"{family}/tp2/{name}: same tokens as 1 rank", run["tokens"] == twin["tokens"],
                 f"{run['tokens']} vs {twin['tokens']}")
        chk.close(f"{family}/tp2/{name} vs full (1 rank)", seq_logprobs(run),
                  seq_logprobs(twin), TOL_SELF[full["dtype"]])


REGISTRATION = r"""
import os, sys, vllm
case = sys.argv[1]
if case == "old":
    vllm.__version__ = "0.31.0"
if case == "newer":
    vllm.__version__ = "0.33.0"
if case == "changed":  # one seam's function with other parameters than the plugin's
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention
    gdn_attention._cpu_gdn_attention_nonspec = lambda layer, attn_metadata_i: None
from vllm.plugins import load_general_plugins
load_general_plugins()  # through the installed entry point
import ssmk.vllm as sv
print("PATCHED", ",".join(sv.patched()))
"""
ALL_SEAMS = ("conv_prefill,conv_decode,gdn,short_conv,kda,mamba2,mamba1,mamba2_prefill,"
             "mamba2_decode,batch_memcpy,zero_blocks")


def check_registration(chk):
    """The entry point loads the plugin; SSMK_VLLM=0 and an older vLLM patch nothing; a newer one
    gets every seam whose functions match, a seam whose function changed is left out."""
    for case, env, patched, says in (
            ("on", {}, ALL_SEAMS, "ssmk.vllm: libssmk"),
            ("off", {"SSMK_VLLM": "0"}, "", "disabled by SSMK_VLLM=0"),
            ("old", {}, "", "vLLM 0.31.0 is older than 0.32"),
            ("newer", {}, ALL_SEAMS, "serves vLLM 0.33.0"),
            ("changed", {}, ALL_SEAMS.replace(",gdn", ""), "seam gdn left to vLLM")):
        out = subprocess.run([sys.executable, "-c", REGISTRATION, case], capture_output=True,
                             text=True, env=dict(os.environ, **env))
        got = [ln[8:] for ln in out.stdout.splitlines() if ln.startswith("PATCHED ")]
        text = out.stdout + out.stderr
        chk.true(f"registration/{case}: patched [{patched}], log says '{says}' once",
                 out.returncode == 0 and got == [patched] and text.count(says) == 1,
                 f"exit {out.returncode}, patched {got}" + ("" if out.returncode == 0 else
                                                             "\n" + out.stderr[-2000:]))


def check_step_caches(chk):
    """The plugin's per-layer views and per-batch-size decode tables: built once, rebuilt when
    the layer's tensor is replaced, and equal to what each step would build."""
    import torch

    import ssmk.vllm as sv

    class Layer:
        pass

    layer = Layer()
    pool = torch.zeros(4, 3, 8)
    first = sv._static(layer, "_v", pool, lambda p: p.transpose(-1, -2))
    again = sv._static(layer, "_v", pool, lambda p: p.transpose(-1, -2))
    replaced = torch.zeros(4, 3, 8)
    rebuilt = sv._static(layer, "_v", replaced, lambda p: p.transpose(-1, -2))
    chk.true("plugin/_static: kept while the source is the same tensor, rebuilt when replaced",
             again is first and rebuilt is not first
             and rebuilt.data_ptr() == replaced.data_ptr(), "")
    qsl, his = sv._decode_only(5, torch.device("cpu"))
    same = sv._decode_only(5, torch.device("cpu"))
    chk.true("plugin/_decode_only: 0..nd and all-true, one pair per batch size",
             qsl.tolist() == list(range(6)) and qsl.dtype == torch.int32
             and his.tolist() == [True] * 5 and same[0] is qsl and same[1] is his, "")


# Engine processes run side by side (SSMK_VLLM_LANE_JOBS, default: the core count).
LANE_JOBS = int(os.environ.get("SSMK_VLLM_LANE_JOBS", "0") or 0) or os.cpu_count() or 1


def run_side_by_side(commands, work, jobs):
    """Runs each command of ``{key: argv}`` (output in ``work/<key joined by "-">.log``), ``jobs``
    at a time in the order given; returns ``{key: exit code}`` in that order."""
    pending, running, codes = list(commands.items()), {}, {}
    while pending or running:
        while pending and len(running) < jobs:
            key, argv = pending.pop(0)
            log = open(os.path.join(work, "-".join(key) + ".log"), "w")
            running[key] = (subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), log)
        time.sleep(0.2)
        for key, (proc, log) in list(running.items()):
            if proc.poll() is not None:
                log.close()
                codes[key] = proc.returncode
                del running[key]
    return {key: codes[key] for key in commands}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("command", nargs="?", default="all", choices=["all", "engine"])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--work", default=os.environ.get("SSMK_VLLM_WORK", "/tmp/ssmk-vllm-lane"))
    ap.add_argument("--family")
    ap.add_argument("--mode")
    ap.add_argument("--models")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.command == "engine":
        return run_engine(args)
    models = os.path.join(args.work, "models")
    os.makedirs(models, exist_ok=True)
    chk = Checker()
    t0 = time.time()
    check_registration(chk)
    check_step_caches(chk)
    print("\n".join(chk.lines), flush=True)
    chk.lines = []
    families = args.families.split(",")
    import tiny_models

    for family in families:  # before the engines, which run side by side and read them
        tiny_models.build(family, models)
    kimi = os.environ.get("SSMK_VLLM_LANE_KIMI", "1") != "0"
    # One engine process per (family, mode), LANE_JOBS at a time (each spends most of its life
    # in single-threaded Python: imports, engine start, scheduling), then the checks in order.
    jobs = [(family, mode) for family in families for mode in
            (["full", "chunked"] + NOPLUGIN_MODES.get(family, ["full-noplugin"])
             + SPEC.get(family, []) + (["tp2"] if family in TENSOR_PARALLEL else []))]
    commands = {}
    for family, mode in jobs:
        out = os.path.join(args.work, f"{family}-{mode}.json")
        commands[family, mode] = [sys.executable, os.path.abspath(__file__), "engine",
                                  "--family", family, "--mode", mode, "--models", models,
                                  "--out", out]
    if kimi:
        # Kimi Linear (KDA) needs workarounds of six vLLM defects in its engine process (never
        # in the plugin; kimi_linear_cpu.py lists them), so it runs as its own script: one engine,
        # a batch of 4 prompts, full prefill + 16 tokens, against transformers in f32.
        commands["kimi_linear", "full"] = [sys.executable, os.path.join(HERE, "kimi_linear_cpu.py"),
                                           "--work", os.path.join(args.work, "kimi")]
    codes = run_side_by_side(commands, args.work, LANE_JOBS)
    for family in families:
        results = {}
        for (fam, mode), rc in codes.items():
            if fam != family:
                continue
            out = os.path.join(args.work, f"{family}-{mode}.json")
            log = os.path.join(args.work, f"{family}-{mode}.log")
            expected = NOPLUGIN_REFUSES.get((family, mode))
            if rc != 0 and expected and all(e in open(log).read() for e in expected):
                chk.true(f"{family}/{mode}: vLLM without ssmk fails here", True,
                         " ... ".join(expected) + " (ssmk serves it)")
                continue
            if rc != 0:
                chk.true(f"{family}/{mode}: engine run", False, f"exit {rc}, see {log}")
                print(open(log).read()[-3000:])
                continue
            with open(out) as f:
                results[mode] = json.load(f)
            r = results[mode]
            print(f"{family}/{mode}: engine {r['engine_s']:.1f} s, "
                  f"generate {r['generate_s']:.1f} s,"
                  f" calls {r['calls']}", flush=True)
        if "full" in results and "chunked" in results:
            check_family(family, results, models, chk)
        print("\n".join(chk.lines), flush=True)
        chk.lines = []
    if kimi:
        rc = codes["kimi_linear", "full"]
        text = open(os.path.join(args.work, "kimi_linear-full.log")).read()
        chk.true("kimi_linear/full: KDA seam called, equal to transformers", rc == 0
                 and "PASS" in text, text[-1500:] if rc else "see its log")
        print("\n".join(chk.lines + [line for line in text.splitlines()
                                     if line.startswith(("calls", "prompt"))]), flush=True)
        chk.lines = []
    print(f"== vLLM lane: {len(chk.failures)} failures, {time.time() - t0:.0f} s")
    for f in chk.failures:
        print("FAILED:", f)
    return 1 if chk.failures else 0


if __name__ == "__main__":
    sys.exit(main())
