"""Tiny random-weight hybrid models for the vLLM lane, built locally (no downloads).

Each builder writes a Hugging Face checkpoint (config + ``save_pretrained`` safetensors) and a
word-level tokenizer built from a fixed vocabulary, so vLLM and transformers load the same files.
"""

import os

import torch

VOCAB = 256
WORDS = ["<unk>", "<pad>", "<eos>"] + [f"w{i}" for i in range(VOCAB - 3)]


def save_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                                   eos_token="<eos>")
    fast.save_pretrained(path)


def _common(**kw):
    base = dict(vocab_size=VOCAB, pad_token_id=1, bos_token_id=2, eos_token_id=2,
                max_position_embeddings=1024, tie_word_embeddings=False)
    base.update(kw)
    return base


def qwen3_5_config(hidden=64, layers=4, k_heads=2, v_heads=4, head=32, attn_head=32, **kw):
    # Two attention heads and even GDN head counts: the model splits over 2 tensor-parallel ranks.
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(**_common(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // attn_head), num_key_value_heads=1,
        head_dim=attn_head, linear_conv_kernel_dim=4, linear_key_head_dim=head,
        linear_value_head_dim=head, linear_num_key_heads=k_heads, linear_num_value_heads=v_heads,
        layer_types=[("full_attention" if i % 4 == 3 else "linear_attention")
                     for i in range(layers)],
        architectures=["Qwen3_5ForCausalLM"], **kw))


def qwen3_next_config(hidden=64, layers=4, head=64, **kw):
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(**_common(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=2, head_dim=64, linear_conv_kernel_dim=4,
        linear_key_head_dim=head, linear_value_head_dim=head, linear_num_key_heads=1,
        linear_num_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, decoder_sparse_step=1,
        layer_types=[("full_attention" if i % 4 == 3 else "linear_attention")
                     for i in range(layers)],
        architectures=["Qwen3NextForCausalLM"], **kw))


def lfm2_config(hidden=64, layers=4, attn_heads=2, kv_heads=1, **kw):
    from transformers import Lfm2Config

    return Lfm2Config(**_common(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=attn_heads, num_key_value_heads=kv_heads, conv_L_cache=3,
        conv_bias=False, block_auto_adjust_ff_dim=False, conv_dim=hidden, block_dim=hidden,
        layer_types=[("full_attention" if i % 2 == 1 else "conv") for i in range(layers)],
        architectures=["Lfm2ForCausalLM"], **kw))


def nemotron_h_config(hidden=64, pattern="M*M-", heads=4, head=16, state=16, groups=2, expand=1,
                      attn_heads=2, kv_heads=1, attn_head=32, **kw):
    from transformers import NemotronHConfig

    return NemotronHConfig(**_common(
        hidden_size=hidden, hybrid_override_pattern=pattern, num_attention_heads=attn_heads,
        num_key_value_heads=kv_heads, head_dim=attn_head, intermediate_size=2 * hidden,
        mamba_num_heads=heads,
        mamba_head_dim=head, ssm_state_size=state, n_groups=groups, conv_kernel=4, expand=expand,
        chunk_size=32, mamba_ssm_cache_dtype="float32", architectures=["NemotronHForCausalLM"],
        **kw))


def kimi_linear_config(hidden=64, layers=4, **kw):
    from transformers import KimiLinearConfig

    types = [("full_attention" if i % 4 == 3 else "linear_attention") for i in range(layers)]
    return KimiLinearConfig(**_common(
        hidden_size=hidden, intermediate_size=2 * hidden, moe_intermediate_size=32,
        num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=512,
        q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32,
        num_experts=4, num_experts_per_token=2, num_shared_experts=1,
        mlp_layer_types=["dense"] * layers, first_k_dense_replace=layers, moe_layer_freq=1,
        linear_head_dim=32, linear_num_heads=2, linear_conv_kernel_dim=4,
        layer_types=types,
        # vLLM reads the checkpoint's own format: 1-based KDA / MLA layer lists and a NoPE MLA
        # (transformers' MLA applies no rotary either).
        linear_attn_config=dict(
            kda_layers=[i + 1 for i, t in enumerate(types) if t == "linear_attention"],
            full_attn_layers=[i + 1 for i, t in enumerate(types) if t == "full_attention"],
            num_heads=2, head_dim=32, short_conv_kernel_size=4),
        mla_use_nope=True, architectures=["KimiLinearForCausalLM"], **kw))


def jamba_config(hidden=64, layers=4, state=16, expand=2, **kw):
    from transformers import JambaConfig

    # Layers M, M(MoE), M, A(MoE): Mamba-1 mixers with per-channel A [d_inner, N], and one
    # attention layer; experts on every second layer as in the released models.
    return JambaConfig(**_common(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, num_experts=4, num_experts_per_tok=2,
        expert_layer_period=2, expert_layer_offset=1, attn_layer_period=4, attn_layer_offset=3,
        use_mamba_kernels=False, mamba_d_state=state, mamba_d_conv=4, mamba_expand=expand,
        mamba_dt_rank=8, mamba_conv_bias=True, mamba_proj_bias=False,
        architectures=["JambaForCausalLM"], **kw))


CONFIGS = {
    # float32: vLLM's own GDN op asserts bf16, the plugin serves f32 (Qwen3-Next keeps bf16).
    "qwen3_5": (qwen3_5_config, torch.float32),
    "qwen3_next": (qwen3_next_config, torch.bfloat16),
    "lfm2": (lfm2_config, torch.float32),
    "nemotron_h": (nemotron_h_config, torch.float32),
    "kimi_linear": (kimi_linear_config, torch.bfloat16),
    "jamba": (jamba_config, torch.float32),
}


def build(family, root, seed=0, **kw):
    """Writes ``root/family`` (once) and returns ``(path, dtype)``."""
    from transformers import AutoModelForCausalLM

    make, dtype = CONFIGS[family]
    path = os.path.join(root, family)
    if not os.path.exists(os.path.join(path, "config.json")):
        cfg = make(**kw)
        cfg.dtype = dtype
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        with torch.no_grad():
            for name, p in model.named_parameters():
                # Larger random weights than the 0.02 default, so that every layer moves the
                # logits and a wrong state shows; decays kept in the models' usual range.
                if p.dim() >= 2:
                    p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
        model.save_pretrained(path)
        if family == "kimi_linear":
            _dense_mlp_names(path)
        if family == "qwen3_5":
            _add_mtp_layer(path, seed)
        save_tokenizer(path)
    return path, dtype


def _dense_mlp_names(path):
    """transformers saves Kimi Linear's dense MLPs under ``block_sparse_moe.`` (its reverse of the
    MoE renaming); the released checkpoints, and vLLM, name them ``mlp.``, which transformers
    loads as well."""
    from safetensors.torch import load_file, save_file

    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    save_file({k.replace(".block_sparse_moe.", ".mlp."): v for k, v in tensors.items()}, file,
              metadata={"format": "pt"})


def _add_mtp_layer(path, seed):
    """Adds the multi-token-prediction head Qwen3.5 checkpoints ship (``mtp.*``, one layer; vLLM's
    ``speculative_config={"method": "mtp"}`` drafts with it, transformers ignores it): a copy of
    the model's attention layer, random ``fc`` and zero (identity) norms. Random weights draft
    tokens the model mostly rejects, which is what the check needs: drafts verified every step."""
    import json

    from safetensors.torch import load_file, save_file

    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    hidden, dtype = config["hidden_size"], tensors["lm_head.weight"].dtype
    layer = f"model.layers.{config['layer_types'].index('full_attention')}."
    for name, value in list(tensors.items()):
        if name.startswith(layer):
            tensors["mtp.layers.0." + name[len(layer):]] = value.clone()
    gen = torch.Generator().manual_seed(seed + 1)
    tensors["mtp.fc.weight"] = (torch.randn(hidden, 2 * hidden, generator=gen)
                                / (2 * hidden) ** 0.5).to(dtype)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"mtp.{norm}.weight"] = torch.zeros(hidden, dtype=dtype)
    save_file(tensors, file, metadata={"format": "pt"})
    config["mtp_num_hidden_layers"] = 1
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
