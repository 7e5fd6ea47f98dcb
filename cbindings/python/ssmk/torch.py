"""libssmk's kernels as torch custom operators: ``torch.ops.ssmk.*``.

Importing this module registers one ``torch.library`` custom op per kernel. Each takes the C
function's arguments in the C order, without the context (optional tensors may be ``None``,
enumerated choices and scalars are ints and floats) plus a trailing ``num_threads`` (0 = the
default below) and, for the four prefill ops, then the optional ``checkpoint_offsets`` and
``checkpoint_slots`` ``[B, C]`` tables of ABI.md §4.10 (after ``num_threads``, so calls written
before them still bind), writes its outputs and states in place and returns nothing; the arguments it
writes are declared mutated, and a fake (meta) implementation lets ``torch.compile`` trace it
(``fullgraph=True`` works)::

    torch.ops.ssmk.causal_conv1d_fwd(x, weight, bias, conv_states, query_start_loc, cache_indices,
                                     has_initial_state, activation, pad_slot_id, out)

The functions of the same names in this module are the convenient form: keyword arguments, the
outputs allocated when not given (``out=None``) and returned::

    import ssmk.torch as st
    y = st.causal_conv1d_fwd(x, weight, bias, conv_states=states, activation="silu")
    o = st.gated_delta_rule(q, k, v, g, beta, state=pool, qk_l2norm=True)

Tensors go to the library as they are, strides included (no copy): non-contiguous views such as
q/k/v sliced out of one projection are read in place where the ABI accepts their strides. dtypes
are the ABI's (f32/bf16/f16 activations, int32/int64 indices, bool/uint8/int32 masks); any other
dtype or a non-CPU device is refused by the library. A refused call raises :class:`ssmk.SsmkError`
(a ``RuntimeError``; ``.status`` and ``.message`` as the library gave them) naming the C function
and the argument, e.g. ``ssmk_causal_conv1d_fwd: SSMK_ERR_INVALID_ARGUMENT: shape, stride, ndim
or value inconsistent: weight.shape[0] = 8, expected dim = D = 16``; nothing has been written.

Threads: a call runs on ``torch.get_num_threads()`` threads (read at each call), unless
:func:`set_num_threads` fixed another count or the call passes ``num_threads=n``. One
``ssmk.Context`` per thread count is created on first use and kept.
"""

import inspect
import math
import threading
from typing import List, Optional, Sequence, Tuple

import torch

import ssmk
from ssmk import (
    ACTIVATION_NONE,
    ACTIVATION_SILU,
    DPLR_W_LINEAR,
    ERR_INVALID_ARGUMENT,
    GDN_GQA_TILED,
    GDN_QK_L2NORM,
    MAMBA2_DT_SOFTPLUS,
    SsmkError,
)
from ssmk import _check
from ssmk import lib as _lib

__all__ = [
    "SsmkError",
    "batch_memcpy",
    "causal_conv1d_fwd",
    "causal_conv1d_update",
    "dplr_delta_rule",
    "gated_delta_rule",
    "gdn_gating",
    "get_num_threads",
    "kda_gating",
    "mamba2_scan",
    "set_num_threads",
    "short_conv",
    "zero_blocks",
    "zero_blocks_multi",
]

Tensor = torch.Tensor

# ---------------------------------------------------------------------------------------------
# Threads

_lock = threading.Lock()
_contexts = {}
_fixed_threads = None


def set_num_threads(n: Optional[int]) -> None:
    """Runs every later call on ``n`` threads; ``None`` follows ``torch.get_num_threads()`` again."""
    global _fixed_threads
    if n is not None and int(n) < 1:
        raise ValueError(f"num_threads must be >= 1 or None, got {n}")
    _fixed_threads = None if n is None else int(n)


def get_num_threads() -> int:
    """The thread count a call without ``num_threads`` runs on."""
    return _fixed_threads if _fixed_threads is not None else max(1, torch.get_num_threads())


def _context(num_threads: int) -> ssmk.Context:
    n = int(num_threads) if num_threads > 0 else get_num_threads()
    ctx = _contexts.get(n)
    if ctx is None:
        with _lock:
            ctx = _contexts.get(n)
            if ctx is None:
                ctx = _contexts[n] = ssmk.Context(n)
    return ctx


# ---------------------------------------------------------------------------------------------
# Descriptors

# torch dtype -> DLPack (code, bits). Types the ABI does not accept are described truthfully so
# that the library's refusal names the argument.
_DLPACK = {
    torch.float32: (2, 32),
    torch.float16: (2, 16),
    torch.bfloat16: (4, 16),
    torch.float64: (2, 64),
    torch.int32: (0, 32),
    torch.int64: (0, 64),
    torch.int16: (0, 16),
    torch.int8: (0, 8),
    torch.uint8: (1, 8),
    torch.bool: (6, 8),
    torch.complex64: (5, 64),
    torch.complex128: (5, 128),
}
# DLPack device types; every one but CPU is refused by the library (SSMK_ERR_UNSUPPORTED_DEVICE).
_DEVICES = {"cpu": 1, "cuda": 2, "opencl": 4, "vulkan": 7, "metal": 8, "mps": 8, "xpu": 14}


_DTYPE_STRUCTS = {t: ssmk.DType(code, bits, 1) for t, (code, bits) in _DLPACK.items()}
_CPU = ssmk.Device(1, 0)
_INT64_ARRAYS = [ssmk.c_int64 * max(1, n) for n in range(9)]


class _Desc(ssmk.Tensor):
    """An ``ssmk_tensor`` over a torch tensor's memory: its data pointer, shape and strides.

    Built directly (not through ``ssmk.Tensor.__init__``, which accepts only the ABI's dtypes):
    this runs for every tensor of every call, so it does the least it can. It holds no reference
    to the tensor: it is a function of the address, shape, strides, dtype and device alone, so
    :func:`_d` can hand the same one to every call on the same memory.
    """

    def __init__(self, t: Tensor):
        shape = t.shape
        nd = len(shape)
        arr = _INT64_ARRAYS[nd] if nd < len(_INT64_ARRAYS) else ssmk.c_int64 * nd
        self._shape_arr = shape_arr = arr(*shape)
        self._strides_arr = strides_arr = arr(*t.stride())
        self._torch_dtype = t.dtype
        dtype = _DTYPE_STRUCTS.get(t.dtype)
        if dtype is None:  # described truthfully for the library to refuse by name
            dtype = ssmk.DType(255, 8 * t.element_size(), 1)
        dev = t.device
        device = _CPU if dev.type == "cpu" else ssmk.Device(_DEVICES.get(dev.type, 0), dev.index or 0)
        self.struct = ssmk.TensorStruct(t.data_ptr() or None, device, nd, dtype, shape_arr,
                                        strides_arr, 0)
        self._ref = ssmk.ctypes.byref(self.struct)

    @property
    def ptr(self):
        return self._ref

    @property
    def dtype(self):
        return str(self._torch_dtype)

    @property
    def shape(self):
        return tuple(self._shape_arr[:self.struct.ndim])

    @property
    def strides(self):
        return tuple(self._strides_arr[:self.struct.ndim])


# Descriptors of CPU tensors by (address, shape, strides, dtype). A model's weights, state pools
# and the activation buffers torch's allocator hands out again recur every step; a lookup costs
# a fifth of building one (measured: 0.4 us against 3.5 us).
_DESCS = {}
_MAX_DESCS = 4096


def _d(t: Optional[Tensor]) -> Optional[_Desc]:
    if t is None:
        return None
    if not t.is_cpu:  # refused by the library; not worth a cache entry
        return _Desc(t)
    key = (t.data_ptr(), t.shape, t.stride(), t.dtype)
    desc = _DESCS.get(key)
    if desc is None:
        if len(_DESCS) >= _MAX_DESCS:
            _DESCS.clear()
        desc = _DESCS[key] = _Desc(t)
    return desc


def _p(t: Optional[Tensor]):
    """The C argument for ``t``: its cached descriptor (:func:`_d`) by reference, or NULL."""
    return None if t is None else _d(t)._ref


# ---------------------------------------------------------------------------------------------
# The custom ops: C argument order minus the context, plus num_threads; outputs written in place.

# name -> (the op's plain implementation, positions of the arguments it writes)
_IMPLS = {}


def _custom_op(name: str, mutates_args: Tuple[str, ...]):
    """``torch.library.custom_op("ssmk::<name>")``, keeping the plain function for :func:`_call`."""

    def register(fn):
        params = list(inspect.signature(fn).parameters)
        _IMPLS[name] = (fn, tuple(params.index(a) for a in mutates_args))
        return torch.library.custom_op("ssmk::" + name, mutates_args=mutates_args)(fn)

    return register


# The probes of _direct() and the version bump, bound once: each is a module attribute lookup
# less per call (on a decode step's cold caches a lookup is ~1 us).
try:
    _grad_enabled = torch.is_grad_enabled
    _compiling = torch.compiler.is_compiling
    _dispatch_modes = torch._C._len_torch_dispatch_stack
    _function_mode = torch._C._is_torch_function_mode_enabled
    _increment_version = torch._C._increment_version
except AttributeError:  # a torch without these probes: always dispatch
    _grad_enabled = None


def _direct() -> bool:
    """True in eager code without autograd (``no_grad`` or ``inference_mode``, as vLLM and
    ``generate`` run models), not traced by ``torch.compile`` and under no torch function or
    dispatch mode: there the op's dispatch does nothing but cost time (25-95 us a call, measured,
    more than a one-token kernel takes)."""
    return (_grad_enabled is not None and not _grad_enabled() and not _compiling()
            and _dispatch_modes() == 0 and not _function_mode())


def _call(name: str, *args) -> None:
    """``torch.ops.ssmk.<name>(*args)``; where :func:`_direct` holds, the implementation itself,
    then the version counters of the tensors it wrote bumped, as the dispatcher does. (The torch
    profiler then shows no ``ssmk::`` record for the call.)"""
    if not _direct():
        getattr(torch.ops.ssmk, name)(*args)
        return
    fn, written = _IMPLS[name]
    fn(*args)
    bumped = []
    for i in written:
        arg = args[i]
        if isinstance(arg, Tensor):
            bumped.append(arg)
        elif arg is not None:
            bumped.extend(arg)
    if bumped:
        _increment_version(bumped)


@_custom_op("causal_conv1d_fwd", mutates_args=("conv_states", "out"))
def _causal_conv1d_fwd(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    conv_states: Optional[Tensor],
    query_start_loc: Optional[Tensor],
    cache_indices: Optional[Tensor],
    has_initial_state: Optional[Tensor],
    activation: int,
    pad_slot_id: int,
    out: Tensor,
    num_threads: int = 0,
    checkpoint_offsets: Optional[Tensor] = None,
    checkpoint_slots: Optional[Tensor] = None,
) -> None:
    _check("ssmk_causal_conv1d_fwd", _lib.ssmk_causal_conv1d_fwd(
        _context(num_threads).handle, _p(x), _p(weight), _p(bias), _p(conv_states),
        _p(query_start_loc), _p(cache_indices), _p(has_initial_state), activation, pad_slot_id,
        _p(out), _p(checkpoint_offsets), _p(checkpoint_slots)))


@_custom_op("causal_conv1d_update", mutates_args=("conv_states", "out"))
def _causal_conv1d_update(
    x: Tensor,
    conv_states: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    conv_state_indices: Optional[Tensor],
    num_accepted_tokens: Optional[Tensor],
    activation: int,
    pad_slot_id: int,
    out: Tensor,
    num_threads: int = 0,
) -> None:
    _check("ssmk_causal_conv1d_update", _lib.ssmk_causal_conv1d_update(
        _context(num_threads).handle, _p(x), _p(conv_states), _p(weight), _p(bias),
        _p(conv_state_indices), _p(num_accepted_tokens), activation, pad_slot_id, _p(out)))


@_custom_op("gdn_gating", mutates_args=("g", "beta"))
def _gdn_gating(
    A_log: Tensor,
    a: Tensor,
    b: Tensor,
    dt_bias: Tensor,
    softplus_beta: float,
    softplus_threshold: float,
    g: Tensor,
    beta: Tensor,
    num_threads: int = 0,
) -> None:
    _check("ssmk_gdn_gating", _lib.ssmk_gdn_gating(
        _context(num_threads).handle, _p(A_log), _p(a), _p(b), _p(dt_bias), softplus_beta,
        softplus_threshold, _p(g), _p(beta)))


@_custom_op("kda_gating", mutates_args=("g", "beta"))
def _kda_gating(
    A_log: Tensor,
    a: Tensor,
    dt_bias: Optional[Tensor],
    lower_bound: float,
    b: Optional[Tensor],
    g: Tensor,
    beta: Optional[Tensor],
    num_threads: int = 0,
) -> None:
    _check("ssmk_kda_gating", _lib.ssmk_kda_gating(
        _context(num_threads).handle, _p(A_log), _p(a), _p(dt_bias), lower_bound, _p(b), _p(g),
        _p(beta)))


@_custom_op("gated_delta_rule", mutates_args=("state", "out"))
def _gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float,
    state: Optional[Tensor],
    cu_seqlens: Optional[Tensor],
    state_indices: Optional[Tensor],
    has_initial_state: Optional[Tensor],
    num_accepted_tokens: Optional[Tensor],
    flags: int,
    l2norm_eps: float,
    pad_slot_id: int,
    out: Tensor,
    num_threads: int = 0,
    checkpoint_offsets: Optional[Tensor] = None,
    checkpoint_slots: Optional[Tensor] = None,
) -> None:
    _check("ssmk_gated_delta_rule", _lib.ssmk_gated_delta_rule(
        _context(num_threads).handle, _p(q), _p(k), _p(v), _p(g), _p(beta), scale, _p(state),
        _p(cu_seqlens), _p(state_indices), _p(has_initial_state), _p(num_accepted_tokens), flags,
        l2norm_eps, pad_slot_id, _p(out), _p(checkpoint_offsets), _p(checkpoint_slots)))


@_custom_op("dplr_delta_rule", mutates_args=("state", "out"))
def _dplr_delta_rule(
    r: Tensor,
    w: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    scale: float,
    state: Optional[Tensor],
    cu_seqlens: Optional[Tensor],
    state_indices: Optional[Tensor],
    has_initial_state: Optional[Tensor],
    num_accepted_tokens: Optional[Tensor],
    flags: int,
    pad_slot_id: int,
    out: Tensor,
    num_threads: int = 0,
    checkpoint_offsets: Optional[Tensor] = None,
    checkpoint_slots: Optional[Tensor] = None,
) -> None:
    _check("ssmk_dplr_delta_rule", _lib.ssmk_dplr_delta_rule(
        _context(num_threads).handle, _p(r), _p(w), _p(k), _p(v), _p(a), _p(b), scale, _p(state),
        _p(cu_seqlens), _p(state_indices), _p(has_initial_state), _p(num_accepted_tokens), flags,
        pad_slot_id, _p(out), _p(checkpoint_offsets), _p(checkpoint_slots)))


@_custom_op("short_conv", mutates_args=("conv_states", "out"))
def _short_conv(
    bcx: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    conv_states: Optional[Tensor],
    query_start_loc: Optional[Tensor],
    cache_indices: Optional[Tensor],
    has_initial_state: Optional[Tensor],
    pad_slot_id: int,
    out: Tensor,
    num_threads: int = 0,
    checkpoint_offsets: Optional[Tensor] = None,
    checkpoint_slots: Optional[Tensor] = None,
) -> None:
    _check("ssmk_short_conv", _lib.ssmk_short_conv(
        _context(num_threads).handle, _p(bcx), _p(weight), _p(bias), _p(conv_states),
        _p(query_start_loc), _p(cache_indices), _p(has_initial_state), pad_slot_id, _p(out),
        _p(checkpoint_offsets), _p(checkpoint_slots)))


@_custom_op("mamba2_scan", mutates_args=("state", "out"))
def _mamba2_scan(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Optional[Tensor],
    z: Optional[Tensor],
    dt_bias: Optional[Tensor],
    dt_min: float,
    dt_max: float,
    flags: int,
    state: Optional[Tensor],
    cu_seqlens: Optional[Tensor],
    state_indices: Optional[Tensor],
    has_initial_state: Optional[Tensor],
    num_accepted_tokens: Optional[Tensor],
    pad_slot_id: int,
    out: Tensor,
    num_threads: int = 0,
    checkpoint_offsets: Optional[Tensor] = None,
    checkpoint_slots: Optional[Tensor] = None,
) -> None:
    _check("ssmk_mamba2_scan", _lib.ssmk_mamba2_scan(
        _context(num_threads).handle, _p(x), _p(dt), _p(A), _p(B), _p(C), _p(D), _p(z),
        _p(dt_bias), dt_min, dt_max, flags, _p(state), _p(cu_seqlens), _p(state_indices),
        _p(has_initial_state), _p(num_accepted_tokens), pad_slot_id, _p(out),
        _p(checkpoint_offsets), _p(checkpoint_slots)))


@_custom_op("zero_blocks", mutates_args=("cache",))
def _zero_blocks(cache: Tensor, block_ids: Tensor, num_threads: int = 0) -> None:
    _check("ssmk_zero_blocks", _lib.ssmk_zero_blocks(_context(num_threads).handle, _p(cache),
                                                     _p(block_ids)))


@_custom_op("zero_blocks_multi", mutates_args=("caches",))
def _zero_blocks_multi(caches: List[Tensor], block_ids: Tensor, num_threads: int = 0) -> None:
    descs = [_Desc(c) for c in caches]  # an array of pointers: ctypes.pointer, not byref
    arr = (ssmk.POINTER(ssmk.TensorStruct) * max(1, len(descs)))(
        *[ssmk.ctypes.pointer(d.struct) for d in descs])
    _check("ssmk_zero_blocks_multi", _lib.ssmk_zero_blocks_multi(
        _context(num_threads).handle, arr, len(descs), _p(block_ids)))


@_custom_op("batch_memcpy", mutates_args=("dst",))
def _batch_memcpy(dst: List[Tensor], src: List[Tensor], num_threads: int = 0) -> None:
    # The C function copies raw byte ranges; as an op it copies whole tensors, src[i] -> dst[i]
    # (each contiguous, the same number of bytes), so that torch sees what is written.
    name = "ssmk_batch_memcpy"
    if len(dst) != len(src):
        raise SsmkError(name, ERR_INVALID_ARGUMENT, f"len(dst) = {len(dst)}, len(src) = {len(src)}")
    sizes = []
    for i, (d, s) in enumerate(zip(dst, src)):
        for what, t in (("dst", d), ("src", s)):
            if not t.is_contiguous():
                raise SsmkError(name, ERR_INVALID_ARGUMENT, f"{what}[{i}] is not contiguous")
            if t.device.type != "cpu":
                raise SsmkError(name, ssmk.ERR_UNSUPPORTED_DEVICE, f"{what}[{i}] is on {t.device}")
        n = d.numel() * d.element_size()
        if s.numel() * s.element_size() != n:
            raise SsmkError(name, ERR_INVALID_ARGUMENT,
                            f"src[{i}] has {s.numel() * s.element_size()} bytes, dst[{i}] has {n}")
        sizes.append(n)
    ssmk.batch_memcpy([d.data_ptr() or None for d in dst], [s.data_ptr() or None for s in src],
                      sizes, ctx=_context(num_threads))


def _no_output(*args, **kwargs):
    """Fake (meta) kernel: every op writes only arguments it was given, so nothing to build."""
    return None


for _op in (_causal_conv1d_fwd, _causal_conv1d_update, _gdn_gating, _kda_gating, _gated_delta_rule,
            _dplr_delta_rule, _short_conv, _mamba2_scan, _zero_blocks, _zero_blocks_multi, _batch_memcpy):
    _op.register_fake(_no_output)
del _op

# ---------------------------------------------------------------------------------------------
# The convenient form


def _activation(activation) -> int:
    if activation is None or activation is False:
        return ACTIVATION_NONE
    if activation is True:
        return ACTIVATION_SILU
    if isinstance(activation, str):
        name = activation.lower()
        if name in ("silu", "swish"):
            return ACTIVATION_SILU
        if name in ("", "none", "identity"):
            return ACTIVATION_NONE
        raise ValueError(f"activation {activation!r}: expected None, 'silu' or 'swish'")
    return int(activation)


def _empty(shape, dtype, like: Tensor) -> Tensor:
    return torch.empty(shape, dtype=dtype, device=like.device)


def causal_conv1d_fwd(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                      conv_states: Optional[Tensor] = None, query_start_loc: Optional[Tensor] = None,
                      cache_indices: Optional[Tensor] = None,
                      has_initial_state: Optional[Tensor] = None, activation=None,
                      pad_slot_id: int = -1, *, out: Optional[Tensor] = None,
                      num_threads: int = 0, checkpoint_offsets: Optional[Tensor] = None,
                      checkpoint_slots: Optional[Tensor] = None) -> Tensor:
    """Varlen causal conv prefill ``x [T,D]``, weight ``[D,W]``; ``conv_states [S,L,D]`` updated.

    ``activation``: None or ``"silu"`` (or the ``ssmk.ACTIVATION_*`` value). Returns ``out [T,D]``.
    ``checkpoint_offsets``/``checkpoint_slots`` ``[B,C]`` (ABI.md §4.10): the state after token
    ``offsets[b][c]`` of sequence ``b`` also goes to slot ``slots[b][c]``.
    """
    if out is None:
        out = _empty(x.shape, x.dtype, x)
    _call("causal_conv1d_fwd", x, weight, bias, conv_states, query_start_loc, cache_indices,
          has_initial_state, _activation(activation), pad_slot_id, out,
          num_threads, checkpoint_offsets, checkpoint_slots)
    return out


def causal_conv1d_update(x: Tensor, conv_states: Tensor, weight: Tensor,
                         bias: Optional[Tensor] = None, conv_state_indices: Optional[Tensor] = None,
                         num_accepted_tokens: Optional[Tensor] = None, activation=None,
                         pad_slot_id: int = -1, *, out: Optional[Tensor] = None,
                         num_threads: int = 0) -> Tensor:
    """Decode step (``x [B,D]``) or speculative verify (``x [B,Q,D]``); returns ``out`` (x's shape)."""
    if out is None:
        out = _empty(x.shape, x.dtype, x)
    _call("causal_conv1d_update", x, conv_states, weight, bias, conv_state_indices,
          num_accepted_tokens, _activation(activation), pad_slot_id,
          out, num_threads)
    return out


def gdn_gating(A_log: Tensor, a: Tensor, b: Tensor, dt_bias: Tensor, softplus_beta: float = 1.0,
               softplus_threshold: float = 20.0, *, g: Optional[Tensor] = None,
               beta: Optional[Tensor] = None, num_threads: int = 0) -> Tuple[Tensor, Tensor]:
    """Gated DeltaNet gates: returns ``(g [N,HV] f32, beta [N,HV] in b's dtype)``."""
    if g is None:
        g = _empty(a.shape, torch.float32, a)
    if beta is None:
        beta = _empty(b.shape, b.dtype, b)
    _call("gdn_gating", A_log, a, b, dt_bias, float(softplus_beta), float(softplus_threshold),
          g, beta, num_threads)
    return g, beta


def kda_gating(A_log: Tensor, a: Tensor, dt_bias: Optional[Tensor] = None, lower_bound: float = 0.0,
               b: Optional[Tensor] = None, *, g: Optional[Tensor] = None,
               beta: Optional[Tensor] = None,
               num_threads: int = 0) -> Tuple[Tensor, Optional[Tensor]]:
    """Kimi Delta Attention gates: returns ``(g [N,HV,K] f32, beta [N,HV] or None)``.

    ``beta = sigmoid(b)`` (b's dtype) is computed when ``b`` is given.
    """
    if g is None:
        g = _empty(a.shape, torch.float32, a)
    if beta is None and b is not None:
        beta = _empty(b.shape, b.dtype, b)
    _call("kda_gating", A_log, a, dt_bias, float(lower_bound), b, g, beta, num_threads)
    return g, beta


def gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                     scale: Optional[float] = None, state: Optional[Tensor] = None,
                     cu_seqlens: Optional[Tensor] = None, state_indices: Optional[Tensor] = None,
                     has_initial_state: Optional[Tensor] = None,
                     num_accepted_tokens: Optional[Tensor] = None, *, qk_l2norm: bool = False,
                     gqa_tiled: bool = False, flags: int = 0, l2norm_eps: float = 1e-6,
                     pad_slot_id: int = -1, out: Optional[Tensor] = None,
                     num_threads: int = 0, checkpoint_offsets: Optional[Tensor] = None,
                     checkpoint_slots: Optional[Tensor] = None) -> Tensor:
    """Gated delta rule (GDN with ``g [T,HV]``, KDA with ``g [T,HV,K]``): prefill, decode, spec.

    ``q, k [T,H,K]``, ``v [T,HV,V]``, ``beta [T,HV]``; ``state [S,HV,K,V]`` is read and written in
    place. ``scale`` None = ``1/sqrt(K)``. Returns ``out [T,HV,V]`` (v's dtype unless given).
    """
    if out is None:
        out = _empty(v.shape, v.dtype, v)
    flags = int(flags) | (GDN_QK_L2NORM if qk_l2norm else 0) | (GDN_GQA_TILED if gqa_tiled else 0)
    _call("gated_delta_rule", q, k, v, g, beta, 0.0 if scale is None else float(scale), state,
          cu_seqlens, state_indices, has_initial_state,
          num_accepted_tokens, flags, float(l2norm_eps), pad_slot_id, out,
          num_threads, checkpoint_offsets, checkpoint_slots)
    return out


def dplr_delta_rule(r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor,
                    scale: Optional[float] = None, state: Optional[Tensor] = None,
                    cu_seqlens: Optional[Tensor] = None, state_indices: Optional[Tensor] = None,
                    has_initial_state: Optional[Tensor] = None,
                    num_accepted_tokens: Optional[Tensor] = None, *, w_linear: bool = False,
                    pad_slot_id: int = -1, out: Optional[Tensor] = None, num_threads: int = 0,
                    checkpoint_offsets: Optional[Tensor] = None,
                    checkpoint_slots: Optional[Tensor] = None) -> Tensor:
    """RWKV-7's generalized delta rule (``a = -kk``, ``b = kk * a_iclr``): prefill, decode, spec.

    ``r, w, k, a, b [T,H,K]``, ``v [T,H,V]``; ``w`` f32 log-decays (the factors with
    ``w_linear``); ``state [S,H,K,V]`` (or a ``[v][k]`` view of it) is read and written in place.
    ``scale`` None = 1. Returns ``out [T,H,V]`` (v's dtype unless given).
    """
    if out is None:
        out = _empty(v.shape, v.dtype, v)
    _call("dplr_delta_rule", r, w, k, v, a, b, 0.0 if scale is None else float(scale), state,
          cu_seqlens, state_indices, has_initial_state, num_accepted_tokens,
          DPLR_W_LINEAR if w_linear else 0, pad_slot_id, out, num_threads, checkpoint_offsets,
          checkpoint_slots)
    return out


def short_conv(bcx: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
               conv_states: Optional[Tensor] = None, query_start_loc: Optional[Tensor] = None,
               cache_indices: Optional[Tensor] = None, has_initial_state: Optional[Tensor] = None,
               pad_slot_id: int = -1, *, out: Optional[Tensor] = None,
               num_threads: int = 0, checkpoint_offsets: Optional[Tensor] = None,
               checkpoint_slots: Optional[Tensor] = None) -> Tensor:
    """LFM2 ShortConv core ``C * conv(B * x)`` of ``bcx [T,3D]``; returns ``out [T,D]``."""
    if out is None:
        out = _empty((*bcx.shape[:-1], bcx.shape[-1] // 3), bcx.dtype, bcx)
    _call("short_conv", bcx, weight, bias, conv_states, query_start_loc, cache_indices,
          has_initial_state, pad_slot_id, out, num_threads, checkpoint_offsets,
          checkpoint_slots)
    return out


def mamba2_scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Optional[Tensor] = None,
                z: Optional[Tensor] = None, dt_bias: Optional[Tensor] = None,
                dt_min: float = -math.inf, dt_max: float = math.inf, dt_softplus: bool = False,
                state: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                state_indices: Optional[Tensor] = None, has_initial_state: Optional[Tensor] = None,
                num_accepted_tokens: Optional[Tensor] = None, pad_slot_id: int = -1, *,
                flags: int = 0, out: Optional[Tensor] = None, num_threads: int = 0,
                checkpoint_offsets: Optional[Tensor] = None,
                checkpoint_slots: Optional[Tensor] = None) -> Tensor:
    """Mamba-2 selective-state scan; ``state [S,NH,P,N]`` in place. Returns ``out`` (x's shape/dtype).

    ``A`` is ``[NH]`` f32 (one decay rate per head, Mamba-2) or ``[NH, N]`` f32 (one per state
    channel, Mamba-1: a layer of ``d_inner`` channels is ``x, z, out [T, d_inner, 1]``, ``dt
    [T, d_inner]``, ``B, C [T, 1, N]``, ``state [S, d_inner, 1, N]``, ``A = -exp(A_log)``; x, dt,
    z and out may be channel-major views such as ``xz[:d_inner].t().unsqueeze(-1)`` of a
    ``[2 d_inner, T]`` projection). ``dt_softplus`` (the C flag ``SSMK_MAMBA2_DT_SOFTPLUS``, in
    its place) applies softplus to ``dt + dt_bias``; ``dt_min``/``dt_max`` default to no limit.
    """
    if out is None:
        out = _empty(x.shape, x.dtype, x)
    flags = int(flags) | (MAMBA2_DT_SOFTPLUS if dt_softplus else 0)
    _call("mamba2_scan", x, dt, A, B, C, D, z, dt_bias, float(dt_min), float(dt_max), flags,
          state, cu_seqlens, state_indices, has_initial_state,
          num_accepted_tokens, pad_slot_id, out, num_threads, checkpoint_offsets,
          checkpoint_slots)
    return out


def zero_blocks(cache: Tensor, block_ids: Tensor, *, num_threads: int = 0) -> Tensor:
    """Zeroes ``cache[i]`` for every id in ``block_ids``; returns ``cache``."""
    _call("zero_blocks", cache, block_ids, num_threads)
    return cache


def zero_blocks_multi(caches: Sequence[Tensor], block_ids: Tensor, *, num_threads: int = 0) -> None:
    """Zeroes ``c[i]`` of every cache ``c`` for every id in ``block_ids`` (one parallel call)."""
    _call("zero_blocks_multi", list(caches), block_ids, num_threads)


def batch_memcpy(dst: Sequence[Tensor], src: Sequence[Tensor], *, num_threads: int = 0) -> None:
    """Copies the bytes of ``src[i]`` into ``dst[i]`` (contiguous, equal byte sizes) for every i."""
    _call("batch_memcpy", list(dst), list(src), num_threads)
