"""ctypes binding for libssmk (state-space model kernels).

Loads the shared library, declares ``argtypes``/``restype`` for every exported function, and
builds DLPack-compatible ``ssmk_tensor`` descriptors from:

* buffer-protocol objects (``array.array``, ``bytearray``, writable ``memoryview``),
* numpy arrays (anything with ``__array_interface__``),
* torch tensors, duck-typed (``data_ptr()``, ``shape``, ``stride()``, ``dtype``).

No copy is made: descriptors point at the caller's memory, which must stay alive for the call.
Every wrapper raises :class:`SsmkError` (with ``status`` and the library's message) on failure.
The library is found through ``$SSMK_LIBRARY``, then next to this file (where ``pip install``
puts it), then the loader's path; ``library_path`` tells which file was loaded. The torch custom
ops are in :mod:`ssmk.torch` (``import ssmk`` alone never imports torch).
"""

import ctypes
import ctypes.util
import os
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_float,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)

# The package's version, kept equal to Cargo.toml's (and pyproject.toml's); version() is the
# loaded library's.
__version__ = "0.1.0"

OK = 0
ERR_NULL_POINTER = -1
ERR_INVALID_ARGUMENT = -2
ERR_UNSUPPORTED_DTYPE = -3
ERR_OUT_OF_BOUNDS = -4
ERR_OVERFLOW = -5
ERR_ALIASING = -6
ERR_UNSUPPORTED_DEVICE = -7
ERR_ALLOCATION = -8
ERR_PANIC = -99

ACTIVATION_NONE = 0
ACTIVATION_SILU = 1
GDN_QK_L2NORM = 1
GDN_GQA_TILED = 2
DPLR_W_LINEAR = 1
MAMBA2_DT_SOFTPLUS = 1

DEVICE_CPU = 1
DEVICE_CUDA_HOST = 3

# dtype name -> (DLPack code, bits)
DTYPES = {
    "float32": (2, 32),
    "float16": (2, 16),
    "bfloat16": (4, 16),
    "int32": (0, 32),
    "int64": (0, 64),
    "bool": (6, 8),
    "uint8": (1, 8),
}
_ITEMSIZE = {name: bits // 8 for name, (_, bits) in DTYPES.items()}

# Buffer-protocol / numpy type characters -> dtype name. 16-bit unsigned ('H', 'u2') carries raw
# bfloat16 or float16 bits: pass dtype= explicitly for those.
_FORMATS = {"f": "float32", "e": "float16", "i": "int32", "q": "int64", "l": "int64", "?": "bool", "B": "uint8", "b": "uint8"}
_NUMPY = {"f4": "float32", "f2": "float16", "i4": "int32", "i8": "int64", "b1": "bool", "u1": "uint8"}


class Device(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class TensorStruct(Structure):
    """``ssmk_tensor``, layout-identical to DLPack's ``DLTensor``."""

    _fields_ = [
        ("data", c_void_p),
        ("device", Device),
        ("ndim", c_int32),
        ("dtype", DType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class SsmkError(RuntimeError):
    """A non-zero status from libssmk, with the library's message."""

    def __init__(self, function, status, message):
        self.function, self.status, self.message = function, status, message
        super().__init__(f"{function}: {status_str(status)}: {message}")


_T = POINTER(TensorStruct)
_CTX = c_void_p

# Every exported function: name -> (restype, argtypes). A test checks this covers the header.
SIGNATURES = {
    "ssmk_status_str": (c_char_p, [c_int32]),
    "ssmk_last_error_message": (c_char_p, []),
    "ssmk_version": (c_char_p, []),
    "ssmk_active_isa": (c_char_p, []),
    "ssmk_context_create": (c_void_p, [c_uint32]),
    "ssmk_context_destroy": (None, [c_void_p]),
    "ssmk_context_num_threads": (c_uint32, [_CTX]),
    "ssmk_batch_memcpy": (c_int32, [_CTX, POINTER(c_void_p), POINTER(c_void_p), POINTER(c_size_t), c_size_t]),
    "ssmk_zero_blocks": (c_int32, [_CTX, _T, _T]),
    "ssmk_zero_blocks_multi": (c_int32, [_CTX, POINTER(_T), c_size_t, _T]),
    "ssmk_causal_conv1d_fwd": (c_int32, [_CTX, _T, _T, _T, _T, _T, _T, _T, c_uint32, c_int64, _T, _T, _T]),
    "ssmk_causal_conv1d_update": (c_int32, [_CTX, _T, _T, _T, _T, _T, _T, c_uint32, c_int64, _T]),
    "ssmk_gdn_gating": (c_int32, [_CTX, _T, _T, _T, _T, c_float, c_float, _T, _T]),
    "ssmk_kda_gating": (c_int32, [_CTX, _T, _T, _T, c_float, _T, _T, _T]),
    "ssmk_gated_delta_rule": (
        c_int32,
        [_CTX, _T, _T, _T, _T, _T, c_float, _T, _T, _T, _T, _T, c_uint32, c_float, c_int64, _T, _T, _T],
    ),
    "ssmk_dplr_delta_rule": (
        c_int32,
        [_CTX, _T, _T, _T, _T, _T, _T, c_float, _T, _T, _T, _T, _T, c_uint32, c_int64, _T, _T, _T],
    ),
    "ssmk_short_conv": (c_int32, [_CTX, _T, _T, _T, _T, _T, _T, _T, c_int64, _T, _T, _T]),
    "ssmk_mamba2_scan": (
        c_int32,
        [_CTX, _T, _T, _T, _T, _T, _T, _T, _T, c_float, c_float, c_uint32, _T, _T, _T, _T, _T, c_int64, _T, _T,
         _T],
    ),
}


def _version_tuple(version):
    """``(major, minor)`` of a version string (``"5.25.0.dev0"`` -> ``(5, 25)``): the runtime
    hooks' version rules (``ssmk.transformers``, ``ssmk.vllm``)."""
    parts = []
    for part in version.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _find_library():
    env = os.environ.get("SSMK_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    # An installed package carries the library beside this file (built by setuptools-rust as an
    # extension-named file, e.g. _libssmk.cpython-311-x86_64-linux-gnu.so).
    for name in sorted(os.listdir(here)):
        if name.startswith("_libssmk") and name.endswith(".so") or name in ("libssmk.so", "libssmk.so.0"):
            return os.path.join(here, name)
    found = ctypes.util.find_library("ssmk")
    if found:
        return found
    raise OSError("libssmk not found: set SSMK_LIBRARY to the path of libssmk.so")


def _load(path):
    lib = ctypes.CDLL(path)
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is not None:  # kernels of newer library versions may be absent from older ones
            fn.restype, fn.argtypes = restype, argtypes
    return lib


library_path = _find_library()
lib = _load(library_path)


def status_str(status):
    return lib.ssmk_status_str(status).decode()


def last_error_message():
    return lib.ssmk_last_error_message().decode()


def version():
    return lib.ssmk_version().decode()


def active_isa():
    return lib.ssmk_active_isa().decode()


def _check(name, status):
    if status != OK:
        raise SsmkError(name, status, last_error_message())


class Context:
    """Owns an ``ssmk_context``; ``Context(1)`` runs every kernel on the calling thread."""

    def __init__(self, num_threads=0):
        # Held by the object: at interpreter exit `__del__` may run after the module's `lib`
        # global is cleared.
        self._destroy = lib.ssmk_context_destroy
        self.handle = lib.ssmk_context_create(num_threads)
        if not self.handle:
            raise SsmkError("ssmk_context_create", ERR_ALLOCATION, "returned NULL")

    @property
    def num_threads(self):
        return lib.ssmk_context_num_threads(self.handle)

    def close(self):
        if getattr(self, "handle", None):
            self._destroy(self.handle)
            self.handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


def _ctx(ctx):
    return ctx.handle if isinstance(ctx, Context) else ctx


class Tensor:
    """A descriptor over caller memory. Keeps the source object, shape and strides alive."""

    def __init__(self, address, dtype, shape, strides=None, owner=None, byte_offset=0, device=DEVICE_CPU):
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
        self.owner, self.dtype = owner, dtype
        self.shape = tuple(int(s) for s in shape)
        self.strides = None if strides is None else tuple(int(s) for s in strides)
        self._shape_arr = (c_int64 * max(1, len(self.shape)))(*self.shape)
        self._strides_arr = None if strides is None else (c_int64 * max(1, len(self.strides)))(*self.strides)
        code, bits = DTYPES[dtype]
        self.struct = TensorStruct(
            c_void_p(address or None),
            Device(device, 0),
            len(self.shape),
            DType(code, bits, 1),
            self._shape_arr,
            self._strides_arr,
            byte_offset,
        )

    @property
    def ptr(self):
        return ctypes.pointer(self.struct)


def _buffer_address(obj):
    """Address and byte length of a writable, C-contiguous buffer-protocol object."""
    view = memoryview(obj)
    if view.readonly:
        raise ValueError("read-only buffer: pass a writable object (bytearray, array.array, ...)")
    if not view.c_contiguous:
        raise ValueError("non-contiguous buffer: pass the contiguous base object with shape=/strides=")
    if view.nbytes == 0:
        return 0, 0, view
    raw = view.cast("B")
    address = ctypes.addressof((ctypes.c_char * view.nbytes).from_buffer(raw))
    return address, view.nbytes, view


def tensor(obj, dtype=None, shape=None, strides=None, byte_offset=0):
    """Describes ``obj`` (buffer, numpy array, torch tensor or an existing Tensor) without copying.

    ``dtype`` overrides the element type (required for raw bf16/f16 bits held in 16-bit unsigned
    storage); ``shape``/``strides`` (strides in elements) describe a view of a contiguous buffer.
    """
    if obj is None or isinstance(obj, Tensor):
        return obj
    if hasattr(obj, "data_ptr") and hasattr(obj, "stride"):  # torch-like
        name = str(obj.dtype).replace("torch.", "")
        device = getattr(getattr(obj, "device", None), "type", "cpu")
        if device != "cpu":
            raise ValueError(f"tensor on device {device!r}: ssmk runs on CPU memory")
        pinned = bool(getattr(obj, "is_pinned", lambda: False)())
        return Tensor(
            obj.data_ptr(),
            dtype or name,
            shape or tuple(obj.shape),
            strides or tuple(obj.stride()),
            owner=obj,
            byte_offset=byte_offset,
            device=DEVICE_CUDA_HOST if pinned else DEVICE_CPU,
        )
    if hasattr(obj, "__array_interface__"):  # numpy-like
        ai = obj.__array_interface__
        typestr = ai["typestr"]
        if typestr[0] == ">":
            raise ValueError("big-endian arrays are not supported")
        name = dtype or _NUMPY.get(typestr[1:])
        if name is None:
            raise ValueError(f"numpy dtype {typestr!r}: pass dtype= (e.g. 'bfloat16' for uint16 bits)")
        size = _ITEMSIZE[name]
        byte_strides = ai.get("strides")
        elem_strides = None
        if byte_strides is not None:
            if any(s < 0 or s % size for s in byte_strides):
                raise ValueError(f"strides {byte_strides} are negative or not multiples of {size} bytes")
            elem_strides = tuple(s // size for s in byte_strides)
        return Tensor(ai["data"][0], name, shape or ai["shape"], strides or elem_strides, owner=obj, byte_offset=byte_offset)
    address, nbytes, view = _buffer_address(obj)
    name = dtype or _FORMATS.get(view.format.lstrip("@=<"))
    if name is None:
        raise ValueError(f"buffer format {view.format!r}: pass dtype=")
    if shape is None:
        shape = (nbytes // _ITEMSIZE[name],) if view.ndim <= 1 or dtype else view.shape
    return Tensor(address, name, shape, strides, owner=obj, byte_offset=byte_offset)


def _ptr(t):
    t = tensor(t)
    return None if t is None else t.ptr


def batch_memcpy(dst, src, sizes, ctx=None):
    """``memmove(dst[i], src[i], sizes[i])`` for every i, in order; addresses are integers."""
    n = len(sizes)
    if not (len(dst) == len(src) == n):
        raise ValueError("dst, src and sizes must have the same length")
    d = (c_void_p * max(n, 1))(*dst)
    s = (c_void_p * max(n, 1))(*src)
    z = (c_size_t * max(n, 1))(*sizes)
    _check("ssmk_batch_memcpy", lib.ssmk_batch_memcpy(_ctx(ctx), d, s, z, n))


def zero_blocks(cache, block_ids, ctx=None):
    cache, block_ids = tensor(cache), tensor(block_ids)
    _check("ssmk_zero_blocks", lib.ssmk_zero_blocks(_ctx(ctx), cache.ptr, block_ids.ptr))


def zero_blocks_multi(caches, block_ids, ctx=None):
    caches = [tensor(c) for c in caches]
    arr = (_T * max(len(caches), 1))(*[c.ptr for c in caches])
    block_ids = tensor(block_ids)
    _check("ssmk_zero_blocks_multi", lib.ssmk_zero_blocks_multi(_ctx(ctx), arr, len(caches), block_ids.ptr))


def causal_conv1d_fwd(x, weight, out, bias=None, conv_states=None, query_start_loc=None,
                      cache_indices=None, has_initial_state=None, activation=ACTIVATION_NONE,
                      pad_slot_id=-1, ctx=None, checkpoint_offsets=None, checkpoint_slots=None):
    """Varlen conv prefill; ``checkpoint_offsets``/``checkpoint_slots`` ``[B, C]`` (ABI.md §4.10) also
    store the state after token ``offsets[b][c]`` of sequence ``b`` in slot ``slots[b][c]``."""
    keep = [tensor(a) for a in (x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state, out,
                                checkpoint_offsets, checkpoint_slots)]
    x, weight, bias, conv_states, qsl, idx, init, out, co, cs = (None if k is None else k.ptr for k in keep)
    _check("ssmk_causal_conv1d_fwd", lib.ssmk_causal_conv1d_fwd(
        _ctx(ctx), x, weight, bias, conv_states, qsl, idx, init, activation, pad_slot_id, out, co, cs))


def causal_conv1d_update(x, conv_states, weight, out, bias=None, conv_state_indices=None,
                         num_accepted_tokens=None, activation=ACTIVATION_NONE, pad_slot_id=-1, ctx=None):
    keep = [tensor(a) for a in (x, conv_states, weight, bias, conv_state_indices, num_accepted_tokens, out)]
    x, states, weight, bias, idx, acc, out = (None if k is None else k.ptr for k in keep)
    _check("ssmk_causal_conv1d_update", lib.ssmk_causal_conv1d_update(
        _ctx(ctx), x, states, weight, bias, idx, acc, activation, pad_slot_id, out))


def gdn_gating(A_log, a, b, dt_bias, g, beta, softplus_beta=1.0, softplus_threshold=20.0, ctx=None):
    keep = [tensor(t) for t in (A_log, a, b, dt_bias, g, beta)]
    A_log, a, b, dt_bias, g, beta = (k.ptr for k in keep)
    _check("ssmk_gdn_gating", lib.ssmk_gdn_gating(
        _ctx(ctx), A_log, a, b, dt_bias, softplus_beta, softplus_threshold, g, beta))


def kda_gating(A_log, a, g, dt_bias=None, lower_bound=0.0, b=None, beta=None, ctx=None):
    keep = [None if t is None else tensor(t) for t in (A_log, a, dt_bias, b, g, beta)]
    A_log, a, dt_bias, b, g, beta = (None if t is None else t.ptr for t in keep)
    _check("ssmk_kda_gating", lib.ssmk_kda_gating(_ctx(ctx), A_log, a, dt_bias, lower_bound, b, g, beta))


def gated_delta_rule(q, k, v, g, beta, out, state=None, cu_seqlens=None, state_indices=None,
                     has_initial_state=None, num_accepted_tokens=None, scale=0.0, flags=0,
                     l2norm_eps=1e-6, pad_slot_id=-1, ctx=None, checkpoint_offsets=None, checkpoint_slots=None):
    keep = [tensor(t) for t in (q, k, v, g, beta, state, cu_seqlens, state_indices, has_initial_state,
                                num_accepted_tokens, out, checkpoint_offsets, checkpoint_slots)]
    q, k, v, g, beta, state, cu, idx, init, acc, out, co, cs = (None if t is None else t.ptr for t in keep)
    _check("ssmk_gated_delta_rule", lib.ssmk_gated_delta_rule(
        _ctx(ctx), q, k, v, g, beta, scale, state, cu, idx, init, acc, flags, l2norm_eps, pad_slot_id, out,
        co, cs))


def dplr_delta_rule(r, w, k, v, a, b, out, state=None, cu_seqlens=None, state_indices=None,
                    has_initial_state=None, num_accepted_tokens=None, scale=0.0, flags=0, pad_slot_id=-1,
                    ctx=None, checkpoint_offsets=None, checkpoint_slots=None):
    keep = [tensor(t) for t in (r, w, k, v, a, b, state, cu_seqlens, state_indices, has_initial_state,
                                num_accepted_tokens, out, checkpoint_offsets, checkpoint_slots)]
    r, w, k, v, a, b, state, cu, idx, init, acc, out, co, cs = (None if t is None else t.ptr for t in keep)
    _check("ssmk_dplr_delta_rule", lib.ssmk_dplr_delta_rule(
        _ctx(ctx), r, w, k, v, a, b, scale, state, cu, idx, init, acc, flags, pad_slot_id, out, co, cs))


def mamba2_scan(x, dt, A, B, C, out, D=None, z=None, dt_bias=None, dt_min=float("-inf"),
                dt_max=float("inf"), flags=0, state=None, cu_seqlens=None, state_indices=None,
                has_initial_state=None, num_accepted_tokens=None, pad_slot_id=-1, ctx=None,
                checkpoint_offsets=None, checkpoint_slots=None):
    """Mamba-2 selective-state scan (prefill, decode, speculative, mixed); ``out`` has x's dtype.

    ``A`` is ``[NH]`` f32 (per head) or ``[NH, N]`` f32 (per state channel: Mamba-1, with ``P = 1``
    and ``G = 1``; ABI.md 4.9).

    ``dt_min``/``dt_max`` default to no limit; ``flags=MAMBA2_DT_SOFTPLUS`` applies softplus to
    ``dt + dt_bias``.
    """
    keep = [tensor(t) for t in (x, dt, A, B, C, D, z, dt_bias, state, cu_seqlens, state_indices,
                                has_initial_state, num_accepted_tokens, out, checkpoint_offsets, checkpoint_slots)]
    x, dt, A, B, C, D, z, dt_bias, state, cu, idx, init, acc, out, co, cs = (
        None if t is None else t.ptr for t in keep)
    _check("ssmk_mamba2_scan", lib.ssmk_mamba2_scan(
        _ctx(ctx), x, dt, A, B, C, D, z, dt_bias, dt_min, dt_max, flags, state, cu, idx, init, acc,
        pad_slot_id, out, co, cs))


def short_conv(bcx, weight, out, bias=None, conv_states=None, query_start_loc=None, cache_indices=None,
               has_initial_state=None, pad_slot_id=-1, ctx=None, checkpoint_offsets=None, checkpoint_slots=None):
    keep = [tensor(t) for t in (bcx, weight, bias, conv_states, query_start_loc, cache_indices,
                                has_initial_state, out, checkpoint_offsets, checkpoint_slots)]
    bcx, weight, bias, states, qsl, idx, init, out, co, cs = (None if t is None else t.ptr for t in keep)
    _check("ssmk_short_conv", lib.ssmk_short_conv(
        _ctx(ctx), bcx, weight, bias, states, qsl, idx, init, pad_slot_id, out, co, cs))


def bf16_bits(x):
    """float -> bfloat16 bits, round to nearest even (as the library stores)."""
    import struct

    (u,) = struct.unpack("<I", struct.pack("<f", x))
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return (u >> 16) | 0x40
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def bf16_value(bits):
    import struct

    return struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]
