"""End to end: transformers models give the same logits with ``ssmk.transformers`` routing their
recurrent kernels to ssmk as without it.

No network and no downloads: every model is a tiny random-weight model built from a config below
(``HF_HUB_OFFLINE=1``); torch (CPU) and transformers come from PyPI, pinned in
``requirements.txt`` next to this file (tests/python_package.rs runs the file again on each
``requirements-transformers-*.txt`` release). ssmk is the installed package if there is one, else
the source tree (``cbindings/python``, with ``$SSMK_LIBRARY`` or ``target/release/libssmk.so``).
Run::

    python -m unittest discover -s cbindings/python/tests_e2e -v
    python cbindings/python/tests_e2e/test_transformers_hook.py --report   # the measured errors

Everything runs on one thread (``setUpModule``) but the thread-count test; about 160-180 s per
transformers release on 2 cores (25 families, f32 and bf16).

For every family (Gated DeltaNet: Qwen3-Next, Qwen3.5, Qwen3.5-MoE, Qwen4-Exp, Lara-Mini,
OLMo-Hybrid; short convs: LFM2, LFM2-MoE, LFM3, Inkling, Inkling2, Inkling2-Loop; KDA: Kimi Linear,
GLM-5-Next, Ling (bailing_hybrid); Mamba-2: Nemotron-H, Mamba-2, Bamba, Granite 4, Falcon-H1,
Zamba2; Mamba-1: Mamba, Falcon-Mamba, Jamba, Zamba) and each of the checks vLLM runs end to end
for chunked prefill and prefix caching on CPU, batch 2:

(a) a full prefill of the batch (80 tokens: the delta-rule and Mamba-2 kernels take their chunked
    form, more than one 64-token chunk), no cache;
(b) the same prompts prefilled in three chunks (37 + 24 + 19 tokens: the first chunked, the others
    short continuations from the carried state) with the cache carried over;
(c) a prefill of 72 tokens, then 8 single-token decode steps;
(d) a prefix-cache hit: the 40-token prefix is prefilled in slot 0 (slot 1 holds a stale, different
    prompt), every state of the cache (conv and recurrent states, attention keys/values) is copied
    slot 0 -> slot 1 with one ``ssmk.batch_memcpy``, then two different 6-token suffixes and 2
    decode steps continue in the two slots; the result must equal cold prefills of
    prefix + suffix;
(e) a prefix-cache hit inside a prefill (ssmk's state checkpoints, ABI.md 4.10): the 80 tokens
    of (a) are prefilled once under ``ssmk.transformers.checkpoints(cache, every=16)``, so every
    routed kernel also stores its state after tokens 16, 32, ..., 80 (into spare slots); two
    64-token prompts sharing the first 37 and 53 tokens of it (neither the end of any call)
    continue from copies of that cache rewound (``Checkpoints.rewind``) to the checkpoints at 32
    and 48 -- conv and recurrent states from the checkpoints, attention keys/values cut to that
    length -- with a prefill of all but two tokens and two decode steps (Mamba-1: decode steps
    only, see below). Compared with cold prefills of the prompts (``e~cold``), and with the
    unhooked run, which starts each continuation from a cache prefilled with the prompt's own
    first 32 / 48 tokens (``e``), and so are the states each continuation started from
    (``e.state*``: the checkpoints against states of calls that ended there).

Compared: the logits (GLM-5-Next: the text model's last hidden state, it has no LM head) of the hooked
run with those of the same scenario without the hook, and of (b), (c), (d) also with the unhooked
full prefill of the same tokens; in (c) also the final conv and recurrent cache tensors, and that
they are the same tensors (same storage) as after the prefill, i.e. updated in place. Every run
asserts that each replaced function was called and went to ssmk (no fallback), so no comparison
passes vacuously, and a sensitivity check proves the logits react to the states: dropping the carried
states between the chunks of (b) moves them by more than 100x the f32 tolerance, and so does
zeroing the states restored from the checkpoints in (e) (measured 0.12-1.3).

Mamba-1 families (``RESTARTS_STATE``): transformers 5.24's selective scan takes no initial state,
so a multi-token continuation of a cached prefill restarts the SSM state from zero, with or without
ssmk (the torch reference and mamba_ssm's ``selective_scan_fn`` alike; without ssmk (b) differs
from (a) by 9e-3 on the tiny Mamba). Their (b) and (d) are compared with the unhooked run of the
same scenario only, not with the full prefill; decode steps do carry the state, so (c) is compared
with (a) as for every family, and a second sensitivity check zeroes only the recurrent states
after the prefill of (c) (the chunks of (b) carry only the conv state).

Tolerances (an error is ``max |got - want| / max |want|``, relative to the largest logit):

* float32: ``1e-5``. ssmk computes in f32 like transformers' torch references, only in another
  order (fused loops, a chunked WY / SSD form where the reference loops per token or chunks
  differently), so the two differ by accumulated f32 rounding: measured <= 1e-6 over all families
  and scenarios (``--report``; LFM2's conv is bit-identical), 10x below the tolerance (Jamba
  1.2e-6, Zamba 3.5e-6: their larger weights, below, amplify rounding). A checkpoint is the state
  of a call ending there up to the same f32 rounding (ABI.md 4.10: within the two-calls-equal-one
  tolerance; conv states bit for bit), so (e) needs no tolerance of its own: measured <= 7e-7
  (e~cold) and <= 9e-7 (its states), Jamba 2.8e-6 and Zamba 5.6e-6, while the
  kind of defect this guards against (a lost or misplaced state) moves the logits by 0.09-0.99
  (the sensitivity check; the Mamba-1 models 0.007-0.29), 10^3-10^5 times the tolerance.
* bfloat16: the model in bf16, compared with the f32 computation of the same bf16-rounded weights.
  With ``e_ref`` = the error of transformers' own bf16 run against that f32 run (the bf16 noise
  of the whole model, 2e-3 to 8e-2 here), the hooked bf16 run must satisfy
  ``|hooked - f32| <= 2 e_ref + 1e-3`` (ssmk's bf16 path is at most twice as far from the f32
  result as transformers' own bf16 path) and ``|hooked - unhooked| <= 3 e_ref + 1e-3`` (what the
  first bound and the triangle inequality allow). Measured: at most 1.61 e_ref (Falcon-Mamba's
  (e) against the cold prefill; 1.22 without (e)) and 1.93 e_ref (Falcon-Mamba's (d); Jamba's
  (e) 1.90).
  Both runs round activations to bf16 at every layer boundary, so they differ by bf16 noise, not
  by f32 rounding; 1e-3 (a quarter of bf16's unit roundoff 2^-8) covers families whose bf16
  noise would be tiny. bf16 is only meaningful without discrete decisions: tiny random models
  route MoE top-k on near-ties, which bf16 noise flips, moving the logits by O(1), so the bf16
  models activate all experts (``smooth=True``); f32 runs use real top-k routing.

Model choices: weights are transformers' random init (std 0.02), except LFM2, LFM2-MoE, LFM3,
Inkling and Falcon-H1 at std 0.1, whose default-scale tiny models barely react to their conv
state (dropping it moved the logits by only 6e-4; Inkling's 3e-4), OLMo-Hybrid at 0.1 (so that
its beta = 2 sigmoid(b) spans about [0.3, 1.7], not just ~1), and Jamba at 0.1 and Zamba at 0.13,
whose default-scale models barely react to their SSM state (4e-4 and 2e-8; Zamba at 0.2 is so
ill-conditioned that transformers' own f32 run is 2.7e-5 from its f64 run, ssmk's 2.1e-5);
GLM-5-Next keeps every indexer key (``index_topk=256``): with a smaller top-k transformers' own
cached forward differs from its uncached forward of the same tokens (by 0.12 from position 28 on
with top-k 16, with or without ssmk), which would mask the comparisons (b)-(d) against (a);
Qwen4-Exp's QSA indexer keeps every token likewise (``indexer_budget=256``). The bf16 models keep
the modules transformers keeps in f32 (``_keep_in_fp32_modules_strict``) in f32, as
``from_pretrained(dtype=torch.bfloat16)`` does: Inkling2's router does not run otherwise.
Inkling2 and Inkling2-Loop skip (e): see ``NO_CHECKPOINTS``.
"""

import copy
import os
import sys
import time
import unittest
import warnings
from unittest import mock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

try:
    import torch
    import transformers as T
    from transformers import DynamicCache
except ImportError as e:  # pragma: no cover - the CI job installs them
    raise unittest.SkipTest(f"torch and transformers are needed: {e}")

try:
    import ssmk  # an installed package (it finds its own library)
except ImportError:  # install-free: the source tree, with SSMK_LIBRARY or target/release/libssmk.so
    _PYTHON = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # cbindings/python
    sys.path.insert(0, _PYTHON)
    _LIB = os.path.join(_PYTHON, "..", "..", "target", "release", "libssmk.so")
    if "SSMK_LIBRARY" not in os.environ and os.path.exists(_LIB):
        os.environ["SSMK_LIBRARY"] = os.path.abspath(_LIB)
    import ssmk
import ssmk.transformers as st

F32_TOL = 1e-5
BF16_VS_REF = 3.0  # x e_ref
BF16_VS_F32 = 2.0  # x e_ref
BF16_FLOOR = 1e-3
SENSITIVITY = 100  # x F32_TOL

BATCH, LENGTH = 2, 80
CHUNKS = (37, 24, 19)
PREFILL, DECODE = 72, 8
PREFIX, SUFFIX, SUFFIX_DECODE = 40, 6, 2
CHECKPOINT_EVERY, SHARED, PROMPT_B = 16, (37, 53), 64


# ------------------------------------------------------------------ tiny configs (no downloads)

def _experts(smooth, n, k):
    return n if smooth else k


def qwen3_next(smooth):
    return T.Qwen3NextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4,  # GQA in the delta rule: HV/H = 2
        num_experts=4, num_experts_per_tok=_experts(smooth, 4, 2), moe_intermediate_size=32,
        shared_expert_intermediate_size=32, decoder_sparse_step=1,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        max_position_embeddings=256, pad_token_id=0)


def qwen3_5(smooth):
    return T.Qwen3_5TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        max_position_embeddings=256, pad_token_id=0)


def qwen3_5_moe(smooth):
    return T.Qwen3_5MoeTextConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=4, num_experts_per_tok=_experts(smooth, 4, 2), moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        max_position_embeddings=256, pad_token_id=0)


def qwen4_exp(smooth):
    # No PLE layers (their short conv is inline torch, not a seam, and they need the n-gram table);
    # the QSA indexer keeps every token (budget 256 >= every prompt, as GLM-5-Next's below).
    return T.Qwen4ExpTextConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=4, num_experts_per_tok=_experts(smooth, 4, 2), moe_intermediate_size=32,
        shared_expert_intermediate_size=32, hc_count=2, hc_lowrank=8,
        indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=256, indexer_compress_ratio=4,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        max_position_embeddings=256, pad_token_id=0)


def lara_mini(smooth):
    return T.LaraMiniConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=4, num_experts_per_tok=_experts(smooth, 4, 2), moe_intermediate_size=32,
        shared_expert_intermediate_size=32, sliding_window=256,
        layer_types=["linear_attention", "sliding_attention", "linear_attention", "full_attention"],
        max_position_embeddings=256, pad_token_id=0)


def olmo_hybrid(smooth):
    # std 0.1: beta = 2 sigmoid(b) then spans about [0.3, 1.7] (allow_neg_eigval), not just ~1.
    return T.OlmoHybridConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2,
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_allow_neg_eigval=True,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        max_position_embeddings=256, pad_token_id=0, eos_token_id=2, initializer_range=0.1)


def lfm2(smooth):
    return T.Lfm2Config(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, conv_L_cache=3,
        layer_types=["conv", "full_attention", "conv"], block_auto_adjust_ff_dim=False,
        max_position_embeddings=256, initializer_range=0.1)


def lfm2_moe(smooth):
    return T.Lfm2MoeConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, conv_L_cache=3, num_dense_layers=1,
        num_experts=4, num_experts_per_tok=_experts(smooth, 4, 2),
        layer_types=["conv", "full_attention", "conv"], max_position_embeddings=256, initializer_range=0.1)


def kimi_linear(smooth):
    return T.KimiLinearConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
        num_local_experts=4, num_experts_per_tok=_experts(smooth, 4, 2), n_group=1, topk_group=1,
        linear_head_dim=16, linear_num_heads=4, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        mlp_layer_types=["dense", "sparse", "dense"],
        max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def glm5_next(smooth):
    return T.Glm5NextTextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        n_routed_experts=4, num_experts_per_tok=_experts(smooth, 4, 2), n_shared_experts=1,
        kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=0, qk_nope_head_dim=16, v_head_dim=16,
        index_topk=256,  # >= every prompt: see the note on GLM-5 in the docstring index_head_dim=16, index_n_heads=2, index_kpool=4,
        linear_head_dim=16, linear_num_heads=4, linear_conv_kernel_dim=4, linear_lower_bound=-5.0,
        hc_mult=2, hc_sinkhorn_iters=3,
        mlp_layer_types=["dense", "dense", "sparse", "sparse"],
        max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def bailing_hybrid(smooth):
    return T.BailingHybridConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
        kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
        num_local_experts=4, num_experts_per_tok=_experts(smooth, 4, 2), n_group=1, topk_group=1,
        first_k_dense_replace=1, short_conv_kernel_size=4, kda_safe_gate=True, kda_lower_bound=-5.0,
        layer_types=["linear_attention", "full_attention", "linear_attention"], num_mtp_layers=0,
        rope_theta=10000.0, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def lfm3(smooth):
    # The default conv width, 7 (LFM2's tests use 3).
    return T.Lfm3Config(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=256,
        layer_types=["conv", "sliding_attention", "full_attention", "conv"],
        max_position_embeddings=256, initializer_range=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _inkling_sizes(smooth):
    """The sizes the three Inkling text configs share."""
    return dict(
        vocab_size=128, unpadded_vocab_size=128, hidden_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=16,
        sliding_window_size=256, d_rel=4, rel_extent=64, conv_kernel_size=4,
        moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=_experts(smooth, 4, 2),
        layer_types=["hybrid_sliding", "hybrid_sliding", "hybrid"], max_position_embeddings=256, pad_token_id=0,
        eos_token_id=2)


def inkling(smooth):
    # std 0.1: at 0.02 dropping the conv states moved the logits by only 3e-4.
    return T.InklingTextConfig(**_inkling_sizes(smooth), intermediate_size=64, n_shared_experts=1,
                               initializer_range=0.1)


def inkling2(smooth):
    return T.Inkling2TextConfig(**_inkling_sizes(smooth), n_layers_per_attn_res_block=1)


def inkling2_loop(smooth):
    return T.Inkling2LoopTextConfig(
        **_inkling_sizes(smooth), n_layers_per_attn_res_block=1, loop_layer_index_start=1,
        loop_layer_index_end=2, loop_num_passes=2, loop_gate_rank=8)  # layer 1 runs twice


def nemotron_h(smooth):
    return T.NemotronHConfig(
        vocab_size=128, hidden_size=64,
        layers_block_type=["linear_attention", "mlp", "full_attention", "linear_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=64,
        ssm_state_size=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, conv_kernel=4, expand=2,
        chunk_size=8, max_position_embeddings=256)


def mamba2(smooth):
    return T.Mamba2Config(
        vocab_size=128, hidden_size=64, num_heads=8, head_dim=16, state_size=16, num_hidden_layers=2,
        expand=2, conv_kernel=4, n_groups=2, chunk_size=8)


def bamba(smooth):
    return T.BambaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[1],
        mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=8, max_position_embeddings=256)


def granitemoehybrid(smooth):
    return T.GraniteMoeHybridConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=_experts(smooth, 4, 2), shared_intermediate_size=32,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=8, max_position_embeddings=256, pad_token_id=0)


def falcon_h1(smooth):
    return T.FalconH1Config(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16,
        mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, mamba_rms_norm=False,
        max_position_embeddings=256, initializer_range=0.1)


def mamba(smooth):
    return T.MambaConfig(
        vocab_size=128, hidden_size=64, state_size=16, num_hidden_layers=2, expand=2, conv_kernel=4,
        time_step_rank=8)


def falcon_mamba(smooth):
    return T.FalconMambaConfig(
        vocab_size=128, hidden_size=64, state_size=16, num_hidden_layers=2, expand=2, conv_kernel=4,
        time_step_rank=8)


def jamba(smooth):
    return T.JambaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, num_experts=4,
        num_experts_per_tok=_experts(smooth, 4, 2), expert_layer_period=2, expert_layer_offset=1,
        attn_layer_period=4, attn_layer_offset=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
        mamba_dt_rank=8, max_position_embeddings=256, initializer_range=0.1)


def zamba(smooth):
    return T.ZambaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, n_mamba_heads=2,
        layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid"],
        mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8, max_position_embeddings=256,
        initializer_range=0.13)


def zamba2(smooth):
    return T.Zamba2Config(
        vocab_size=128, hidden_size=64, num_hidden_layers=4,
        layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid"],
        mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_ngroups=2, n_mamba_heads=8,
        chunk_size=8, num_attention_heads=4, num_key_value_heads=4, intermediate_size=64,
        num_mem_blocks=1, max_position_embeddings=256, use_mem_rope=True)


# family -> (config factory, model class, has an LM head, takes position_ids)
MODELS = {
    "qwen3_next": (qwen3_next, "Qwen3NextForCausalLM", True, True),
    "qwen3_5": (qwen3_5, "Qwen3_5ForCausalLM", True, True),
    "qwen3_5_moe": (qwen3_5_moe, "Qwen3_5MoeForCausalLM", True, True),
    "qwen4_exp": (qwen4_exp, "Qwen4ExpForCausalLM", True, True),
    "lara_mini": (lara_mini, "LaraMiniForCausalLM", True, True),
    "olmo_hybrid": (olmo_hybrid, "OlmoHybridForCausalLM", True, True),
    "lfm2": (lfm2, "Lfm2ForCausalLM", True, True),
    "lfm2_moe": (lfm2_moe, "Lfm2MoeForCausalLM", True, True),
    "lfm3": (lfm3, "Lfm3ForCausalLM", True, True),
    "inkling": (inkling, "InklingForCausalLM", True, True),
    "inkling2": (inkling2, "Inkling2ForCausalLM", True, True),
    "inkling2_loop": (inkling2_loop, "Inkling2LoopForCausalLM", True, True),
    "kimi_linear": (kimi_linear, "KimiLinearForCausalLM", True, True),
    "glm5_next": (glm5_next, "Glm5NextTextModel", False, True),
    "bailing_hybrid": (bailing_hybrid, "BailingHybridForCausalLM", True, True),
    "nemotron_h": (nemotron_h, "NemotronHForCausalLM", True, True),
    "mamba2": (mamba2, "Mamba2ForCausalLM", True, False),
    "bamba": (bamba, "BambaForCausalLM", True, True),  # Bamba needs explicit positions with a cache
    "granitemoehybrid": (granitemoehybrid, "GraniteMoeHybridForCausalLM", True, True),
    "falcon_h1": (falcon_h1, "FalconH1ForCausalLM", True, True),
    "zamba2": (zamba2, "Zamba2ForCausalLM", True, True),
    "mamba": (mamba, "MambaForCausalLM", True, False),
    "falcon_mamba": (falcon_mamba, "FalconMambaForCausalLM", True, False),
    "jamba": (jamba, "JambaForCausalLM", True, True),
    "zamba": (zamba, "ZambaForCausalLM", True, True),
}

# Mamba-1 families: transformers 5.24's selective scan takes no initial state, so a multi-token
# continuation of a cached prefill restarts the SSM state from zero (with or without ssmk; mamba_ssm's
# kernel behind the same seam does the same). (b) and (d) are compared with the unhooked run of the
# same scenario only, not with the full prefill; decode steps carry the state, so (c) still is.
RESTARTS_STATE = {"mamba", "falcon_mamba", "jamba", "zamba"}

# Families with conv states no seam computes: Inkling2's dynamic short convs (input-dependent
# kernels, inline torch) keep theirs in the same cache, so ssmk's checkpoints cannot restore a
# whole cache (Checkpoints.rewind raises); (e) is not run for them.
NO_CHECKPOINTS = {"inkling2", "inkling2_loop"}


def build(family, dtype=torch.float32, smooth=False, seed=0):
    config_fn, cls, _, _ = MODELS[family]
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = getattr(T, cls)(config_fn(smooth)).eval().to(dtype)
    if dtype != torch.float32:
        # As from_pretrained(dtype=...) leaves it: the modules the model keeps in f32 stay f32
        # (Inkling2's router needs its gate in f32 to run at all).
        keep = model._keep_in_fp32_modules_strict or ()
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if any(k in name for k in keep):
                t.data = t.data.float()
    return model


# ------------------------------------------------------------------ the scenarios

class Runner:
    def __init__(self, family, model):
        self.family, self.model = family, model
        _, _, self.lm, self.positions = MODELS[family]

    def forward(self, ids, cache=None, start=0):
        kw = {}
        if self.positions:
            kw["position_ids"] = torch.arange(start, start + ids.shape[1]).unsqueeze(0).expand(ids.shape[0], -1)
        out = self.model(input_ids=ids, cache=cache, use_cache=cache is not None, **kw)
        return (out.logits if self.lm else out.last_hidden_state).float()

    def cache(self):
        return DynamicCache(config=self.model.config)

    def full(self, ids):
        return self.forward(ids)

    def chunked(self, ids, chunks=CHUNKS, drop_states=False):
        cache, outs, start = self.cache(), [], 0
        for n in chunks:
            outs.append(self.forward(ids[:, start:start + n], cache, start))
            start += n
            if drop_states:
                for t in linear_states(cache):
                    t.zero_()
        return torch.cat(outs, 1)

    def decode(self, ids, prefill=PREFILL, drop_recurrent=False):
        cache = self.cache()
        outs = [self.forward(ids[:, :prefill], cache)]
        if drop_recurrent:
            for t in linear_states(cache, ("recurrent_states",)):
                t.zero_()
        before = [(t.data_ptr(), t.shape) for t in linear_states(cache)]
        for t in range(prefill, ids.shape[1]):
            outs.append(self.forward(ids[:, t:t + 1], cache, t))
        after = [(t.data_ptr(), t.shape) for t in linear_states(cache)]
        states = [t.float().clone() for t in linear_states(cache)]
        return torch.cat(outs, 1), states, before == after

    def prefix_hit(self, prefix, stale, suffixes):
        """Slot 0 prefills ``prefix``, slot 1 a stale prompt; slot 0 is copied to slot 1 with
        ssmk.batch_memcpy, then each slot continues with its suffix (prefill, then decode steps)."""
        cache = self.cache()
        self.forward(torch.cat([prefix, stale]), cache)
        copy_slot(cache, 0, 1)
        P, S = prefix.shape[1], SUFFIX
        outs = [self.forward(suffixes[:, :S], cache, P)]
        for t in range(S, suffixes.shape[1]):
            outs.append(self.forward(suffixes[:, t:t + 1], cache, P + t))
        return torch.cat(outs, 1)

    def checkpoint_hit(self, a, shared, drop_states=False):
        """(e): hooked, ``a`` is prefilled once with checkpoints at every 16th token and each prompt
        of ``shared`` (sharing ``a``'s first k tokens) continues from a copy of that cache rewound
        to the checkpoint at ``16 * (k // 16)``; unhooked (the reference), from a cold prefill of
        its own first ``16 * (k // 16)`` tokens. Returns the continuations' outputs and the
        linear-attention states each continuation started from (zeroed with ``drop_states``)."""
        hooked = self.family in st.enabled_families()
        if hooked:
            prefilled = self.cache()
            with st.checkpoints(prefilled, every=CHECKPOINT_EVERY) as ckpt:
                self.forward(a, prefilled)
            assert ckpt.offsets == list(range(CHECKPOINT_EVERY, a.shape[1] + 1, CHECKPOINT_EVERY)), ckpt.offsets
        outs, states = [], []
        for k, b in zip(SHARED, shared):
            start = k // CHECKPOINT_EVERY * CHECKPOINT_EVERY
            if hooked:
                cache = ckpt.rewind(copy.deepcopy(prefilled), start)
            else:
                cache = self.cache()
                self.forward(b[:, :start], cache)
            states += [t.float().clone() for t in linear_states(cache)]
            if drop_states:
                for t in linear_states(cache):
                    t.zero_()
            outs.append(self.continue_from(b, cache, start))
        return torch.cat(outs, 1), states

    def continue_from(self, ids, cache, start):
        """``ids[:, start:]`` on a cache holding ``ids[:, :start]``: a prefill of all but the last
        two tokens, then two decode steps (Mamba-1: decode steps only, see RESTARTS_STATE)."""
        stop = start if self.family in RESTARTS_STATE else ids.shape[1] - 2
        outs = [self.forward(ids[:, start:stop], cache, start)] if stop > start else []
        for t in range(stop, ids.shape[1]):
            outs.append(self.forward(ids[:, t:t + 1], cache, t))
        return torch.cat(outs, 1)

    def all(self, ids, prefix_ids, shared):
        """Every scenario's output for this model (hooked or not, as the caller set up)."""
        with torch.inference_mode():
            prefix, stale, suffixes = prefix_ids
            return {
                "a": self.full(ids),
                "b": self.chunked(ids),
                "c": self.decode(ids),
                "d": self.prefix_hit(prefix, stale, suffixes),
                "d_cold": self.full(torch.cat([prefix.expand(2, -1), suffixes], 1))[:, PREFIX:],
                **({} if self.family in NO_CHECKPOINTS else {
                    "e": self.checkpoint_hit(ids, shared),
                    "e_cold": torch.cat([self.full(b)[:, k // CHECKPOINT_EVERY * CHECKPOINT_EVERY:]
                                         for k, b in zip(SHARED, shared)], 1),
                }),
            }


def linear_states(cache, kinds=("conv_states", "recurrent_states")):
    """The conv and recurrent state tensors of every linear-attention layer of a DynamicCache."""
    out = []
    for layer in cache.layers:
        for attr in kinds:
            for t in getattr(layer, attr, {}).values():
                if isinstance(t, torch.Tensor):
                    out.append(t)
    return out


def slot_tensors(cache):
    """Every per-sequence tensor of the cache: conv/recurrent states, attention keys/values, indexer keys."""
    out = list(linear_states(cache))
    for layer in cache.layers:
        for attr in ("keys", "values", "indexer_keys"):
            t = getattr(layer, attr, None)
            if isinstance(t, torch.Tensor) and t.numel():
                out.append(t)
    return out


def copy_slot(cache, src, dst):
    """vLLM's prefix-cache hit: copy slot ``src``'s states to slot ``dst`` in one ssmk.batch_memcpy."""
    dsts, srcs, sizes = [], [], []
    for t in slot_tensors(cache):
        assert t.is_contiguous() and t.dim() >= 2, (t.shape, t.stride())
        row = t[0].numel() * t.element_size()
        dsts.append(t[dst].data_ptr())
        srcs.append(t[src].data_ptr())
        sizes.append(row)
    assert dsts
    ssmk.batch_memcpy(dsts, srcs, sizes)


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 128, (BATCH, LENGTH), generator=g)
    prefix = torch.randint(3, 128, (1, PREFIX), generator=g)
    stale = torch.randint(3, 128, (1, PREFIX), generator=g)
    suffixes = torch.randint(3, 128, (2, SUFFIX + SUFFIX_DECODE), generator=g)
    g = torch.Generator().manual_seed(seed + 1)
    shared = [torch.cat([ids[:, :k], torch.randint(3, 128, (BATCH, PROMPT_B - k), generator=g)], 1) for k in SHARED]
    return ids, (prefix, stale, suffixes), shared


def err(got, want):
    return ((got - want).abs().max() / want.abs().max()).item()


def comparisons(hook, ref, family):
    """name -> (hooked output, reference output) for one family, all scenarios."""
    c_hook, states_hook, inplace = hook["c"]
    c_ref, states_ref, _ = ref["c"]
    out = {
        "a": (hook["a"], ref["a"]),
        "b": (hook["b"], ref["b"]),
        "b~a": (hook["b"], ref["a"]),
        "c": (c_hook, c_ref),
        "c~a": (c_hook, ref["a"]),
        "d": (hook["d"], ref["d"]),
        "d~cold": (hook["d"], ref["d_cold"]),
    }
    if family in RESTARTS_STATE:
        del out["b~a"], out["d~cold"]
    for i, (h, r) in enumerate(zip(states_hook, states_ref)):
        out[f"c.state{i}"] = (h, r)
    if family not in NO_CHECKPOINTS:
        (e_hook, e_states_hook), (e_ref, e_states_ref) = hook["e"], ref["e"]
        out["e"], out["e~cold"] = (e_hook, e_ref), (e_hook, ref["e_cold"])
        assert len(e_states_hook) == len(e_states_ref) > 0
        for i, (h, r) in enumerate(zip(e_states_hook, e_states_ref)):
            out[f"e.state{i}"] = (h, r)
    return out, inplace


def run_family(family, dtype=torch.float32, smooth=False):
    """(reference outputs, hooked outputs, ssmk call counts) for one family."""
    model = build(family, dtype, smooth)
    runner = Runner(family, model)
    ref = runner.all(*inputs())
    st.reset_call_counts()
    with st.enabled([family]) as routed:
        assert routed == [family], routed
        hook = runner.all(*inputs())
    return ref, hook, st.call_counts(), runner


# ------------------------------------------------------------------ tests

_threads = None


def setUpModule():
    # One thread (torch and ssmk alike) for the tiny models: a second buys nothing at this size, and
    # on a loaded machine torch's spinning OpenMP barriers made the file 15x slower at 2 threads.
    # test_threads_follow_torch runs both counts.
    global _threads
    _threads = torch.get_num_threads()
    torch.set_num_threads(1)


def tearDownModule():
    torch.set_num_threads(_threads)


class HookTest(unittest.TestCase):
    def assertRouted(self, family, counts):
        used = {name for (fam, name, route), n in counts.items() if fam == family and route == "ssmk" and n}
        fallbacks = {k: n for k, n in counts.items() if k[2] == "fallback"}
        self.assertEqual(used, set(st.FAMILIES[family]), f"{family}: functions that reached ssmk")
        self.assertEqual(fallbacks, {}, f"{family}: unexpected fallbacks")

    def check_f32(self, family):
        ref, hook, counts, runner = run_family(family)
        self.assertRouted(family, counts)
        pairs, inplace = comparisons(hook, ref, family)
        self.assertTrue(inplace, f"{family}: the cache tensors were replaced, not updated in place")
        for name, (got, want) in pairs.items():
            self.assertLessEqual(err(got, want), F32_TOL, f"{family} f32 {name}")
        # The comparisons have teeth: losing the carried state is far outside the tolerance.
        ids = inputs()[0]
        with torch.inference_mode():
            dropped = runner.chunked(ids, drop_states=True)
        self.assertGreater(err(dropped, ref["b"]), SENSITIVITY * F32_TOL, f"{family}: logits ignore the state")
        if family in RESTARTS_STATE:  # (b) carries only the conv state there: (c) needs the SSM state
            with torch.inference_mode():
                dropped = runner.decode(ids, drop_recurrent=True)[0]
            self.assertGreater(err(dropped, ref["c"][0]), SENSITIVITY * F32_TOL,
                               f"{family}: decode ignores the recurrent state")
        if family in NO_CHECKPOINTS:
            return
        # (e) too: the continuations depend on the states restored from the checkpoints.
        with torch.inference_mode(), st.enabled([family]):
            dropped = runner.checkpoint_hit(ids, inputs()[2], drop_states=True)[0]
        self.assertGreater(err(dropped, ref["e_cold"]), SENSITIVITY * F32_TOL,
                           f"{family}: the continuation ignores the checkpointed states")

    def check_bf16(self, family):
        ref, hook, counts, runner = run_family(family, torch.bfloat16, smooth=True)
        self.assertRouted(family, counts)
        f32 = Runner(family, runner.model.float()).all(*inputs())  # same (bf16-rounded) weights in f32
        pairs_hook, inplace = comparisons(hook, ref, family)
        self.assertTrue(inplace)
        pairs_f32, _ = comparisons(hook, f32, family)
        pairs_ref, _ = comparisons(ref, f32, family)
        for name in pairs_hook:
            if ".state" in name:
                continue  # bf16 models keep f32 recurrent states; covered by the logits
            e_ref = err(*pairs_ref[name])
            self.assertLessEqual(err(*pairs_hook[name]), BF16_VS_REF * e_ref + BF16_FLOOR,
                                 f"{family} bf16 {name}: hooked vs unhooked (e_ref {e_ref:.2e})")
            self.assertLessEqual(err(*pairs_f32[name]), BF16_VS_F32 * e_ref + BF16_FLOOR,
                                 f"{family} bf16 {name}: hooked vs f32 (e_ref {e_ref:.2e})")


def _add_tests():
    for family in MODELS:
        setattr(HookTest, f"test_{family}_f32", lambda self, f=family: self.check_f32(f))
        setattr(HookTest, f"test_{family}_bf16", lambda self, f=family: self.check_bf16(f))


_add_tests()


class ControlTest(unittest.TestCase):
    def tearDown(self):
        st.disable()

    def modules(self):
        import importlib

        return {f: importlib.import_module(f"transformers.models.{f}.modeling_{f}") for f in st.FAMILIES}

    def snapshot(self):
        return {(f, n): getattr(m, n) for f, m in self.modules().items() for n in st.FAMILIES[f]}

    def test_enable_disable_restores_originals(self):
        before = self.snapshot()
        routed = st.enable()
        self.assertEqual(sorted(routed), sorted(st.FAMILIES))
        after = self.snapshot()
        for key, fn in after.items():
            self.assertIsNot(fn, before[key], key)
            self.assertIs(fn._ssmk_original, before[key], key)
        self.assertEqual(sorted(st.enable()), sorted(st.FAMILIES))  # idempotent
        self.assertEqual(self.snapshot(), after)
        st.disable()
        self.assertEqual(st.enabled_families(), [])
        for key, fn in self.snapshot().items():
            self.assertIs(fn, before[key], key)

    def test_context_manager_nests(self):
        before = self.snapshot()
        with st.enabled(["lfm2"]):
            with st.enabled(["lfm2", "mamba2"]) as routed:
                self.assertEqual(routed, ["lfm2", "mamba2"])
            self.assertEqual(st.enabled_families(), ["lfm2"])  # the outer one's stays
        self.assertEqual(self.snapshot(), before)

    def test_versions_from_the_minimum_on(self):
        """Older than MIN_VERSION: nothing patched (unless forced); any newer one, tested or not, is
        routed function by function (no version lock)."""
        before = self.snapshot()
        transformers = sys.modules["transformers"]
        with mock.patch.object(transformers, "__version__", "5.18.2"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.assertEqual(st.enable(), [])
                with st.enabled() as routed:
                    self.assertEqual(routed, [])
            self.assertTrue(any("5.18.2" in str(w.message) and "nothing was patched" in str(w.message)
                                for w in caught), [str(w.message) for w in caught])
            self.assertEqual(self.snapshot(), before)
            self.assertEqual(st.enable(["lfm2"], force=True), ["lfm2"])  # force overrides
        st.disable()
        self.assertEqual(self.snapshot(), before)
        with mock.patch.object(transformers, "__version__", "5.99.0.dev0"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.assertEqual(sorted(st.enable()), sorted(st.FAMILIES))
            self.assertEqual([str(w.message) for w in caught], [])
        st.disable()
        self.assertEqual(self.snapshot(), before)

    def test_runs_on_a_tested_version(self):
        """The pinned transformers of this run is one TESTED_VERSIONS names (a new pin updates both)."""
        self.assertIn(T.__version__, st.TESTED_VERSIONS)

    def test_every_family_with_a_seam_is_routed(self):
        """Every modeling_*.py of this transformers with a kernel seam (a module-level function
        decorated with use_kernel_func_from_hub_with_fallback) is in FAMILIES, with all of its seams
        but the training-only fused ones (ssmk has no backward)."""
        import ast
        import pathlib

        training_only = {"mamba2_split_conv1d_scan_combined", "mamba_inner_fn"}
        found = {}
        for path in sorted(pathlib.Path(T.__file__).parent.glob("models/*/modeling_*.py")):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.FunctionDef) and any(
                        "use_kernel_func_from_hub_with_fallback" in ast.unparse(d) for d in node.decorator_list):
                    found.setdefault(path.parent.name, set()).add(node.name)
        self.assertEqual(sorted(found), sorted(st.FAMILIES))
        for family, names in found.items():
            self.assertEqual(names - training_only, set(st.FAMILIES[family]), family)

    def test_unknown_family_and_model_class_warn(self):
        before = self.snapshot()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertEqual(st.enable(["llama"]), [])
            self.assertEqual(st.enable(torch.nn.Linear(2, 2)), [])
        messages = " | ".join(str(w.message) for w in caught)
        self.assertIn("unknown family 'llama'", messages)
        self.assertIn("no ssmk route for Linear", messages)
        self.assertEqual(self.snapshot(), before)
        # A family this transformers does not ship: warned about and skipped, the others proceed.
        with mock.patch.dict(st.FAMILIES, {"not_in_this_version": st.FAMILIES["lfm2"]}):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.assertEqual(st.enable(["not_in_this_version", "lfm2"]), ["lfm2"])
        self.assertIn("has no not_in_this_version model", " ".join(str(w.message) for w in caught))
        st.disable()
        self.assertEqual(self.snapshot(), before)
        # A model instance enables its own family.
        self.assertEqual(st.enable(build("lfm2")), ["lfm2"])

    def test_functions_are_checked_one_by_one(self):
        """A function replaced by someone else or with other parameters is skipped with a warning and
        keeps what it is; the family's other functions are routed, and disable() restores them."""
        import transformers.models.lfm2.modeling_lfm2 as m
        import transformers.models.qwen3_5.modeling_qwen3_5 as q

        before = self.snapshot()
        foreign = lambda *a, **k: None  # noqa: E731

        def torch_chunk_gated_delta_rule(query, key, value, g, beta, scale, **kwargs):  # another signature
            return None

        torch_chunk_gated_delta_rule.__module__ = q.__name__
        with mock.patch.object(m, "causal_conv1d_fn", foreign), \
                mock.patch.object(q, "torch_chunk_gated_delta_rule", torch_chunk_gated_delta_rule):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.assertEqual(st.enable(["lfm2", "qwen3_5"]), ["lfm2", "qwen3_5"])
            messages = " | ".join(str(w.message) for w in caught)
            self.assertIn("modeling_lfm2.causal_conv1d_fn was already replaced", messages)
            self.assertIn("modeling_qwen3_5.torch_chunk_gated_delta_rule has parameters", messages)
            self.assertEqual(len(caught), 2, messages)
            self.assertIs(m.causal_conv1d_fn, foreign)
            self.assertIs(q.torch_chunk_gated_delta_rule, torch_chunk_gated_delta_rule)
            self.assertEqual(m.causal_conv1d_update._ssmk_family, "lfm2")
            for name in ("causal_conv1d_fn", "causal_conv1d_update", "torch_recurrent_gated_delta_rule"):
                self.assertEqual(getattr(q, name)._ssmk_family, "qwen3_5", name)
            st.disable()
            self.assertIs(m.causal_conv1d_fn, foreign)
        self.assertEqual(self.snapshot(), before)

    def test_olmo_hybrid_beta_reaches_two(self):
        """OLMo-Hybrid's beta = 2 sigmoid(b) (negative eigenvalues of the transition): the routed
        calls see beta well above 1, and check_f32 holds there (its model is the one below)."""
        import transformers.models.olmo_hybrid.modeling_olmo_hybrid as m

        seen = []
        st.enable(["olmo_hybrid"])
        routed = m.torch_chunk_gated_delta_rule

        def spy(*args, **kwargs):
            seen.append(float(kwargs["beta"].max()))
            return routed(*args, **kwargs)

        with mock.patch.object(m, "torch_chunk_gated_delta_rule", spy), torch.inference_mode():
            build("olmo_hybrid")(input_ids=inputs()[0])
        self.assertTrue(seen)
        self.assertGreater(max(seen), 1.5)

    def test_fallbacks(self):
        """Autograd and float64 go to transformers' own functions."""
        model = build("qwen3_5")
        ids = torch.randint(3, 128, (1, 12))
        with torch.no_grad():
            want = model(input_ids=ids).logits
        st.enable(["qwen3_5"])
        st.reset_call_counts()
        got = model(input_ids=ids).logits  # grad enabled, weights require grad
        self.assertTrue(got.requires_grad)
        got.sum().backward()  # works: the torch path ran
        self.assertEqual({k[2] for k in st.call_counts()}, {"fallback"})
        torch.testing.assert_close(got.detach(), want, rtol=0, atol=0)
        st.reset_call_counts()
        with torch.no_grad():
            model.double()(input_ids=ids)
        self.assertEqual({k[2] for k in st.call_counts()}, {"fallback"})

    def test_conv_weight_in_another_dtype(self):
        """A bf16 conv fed f32 activations (Inkling's short convs in a model cast whole to bf16):
        ssmk convolves with the weight widened to f32, i.e. transformers' function on the f32 weight
        (which itself would round the activations to bf16 first)."""
        import transformers.models.inkling.modeling_inkling as m

        g = torch.Generator().manual_seed(5)
        x, x1 = torch.randn(2, 16, 9, generator=g), torch.randn(2, 16, 1, generator=g)
        w, bias = torch.randn(16, 4, generator=g).bfloat16(), torch.randn(16, generator=g).bfloat16()
        state = torch.randn(2, 16, 4, generator=g)
        with torch.no_grad():
            want = m.causal_conv1d_fn(x, w.float(), bias.float())
            want_state = state.clone()
            want1 = m.causal_conv1d_update(x1, want_state, w.float(), bias.float())
            st.enable(["inkling"])
            st.reset_call_counts()
            got = m.causal_conv1d_fn(x, w, bias)
            got1 = m.causal_conv1d_update(x1, state, w, bias)
        self.assertEqual({k[2] for k in st.call_counts()}, {"ssmk"})
        self.assertEqual((got.dtype, got1.dtype), (torch.float32, torch.float32))
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        torch.testing.assert_close(got1, want1, rtol=0, atol=1e-6)
        torch.testing.assert_close(state, want_state, rtol=0, atol=0)

    def test_compile_traces_the_original(self):
        """Under torch.compile (dynamo) tracing the replacement hands over to transformers' function."""
        import transformers.models.lfm2.modeling_lfm2 as m

        x, w = torch.randn(2, 8, 5), torch.randn(8, 3)
        want = m.causal_conv1d_fn(x, w, None, activation="silu")
        st.enable(["lfm2"])
        st.reset_call_counts()
        compiled = torch.compile(lambda x, w: m.causal_conv1d_fn(x, w, None, activation="silu"),
                                 backend="eager", fullgraph=True)
        with torch.no_grad():
            got = compiled(x, w)
        self.assertEqual(st.call_counts(), {("lfm2", "causal_conv1d_fn", "fallback"): 1})
        torch.testing.assert_close(got, want)
        with torch.no_grad():
            eager = m.causal_conv1d_fn(x, w, None, activation="silu")  # not compiling: ssmk
        self.assertEqual(st.call_counts()[("lfm2", "causal_conv1d_fn", "ssmk")], 1)
        torch.testing.assert_close(eager, want, rtol=0, atol=1e-6)

    def test_mamba1_seams_on_every_layout(self):
        """The Mamba-1 replacements against transformers' own functions on the views the layers pass
        (batch 2: u channel-major, dt token-major, z a slice of the [B, 2D, L] projection, B/C
        transposed [B, L, N] splits), a Zamba-style strided state slice in decode, and the
        fallback (autograd) with the original's arguments."""
        import transformers.models.mamba.modeling_mamba as mm

        g = torch.Generator().manual_seed(4)
        Bsz, Dm, L, N = 2, 12, 9, 4
        scan_ref, update_ref = mm.mamba_selective_scan, mm.mamba_selective_state_update
        u = torch.randn(Bsz, Dm, L, generator=g)
        dt = torch.randn(Bsz, L, Dm, generator=g).transpose(1, 2) - 2
        z = torch.randn(Bsz, 2 * Dm, L, generator=g)[:, Dm:]
        bc = torch.randn(Bsz, L, 3 + 2 * N, generator=g)
        B, C = bc[..., 3:3 + N].transpose(1, 2), bc[..., 3 + N:].transpose(1, 2)
        A = -torch.exp(torch.rand(Dm, N, generator=g) * 2)
        D, bias = torch.randn(Dm, generator=g), torch.randn(Dm, generator=g) - 2
        kw = dict(D=D, z=z, delta_bias=bias, delta_softplus=True, return_last_state=True)
        pool = torch.randn(Bsz, 3, Dm, N, generator=g)  # Zamba: [B, heads, D, N], one head's slice
        x1, dt1, z1 = (torch.randn(Bsz, Dm, generator=g) for _ in range(3))
        B1, C1 = torch.randn(Bsz, N, generator=g), torch.randn(Bsz, N, generator=g)
        with torch.no_grad():
            want, want_state = scan_ref(u, dt, A, B, C, **kw)
            want_pool = pool.clone()
            want1 = update_ref(want_pool[:, 1], x1, dt1, A, B1, C1, D, dt_bias=bias, dt_softplus=True, z=z1)
            st.enable(["mamba"])
            st.reset_call_counts()
            got, got_state = mm.mamba_selective_scan(u, dt, A, B, C, **kw)
            got1 = mm.mamba_selective_state_update(pool[:, 1], x1, dt1, A, B1, C1, D, dt_bias=bias,
                                                   dt_softplus=True, z=z1)
        self.assertEqual(st.call_counts(), {("mamba", "mamba_selective_scan", "ssmk"): 1,
                                            ("mamba", "mamba_selective_state_update", "ssmk"): 1})
        tol = dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got, want.float(), **tol)
        torch.testing.assert_close(got_state, want_state.float(), **tol)
        torch.testing.assert_close(got1, want1, **tol)
        torch.testing.assert_close(pool, want_pool, **tol)  # only head 1 changed, in place
        # Autograd: transformers' function runs, with the arguments it was given.
        st.reset_call_counts()
        out = mm.mamba_selective_scan(u.clone().requires_grad_(), dt, A, B, C, **kw)[0]
        self.assertTrue(out.requires_grad)
        self.assertEqual(st.call_counts(), {("mamba", "mamba_selective_scan", "fallback"): 1})
        torch.testing.assert_close(out.detach(), want, rtol=0, atol=0)

    def test_packed_sequences_are_kept_apart(self):
        """Batch 1 with cu_seqlens / seq_idx (packed sequences): each sequence as if alone
        (transformers' torch references refuse these arguments; fla and mamba_ssm honour them)."""
        import transformers.models.mamba2.modeling_mamba2 as mm
        import transformers.models.qwen3_next.modeling_qwen3_next as qm

        g = torch.Generator().manual_seed(3)
        lens, L = (7, 30), 37
        cu = torch.tensor([0, 7, 37], dtype=torch.int32)
        seq_idx = torch.tensor([[0] * 7 + [1] * 30], dtype=torch.int32)
        pieces = lambda t, dim: torch.split(t, lens, dim)  # noqa: E731
        conv_ref, gdn_ref, scan_ref = qm.causal_conv1d_fn, qm.torch_chunk_gated_delta_rule, mm.mamba2_chunk_scan
        x, w = torch.randn(1, 16, L, generator=g), torch.randn(16, 4, generator=g)
        q, k = (torch.nn.functional.normalize(torch.randn(1, L, 2, 8, generator=g), dim=-1) for _ in range(2))
        v = torch.randn(1, L, 4, 8, generator=g)
        gate = -torch.rand(1, L, 4, generator=g)
        beta = torch.rand(1, L, 4, generator=g)
        xs, dt = torch.randn(1, L, 4, 8, generator=g), torch.randn(1, L, 4, generator=g)
        A, B, C = -torch.rand(4, generator=g), torch.randn(1, L, 2, 8, generator=g), torch.randn(1, L, 2, 8, generator=g)
        D, dt_bias = torch.rand(4, generator=g), torch.rand(4, generator=g)
        with torch.no_grad():
            conv_want = torch.cat([conv_ref(p, w, None, activation="silu") for p in pieces(x, 2)], 2)
            gdn_want = [gdn_ref(*a, g=b, beta=c, output_final_state=True, use_qk_l2norm_in_kernel=True)
                        for *a, b, c in zip(pieces(q, 1), pieces(k, 1), pieces(v, 1), pieces(gate, 1), pieces(beta, 1))]
            scan_want = [scan_ref(a, b, A, c, d, chunk_size=8, D=D, dt_bias=dt_bias, dt_softplus=True,
                                  return_final_states=True)
                         for a, b, c, d in zip(pieces(xs, 1), pieces(dt, 1), pieces(B, 1), pieces(C, 1))]
            st.enable(["qwen3_next", "mamba2"])
            st.reset_call_counts()
            conv_a = qm.causal_conv1d_fn(x, w, None, activation="silu", cu_seq_lens_q=cu)
            conv_b = qm.causal_conv1d_fn(x, w, None, activation="silu", seq_idx=seq_idx)
            out, state = qm.torch_chunk_gated_delta_rule(q, k, v, g=gate, beta=beta, output_final_state=True,
                                                         use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
            y, h = mm.mamba2_chunk_scan(xs, dt, A, B, C, chunk_size=8, D=D, dt_bias=dt_bias, dt_softplus=True,
                                        return_final_states=True, seq_idx=seq_idx)
        self.assertEqual({k[2] for k in st.call_counts()}, {"ssmk"})
        tol = dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(conv_a, conv_want, **tol)
        torch.testing.assert_close(conv_b, conv_want, **tol)
        torch.testing.assert_close(out, torch.cat([o for o, _ in gdn_want], 1), **tol)
        torch.testing.assert_close(state, torch.cat([s for _, s in gdn_want]), **tol)
        torch.testing.assert_close(y.float(), torch.cat([o for o, _ in scan_want], 1), **tol)
        torch.testing.assert_close(h, torch.cat([s for _, s in scan_want]), **tol)

    def test_generate_left_padded(self):
        """Greedy generate of a left-padded batch (attention mask): the same tokens."""
        for family in ("qwen3_next", "lfm2", "kimi_linear", "bamba", "jamba", "qwen4_exp", "lara_mini",
                       "olmo_hybrid", "bailing_hybrid", "lfm3", "inkling", "inkling2", "inkling2_loop"):
            model = build(family)
            ids = torch.randint(3, 128, (2, 30))
            mask = torch.ones_like(ids)
            ids[1, :9], mask[1, :9] = 0, 0
            kw = dict(attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = model.generate(ids, **kw)
                st.reset_call_counts()
                with st.enabled([family]):
                    got = model.generate(ids, **kw)
            self.assertEqual({k[2] for k in st.call_counts()}, {"ssmk"}, family)
            self.assertTrue(torch.equal(got, want), family)

    def test_checkpoints_api(self):
        """Explicit offsets (one inside a 16-token chunk, one at the end), rewinding to each, and
        the errors: no such checkpoint, nothing captured, a fallback under a capture, nesting."""
        runner = Runner("qwen3_5", build("qwen3_5"))
        ids, _, shared = inputs()
        st.enable(["qwen3_5"])
        with torch.inference_mode():
            cache = runner.cache()
            with st.checkpoints(cache, offsets=[80, 5, 37]) as ckpt:
                with self.assertRaisesRegex(RuntimeError, "another capture"):
                    with st.checkpoints(runner.cache(), every=16):
                        pass
                with self.assertRaisesRegex(RuntimeError, "nothing was captured"):
                    ckpt.rewind(cache, 37)
                runner.forward(ids, cache)
            self.assertEqual(ckpt.offsets, [5, 37, 80])
            self.assertFalse("update_conv_state" in vars(cache) or "update_recurrent_state" in vars(cache))
            b = shared[0]  # shares 37 tokens
            for start in (5, 37):
                got = runner.continue_from(b, ckpt.rewind(copy.deepcopy(cache), start), start)
                self.assertLessEqual(err(got, runner.full(b)[:, start:]), F32_TOL, start)
            with self.assertRaisesRegex(ValueError, "no checkpoint at 36"):
                ckpt.rewind(cache, 36)
            cache = runner.cache()
            with self.assertRaisesRegex(ValueError, "outside"):
                with st.checkpoints(cache, offsets=[81]):
                    runner.forward(ids, cache)
        with self.assertRaisesRegex(ValueError, "one of every= and offsets="):
            with st.checkpoints(cache):
                pass
        # Autograd: the kernels would fall back to transformers, which take no checkpoints.
        cache = runner.cache()
        with self.assertRaisesRegex(RuntimeError, "fell back to transformers"):
            with st.checkpoints(cache, every=16):
                runner.forward(ids, cache)

    def test_threads_follow_torch(self):
        model = build("qwen3_5")
        ids = torch.randint(3, 128, (2, 40))
        n = torch.get_num_threads()
        outs = []
        try:
            with st.enabled(["qwen3_5"]), torch.inference_mode():
                for threads in (1, 2):
                    torch.set_num_threads(threads)
                    outs.append(model(input_ids=ids).logits)
        finally:
            torch.set_num_threads(n)
        self.assertTrue(torch.equal(outs[0], outs[1]))  # ssmk results do not depend on the thread count
        self.assertTrue({1, 2} <= set(st._contexts))


# ------------------------------------------------------------------ --report

def report():
    """Print the measured errors and timings (what the tolerances were chosen from)."""
    setUpModule()
    print(f"transformers {T.__version__}, torch {torch.__version__}, ssmk {ssmk.version()} "
          f"({ssmk.active_isa()}), {torch.get_num_threads()} threads")
    print("f32: max err over scenarios (relative to max |logit|); sensitivity = err when the state is dropped")
    for family in MODELS:
        t0 = time.time()
        ref, hook, counts, runner = run_family(family)
        pairs, inplace = comparisons(hook, ref, family)
        errs = {k: err(*v) for k, v in pairs.items()}
        with torch.inference_mode():
            dropped = err(runner.chunked(inputs()[0], drop_states=True), ref["b"])
            if family in RESTARTS_STATE:
                dropped = min(dropped, err(runner.decode(inputs()[0], drop_recurrent=True)[0], ref["c"][0]))
            checkpoints = "(e) n/a"
            if family not in NO_CHECKPOINTS:
                with st.enabled([family]):
                    e_dropped = err(runner.checkpoint_hit(inputs()[0], inputs()[2], drop_states=True)[0],
                                    ref["e_cold"])
                e_states = max(v for k, v in errs.items() if k.startswith("e.state"))
                checkpoints = (f"e {errs['e']:.1e} e~cold {errs['e~cold']:.1e} e.states {e_states:.1e}, "
                               f"sensitivity {e_dropped:.1e}")
        worst = max(errs, key=errs.get)
        cold = f"{errs['d~cold']:.1e}" if "d~cold" in errs else "n/a"
        print(f"  {family:17s} max {errs[worst]:.1e} ({worst}); a {errs['a']:.1e} b {errs['b']:.1e} "
              f"c {errs['c']:.1e} d {errs['d']:.1e} d~cold {cold}; sensitivity {dropped:.1e}; {checkpoints}; "
              f"in place {inplace}; {time.time() - t0:.1f}s")
    print("bf16 (smooth configs): e_ref = err(torch bf16 vs f32); hook/ref = err(hooked vs unhooked) / e_ref; "
          "hook/f32 = err(hooked vs f32) / e_ref (worst scenario)")
    for family in MODELS:
        t0 = time.time()
        ref, hook, counts, runner = run_family(family, torch.bfloat16, smooth=True)
        f32 = Runner(family, runner.model.float()).all(*inputs())
        ph, _ = comparisons(hook, ref, family)
        pf, _ = comparisons(hook, f32, family)
        pr, _ = comparisons(ref, f32, family)
        rows = []
        for name in ph:
            if ".state" in name:
                continue
            e_ref = err(*pr[name])
            rows.append((name, e_ref, err(*ph[name]), err(*pf[name])))
        e_max = max(r[1] for r in rows)
        r1 = max(rows, key=lambda r: r[2] / r[1])
        r2 = max(rows, key=lambda r: r[3] / r[1])
        print(f"  {family:17s} e_ref {min(r[1] for r in rows):.1e}..{e_max:.1e}; "
              f"hook/ref {r1[2] / r1[1]:.2f} ({r1[0]}, {r1[2]:.1e}); hook/f32 {r2[3] / r2[1]:.2f} ({r2[0]}); "
              f"{time.time() - t0:.1f}s")


if __name__ == "__main__":
    if "--report" in sys.argv:
        report()
    else:
        unittest.main()
