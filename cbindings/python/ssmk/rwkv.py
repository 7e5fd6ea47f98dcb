"""Run the RWKV-7 (x070) time-mix recurrence of BlinkDL's ``rwkv`` package on ssmk, on CPU.

::

    import os
    os.environ["RWKV_V7_ON"] = "1"          # before rwkv.model is imported, as the package asks
    import ssmk.rwkv
    from rwkv.model import RWKV

    ssmk.rwkv.enable()                      # before the model is built (see below)
    model = RWKV(model="/path/to/rwkv7-model", strategy="cpu fp32")   # or "cpu bf16"
    logits, state = model.forward(tokens, None)
    ssmk.rwkv.disable()                     # the package's own loop again, for every model

    with ssmk.rwkv.enabled():               # or scoped
        ...

How: ``RWKV_x070``'s script methods call two TorchScript functions of ``rwkv.model`` by their global
name, ``RWKV_x070_TMix_seq`` (a prompt: a per-token torch loop on CPU) and ``RWKV_x070_TMix_one``
(one token). The recurrence is written inline in them, so the narrowest seam is the whole
function: :func:`enable` replaces both globals by TorchScript functions that are the package's
code of 0.8.32 (token shift, projections, ``kk`` normalisation, GroupNorm, bonus term: unchanged)
with only the state update and readout handed to ``ssmk_dplr_delta_rule`` (``a = -kk``,
``b = kk * a``, the package's own decay factors with ``SSMK_DPLR_W_LINEAR``, scale 1).
:func:`enable` refuses other ``rwkv`` versions unless ``force=True``.

The package's script methods are compiled when a model is built and bind the functions they find
then (TorchScript reuses them for later models of the class; :func:`enable` and :func:`disable`
make the next model compile afresh): a model built before :func:`enable` keeps the package's loop,
uncounted. A model built while enabled runs ssmk while routing is on and the package's own
functions after :func:`disable`.

The state stays where the package keeps it: ``state[3*i+1]``, ``[H, N, N]`` f32 per layer, ``S``
stored ``[v][k]``; ssmk updates it in place through a strided ``[1, H, K, V]`` view (no copy), so
the tensor passed in is the one returned (the package builds a new one per token). Routed: a CPU
model with the ``cpu fp32`` or ``cpu bf16`` strategy; anything else (another device, fp16) runs
the package's function and is counted as a fallback (:func:`call_counts`).
"""

import contextlib
import threading
from importlib import metadata
from typing import Tuple

import torch

import ssmk.torch as _st

__all__ = ["TESTED_VERSIONS", "call_counts", "disable", "enable", "enabled", "is_enabled",
           "reset_call_counts"]

TESTED_VERSIONS = ("0.8.32",)
_SEAMS = ("RWKV_x070_TMix_seq", "RWKV_x070_TMix_one")

_lock = threading.RLock()
_routing = False
_originals = {}  # global name in rwkv.model -> the package's function, while replaced
_counts = {}  # (function, "ssmk" | "fallback") -> calls
_HAS_INITIAL_STATE = torch.ones(1, dtype=torch.bool)
_ROUTED_DTYPES = (torch.float32, torch.bfloat16)

Tensor = torch.Tensor


def _count(name, route):
    key = (name, route)
    _counts[key] = _counts.get(key, 0) + 1


def call_counts():
    """``{(function, "ssmk" | "fallback"): calls}`` since the last :func:`reset_call_counts`."""
    return dict(_counts)


def reset_call_counts():
    _counts.clear()


def is_enabled():
    """True between :func:`enable` and :func:`disable`."""
    return _routing


@torch.jit.ignore
def _use_ssmk(name: str, x: Tensor, state: Tensor) -> bool:
    """Whether this call goes to ssmk (counted); False after :func:`disable` (not counted)."""
    if not _routing:
        return False
    ok = (x.device.type == "cpu" and x.dtype in _ROUTED_DTYPES and state.device.type == "cpu"
          and state.dtype == torch.float32 and not torch.is_grad_enabled())
    _count(name, "ssmk" if ok else "fallback")
    return ok


@torch.jit.ignore
def _recurrence(state: Tensor, r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor,
                H: int, N: int) -> Tensor:
    """The package's per-token loop as one ssmk call: ``[T, H*N]`` rows in (``w`` the decay
    factors), ``[T, H, N]`` out in v's dtype; ``state [H, V, K]`` updated in place."""
    shape = (-1, H, N)
    return _st.dplr_delta_rule(r.view(shape), w.view(shape), k.view(shape), v.view(shape),
                               a.view(shape), b.view(shape), state=state.unsqueeze(0).transpose(2, 3),
                               has_initial_state=_HAS_INITIAL_STATE, w_linear=True)


def _replacements(originals):
    """TorchScript copies of the package's two time-mix functions (0.8.32) with the recurrence on
    ssmk; each runs the function it replaces when :func:`_use_ssmk` says no."""
    original_seq, original_one = originals["RWKV_x070_TMix_seq"], originals["RWKV_x070_TMix_one"]

    def RWKV_x070_TMix_seq(layer_id: int, H: int, N: int, x, x_prev, v_first, state, x_r, x_w, x_k,
                           x_v, x_a, x_g, w0, w1, w2, a0, a1, a2, v0, v1, v2, g1, g2, k_k, k_a, r_k,
                           R_, K_, V_, O_, ln_w, ln_b) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        if not _use_ssmk("RWKV_x070_TMix_seq", x, state):
            return original_seq(layer_id, H, N, x, x_prev, v_first, state, x_r, x_w, x_k, x_v, x_a,
                                x_g, w0, w1, w2, a0, a1, a2, v0, v1, v2, g1, g2, k_k, k_a, r_k, R_,
                                K_, V_, O_, ln_w, ln_b)
        T = x.shape[0]
        xx = torch.cat((x_prev.unsqueeze(0), x[:-1, :])) - x
        xr, xw, xk, xv, xa, xg = x+xx*x_r, x+xx*x_w, x+xx*x_k, x+xx*x_v, x+xx*x_a, x+xx*x_g

        r = xr @ R_
        w = torch.tanh(xw @ w1) @ w2
        k = xk @ K_
        v = xv @ V_
        a = torch.sigmoid(a0 + (xa @ a1) @ a2)
        g = torch.sigmoid(xg @ g1) @ g2

        kk = torch.nn.functional.normalize((k * k_k).view(T, H, N), dim=-1, p=2.0).view(T, H*N)
        k = k * (1 + (a-1) * k_a)
        if layer_id == 0:
            v_first = v
        else:
            v = v + (v_first - v) * torch.sigmoid(v0 + (xv @ v1) @ v2)

        w = torch.exp(-0.606531 * torch.sigmoid((w0 + w).float()))  # 0.606531 = exp(-0.5)
        xx = _recurrence(state, r, w, k, v, -kk, kk*a, H, N)

        xx = torch.nn.functional.group_norm(xx.view(T, H*N), num_groups=H, weight=ln_w, bias=ln_b, eps=64e-5).view(T, H*N)
        xx = xx + ((r * k * r_k).view(T, H, N).sum(dim=-1, keepdim=True) * v.view(T, H, N)).view(T, H*N)
        return (xx * g) @ O_, x[-1, :], state, v_first

    def RWKV_x070_TMix_one(layer_id: int, H: int, N: int, x, x_prev, v_first, state, x_r, x_w, x_k,
                           x_v, x_a, x_g, w0, w1, w2, a0, a1, a2, v0, v1, v2, g1, g2, k_k, k_a, r_k,
                           R_, K_, V_, O_, ln_w, ln_b) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        if not _use_ssmk("RWKV_x070_TMix_one", x, state):
            return original_one(layer_id, H, N, x, x_prev, v_first, state, x_r, x_w, x_k, x_v, x_a,
                                x_g, w0, w1, w2, a0, a1, a2, v0, v1, v2, g1, g2, k_k, k_a, r_k, R_,
                                K_, V_, O_, ln_w, ln_b)
        xx = x_prev - x
        xr, xw, xk, xv, xa, xg = x+xx*x_r, x+xx*x_w, x+xx*x_k, x+xx*x_v, x+xx*x_a, x+xx*x_g

        r = xr @ R_
        w = torch.tanh(xw @ w1) @ w2
        k = xk @ K_
        v = xv @ V_
        a = torch.sigmoid(a0 + (xa @ a1) @ a2)
        g = torch.sigmoid(xg @ g1) @ g2

        kk = torch.nn.functional.normalize((k * k_k).view(H, N), dim=-1, p=2.0).view(H*N)
        k = k * (1 + (a-1) * k_a)
        if layer_id == 0:
            v_first = v
        else:
            v = v + (v_first - v) * torch.sigmoid(v0 + (xv @ v1) @ v2)
        w = torch.exp(-0.606531 * torch.sigmoid((w0 + w).float()))  # 0.606531 = exp(-0.5)

        xx = _recurrence(state, r, w, k, v, -kk, kk*a, H, N)

        xx = torch.nn.functional.group_norm(xx.view(1, H*N), num_groups=H, weight=ln_w, bias=ln_b, eps=64e-5).view(H*N)
        xx = xx + ((r * k * r_k).view(H, N).sum(dim=-1, keepdim=True) * v.view(H, N)).view(H*N)
        return (xx * g) @ O_, x, state, v_first

    return {"RWKV_x070_TMix_seq": torch.jit.script(RWKV_x070_TMix_seq),
            "RWKV_x070_TMix_one": torch.jit.script(RWKV_x070_TMix_one)}


def _rwkv_model():
    import rwkv.model

    missing = [name for name in _SEAMS if not hasattr(rwkv.model, name)]
    if missing:
        raise RuntimeError(f"rwkv.model has no {', '.join(missing)}: set RWKV_V7_ON=1 before rwkv.model "
                           "is first imported (the package defines its RWKV-7 code only then)")
    return rwkv.model


def _recompile_new_models(module):
    """Make models built from now on compile their script methods afresh, binding the functions
    the module holds now: TorchScript otherwise reuses the methods it compiled for the first
    ``RWKV_x070`` instance for every later one."""
    torch.jit._recursive.concrete_type_store.type_store.pop(module.RWKV_x070, None)


def enable(*, force=False):
    """Route the x070 time-mix recurrence of models built from now on to ssmk (and of models built
    during an earlier :func:`enable`). Refuses an ``rwkv`` release not in :data:`TESTED_VERSIONS`
    unless ``force``: the replacements are copies of that release's functions."""
    global _routing
    with _lock:
        version = metadata.version("rwkv")
        if version not in TESTED_VERSIONS and not force:
            raise RuntimeError(f"rwkv {version} is not a tested release ({', '.join(TESTED_VERSIONS)}); "
                               "enable(force=True) routes it anyway")
        module = _rwkv_model()
        if not _originals:
            originals = {name: getattr(module, name) for name in _SEAMS}
            for name, replacement in _replacements(originals).items():
                setattr(module, name, replacement)
            _originals.update(originals)
            _recompile_new_models(module)
        _routing = True


def disable():
    """The package's own functions for every model from now on (models built while enabled call
    them through the replacements), and the module globals put back for models built later."""
    global _routing
    with _lock:
        _routing = False
        if _originals:
            module = _rwkv_model()
            for name, original in _originals.items():
                setattr(module, name, original)
            _originals.clear()
            _recompile_new_models(module)


@contextlib.contextmanager
def enabled(*, force=False):
    """``with enabled():`` routes like :func:`enable`; on exit, disables unless it was already on."""
    with _lock:
        was_on = _routing
        enable(force=force)
    try:
        yield
    finally:
        if not was_on:
            disable()
