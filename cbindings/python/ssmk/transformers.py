"""Route the recurrent kernels of Hugging Face ``transformers`` models to ssmk on CPU.

::

    import torch
    import ssmk.transformers

    ssmk.transformers.enable()              # every family this transformers version has
    with torch.inference_mode():
        out = model.generate(input_ids, max_new_tokens=64)
    ssmk.transformers.disable()             # the originals are back

    with ssmk.transformers.enabled(["qwen3_next"]):   # or scoped
        ...

How: in transformers (5.19 on; written against 5.24 and 5.25) every recurrent layer calls
module-level kernel functions of its own ``modeling_<family>.py`` by their global name -- the torch
references decorated with ``use_kernel_func_from_hub_with_fallback`` (the seam through which fla /
mamba_ssm / causal_conv1d / hub kernels are plugged in; 5.25 adds ``causal_conv1d_forward`` and
``mamba(2)_scan_forward`` wrappers in front, which still call them by their global names).
:func:`enable` replaces exactly those globals, keeps the objects it replaced and :func:`disable`
puts them back; no model code is copied or changed and model instances that already exist pick the
change up at their next call:

* every family below: ``causal_conv1d_fn``, ``causal_conv1d_update`` -> ssmk's causal conv;
* ``qwen3_next``, ``qwen3_5``, ``qwen3_5_moe``, ``qwen4_exp``, ``lara_mini``, ``olmo_hybrid``
  (Gated DeltaNet; OLMo-Hybrid's β is in [0, 2], ``allow_neg_eigval``, which ssmk takes as it is):
  ``torch_chunk_gated_delta_rule``, ``torch_recurrent_gated_delta_rule`` ->
  ``ssmk_gated_delta_rule`` (per-head decay);
* ``kimi_linear``, ``glm5_next``, ``bailing_hybrid`` (Kimi Delta Attention; Ling's lower-bound
  "safe" gate is computed by the layer before the seam): ``chunk_kimi_delta_attention``,
  ``recurrent_kimi_delta_attention`` -> ``ssmk_gated_delta_rule`` (per-key-channel decay);
* ``lfm2``, ``lfm2_moe``, ``lfm3`` (ShortConv): the conv pair only (``B*x`` and ``C*y`` are inline
  torch in the layer, so ``ssmk_short_conv`` has no seam);
* ``inkling``, ``inkling2``, ``inkling2_loop``: the conv pair, for their static short convs (the
  dynamic ones of ``inkling2`` / ``inkling2_loop`` compute input-dependent kernels inline in
  torch: no seam);
* ``mamba2``, ``nemotron_h``, ``bamba``, ``granitemoehybrid`` (Granite 4), ``falcon_h1``, ``zamba2``
  (Mamba-2): ``mamba2_chunk_scan``, ``mamba2_selective_state_update`` -> ``ssmk_mamba2_scan``;
* ``mamba``, ``falcon_mamba``, ``jamba``, ``zamba`` (Mamba-1): ``mamba_selective_scan``,
  ``mamba_selective_state_update`` (mamba_ssm's ``selective_scan_fn`` / ``selective_state_update``
  seams) -> ``ssmk_mamba2_scan`` with ``A [d_inner, N]``: the layer's ``d_inner`` channels are
  ``d_inner`` heads of ``P = 1`` sharing one group of ``B``/``C`` (ABI.md 4.9). The layers hold
  ``x``, ``dt``, ``z`` channel-major (``[B, d_inner, L]`` views, tokens contiguous or not): each
  batch row goes to ssmk as its own strided view, no copy. Like the torch reference and
  mamba_ssm's kernel, ``mamba_selective_scan`` starts every sequence from a zero state (it is
  given no initial state): in transformers 5.24 and 5.25 a Mamba-1 layer continuing a cached
  prefill with more than one token drops its recurrent state, with or without ssmk (single-token
  decode steps carry it). MiniMax's lightning attention is computed inline in its attention module (no
  module-level kernel function), so it has no seam to route.

Each replacement has the signature and the semantics of the torch reference it replaces (inputs,
outputs, dtypes, in-place updates; arithmetic in f32), accepts and ignores keyword arguments it
does not know (the layers forward theirs), and calls the replaced object instead -- transformers'
own path, unchanged -- when ssmk cannot or must not run: a tensor not on the CPU, autograd needed
(``torch.is_grad_enabled()`` and an input that requires grad: ssmk has no backward, so run
inference under ``torch.no_grad()`` / ``torch.inference_mode()``), ``torch.compile`` / export
tracing, a dtype other than f32/bf16/f16, or a layout ssmk does not cover (a conv state longer than
the kernel, as in ``record_past`` mode; a non-broadcast decode ``dt``/``A``; packed sequences with
more than one row). Packed sequences (batch 1 with ``cu_seqlens`` / ``cu_seq_lens_q`` /
``seq_idx``) are kept apart, as fla / mamba_ssm do. One deliberate difference: ``mamba2_chunk_scan``
and ``mamba_selective_scan`` return the input's dtype, as mamba_ssm's kernels do, where the torch
references return f32 (what follows casts or computes in f32 either way).

The cache tensors transformers passes are used in place, no copy: a conv state ``[B, D, W]``
(channels first, newest input last) is handed to ssmk as the strided view
``state.transpose(1, 2)[:, 1:, :]`` = ssmk's ``[S=B, W-1, D]`` rows (column 0, which no conv reads,
is kept as transformers would leave it); recurrent states ``[B, HV, K, V]`` / ``[B, NH, P, N]`` f32
are ssmk's ``[S, ...]`` order, Mamba-1's ``[B, D, N]`` (Zamba: a head's strided slice of
``[B, heads, D, N]``) is ssmk's ``[S, D, 1, N]``. When a final state is requested with an ``initial_state`` given (the
cache's tensor: the layers then copy the result back onto it), the final state is written into that
tensor and returned.

Prefix caching inside a prefill: :func:`checkpoints` makes the routed kernels of one cached forward
also store their states at chosen token offsets (ssmk's state checkpoints, ABI.md 4.10), and
:meth:`Checkpoints.rewind` turns a copy of that cache into the cache of a call that ended at any
of them (states from the checkpoints, attention keys/values cropped), for a prompt sharing that
prefix to continue from.

Threads: each call runs on ``torch.get_num_threads()`` threads (one ``ssmk.Context`` per count,
created on first use and kept). Versions: any transformers from :data:`MIN_VERSION` on; each
function is checked on its own (present, not replaced by someone else, the parameters of the torch
reference it stands for): one that differs is skipped with a warning and keeps transformers' code,
the family's other functions are routed. Tested end to end on :data:`TESTED_VERSIONS`. An older
transformers gets a warning and nothing is patched unless ``enable(force=True)``.
"""

import contextlib
import importlib
import inspect
import sys
import threading
import warnings
from ctypes import byref, c_int64

import torch

import ssmk

__all__ = [
    "FAMILIES",
    "MIN_VERSION",
    "TESTED_VERSIONS",
    "Checkpoints",
    "call_counts",
    "checkpoints",
    "disable",
    "enable",
    "enabled",
    "enabled_families",
    "reset_call_counts",
]

#: The oldest transformers whose seams have the semantics this module implements.
MIN_VERSION = (5, 19)
#: The transformers releases the end-to-end tests run on (cbindings/python/tests_e2e).
TESTED_VERSIONS = ("5.24.0", "5.25.0")

_CONV = ("causal_conv1d_fn", "causal_conv1d_update")
_GDN = _CONV + ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
_KDA = _CONV + ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention")
_MAMBA2 = _CONV + ("mamba2_chunk_scan", "mamba2_selective_state_update")
_MAMBA1 = _CONV + ("mamba_selective_scan", "mamba_selective_state_update")

#: family (the ``transformers.models`` sub-package) -> the module functions replaced.
FAMILIES = {
    "qwen3_next": _GDN,
    "qwen3_5": _GDN,
    "qwen3_5_moe": _GDN,
    "qwen4_exp": _GDN,
    "lara_mini": _GDN,
    "olmo_hybrid": _GDN,
    "kimi_linear": _KDA,
    "glm5_next": _KDA,
    "bailing_hybrid": _KDA,
    "lfm2": _CONV,
    "lfm2_moe": _CONV,
    "lfm3": _CONV,
    "inkling": _CONV,
    "inkling2": _CONV,
    "inkling2_loop": _CONV,
    "mamba2": _MAMBA2,
    "nemotron_h": _MAMBA2,
    "bamba": _MAMBA2,
    "granitemoehybrid": _MAMBA2,
    "falcon_h1": _MAMBA2,
    "zamba2": _MAMBA2,
    "mamba": _MAMBA1,
    "falcon_mamba": _MAMBA1,
    "jamba": _MAMBA1,
    "zamba": _MAMBA1,
}

# Parameter names of the torch references (5.19 to 5.25 alike): what the replacements implement.
_PARAMS = {
    "causal_conv1d_fn": ("hidden_states", "weight", "bias", "activation", "kwargs"),
    "causal_conv1d_update": ("hidden_states", "conv_state", "weight", "bias", "activation"),
    "torch_chunk_gated_delta_rule": ("query", "key", "value", "g", "beta", "chunk_size", "initial_state",
                                     "output_final_state", "use_qk_l2norm_in_kernel", "kwargs"),
    "torch_recurrent_gated_delta_rule": ("query", "key", "value", "g", "beta", "initial_state",
                                         "output_final_state", "use_qk_l2norm_in_kernel", "kwargs"),
    "chunk_kimi_delta_attention": ("query", "key", "value", "g", "beta", "chunk_size", "initial_state",
                                   "output_final_state", "use_qk_l2norm_in_kernel", "kwargs"),
    "recurrent_kimi_delta_attention": ("query", "key", "value", "g", "beta", "initial_state",
                                       "output_final_state", "use_qk_l2norm_in_kernel", "kwargs"),
    "mamba2_chunk_scan": ("hidden_states", "dt", "A", "B", "C", "chunk_size", "D", "dt_bias", "initial_states",
                          "dt_softplus", "dt_limit", "return_final_states", "kwargs"),
    "mamba2_selective_state_update": ("state", "hidden_states", "dt", "A", "B", "C", "D", "dt_bias",
                                      "dt_softplus", "z", "kwargs"),
    "mamba_selective_scan": ("hidden_states", "dt", "A", "B", "C", "D", "z", "delta_bias", "delta_softplus",
                             "return_last_state", "use_mambapy", "use_associative_scan", "kwargs"),
    "mamba_selective_state_update": ("state", "hidden_states", "dt", "A", "B", "C", "D", "dt_bias",
                                     "dt_softplus", "z", "kwargs"),
}

_lock = threading.RLock()
_patched = {}  # family -> {name: replaced object}
_counts = {}  # (family, name, "ssmk" | "fallback") -> calls


# ------------------------------------------------------------------ descriptors and contexts

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_DTYPES = {
    torch.float32: ssmk.DType(2, 32, 1),
    torch.float16: ssmk.DType(2, 16, 1),
    torch.bfloat16: ssmk.DType(4, 16, 1),
    torch.int32: ssmk.DType(0, 32, 1),
    torch.int64: ssmk.DType(0, 64, 1),
    torch.uint8: ssmk.DType(1, 8, 1),
    torch.bool: ssmk.DType(6, 8, 1),
}
_CPU = ssmk.Device(ssmk.DEVICE_CPU, 0)


def _desc(t):
    """An ``ssmk_tensor`` over ``t``'s memory (shape and strides as they are); ``None`` -> NULL.

    A leaner form of ``ssmk.tensor`` for the per-token path (CPU tensors only, checked by the
    caller); the struct keeps its shape/stride arrays and the tensor alive.
    """
    if t is None:
        return None
    shape = t.shape
    n = len(shape)
    sh = (c_int64 * n)(*shape)
    st = (c_int64 * n)(*t.stride())
    s = ssmk.TensorStruct(t.data_ptr() or None, _CPU, n, _DTYPES[t.dtype], sh, st, 0)
    s._keep = (sh, st, t)
    return byref(s)


def _view(t, shape, strides, offset=0):
    """A descriptor of a strided view of ``t``'s memory (elements ``offset`` on), without making
    a torch view (cheaper on the per-token path)."""
    n = len(shape)
    sh = (c_int64 * n)(*shape)
    st = (c_int64 * n)(*strides)
    s = ssmk.TensorStruct(t.data_ptr() or None, _CPU, n, _DTYPES[t.dtype], sh, st, offset * t.element_size())
    s._keep = (sh, st, t)
    return byref(s)


_contexts = {}


def _ctx():
    n = torch.get_num_threads()
    c = _contexts.get(n)
    if c is None:
        with _lock:
            c = _contexts.get(n)
            if c is None:
                c = _contexts[n] = ssmk.Context(n)
    return c.handle


def _run(name, status):
    if status != ssmk.OK:
        raise ssmk.SsmkError(name, status, ssmk.last_error_message())


_index_cache = {}


def _cached(key, make):
    t = _index_cache.get(key)
    if t is None:
        if len(_index_cache) > 512:
            _index_cache.clear()
        t = _index_cache[key] = make()
    return t


def _cu(batch, length):
    """int32 ``[0, L, 2L, ..., B*L]`` (batch equal-length sequences), cached (never written)."""
    return _cached(("cu", batch, length), lambda: torch.arange(batch + 1, dtype=torch.int32) * length)


def _ones(n):
    """uint8 ``has_initial_state`` of n sequences, all true, cached (never written)."""
    return _cached(("ones", n), lambda: torch.ones(n, dtype=torch.uint8))


# ------------------------------------------------------------------ when ssmk may run

_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or torch._dynamo.is_compiling


def _compiling():
    """torch.compile / torch.export tracing: the ctypes call is opaque to dynamo."""
    return _is_compiling()


def _usable(*tensors):
    """True when ssmk may take these inputs: all on the CPU, no autograd needed, not tracing."""
    if _compiling():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if t.device.type != "cpu" or (grad and t.requires_grad):
            return False
    return True


def _count(family, name, route):
    key = (family, name, route)
    _counts[key] = _counts.get(key, 0) + 1


def call_counts():
    """``{(family, function, "ssmk" | "fallback"): calls}`` since the last :func:`reset_call_counts`."""
    return dict(_counts)


def reset_call_counts():
    _counts.clear()


_ACTIVATIONS = {None: ssmk.ACTIVATION_NONE, "silu": ssmk.ACTIVATION_SILU, "swish": ssmk.ACTIVATION_SILU}


def _packed_bounds(kwargs, batch, length, conv=False):
    """The ``cu_seqlens`` ssmk should use for packed sequences, ``None`` when not packed, or
    ``False`` when the packing cannot be honoured (the caller then falls back)."""
    cu = kwargs.get("cu_seqlens")
    if cu is None and conv:
        cu = kwargs.get("cu_seq_lens_q")
    seq_idx = kwargs.get("seq_idx")
    if cu is None and seq_idx is None:
        return None
    if batch != 1:
        return False
    if cu is not None:
        if cu.device.type != "cpu" or cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64):
            return False
        if int(cu[-1]) != length:
            # The conv of a cached continuation sees [history, x], which packed kwargs do not
            # describe; transformers' references ignore cu_seq_lens_q there too.
            return None if kwargs.get("cu_seqlens") is None and seq_idx is None else False
        return cu
    if seq_idx.device.type != "cpu" or seq_idx.shape[-1] != length:
        return False
    ids = seq_idx.reshape(-1).long()
    if ids.numel() and (int(ids[0]) != 0 or bool((ids[1:] < ids[:-1]).any())):
        return False  # not sorted sequence ids
    counts = torch.bincount(ids)
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)


# ------------------------------------------------------------------ state checkpoints (prefix caching)

_capture = None  # the active Checkpoints capture, if any


class Checkpoints:
    """The conv and recurrent states of every linear-attention layer at chosen token offsets of one
    cached forward, taken by ssmk's state checkpoints (ABI.md 4.10) -- see :func:`checkpoints`.

    ``offsets``: the token offsets (within the captured forward) whose states were stored, once
    the forward ran; :meth:`rewind` restores a cache to any of them.
    """

    def __init__(self, every, offsets):
        self._every, self._asked = every, offsets
        self.offsets = None
        self._length = None  # tokens of the captured forward
        self._conv_inputs = {}  # id(conv input) -> ((layer, state index), history columns, the input)
        self._pending = []  # recurrent checkpoints of the kernel calls since the last state update
        self._conv = {}  # (layer, state index) -> [C, *conv state shape]
        self._recurrent = {}  # (layer, state index) -> [C, *recurrent state shape]

    # -- during the forward
    def _offsets(self, length):
        """The checkpoint offsets of a kernel call over the forward's ``length`` tokens."""
        if self._length is None:
            if self._asked is None:
                offsets = list(range(self._every, length + 1, self._every))
            else:
                offsets = sorted(set(int(o) for o in self._asked))
                if offsets and not 1 <= offsets[0] <= offsets[-1] <= length:
                    raise ValueError(f"ssmk.transformers.checkpoints: offsets {offsets} outside [1, {length}]")
            self._length, self.offsets = length, offsets
        elif length != self._length:
            raise RuntimeError("ssmk.transformers.checkpoints: captures one forward; a kernel call over "
                               f"{length} tokens followed one over {self._length}")
        return self.offsets

    def _update_conv_state(self, original, conv_states, layer_idx, state_idx=0, **kwargs):
        full = original(conv_states, layer_idx, state_idx, **kwargs)
        # The layer convolves what the cache returns: [history, input] (history = the cached
        # columns, or the zero padding of a prefill shorter than the kernel).
        self._conv_inputs[id(full)] = ((layer_idx, state_idx), full.shape[-1] - conv_states.shape[-1], full)
        return full

    def _update_recurrent_state(self, original, recurrent_states, layer_idx, state_idx=0, **kwargs):
        pending, self._pending = self._pending, []
        key = (layer_idx, state_idx)
        if not pending:
            raise RuntimeError(f"ssmk.transformers.checkpoints: layer {layer_idx}'s recurrent state came from no "
                               "kernel ssmk ran with checkpoints")
        # One kernel call per layer, or one per head whose states the layer stacks on dim 1 (Zamba).
        states = pending[0] if len(pending) == 1 else torch.stack(pending, dim=2)
        if states.shape[1:] != recurrent_states.shape:
            raise RuntimeError(f"ssmk.transformers.checkpoints: layer {layer_idx} stores a recurrent state of shape "
                               f"{tuple(recurrent_states.shape)}, its kernel calls returned "
                               f"{tuple(states.shape[1:])}")
        self._recurrent[key] = states.to(recurrent_states.dtype)
        return original(recurrent_states, layer_idx, state_idx, **kwargs)

    def _conv_call(self, x):
        """``(layer key, history columns)`` of a conv input the cache just returned."""
        entry = self._conv_inputs.pop(id(x), None)
        if entry is None or entry[2] is not x:
            raise RuntimeError("ssmk.transformers.checkpoints: a causal conv ran on an input the cache did not "
                               "return (no cache, or a layer this capture does not know)")
        return entry[0], entry[1]

    # -- afterwards
    def rewind(self, cache, length):
        """Make ``cache`` what it would be had the captured forward ended after its first ``length``
        tokens: every linear-attention layer's conv and recurrent states are overwritten (in place)
        with their checkpoints at ``length``, every attention layer drops the keys/values (and
        indexer keys) of the tokens after it. ``cache`` is the captured cache or a copy of it
        (``copy.deepcopy``) -- rewinding twice to different offsets needs a copy each time."""
        if self.offsets is None:
            raise RuntimeError("ssmk.transformers.checkpoints: nothing was captured (no forward ran in the block)")
        if length not in self.offsets:
            raise ValueError(f"ssmk.transformers.checkpoints: no checkpoint at {length} (offsets {self.offsets})")
        i = self.offsets.index(length)
        from transformers.cache_utils import CacheLayerMixin, LinearAttentionCacheLayerMixin

        for idx, layer in enumerate(cache.layers):
            if isinstance(layer, LinearAttentionCacheLayerMixin):
                for kind, taken in (("conv_states", self._conv), ("recurrent_states", self._recurrent)):
                    for state_idx, t in getattr(layer, kind).items():
                        if t is None:
                            continue
                        if (idx, state_idx) not in taken:
                            raise RuntimeError(f"ssmk.transformers.checkpoints: no checkpoint of layer {idx}'s "
                                               f"{kind}[{state_idx}]")
                        t.copy_(taken[(idx, state_idx)][i])
            # The attention part (transformers' linear-attention layers cannot crop their states):
            # the first class in the layer's MRO that caches keys and defines crop.
            for cls in type(layer).__mro__:
                if (issubclass(cls, CacheLayerMixin) and not issubclass(cls, LinearAttentionCacheLayerMixin)
                        and "crop" in vars(cls)):
                    cls.crop(layer, length - self._length)
                    break
        return cache


@contextlib.contextmanager
def checkpoints(cache, every=None, offsets=None):
    """Capture state checkpoints of the one forward run in the block::

        with ssmk.transformers.checkpoints(cache, every=16) as ckpt:
            model(input_ids=a, cache=cache, use_cache=True)
        b_cache = ckpt.rewind(copy.deepcopy(cache), 48)   # as after a's first 48 tokens
        model(input_ids=b[:, 48:], cache=b_cache, use_cache=True, ...)

    ``every``: a checkpoint after every ``every``-th token of the forward; or ``offsets``: the token
    offsets (``1..length`` of the forward). Each routed kernel of the forward stores the states at
    those offsets (ssmk's checkpoint tables, into spare slots of a pool it allocates) in one call;
    the cache's own states and the outputs are the same as without the capture (ssmk's
    checkpoints do not change them by a bit). The kernels' states are told apart by the cache
    updates that bracket them: a conv convolves what ``cache.update_conv_state`` returned, a
    recurrent kernel's final state goes to ``cache.update_recurrent_state`` (both patched on
    ``cache`` for the block). One capture at a time; the model's families must be routed
    (:func:`enable`), and a kernel that would fall back to transformers raises instead (its
    checkpoints could not be taken).
    """
    global _capture
    if (every is None) == (offsets is None):
        raise ValueError("ssmk.transformers.checkpoints: give one of every= and offsets=")
    if every is not None and every < 1:
        raise ValueError(f"ssmk.transformers.checkpoints: every={every}, expected >= 1")
    capture = Checkpoints(every, offsets)
    originals = cache.update_conv_state, cache.update_recurrent_state
    with _lock:
        if _capture is not None:
            raise RuntimeError("ssmk.transformers.checkpoints: another capture is active")
        _capture = capture
    cache.update_conv_state = lambda *a, **k: capture._update_conv_state(originals[0], *a, **k)
    cache.update_recurrent_state = lambda *a, **k: capture._update_recurrent_state(originals[1], *a, **k)
    try:
        yield capture
    finally:
        del cache.update_conv_state, cache.update_recurrent_state
        _capture = None
    capture._conv_inputs.clear()
    if capture._pending:
        raise RuntimeError("ssmk.transformers.checkpoints: a recurrent kernel's state never reached the cache")


def _checkpoint_tables(offsets, rows, first_slot):
    """``[rows, C]`` int64 offsets and slots: row ``b``'s checkpoint ``c`` into slot
    ``first_slot + c * rows + b``."""
    c = len(offsets)
    o = torch.tensor(offsets, dtype=torch.int64).expand(rows, c).contiguous()
    s = first_slot + torch.arange(c, dtype=torch.int64) * rows + torch.arange(rows, dtype=torch.int64)[:, None]
    return o, s


def _uncapturable(what):
    raise RuntimeError(f"ssmk.transformers.checkpoints: {what} fell back to transformers, whose kernels "
                       "take no checkpoints")


# ------------------------------------------------------------------ the replacements

def _conv_params(weight, bias, dtype):
    """The conv weight and bias as ssmk takes them: in the activations' ``dtype`` or f32. Another
    dtype (a bf16 conv fed f32 activations, as Inkling's short convs are when the whole model is
    cast to bf16) goes as f32, exactly; transformers' reference rounds the activations to the
    weight's dtype instead, so ssmk's result is the more precise one."""
    def f32_unless_usable(t):
        return t if t is None or t.dtype in (dtype, torch.float32) else t.float()

    return f32_unless_usable(weight), f32_unless_usable(bias)


def _make_conv_fn(family, original):
    def causal_conv1d_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
        """ssmk ``causal_conv1d_fwd`` for transformers' stateless causal conv: ``[B, D, L] -> [B, D, L]``."""
        capture = _capture
        where = None if capture is None else capture._conv_call(hidden_states)
        if (
            _usable(hidden_states, weight, bias)
            and hidden_states.dim() == 3
            and weight.dim() == 2
            and hidden_states.dtype in _FLOATS
            and weight.dtype in _FLOATS
            and (bias is None or bias.dtype in _FLOATS)
            and activation in _ACTIVATIONS
            and 2 <= weight.shape[1] <= 8
            and hidden_states.shape[2] > 0
        ):
            B, D, L = hidden_states.shape
            qsl = _packed_bounds(kwargs, B, L, conv=True)
            if qsl is not False and (where is None or qsl is None):
                _count(family, "causal_conv1d_fn", "ssmk")
                weight, bias = _conv_params(weight, bias, hidden_states.dtype)
                x = hidden_states.transpose(1, 2).reshape(B * L, D)  # a view for channels-last input
                out = torch.empty(B * L, D, dtype=hidden_states.dtype)
                states = offsets = slots = None
                if where is not None:
                    # Checkpoints need a pool: slots 0..B-1 take the final states (unused: the
                    # cache keeps its own), the checkpoints follow.
                    (key, history), W = where, weight.shape[1]
                    at = capture._offsets(L - history)
                    states = torch.zeros(B * (1 + len(at)), W - 1, D, dtype=hidden_states.dtype)
                    offsets, slots = _checkpoint_tables([history + o for o in at], B, B)
                _run("ssmk_causal_conv1d_fwd", ssmk.lib.ssmk_causal_conv1d_fwd(
                    _ctx(), _desc(x), _desc(weight), _desc(bias), _desc(states),
                    _desc(_cu(B, L) if qsl is None else qsl), None, None, _ACTIVATIONS[activation], -1,
                    _desc(out), _desc(offsets), _desc(slots)))
                if where is not None:
                    # ssmk's rows (the last W-1 inputs) are the columns 1..W-1 of transformers'
                    # [B, D, W] state.
                    taken = torch.zeros(len(at), B, D, W, dtype=hidden_states.dtype)
                    taken[..., 1:] = states[B:].view(len(at), B, W - 1, D).transpose(2, 3)
                    # Column 0 (read by no conv, kept so that the state is transformers' own).
                    for c, o in enumerate(at):
                        if history + o >= W:
                            taken[c, :, :, 0] = hidden_states[:, :, history + o - W]
                    capture._conv[key] = taken
                return out.view(B, L, D).transpose(1, 2)
        if where is not None:
            _uncapturable("causal_conv1d_fn")
        _count(family, "causal_conv1d_fn", "fallback")
        return original(hidden_states, weight, bias=bias, activation=activation, **kwargs)

    return causal_conv1d_fn


def _make_conv_update(family, original):
    def causal_conv1d_update(hidden_states, conv_state, weight, bias=None, activation=None):
        """ssmk ``causal_conv1d_update``: ``hidden_states [B, D, Q]``, ``conv_state [B, D, W]`` updated in place."""
        if (
            _usable(hidden_states, conv_state, weight, bias)
            and hidden_states.dim() == 3
            and conv_state.dim() == 3
            and weight.dim() == 2
            and hidden_states.dtype in _FLOATS
            and weight.dtype in _FLOATS
            and (bias is None or bias.dtype in _FLOATS)
            and conv_state.dtype in (hidden_states.dtype, torch.float32)
            and activation in _ACTIVATIONS
            and 2 <= weight.shape[1] <= 8
            and conv_state.shape[2] == weight.shape[1]
            and conv_state.shape[:2] == hidden_states.shape[:2]
            and hidden_states.shape[2] > 0
        ):
            _count(family, "causal_conv1d_update", "ssmk")
            weight, bias = _conv_params(weight, bias, hidden_states.dtype)
            B, D, Q = hidden_states.shape
            W = weight.shape[1]
            # transformers keeps the last W inputs, ssmk the last W-1: ssmk's rows are columns
            # 1..W-1. Column 0 is never read; give it what transformers' update leaves there
            # (before the call, which does not read it).
            conv_state[:, :, 0].copy_(conv_state[:, :, Q] if Q < W else hidden_states[:, :, Q - W])
            s0, s1, s2 = conv_state.stride()
            states = _view(conv_state, (B, W - 1, D), (s0, s2, s1), s2)  # [S=B, W-1, D] in place
            x0, x1, x2 = hidden_states.stride()
            out = torch.empty(B, D, Q, dtype=hidden_states.dtype)
            if Q == 1:
                xd, od = _view(hidden_states, (B, D), (x0, x1)), _view(out, (B, D), (D, 1))
            else:
                xd, od = _view(hidden_states, (B, Q, D), (x0, x2, x1)), _view(out, (B, Q, D), (D * Q, 1, Q))
            _run("ssmk_causal_conv1d_update", ssmk.lib.ssmk_causal_conv1d_update(
                _ctx(), xd, states, _desc(weight), _desc(bias), None, None, _ACTIVATIONS[activation], -1, od))
            return out
        _count(family, "causal_conv1d_update", "fallback")
        return original(hidden_states, conv_state, weight, bias=bias, activation=activation)

    return causal_conv1d_update


def _delta_rule(query, key, value, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                kwargs, kda):
    """One ssmk ``gated_delta_rule`` call for the chunk and the recurrent references alike;
    ``None`` when ssmk cannot take the inputs."""
    if not _usable(query, key, value, g, beta, initial_state):
        return None
    if query.dim() != 4 or key.shape != query.shape or value.dim() != 4 or value.shape[:2] != query.shape[:2]:
        return None
    if query.dtype not in _FLOATS or key.dtype != query.dtype or value.dtype != query.dtype:
        return None
    if beta.dtype not in _FLOATS or g.dtype not in _FLOATS:
        return None
    B, L, H, K = key.shape
    HV, V = value.shape[2:]
    if L == 0 or HV % H or beta.shape != (B, L, HV):
        return None
    if g.shape != ((B, L, HV, K) if kda else (B, L, HV)):
        return None
    cu = _packed_bounds(kwargs, B, L)
    if cu is False:
        return None
    nseq = B if cu is None else cu.numel() - 1
    if initial_state is not None and (initial_state.shape != (nseq, HV, K, V) or initial_state.dtype not in _FLOATS):
        return None
    capture = _capture
    if capture is not None and (cu is not None or not output_final_state):
        return None  # packed, or no cache to rewind: checkpoints cannot be placed
    T = B * L
    q, k = query.reshape(T, H, K), key.reshape(T, H, K)
    v = value.reshape(T, HV, V)
    gg = g.reshape(T, *g.shape[2:]).float()
    bb = beta.reshape(T, HV)
    pool, state, tables = _state_pool(initial_state, output_final_state, capture, L, (nseq, HV, K, V))
    init = None if initial_state is None else _ones(nseq)
    out = torch.empty(T, HV, V, dtype=query.dtype)
    flags = ssmk.GDN_QK_L2NORM if use_qk_l2norm_in_kernel else 0
    # transformers' references normalise with eps 1e-6 in prefill and decode alike, scale K**-0.5,
    # GQA in the grouped order (v-head hv uses k-head hv // (HV/H)).
    _run("ssmk_gated_delta_rule", ssmk.lib.ssmk_gated_delta_rule(
        _ctx(), _desc(q), _desc(k), _desc(v), _desc(gg), _desc(bb), 0.0, _desc(pool),
        _desc(_cu(B, L) if cu is None else cu), None, _desc(init), None, flags, 1e-6, -1, _desc(out),
        *tables))
    state = _took_checkpoints(capture, pool, state, initial_state)
    return out.view(B, L, HV, V), (state if output_final_state else None)


def _state_pool(initial, want_final, capture, length, shape):
    """The f32 state pool of a delta-rule or scan call over ``shape = (nseq, ...)`` states: the
    cache's own tensor when the final state goes back there (f32, no capture: written in place),
    else a new pool whose slots ``0..nseq-1`` hold the initial, then final states and, under a
    capture, the checkpoints follow (sequence ``b``'s ``c``-th in slot ``nseq (1 + c) + b``).
    Returns ``(pool or None, the final-state view, the two checkpoint-table descriptors)``."""
    if initial is not None and want_final and initial.dtype == torch.float32 and capture is None:
        return initial, initial, (None, None)
    if not want_final and initial is None:
        return None, None, (None, None)
    nseq = shape[0]
    at = [] if capture is None else capture._offsets(length)
    pool = torch.zeros(nseq * (1 + len(at)), *shape[1:], dtype=torch.float32)
    if initial is not None:
        pool[:nseq].copy_(initial)
    tables = _checkpoint_tables(at, nseq, nseq) if at else (None, None)
    return pool, pool[:nseq], (_desc(tables[0]), _desc(tables[1]))


def _took_checkpoints(capture, pool, state, initial):
    """Hands a capture its checkpoints (``[C, nseq, ...]``) out of ``pool``; returns the final state,
    copied into the cache's f32 ``initial`` when there is one (in place, as without a capture)."""
    if capture is None:
        return state
    nseq = state.shape[0]
    capture._pending.append(pool[nseq:].view(pool.shape[0] // nseq - 1, *state.shape))
    if initial is not None and initial.dtype == torch.float32:
        return initial.copy_(state)
    return state


def _make_delta_rule(family, name, original):
    kda = "kimi" in name

    if name.startswith("torch_chunk") or name.startswith("chunk"):
        def chunk_fn(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, **kwargs):
            r = _delta_rule(query, key, value, g, beta, initial_state, output_final_state,
                            use_qk_l2norm_in_kernel, kwargs, kda)
            if r is not None:
                _count(family, name, "ssmk")
                return r
            if _capture is not None:
                _uncapturable(name)
            _count(family, name, "fallback")
            return original(query, key, value, g=g, beta=beta, chunk_size=chunk_size, initial_state=initial_state,
                            output_final_state=output_final_state,
                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)

        fn = chunk_fn
    else:
        # One wrapper for both recurrent forms: KDA's takes initial_state and output_final_state
        # positionally, GDN's has them default to None / False.
        def recurrent_fn(query, key, value, g, beta, initial_state=None, output_final_state=False,
                         use_qk_l2norm_in_kernel=False, **kwargs):
            r = _delta_rule(query, key, value, g, beta, initial_state, output_final_state,
                            use_qk_l2norm_in_kernel, kwargs, kda)
            if r is not None:
                _count(family, name, "ssmk")
                return r
            if _capture is not None:
                _uncapturable(name)
            _count(family, name, "fallback")
            return original(query, key, value, g=g, beta=beta, initial_state=initial_state,
                            output_final_state=output_final_state,
                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)

        fn = recurrent_fn
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"ssmk ``gated_delta_rule`` in place of transformers' ``{name}`` "
                  f"({'per-key-channel (KDA)' if kda else 'per-head (GDN)'} decay).")
    return fn


def _limits(dt_limit):
    if dt_limit is None:
        return float("-inf"), float("inf")
    return float(dt_limit[0]), float(dt_limit[1])


def _f32(t):
    return None if t is None else t.float()


def _make_chunk_scan(family, original):
    def mamba2_chunk_scan(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None,
                          dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False, **kwargs):
        """ssmk ``mamba2_scan`` (prefill form): ``[B, L, NH, P]`` out, final state ``[B, NH, P, N]`` f32."""
        r = _chunk_scan(hidden_states, dt, A, B, C, D, dt_bias, initial_states, dt_softplus, dt_limit,
                        return_final_states, kwargs)
        if r is not None:
            _count(family, "mamba2_chunk_scan", "ssmk")
            return r
        if _capture is not None:
            _uncapturable("mamba2_chunk_scan")
        _count(family, "mamba2_chunk_scan", "fallback")
        return original(hidden_states, dt, A, B, C, chunk_size=chunk_size, D=D, dt_bias=dt_bias,
                        initial_states=initial_states, dt_softplus=dt_softplus, dt_limit=dt_limit,
                        return_final_states=return_final_states, **kwargs)

    return mamba2_chunk_scan


def _chunk_scan(x, dt, A, B, C, D, dt_bias, initial_states, dt_softplus, dt_limit, return_final_states, kwargs):
    z = kwargs.get("z")
    if not _usable(x, dt, A, B, C, D, dt_bias, initial_states, z):
        return None
    if x.dim() != 4 or dt.dim() != 3 or B.dim() != 4 or C.shape != B.shape or A.dim() != 1:
        return None
    Bsz, L, NH, P = x.shape
    G, N = B.shape[2:]
    if L == 0 or dt.shape != (Bsz, L, NH) or B.shape[:2] != (Bsz, L) or A.shape[0] != NH or NH % G:
        return None
    if any(t is not None and t.dtype not in _FLOATS for t in (x, dt, A, B, C, D, dt_bias, z, initial_states)):
        return None
    if z is not None and z.shape != x.shape:
        return None
    cu = _packed_bounds(kwargs, Bsz, L)
    if cu is False:
        return None
    nseq = Bsz if cu is None else cu.numel() - 1
    if initial_states is not None and initial_states.shape != (nseq, NH, P, N):
        return None
    lo, hi = _limits(dt_limit)
    if not lo <= hi:
        return None
    capture = _capture
    if capture is not None and (cu is not None or not return_final_states):
        return None  # packed, or no cache to rewind: checkpoints cannot be placed
    T = Bsz * L
    pool, state, tables = _state_pool(initial_states, return_final_states, capture, L, (nseq, NH, P, N))
    init = None if initial_states is None else _ones(nseq)
    out = torch.empty(T, NH, P, dtype=x.dtype)
    _run("ssmk_mamba2_scan", ssmk.lib.ssmk_mamba2_scan(
        _ctx(), _desc(x.reshape(T, NH, P)), _desc(dt.reshape(T, NH)), _desc(A.float()),
        _desc(B.reshape(T, G, N)), _desc(C.reshape(T, G, N)), _desc(_f32(D)),
        _desc(None if z is None else z.reshape(T, NH, P)), _desc(_f32(dt_bias)), lo, hi,
        ssmk.MAMBA2_DT_SOFTPLUS if dt_softplus else 0, _desc(pool), _desc(_cu(Bsz, L) if cu is None else cu),
        None, _desc(init), None, -1, _desc(out), *tables))
    state = _took_checkpoints(capture, pool, state, initial_states)
    out = out.view(Bsz, L, NH, P)
    return (out, state) if return_final_states else out


def _broadcast_over(t, dims):
    """t is a per-head value broadcast (stride 0) over its last ``dims`` dimensions."""
    return all(t.stride(-1 - i) == 0 for i in range(dims))


_UNLIMITED = (float("-inf"), float("inf"))


def _heads_update(state, x, dt, A, B, C, D, dt_bias, z):
    """Mamba-2's decode form (``state [B, NH, P, N]``, per-head dt/A/D/dt_bias broadcast over P and
    N): ``(scan arguments x..z and state, out [B, NH, P])``, or ``None``."""
    if not (
        x.dim() == 3
        and state.dim() == 4
        and dt.shape == x.shape
        and A.dim() == 3
        and B.dim() == 3
        and C.shape == B.shape
        and state.shape[:3] == x.shape
        and A.shape == state.shape[1:]
        and B.shape[0] == x.shape[0]
        and B.shape[2] == state.shape[3]
        and x.shape[1] % B.shape[1] == 0
        and (z is None or z.shape == x.shape)
        and (D is None or D.shape == x.shape[1:])
        and (dt_bias is None or dt_bias.shape == x.shape[1:])
        # transformers passes per-head dt/A/D/dt_bias expanded over P (and N); anything else
        # (a real per-channel value) is not the Mamba-2 scan ssmk implements.
        and _broadcast_over(dt, 1)
        and _broadcast_over(A, 2)
        and (D is None or _broadcast_over(D, 1))
        and (dt_bias is None or _broadcast_over(dt_bias, 1))
    ):
        return None
    out = torch.empty(x.shape, dtype=x.dtype)
    return (_desc(x), _desc(dt[..., 0]), _desc(A[:, 0, 0].float()), _desc(B), _desc(C),
            _desc(None if D is None else D[:, 0].float()), _desc(z),
            _desc(None if dt_bias is None else dt_bias[:, 0].float()), _desc(state)), out


def _channels_update(state, x, dt, A, B, C, D, dt_bias, z):
    """Mamba-1's decode form (mamba_ssm's single-head ``selective_state_update``: ``state [B, D, N]``,
    ``x``/``dt``/``z`` ``[B, D]``, ``A [D, N]``, ``B``/``C`` ``[B, N]``) as ssmk's ``D`` heads of
    ``P = 1``: ``(scan arguments, out [B, D])``, or ``None``."""
    if not (
        x.dim() == 2
        and state.dim() == 3
        and state.shape[:2] == x.shape
        and dt.shape == x.shape
        and A.shape == state.shape[1:]
        and B.shape == (x.shape[0], state.shape[2])
        and C.shape == B.shape
        and (z is None or z.shape == x.shape)
        and (D is None or D.shape == x.shape[1:])
        and (dt_bias is None or dt_bias.shape == x.shape[1:])
    ):
        return None
    Bsz, Dm, N = state.shape
    out = torch.empty(Bsz, Dm, dtype=x.dtype)
    s0, s1, s2 = state.stride()
    return (_unit_p(x), _desc(dt), _desc(A.float()), _one_group(B), _one_group(C), _desc(_f32(D)),
            None if z is None else _unit_p(z), _desc(_f32(dt_bias)),
            _view(state, (Bsz, Dm, 1, N), (s0, s1, s1, s2))), out


def _unit_p(t, row=None):
    """``t [B, D]`` as ssmk's ``[T = B, NH = D, P = 1]``; with ``row``, ``t [B, D, L]``'s row as
    ``[T = L, NH = D, P = 1]`` (channel-major or not: the strides say)."""
    if row is None:
        t0, t1 = t.stride()
        return _view(t, (t.shape[0], t.shape[1], 1), (t0, t1, 1))
    t0, t1, t2 = t.stride()
    return _view(t, (t.shape[2], t.shape[1], 1), (t2, t1, 1), row * t0)


def _one_group(t, row=None):
    """``t [B, N]`` as ssmk's ``[T = B, G = 1, N]``; with ``row``, ``t [B, N, L]``'s row as
    ``[T = L, G = 1, N]``."""
    if row is None:
        t0, t1 = t.stride()
        return _view(t, (t.shape[0], 1, t.shape[1]), (t0, t1, t1))
    t0, t1, t2 = t.stride()
    return _view(t, (t.shape[2], 1, t.shape[1]), (t2, t1, t1), row * t0)


def _make_state_update(family, name, original):
    def selective_state_update(state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None,
                               **kwargs):
        x = hidden_states
        if (
            _usable(state, x, dt, A, B, C, D, dt_bias, z)
            and kwargs.get("state_batch_indices") is None
            and all(t is None or t.dtype in _FLOATS for t in (state, x, dt, A, B, C, D, dt_bias, z))
        ):
            call = (_heads_update if state.dim() == 4 else _channels_update)(state, x, dt, A, B, C, D, dt_bias, z)
            if call is not None:
                _count(family, name, "ssmk")
                (x, dt, A, B, C, D, z, dt_bias, state), out = call
                Bsz = out.shape[0]
                _run("ssmk_mamba2_scan", ssmk.lib.ssmk_mamba2_scan(
                    _ctx(), x, dt, A, B, C, D, z, dt_bias, *_UNLIMITED,
                    ssmk.MAMBA2_DT_SOFTPLUS if dt_softplus else 0, state, _desc(_cu(Bsz, 1)), None,
                    _desc(_ones(Bsz)), None, -1, _unit_p(out) if out.dim() == 2 else _desc(out), None, None))
                return out
        _count(family, name, "fallback")
        return original(state, hidden_states, dt, A, B, C, D, dt_bias=dt_bias, dt_softplus=dt_softplus, z=z,
                        **kwargs)

    selective_state_update.__name__ = selective_state_update.__qualname__ = name
    selective_state_update.__doc__ = (
        "ssmk ``mamba2_scan`` (decode form): one token per row, the state updated in place; "
        "``state [B, NH, P, N]`` with per-head A (Mamba-2) or ``state [B, D, N]`` with ``A [D, N]`` (Mamba-1).")
    return selective_state_update


def _make_selective_scan(family, original):
    def mamba_selective_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                             return_last_state=False, use_mambapy=False, use_associative_scan=False, **kwargs):
        """ssmk ``mamba2_scan`` with ``A [D, N]`` (Mamba-1 prefill from a zero state): ``u``, ``dt``,
        ``z`` ``[B, D, L]``, ``B``/``C`` ``[B, N, L]``; returns ``out [B, D, L]`` (u's dtype, as
        mamba_ssm's kernel) and with ``return_last_state`` the final state ``[B, D, N]`` f32.
        ``use_mambapy`` / ``use_associative_scan`` choose among torch algorithms for the same
        recurrence; ssmk replaces them all (tracing, where the associative scan applies, falls back)."""
        r = _selective_scan(hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
        if r is not None:
            _count(family, "mamba_selective_scan", "ssmk")
            return r
        if _capture is not None:
            _uncapturable("mamba_selective_scan")
        _count(family, "mamba_selective_scan", "fallback")
        return original(hidden_states, dt, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus,
                        return_last_state=return_last_state, use_mambapy=use_mambapy,
                        use_associative_scan=use_associative_scan, **kwargs)

    return mamba_selective_scan


def _selective_scan(u, dt, A, B, C, D, z, delta_bias, delta_softplus, return_last_state):
    if not _usable(u, dt, A, B, C, D, z, delta_bias):
        return None
    if u.dim() != 3 or dt.shape != u.shape or A.dim() != 2 or B.dim() != 3 or C.shape != B.shape:
        return None  # mamba_ssm's grouped (4-D) or time-invariant (2-D) B/C: not a transformers call
    Bsz, Dm, L = u.shape
    N = A.shape[1]
    if L == 0 or A.shape[0] != Dm or B.shape != (Bsz, N, L) or (z is not None and z.shape != u.shape):
        return None
    if any(t is not None and t.shape != (Dm,) for t in (D, delta_bias)):
        return None
    if any(t is not None and t.dtype not in _FLOATS for t in (u, dt, A, B, C, D, z, delta_bias)):
        return None
    capture = _capture
    if capture is not None and not return_last_state:
        return None  # no cache to rewind
    # Token-major memory: the out_proj that follows reads the transposed result contiguous.
    out = torch.empty(Bsz, L, Dm, dtype=u.dtype)
    # pool[0]: the final states; under a capture pool[1 + c] the checkpoints at offset c.
    at = [] if capture is None else capture._offsets(L)
    pool = torch.empty(1 + len(at), Bsz, Dm, N, dtype=torch.float32) if return_last_state else None
    offsets, slots = _checkpoint_tables(at, 1, 1) if at else (None, None)
    ctx, cu = _ctx(), _desc(_cu(1, L))
    a, d, bias = _desc(A.float()), _desc(_f32(D)), _desc(_f32(delta_bias))
    flags = ssmk.MAMBA2_DT_SOFTPLUS if delta_softplus else 0
    # One call per batch row: a [B, D, L] tensor folds its rows into one token axis only when it
    # is token-major, and transformers' dt never is (the dt projection writes it channel-major).
    for b in range(Bsz):
        _run("ssmk_mamba2_scan", ssmk.lib.ssmk_mamba2_scan(
            ctx, _unit_p(u, b), _view(dt, (L, Dm), (dt.stride(2), dt.stride(1)), b * dt.stride(0)), a,
            _one_group(B, b), _one_group(C, b), d, None if z is None else _unit_p(z, b), bias, *_UNLIMITED, flags,
            None if pool is None else _view(pool, (1 + len(at), Dm, 1, N), (Bsz * Dm * N, N, N, 1), b * Dm * N),
            cu, None, None, None, -1, _view(out, (L, Dm, 1), (Dm, 1, 1), b * L * Dm), _desc(offsets), _desc(slots)))
    out = out.transpose(1, 2)
    state = None if pool is None else pool[0]
    if capture is not None:
        capture._pending.append(pool[1:])
    return (out, state) if return_last_state else out


def _make(family, name, original):
    if name == "causal_conv1d_fn":
        fn = _make_conv_fn(family, original)
    elif name == "causal_conv1d_update":
        fn = _make_conv_update(family, original)
    elif name == "mamba2_chunk_scan":
        fn = _make_chunk_scan(family, original)
    elif name in ("mamba2_selective_state_update", "mamba_selective_state_update"):
        fn = _make_state_update(family, name, original)
    elif name == "mamba_selective_scan":
        fn = _make_selective_scan(family, original)
    else:
        fn = _make_delta_rule(family, name, original)
    fn._ssmk_family = family
    fn._ssmk_original = original
    return fn


# ------------------------------------------------------------------ enable / disable

def _warn(message):
    warnings.warn(f"ssmk.transformers: {message}", RuntimeWarning, stacklevel=3)


def _version():
    import transformers  # noqa: F401

    # transformers swaps its lazy module object in sys.modules on some submodule imports: read
    # the current one.
    return sys.modules["transformers"].__version__


def _resolve(families):
    """Family names from None (all), a name, names, or a model / module class (its families)."""
    if families is None:
        return list(FAMILIES)
    if isinstance(families, str):
        return [families]
    if isinstance(families, torch.nn.Module) or (isinstance(families, type) and issubclass(families, torch.nn.Module)):
        model = families
        classes = {type(m) for m in model.modules()} if isinstance(model, torch.nn.Module) else {model}
        found = []
        for cls in classes:
            parts = cls.__module__.split(".")
            if len(parts) == 4 and parts[:2] == ["transformers", "models"] and parts[3] == f"modeling_{parts[2]}":
                if parts[2] in FAMILIES and parts[2] not in found:
                    found.append(parts[2])
        if not found:
            name = model.__name__ if isinstance(model, type) else type(model).__name__
            _warn(f"no ssmk route for {name}: the model is left untouched")
        return found
    return list(families)


def _check_function(module, name):
    """``module.name`` when it is transformers' torch reference with the parameters the replacement
    implements, else the reason it is not."""
    fn = getattr(module, name, None)
    if fn is None:
        return f"{module.__name__} has no {name}"
    if getattr(fn, "_ssmk_family", None) is not None:
        return f"{module.__name__}.{name} is already routed to ssmk (by another copy of this module)"
    inner = inspect.unwrap(fn)
    if getattr(inner, "__module__", None) != module.__name__:
        return f"{module.__name__}.{name} was already replaced (by {getattr(inner, '__module__', '?')})"
    try:
        params = tuple(inspect.signature(inner).parameters)
    except (TypeError, ValueError):
        params = ()
    if params != _PARAMS[name]:
        return f"{module.__name__}.{name} has parameters {params}, expected {_PARAMS[name]}"
    return fn


def enable(families=None, *, force=False):
    """Route the given families (default: all of :data:`FAMILIES`) to ssmk; returns the families
    that are routed after the call.

    ``families`` is a name, a list of names, or a model (instance or class: the families of its
    modules). Unknown names, models without a known family and families this transformers does not
    have give a warning and are left untouched; so does each function that is missing, already
    replaced by someone else or has other parameters (the family's other functions are routed).
    A transformers older than :data:`MIN_VERSION` gets a warning and nothing is patched (unless
    ``force=True``). Enabling twice is harmless.
    """
    version = _version()
    if not force and ssmk._version_tuple(version) < MIN_VERSION:
        _warn(f"transformers {version} is older than {'.'.join(map(str, MIN_VERSION))}; "
              "nothing was patched (enable(force=True) to try anyway)")
        return []
    routed = []
    with _lock:
        for family in _resolve(families):
            if family not in FAMILIES:
                _warn(f"unknown family {family!r} (known: {', '.join(FAMILIES)}); skipped")
                continue
            if family in _patched:
                routed.append(family)
                continue
            try:
                module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
            except ImportError as e:
                _warn(f"transformers {version} has no {family} model ({e}); skipped")
                continue
            current = {}
            for name in FAMILIES[family]:
                fn = _check_function(module, name)
                if isinstance(fn, str):
                    _warn(f"{fn}; left to transformers")
                else:
                    current[name] = fn
            if not current:
                continue
            for name, fn in current.items():
                setattr(module, name, _make(family, name, fn))
            _patched[family] = current
            routed.append(family)
    return routed


def disable(families=None):
    """Put back what :func:`enable` replaced, for the given families (default: all routed)."""
    with _lock:
        names = list(_patched) if families is None else [f for f in _resolve(families) if f in _patched]
        for family in names:
            module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
            for name, original in _patched.pop(family).items():
                fn = getattr(module, name, None)
                if getattr(fn, "_ssmk_original", None) is original:
                    setattr(module, name, original)
                else:
                    _warn(f"{module.__name__}.{name} was replaced again after enable(); left as it is")


def enabled_families():
    """The families currently routed to ssmk."""
    return list(_patched)


@contextlib.contextmanager
def enabled(families=None, *, force=False):
    """``with enabled(...):`` routes like :func:`enable` and, on exit, disables what it enabled
    (families already routed before stay routed). Yields the routed families."""
    with _lock:
        before = set(_patched)
        routed = enable(families, force=force)
        mine = [f for f in routed if f not in before]
    try:
        yield routed
    finally:
        if mine:
            disable(mine)
