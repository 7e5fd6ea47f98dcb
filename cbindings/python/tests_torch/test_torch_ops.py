"""Tests of ssmk.torch, the torch custom ops, against small torch references and the ctypes wrappers.

Run with a python that has torch and the installed package (tests/python_package.rs does):
    python -m unittest discover -s cbindings/python/tests_torch -v
From a source tree instead: SSMK_LIBRARY=target/release/libssmk.so PYTHONPATH=cbindings/python ...
"""

import math
import json
import os
import subprocess
import sys
import unittest

import torch

import ssmk
import ssmk.torch as st

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Per-dtype tolerance of an output rounded once to the dtype (plus f32 accumulation noise).
TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
       torch.float16: dict(rtol=2e-3, atol=2e-3)}


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen(seed)) * scale).to(dtype)


def close(test, got, want, dtype, msg=None, scale=1.0):
    tol = TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=tol["rtol"] * scale,
                               atol=tol["atol"] * scale, msg=msg)


# ---------------------------------------------------------------------------------------------
# References (float32 from the same rounded inputs)


def ref_conv_seq(x, w, bias, hist, silu):
    """x [T,D], w [D,W], hist [W-1,D] (oldest first) -> (out [T,D], new history [W-1,D])."""
    T, W = x.shape[0], w.shape[1]
    xin = torch.cat([hist.float(), x.float()])
    out = sum(w[:, k].float() * xin[k:k + T] for k in range(W))
    if bias is not None:
        out = out + bias.float()
    if silu:
        out = torch.nn.functional.silu(out)
    return out, xin[xin.shape[0] - (W - 1):]


def ref_delta_rule(q, k, v, g, beta, scale, S, l2norm, eps):
    """One sequence: q,k [T,H,K], v [T,HV,V], g [T,HV] or [T,HV,K], beta [T,HV], S [HV,K,V] f64."""
    T, H, K = q.shape
    HV = v.shape[1]
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + eps)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + eps)
    S = S.double().clone()
    outs = []
    for t in range(T):
        o = []
        for hv in range(HV):
            h = hv // (HV // H)
            a = torch.exp(g[t, hv])
            Sd = S[hv] * (a[:, None] if a.dim() else a)
            kt, qt = k[t, h], q[t, h]
            S[hv] = Sd + torch.outer(kt, beta[t, hv] * (v[t, hv] - Sd.T @ kt))
            o.append(scale * (S[hv].T @ qt))
        outs.append(torch.stack(o))
    return torch.stack(outs), S


def ref_dplr(r, w, k, v, a, b, S, w_linear):
    """One sequence of RWKV-7's rule: r, w, k, a, b [T,H,K], v [T,H,V], S [H,K,V] f64; ``w`` the
    log-decays, or the factors with ``w_linear``."""
    r, w, k, v, a, b = (t.double() for t in (r, w, k, v, a, b))
    S = S.double().clone()
    outs = []
    for t in range(r.shape[0]):
        o = []
        for h in range(r.shape[1]):
            d = w[t, h] if w_linear else torch.exp(w[t, h])
            sa = a[t, h] @ S[h]
            S[h] = d[:, None] * S[h] + torch.outer(b[t, h], sa) + torch.outer(k[t, h], v[t, h])
            o.append(S[h].T @ r[t, h])
        outs.append(torch.stack(o))
    return torch.stack(outs), S


def ref_mamba2(x, dt, A, B, C, D, z, dt_bias, h):
    """One sequence, softplus, no dt limit: x [T,NH,P], dt [T,NH], A [NH] or [NH,N] (per state
    channel), B/C [T,G,N], h [NH,P,N] f64."""
    T, NH, P = x.shape
    G = B.shape[1]
    x, dt, B, C, z = (t.double() for t in (x, dt, B, C, z))
    h = h.double().clone()
    out = torch.empty(T, NH, P, dtype=torch.float64)
    for t in range(T):
        d = torch.nn.functional.softplus(dt[t] + dt_bias.double())
        for hd in range(NH):
            gi = hd // (NH // G)
            h[hd] = torch.exp(d[hd] * A[hd].double()) * h[hd] + d[hd] * torch.outer(x[t, hd], B[t, gi])
            y = h[hd] @ C[t, gi] + D[hd].double() * x[t, hd]
            out[t, hd] = y * torch.nn.functional.silu(z[t, hd])
    return out, h


# ---------------------------------------------------------------------------------------------


class Package(unittest.TestCase):
    def test_ctypes_module_does_not_import_torch(self):
        code = "import sys, ssmk; assert 'torch' not in sys.modules, 'torch imported'; print(ssmk.version())"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), ssmk.version())

    def test_every_kernel_is_an_op(self):
        for name in ("causal_conv1d_fwd", "causal_conv1d_update", "gdn_gating", "kda_gating",
                     "gated_delta_rule", "dplr_delta_rule", "short_conv", "mamba2_scan", "zero_blocks",
                     "zero_blocks_multi", "batch_memcpy"):
            op = getattr(torch.ops.ssmk, name).default
            self.assertTrue(callable(getattr(st, name)), name)
            mutated = [a.name for a in op._schema.arguments if a.alias_info and a.alias_info.is_write]
            self.assertTrue(mutated, f"{name} declares no mutated argument")
            self.assertEqual(len(op._schema.returns), 0, name)
        schema = torch.ops.ssmk.gated_delta_rule.default._schema
        self.assertEqual([a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write],
                         ["state", "out"])

    def test_version(self):
        self.assertEqual(ssmk.__version__, ssmk.version())

    def test_descriptors_are_shared_only_by_identical_views(self):
        t = torch.zeros(4, 6, dtype=torch.bfloat16)
        d = st._d(t)
        self.assertIs(st._d(t), d)
        self.assertIs(st._d(t.view(4, 6)), d, "a view of the same memory and layout")
        self.assertEqual((d.shape, d.strides, d.dtype), ((4, 6), (6, 1), "torch.bfloat16"))
        for other in (t.t(), t[1:], t.view(6, 4), t.view(torch.float16), t[:, :3]):
            o = st._d(other)
            self.assertIsNot(o, d)
            self.assertEqual((o.shape, o.strides), (tuple(other.shape), other.stride()))
            self.assertEqual(o.struct.data, other.data_ptr())

    def test_eager_calls_without_autograd_skip_only_the_dispatch(self):
        """Under no_grad / inference_mode the convenient functions call the implementation
        directly (the dispatch costs more than a decode kernel); results, version counters and
        errors are those of the op, and anything that needs the dispatcher still gets it."""
        A_log, dt_bias = randn(4, seed=1), randn(4, seed=2)
        a, b = randn(3, 4, seed=3, dtype=torch.bfloat16), randn(3, 4, seed=4, dtype=torch.bfloat16)
        g_op, beta_op = torch.empty(3, 4), torch.empty(3, 4, dtype=torch.bfloat16)
        torch.ops.ssmk.gdn_gating(A_log, a, b, dt_bias, 1.0, 20.0, g_op, beta_op, 0)
        self.assertFalse(st._direct(), "grad mode dispatches")
        for mode in (torch.no_grad, torch.inference_mode):
            with mode():
                self.assertTrue(st._direct(), mode.__name__)
                g, beta = torch.empty(3, 4), torch.empty(3, 4, dtype=torch.bfloat16)
                versions = (g._version, beta._version) if mode is torch.no_grad else None
                st.gdn_gating(A_log, a, b, dt_bias, g=g, beta=beta)
                self.assertTrue(torch.equal(g, g_op) and torch.equal(beta, beta_op), mode.__name__)
                if versions is not None:
                    self.assertEqual((g._version, beta._version), (versions[0] + 1, versions[1] + 1))
                    self.assertEqual(A_log._version, 0, "an input's version is left alone")
                caches = [torch.ones(3, 2), torch.ones(3, 5)]
                before = [c._version for c in caches] if mode is torch.no_grad else None
                st.zero_blocks_multi(caches, torch.tensor([1]))
                self.assertEqual([c[1].abs().sum().item() for c in caches], [0.0, 0.0])
                if before is not None:
                    self.assertEqual([c._version for c in caches], [v + 1 for v in before])
                with self.assertRaises(ssmk.SsmkError):  # refusals raise the same error
                    st.gdn_gating(A_log, a, b, dt_bias[:3], g=g, beta=beta)

        from torch.utils._python_dispatch import TorchDispatchMode

        class Seen(TorchDispatchMode):
            ops = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                Seen.ops.append(str(func))
                return func(*args, **(kwargs or {}))

        with torch.no_grad(), Seen():
            self.assertFalse(st._direct(), "a dispatch mode sees every op")
            st.gdn_gating(A_log, a, b, dt_bias)
        self.assertIn("ssmk.gdn_gating.default", Seen.ops)


class Conv(unittest.TestCase):
    D, W, S = 24, 4, 3

    def test_fwd_varlen_with_states_matches_reference(self):
        D, W, S = self.D, self.W, self.S
        qsl = torch.tensor([0, 5, 5, 13], dtype=torch.int32)
        idx = torch.tensor([2, 0, 1], dtype=torch.int64)
        init = torch.tensor([True, False, True])
        for dtype in DTYPES:
            with self.subTest(dtype=dtype):
                x = randn(13, D, seed=1, dtype=dtype)
                w = randn(D, W, seed=2, dtype=dtype, scale=0.5)
                bias = randn(D, seed=3)  # f32 bias with a narrow activation: allowed
                states = randn(S, W - 1, D, seed=4, dtype=dtype)
                before = states.clone()
                out = st.causal_conv1d_fwd(x, w, bias, states, qsl, idx, init, activation="silu")
                self.assertEqual((out.shape, out.dtype), (x.shape, dtype))
                for b in range(3):
                    lo, hi, slot = int(qsl[b]), int(qsl[b + 1]), int(idx[b])
                    hist = before[slot] if init[b] else torch.zeros(W - 1, D, dtype=dtype)
                    want, new = ref_conv_seq(x[lo:hi], w, bias, hist, True)
                    close(self, out[lo:hi], want, dtype, f"sequence {b}")
                    torch.testing.assert_close(states[slot].float(), new, rtol=0, atol=0)

    def test_op_equals_ctypes_wrapper_bitwise(self):
        D, W = self.D, self.W
        x, w = randn(9, D, seed=5, dtype=torch.bfloat16), randn(D, W, seed=6, dtype=torch.bfloat16)
        s1, s2 = randn(1, W - 1, D, seed=7, dtype=torch.bfloat16), None
        s2 = s1.clone()
        o1, o2 = torch.empty_like(x), torch.empty_like(x)
        init = torch.tensor([1], dtype=torch.uint8)
        torch.ops.ssmk.causal_conv1d_fwd(x, w, None, s1, None, None, init, ssmk.ACTIVATION_SILU, -1, o1)
        ssmk.causal_conv1d_fwd(x, w, o2, conv_states=s2, has_initial_state=init,
                               activation=ssmk.ACTIVATION_SILU)
        self.assertTrue(torch.equal(o1, o2) and torch.equal(s1, s2))

    def test_non_contiguous_views_read_in_place(self):
        # x is the middle third of a projection; the weight is a transposed [W,D] tensor.
        D, W, T = self.D, self.W, 11
        for dtype in DTYPES:
            with self.subTest(dtype=dtype):
                proj = randn(T, 3 * D, seed=8, dtype=dtype)
                x = proj[:, D:2 * D]
                w = randn(W, D, seed=9, dtype=dtype).t()
                self.assertFalse(x.is_contiguous() or w.is_contiguous())
                got = st.causal_conv1d_fwd(x, w, activation=True)
                want = st.causal_conv1d_fwd(x.contiguous(), w.contiguous(), activation=True)
                self.assertTrue(torch.equal(got, want))
                # A strided output view too.
                buf = torch.zeros(T, 2 * D, dtype=dtype)
                st.causal_conv1d_fwd(x, w, activation=True, out=buf[:, :D])
                self.assertTrue(torch.equal(buf[:, :D], want) and not buf[:, D:].any())

    def test_update_decode_and_multi_token(self):
        D, W, S = self.D, self.W, self.S
        for dtype in DTYPES:
            for Q in (None, 3):
                with self.subTest(dtype=dtype, Q=Q):
                    shape = (2, D) if Q is None else (2, Q, D)
                    x = randn(*shape, seed=10, dtype=dtype)
                    w = randn(D, W, seed=11, dtype=dtype, scale=0.5)
                    states = randn(S, W - 1, D, seed=12, dtype=dtype)
                    before = states.clone()
                    idx = torch.tensor([2, 0], dtype=torch.int32)
                    out = st.causal_conv1d_update(x, states, w, conv_state_indices=idx, activation="silu")
                    self.assertEqual(out.shape, x.shape)
                    for b in range(2):
                        xb = x[b].reshape(-1, D)
                        want, new = ref_conv_seq(xb, w, None, before[int(idx[b])], True)
                        close(self, out[b].reshape(-1, D), want, dtype)
                        self.assertTrue(torch.equal(states[int(idx[b])].float(), new))
                    self.assertTrue(torch.equal(states[1], before[1]))

    def test_short_conv_is_the_composition_bitwise(self):
        D, W, T = self.D, 3, 10
        for dtype in DTYPES:
            with self.subTest(dtype=dtype):
                bcx = randn(T, 3 * D, seed=13, dtype=dtype)
                w = randn(D, W, seed=14, dtype=dtype, scale=0.5)
                states = randn(2, W - 1, D, seed=15, dtype=dtype)
                s2 = states.clone()
                qsl = torch.tensor([0, 4, 10], dtype=torch.int32)
                init = torch.tensor([True, False])
                out = st.short_conv(bcx, w, None, states, qsl, None, init)
                B, C, x = bcx[:, :D], bcx[:, D:2 * D], bcx[:, 2 * D:]
                y = st.causal_conv1d_fwd(B * x, w, None, s2, qsl, None, init)
                self.assertTrue(torch.equal(out, C * y))
                self.assertTrue(torch.equal(states, s2))


class Gating(unittest.TestCase):
    def test_gdn_gating(self):
        N, HV = 7, 6
        A_log, dt_bias = randn(HV, seed=20), randn(HV, seed=21)
        for dtype in DTYPES:
            with self.subTest(dtype=dtype):
                a, b = randn(N, HV, seed=22, dtype=dtype, scale=3), randn(N, HV, seed=23, dtype=dtype)
                g, beta = st.gdn_gating(A_log, a, b, dt_bias)
                self.assertEqual((g.dtype, beta.dtype), (torch.float32, dtype))
                want_g = -torch.exp(A_log) * torch.nn.functional.softplus(a.float() + dt_bias)
                torch.testing.assert_close(g, want_g, rtol=1e-5, atol=1e-6)
                close(self, beta, torch.sigmoid(b.float()), dtype)

    def test_kda_gating_both_forms(self):
        N, HV, K = 5, 2, 8
        A_log, dt_bias = randn(HV, seed=24), randn(HV, K, seed=25)
        for dtype in DTYPES:
            for lower in (0.0, -5.0):
                with self.subTest(dtype=dtype, lower=lower):
                    a, b = randn(N, HV, K, seed=26, dtype=dtype, scale=3), randn(N, HV, seed=27, dtype=dtype)
                    g, beta = st.kda_gating(A_log, a, dt_bias, lower, b)
                    xx = a.float() + dt_bias
                    e = torch.exp(A_log)[:, None]
                    want = (-e * torch.nn.functional.softplus(xx) if lower == 0
                            else lower * torch.sigmoid(e * xx))
                    torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-5)
                    close(self, beta, torch.sigmoid(b.float()), dtype)
        g, beta = st.kda_gating(A_log, a, dt_bias)
        self.assertIsNone(beta)


class DeltaRule(unittest.TestCase):
    H, HV, K, V, S = 2, 4, 16, 8, 3

    def proj_qkv(self, T, dtype, seed):
        """q, k, v as views of one projection [T, 2HK + HV V] (non-contiguous), as models slice them."""
        H, HV, K, V = self.H, self.HV, self.K, self.V
        proj = randn(T, 2 * H * K + HV * V, seed=seed, dtype=dtype)
        q = proj[:, :H * K].view(T, H, K)
        k = proj[:, H * K:2 * H * K].view(T, H, K)
        v = proj[:, 2 * H * K:].view(T, HV, V)
        return q, k, v

    def check(self, kda):
        H, HV, K, V, S = self.H, self.HV, self.K, self.V, self.S
        lens = [70, 3, 1]  # a chunked prefill (past one chunk), a short one and a decode
        cu = torch.tensor([0, 70, 73, 74], dtype=torch.int32)
        T = 74
        idx = torch.tensor([2, 0, 1], dtype=torch.int64)
        init = torch.tensor([True, False, True])
        for dtype in DTYPES:
            with self.subTest(dtype=dtype, kda=kda):
                q, k, v = self.proj_qkv(T, dtype, seed=30)
                self.assertFalse(q.is_contiguous())
                gshape = (T, HV, K) if kda else (T, HV)
                g = -torch.rand(*gshape, generator=gen(31)) * 0.5 - 0.01
                beta = torch.rand(T, HV, generator=gen(32)).to(dtype)
                state = randn(S, HV, K, V, seed=33, scale=0.1)
                before = state.clone()
                out = st.gated_delta_rule(q, k, v, g, beta, None, state, cu, idx, init, qk_l2norm=True)
                self.assertEqual((out.shape, out.dtype), ((T, HV, V), dtype))
                for b in range(3):
                    lo, hi, slot = int(cu[b]), int(cu[b + 1]), int(idx[b])
                    s0 = before[slot] if init[b] else torch.zeros(HV, K, V)
                    want, s1 = ref_delta_rule(q[lo:hi], k[lo:hi], v[lo:hi], g[lo:hi], beta[lo:hi],
                                              1 / math.sqrt(K), s0, True, 1e-6)
                    close(self, out[lo:hi], want, dtype, f"out of sequence {b}", scale=2)
                    torch.testing.assert_close(state[slot], s1.float(), rtol=1e-4, atol=1e-4)
                # The same call on contiguous copies agrees.
                s2 = before.clone()
                o2 = st.gated_delta_rule(q.contiguous(), k.contiguous(), v.contiguous(), g, beta, None,
                                         s2, cu, idx, init, qk_l2norm=True)
                close(self, out, o2, dtype)
                torch.testing.assert_close(state, s2, rtol=1e-5, atol=1e-6)

    def test_gdn_varlen_mixed_batch(self):
        self.check(kda=False)

    def test_kda_varlen_mixed_batch(self):
        self.check(kda=True)

    def test_narrow_state_and_explicit_out(self):
        H, HV, K, V = self.H, self.HV, self.K, self.V
        q, k, v = self.proj_qkv(5, torch.bfloat16, seed=34)
        g = torch.full((5, HV), -0.1)
        beta = torch.full((5, HV), 0.5, dtype=torch.bfloat16)
        state = torch.zeros(1, HV, K, V, dtype=torch.bfloat16)
        out = torch.empty(5, HV, V, dtype=torch.float32)  # f32 output of bf16 inputs
        ret = st.gated_delta_rule(q, k, v, g, beta, 0.5, state, out=out)
        self.assertIs(ret, out)
        want, s1 = ref_delta_rule(q, k, v, g, beta, 0.5, torch.zeros(HV, K, V), False, 0)
        torch.testing.assert_close(out, want.float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(state[0].float(), s1.float(), rtol=2e-2, atol=2e-2)


class Dplr(unittest.TestCase):
    H, K, V = 2, 16, 8

    def test_varlen_into_a_transposed_pool_then_decode(self):
        """A prefill (37 tokens, from its slot's state) and a fresh 3-token sequence into a pool
        held [slot][h][v][k] (rwkv's and ggml's layout, passed as its [S,H,K,V] view), then one
        decode token in the linear-decay form; against the f64 recurrence."""
        H, K, V = self.H, self.K, self.V
        cu = torch.tensor([0, 37, 40], dtype=torch.int32)
        idx = torch.tensor([2, 0], dtype=torch.int64)
        init = torch.tensor([True, False])
        for dtype in DTYPES:
            with self.subTest(dtype=dtype):
                T = 41
                r, k = randn(T, H, K, seed=50, dtype=dtype), randn(T, H, K, seed=51, dtype=dtype, scale=0.3)
                v = randn(T, H, V, seed=52, dtype=dtype)
                kk = torch.nn.functional.normalize(randn(T, H, K, seed=53), dim=-1)
                iclr = torch.rand(T, H, K, generator=gen(54))
                a, b = (-kk).to(dtype), (kk * iclr).to(dtype)
                w = -torch.rand(T, H, K, generator=gen(55)) * 0.6 - 0.01
                pool = randn(3, H, V, K, seed=56, scale=0.1)
                before = pool.clone()
                state = pool.transpose(2, 3)
                out = st.dplr_delta_rule(r[:40], w[:40], k[:40], v[:40], a[:40], b[:40], None, state, cu,
                                         idx, init)
                self.assertEqual((out.shape, out.dtype), ((40, H, V), dtype))
                for seq, (lo, hi) in enumerate(((0, 37), (37, 40))):
                    slot = int(idx[seq])
                    s0 = before[slot].transpose(1, 2) if init[seq] else torch.zeros(H, K, V)
                    want, s1 = ref_dplr(r[lo:hi], w[lo:hi], k[lo:hi], v[lo:hi], a[lo:hi], b[lo:hi], s0, False)
                    close(self, out[lo:hi], want, dtype, f"out of sequence {seq}", scale=2)
                    torch.testing.assert_close(state[slot], s1.float(), rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(pool[1], before[1], rtol=0, atol=0)  # no sequence's slot
                s1 = state[2].clone()
                o1 = st.dplr_delta_rule(r[40:], w[40:].exp(), k[40:], v[40:], a[40:], b[40:], None, state,
                                        state_indices=idx[:1], has_initial_state=init[:1], w_linear=True)
                want, s2 = ref_dplr(r[40:], w[40:], k[40:], v[40:], a[40:], b[40:], s1, False)
                close(self, o1, want, dtype, "decode", scale=2)
                torch.testing.assert_close(state[2], s2.float(), rtol=1e-5, atol=1e-5)

    def test_matches_flash_linear_attention_reference(self):
        """The cross-check of this file's oracle and of ssmk against another implementation:
        flash-linear-attention's own DPLR recurrence (fla-core's ``dplr/naive.py``, plain torch,
        loaded by path so that no Triton kernel is imported; tests/python_package.rs puts it on
        PYTHONPATH for this run), 2 sequences of 48 tokens from random states, RWKV-7's inputs,
        fla's fixed scale ``K ** -0.5``."""
        import importlib.util

        spec = importlib.util.find_spec("fla")
        if spec is None:
            self.skipTest("fla-core is not installed")
        path = os.path.join(os.path.dirname(spec.origin), "ops", "generalized_delta_rule", "dplr",
                            "naive.py")
        naive_spec = importlib.util.spec_from_file_location("fla_dplr_naive", path)
        naive = importlib.util.module_from_spec(naive_spec)
        naive_spec.loader.exec_module(naive)
        B, T, H, K, V = 2, 48, self.H, 32, 24
        r, k, v = randn(B, T, H, K, seed=60), randn(B, T, H, K, seed=61, scale=0.3), randn(B, T, H, V, seed=62)
        kk = torch.nn.functional.normalize(randn(B, T, H, K, seed=63), dim=-1)
        a, b = -kk, kk * torch.rand(B, T, H, K, generator=gen(64))
        w = -torch.rand(B, T, H, K, generator=gen(65)) * 0.6 - 0.01
        s0 = randn(B, H, K, V, seed=66, scale=0.1)
        heads_first = [x.transpose(1, 2) for x in (r, k, v, a, b, w)]
        fla_out, fla_state = naive.dplr_recurrence(*heads_first[:3], heads_first[3], heads_first[4],
                                                   heads_first[5], initial_state=s0.clone())
        fla_out = fla_out.transpose(1, 2)
        scale = K ** -0.5
        state = s0.clone()
        flat = [x.reshape(B * T, H, -1) for x in (r, w, k, v, a, b)]
        cu = torch.tensor([0, T, 2 * T], dtype=torch.int32)
        out = st.dplr_delta_rule(flat[0], flat[1], flat[2], flat[3], flat[4], flat[5], scale, state, cu,
                                 torch.arange(B), torch.ones(B, dtype=torch.bool))
        torch.testing.assert_close(out.reshape(B, T, H, V), fla_out, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(state, fla_state, rtol=1e-4, atol=1e-4)
        for seq in range(B):
            want, s1 = ref_dplr(r[seq] * scale, w[seq], k[seq], v[seq], a[seq], b[seq], s0[seq], False)
            torch.testing.assert_close(want.float(), fla_out[seq], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(s1.float(), fla_state[seq], rtol=1e-4, atol=1e-4)


class Mamba2(unittest.TestCase):
    NH, P, G, N = 4, 8, 2, 16

    def test_prefill_then_decode(self):
        NH, P, G, N = self.NH, self.P, self.G, self.N
        A = -torch.exp(torch.linspace(0, 2, NH))
        D, dt_bias = randn(NH, seed=40), torch.full((NH,), -3.0)
        for dtype in DTYPES:
            with self.subTest(dtype=dtype):
                T = 70
                # x and z views of one projection [T, 2 NH P].
                xz = randn(T + 1, 2 * NH * P, seed=41, dtype=dtype)
                x, z = xz[:, :NH * P].view(T + 1, NH, P), xz[:, NH * P:].view(T + 1, NH, P)
                dt = randn(T + 1, NH, seed=42, dtype=dtype)
                B, C = randn(T + 1, G, N, seed=43, dtype=dtype), randn(T + 1, G, N, seed=44, dtype=dtype)
                state = randn(2, NH, P, N, seed=45, scale=0.5)
                h0 = state[1].clone()
                init = torch.tensor([True])
                idx = torch.tensor([1], dtype=torch.int32)
                out = st.mamba2_scan(x[:T], dt[:T], A, B[:T], C[:T], D, z[:T], dt_bias, dt_softplus=True,
                                     state=state, state_indices=idx, has_initial_state=init)
                want, h1 = ref_mamba2(x[:T], dt[:T], A, B[:T], C[:T], D, z[:T], dt_bias, h0)
                close(self, out, want, dtype, "prefill", scale=4)
                torch.testing.assert_close(state[1], h1.float(), rtol=2e-4, atol=2e-4)
                # One decode token from the carried state.
                h1 = state[1].clone()
                o1 = st.mamba2_scan(x[T:], dt[T:], A, B[T:], C[T:], D, z[T:], dt_bias, dt_softplus=True,
                                    state=state, state_indices=idx, has_initial_state=init)
                want, h2 = ref_mamba2(x[T:], dt[T:], A, B[T:], C[T:], D, z[T:], dt_bias, h1)
                close(self, o1, want, dtype, "decode", scale=4)
                torch.testing.assert_close(state[1], h2.float(), rtol=1e-5, atol=1e-5)


    def test_mamba1_per_channel_A(self):
        """A [D, N] (Mamba-1: D channels = D heads of P = 1 sharing one group of B/C) in the two
        layouts runtimes hold: token-major [T, D] and channel-major [D, T] (vLLM's) views, x and z
        sliced out of one projection; prefill then one decode step against the f64 recurrence."""
        Dm, N, T = 24, 16, 70
        A = -torch.arange(1, N + 1, dtype=torch.float32) * (1 + 0.5 * torch.rand(Dm, N, generator=gen(50)))
        D, dt_bias = randn(Dm, seed=51), torch.full((Dm,), -3.0) + randn(Dm, seed=52, scale=0.5)
        for dtype in DTYPES:
            for layout in ("token-major", "channel-major"):
                with self.subTest(dtype=dtype, layout=layout):
                    xz, dt = randn(2 * Dm, T + 1, seed=53, dtype=dtype), randn(Dm, T + 1, seed=54, dtype=dtype)
                    if layout == "token-major":
                        xz, dt = xz.t().contiguous(), dt.t().contiguous()
                        x, z = xz[:, :Dm], xz[:, Dm:]
                        out = torch.empty(T + 1, Dm, dtype=dtype)
                    else:  # [D, T] memory, tokens contiguous, seen as [T, D]
                        x, z, dt = xz[:Dm].t(), xz[Dm:].t(), dt.t()
                        out = torch.empty(Dm, T + 1, dtype=dtype).t()
                    x, z, out = x.unsqueeze(-1), z.unsqueeze(-1), out.unsqueeze(-1)  # [T, D, P = 1]
                    B, C = randn(T + 1, 1, N, seed=55, dtype=dtype), randn(T + 1, 1, N, seed=56, dtype=dtype)
                    state = randn(2, Dm, 1, N, seed=57, scale=0.5)
                    h0 = state[1].clone()
                    idx, init = torch.tensor([1], dtype=torch.int32), torch.tensor([True])
                    ret = st.mamba2_scan(x[:T], dt[:T], A, B[:T], C[:T], D, z[:T], dt_bias, dt_softplus=True,
                                         state=state, state_indices=idx, has_initial_state=init, out=out[:T])
                    self.assertEqual(ret.stride(), out.stride())
                    want, h1 = ref_mamba2(x[:T], dt[:T], A, B[:T], C[:T], D, z[:T], dt_bias, h0)
                    close(self, out[:T], want, dtype, "prefill", scale=4)
                    torch.testing.assert_close(state[1], h1.float(), rtol=2e-4, atol=2e-4)
                    h1 = state[1].clone()
                    st.mamba2_scan(x[T:], dt[T:], A, B[T:], C[T:], D, z[T:], dt_bias, dt_softplus=True, state=state,
                                   state_indices=idx, has_initial_state=init, out=out[T:])
                    want, h2 = ref_mamba2(x[T:], dt[T:], A, B[T:], C[T:], D, z[T:], dt_bias, h1)
                    close(self, out[T:], want, dtype, "decode", scale=4)
                    torch.testing.assert_close(state[1], h2.float(), rtol=1e-5, atol=1e-5)

    def test_bad_A_is_refused_and_writes_nothing(self):
        Dm, N, T = 8, 16, 3
        x, z, dt = randn(T, Dm, 1, seed=60), randn(T, Dm, 1, seed=61), randn(T, Dm, seed=62)
        B, C = randn(T, 1, N, seed=63), randn(T, 1, N, seed=64)
        for A, what in ((-torch.ones(Dm, N + 1), "A"), (-torch.ones(Dm, 1, N), "A.ndim"),
                        (-torch.ones(Dm, N, dtype=torch.float64), "A.dtype")):
            with self.subTest(shape=tuple(A.shape), dtype=A.dtype):
                state, out = torch.full((1, Dm, 1, N), 0.25), torch.full((T, Dm, 1), 7.0)
                with self.assertRaises(ssmk.SsmkError) as cm:
                    st.mamba2_scan(x, dt, A, B, C, z=z, dt_softplus=True, state=state, out=out)
                self.assertIn(what, cm.exception.message)
                self.assertTrue(torch.equal(state, torch.full((1, Dm, 1, N), 0.25)))
                self.assertTrue(torch.equal(out, torch.full((T, Dm, 1), 7.0)))

class Checkpoints(unittest.TestCase):
    """ABI.md §4.10 through the ops: the state after chosen tokens of a prefill goes to other slots."""

    def test_mamba2_and_delta_rule_checkpoints_equal_shorter_calls(self):
        T, NH, P, G, N = 150, 2, 8, 1, 16
        x, dt = randn(T, NH, P, seed=60), randn(T, NH, seed=61)
        B, C = randn(T, G, N, seed=62), randn(T, G, N, seed=63)
        A = -torch.exp(torch.linspace(0, 1, NH))
        offsets = torch.tensor([[16, 64, 100, 150]], dtype=torch.int64)
        slots = torch.tensor([[1, 2, 3, -1]], dtype=torch.int32)  # the pad entry is ignored
        state = torch.zeros(5, NH, P, N)
        plain = torch.zeros(5, NH, P, N)
        out = st.mamba2_scan(x, dt, A, B, C, dt_softplus=True, state=state,
                             checkpoint_offsets=offsets, checkpoint_slots=slots)
        out0 = st.mamba2_scan(x, dt, A, B, C, dt_softplus=True, state=plain)
        self.assertTrue(torch.equal(out, out0) and torch.equal(state[0], plain[0]))
        for o, slot in [(16, 1), (64, 2), (100, 3)]:
            alone = torch.zeros(1, NH, P, N)
            st.mamba2_scan(x[:o], dt[:o], A, B[:o], C[:o], dt_softplus=True, state=alone)
            torch.testing.assert_close(state[slot], alone[0], rtol=1e-4, atol=1e-4)
        self.assertTrue(torch.equal(state[4], plain[4]))
        H, HV, K, V = 1, 2, 16, 8
        q, k, v = randn(T, H, K, seed=64), randn(T, H, K, seed=65), randn(T, HV, V, seed=66)
        g = -torch.rand(T, HV, generator=gen(67)) * 0.3
        beta = torch.rand(T, HV, generator=gen(68))
        pool = torch.zeros(5, HV, K, V)
        torch.ops.ssmk.gated_delta_rule(q, k, v, g, beta, 0.0, pool, None, None, None, None, 1, 1e-6, -1,
                                        torch.empty(T, HV, V), 0, offsets, slots)
        for o, slot in [(16, 1), (64, 2), (100, 3)]:
            alone = torch.zeros(1, HV, K, V)
            st.gated_delta_rule(q[:o], k[:o], v[:o], g[:o], beta[:o], state=alone, qk_l2norm=True)
            torch.testing.assert_close(pool[slot], alone[0], rtol=1e-4, atol=1e-4)

    def test_conv_checkpoint_is_bit_exact_and_refusals_name_it(self):
        D, W, T = 8, 4, 40
        x, w = randn(T, D, seed=69), randn(D, W, seed=70)
        states = torch.zeros(3, W - 1, D)
        st.causal_conv1d_fwd(x, w, conv_states=states, activation="silu",
                             checkpoint_offsets=torch.tensor([[33]]), checkpoint_slots=torch.tensor([[2]]))
        alone = torch.zeros(1, W - 1, D)
        st.causal_conv1d_fwd(x[:33], w, conv_states=alone, activation="silu")
        self.assertTrue(torch.equal(states[2], alone[0]))
        with self.assertRaisesRegex(ssmk.SsmkError, "checkpoint_slots is NULL"):
            st.causal_conv1d_fwd(x, w, conv_states=states, checkpoint_offsets=torch.tensor([[3]]))
        torch.library.opcheck(torch.ops.ssmk.causal_conv1d_fwd.default,
                              (x, w, None, states, None, None, None, 1, -1, torch.empty(T, D), 0,
                               torch.tensor([[5]]), torch.tensor([[1]])))


class Memory(unittest.TestCase):
    def test_zero_blocks_on_a_strided_view(self):
        kv = torch.ones(5, 2, 4, 3, dtype=torch.bfloat16)
        v = kv[:, 1]  # V half of every block
        st.zero_blocks(v, torch.tensor([3, 0, 3]))
        for blk in range(5):
            self.assertTrue(bool((kv[blk, 0] == 1).all()))
            self.assertEqual(bool((kv[blk, 1] == 0).all()), blk in (0, 3))

    def test_zero_blocks_multi_and_batch_memcpy(self):
        a, b = torch.ones(4, 6), torch.ones(4, 2, 2, dtype=torch.float16)
        st.zero_blocks_multi([a, b], torch.tensor([1, 2], dtype=torch.int32))
        self.assertEqual(a.sum().item(), 12)
        self.assertEqual(b.sum().item(), 8)
        src = [torch.arange(10, dtype=torch.float32), torch.arange(6, dtype=torch.int64)]
        dst = [torch.zeros(10), torch.zeros(3, 2, dtype=torch.int64)]
        st.batch_memcpy(dst, src)
        self.assertTrue(torch.equal(dst[0], src[0]) and torch.equal(dst[1].flatten(), src[1]))
        with self.assertRaises(ssmk.SsmkError) as cm:
            st.batch_memcpy([torch.zeros(3)], [torch.zeros(4)])
        self.assertIn("src[0]", str(cm.exception))


class Errors(unittest.TestCase):
    def test_refusal_names_function_and_argument_and_writes_nothing(self):
        D, W = 16, 4
        x = randn(6, D, seed=50)
        states = randn(2, W - 1, D, seed=51)
        out = torch.full((6, D), 7.0)
        before = states.clone()
        cases = [
            (dict(weight=randn(8, W)), ssmk.ERR_INVALID_ARGUMENT, "weight.shape[0] = 8"),
            (dict(cache_indices=torch.tensor([2])), ssmk.ERR_OUT_OF_BOUNDS, "cache_indices[0] = 2"),
            (dict(x=x.double()), ssmk.ERR_UNSUPPORTED_DTYPE, "x.dtype"),
        ]
        for kw, status, text in cases:
            with self.subTest(text=text):
                args = dict(x=x, weight=randn(D, W), conv_states=states)
                args.update(kw)
                with self.assertRaises(ssmk.SsmkError) as cm:
                    st.causal_conv1d_fwd(args.pop("x"), args.pop("weight"), out=out, **args)
                e = cm.exception
                self.assertIsInstance(e, RuntimeError)
                self.assertEqual(e.status, status)
                self.assertIn("ssmk_causal_conv1d_fwd", str(e))
                self.assertIn(text, str(e))
                self.assertTrue(torch.equal(states, before) and bool((out == 7).all()))

    def test_delta_rule_refusal(self):
        q = k = torch.zeros(3, 1, 4)
        v = torch.zeros(3, 1, 2)
        state = torch.zeros(2, 1, 4, 2)
        with self.assertRaises(ssmk.SsmkError) as cm:
            st.gated_delta_rule(q, k, v, torch.zeros(3, 1), torch.zeros(3, 1), None, state,
                                state_indices=torch.tensor([5]))
        self.assertIn("state_indices", cm.exception.message)
        with self.assertRaises(ssmk.SsmkError) as cm:  # wrong state head dim
            st.gated_delta_rule(q, k, v, torch.zeros(3, 1), torch.zeros(3, 1), None,
                                torch.zeros(2, 1, 4, 3))
        self.assertIn("state", cm.exception.message)


class Threads(unittest.TestCase):
    def tearDown(self):
        st.set_num_threads(None)

    def test_follows_torch_unless_told(self):
        saved = torch.get_num_threads()
        try:
            for n in (1, 2):
                torch.set_num_threads(n)
                self.assertEqual(st.get_num_threads(), n)
                self.assertEqual(st._context(0).num_threads, n)
            st.set_num_threads(3)
            self.assertEqual(st._context(0).num_threads, 3)
            self.assertEqual(st._context(1).num_threads, 1)
            st.set_num_threads(None)
            self.assertEqual(st.get_num_threads(), torch.get_num_threads())
        finally:
            torch.set_num_threads(saved)
        with self.assertRaises(ValueError):
            st.set_num_threads(0)

    def test_results_do_not_depend_on_threads(self):
        q, k, v = (randn(80, 2, 16, seed=s) for s in (60, 61, 62))
        g, beta = -torch.rand(80, 2, generator=gen(63)), torch.rand(80, 2, generator=gen(64))
        cu = torch.tensor([0, 40, 79, 80], dtype=torch.int32)
        outs, states = [], []
        for n in (1, 2):
            state = torch.zeros(3, 2, 16, 16)
            outs.append(st.gated_delta_rule(q, k, v, g, beta, None, state, cu, num_threads=n))
            states.append(state)
        self.assertTrue(torch.equal(outs[0], outs[1]) and torch.equal(states[0], states[1]))

    def test_openmp_pool_runs_on_torchs_threads_with_the_same_bits(self):
        # SSMK_POOL is read when a context is created: each setting in a fresh process. A decode
        # batch moving 32 MiB spreads; on OpenMP it starts no thread beyond torch's worker.
        code = """if True:
            import json, os, torch, ssmk.torch as st
            torch.set_num_threads(2)
            torch.mm(torch.randn(512, 512), torch.randn(512, 512))  # starts torch's worker
            before = len(os.listdir("/proc/self/task"))
            g = torch.Generator().manual_seed(5)
            equal = True
            # 256 tasks, and 111 (each member's run ends apart; the others take what is left).
            for b, h, hv in ((64, 2, 4), (37, 1, 3)):
                q, k = (torch.randn(b, h, 128, generator=g) for _ in range(2))
                v = torch.randn(b, hv, 128, generator=g)
                gate, beta = -torch.rand(b, hv, generator=g), torch.rand(b, hv, generator=g)
                cu = torch.arange(b + 1, dtype=torch.int32)
                init = torch.ones(b, dtype=torch.bool)
                start = torch.randn(b, hv, 128, 128, generator=g) * 0.1
                runs = []
                for n in (1, 2, 2):
                    state = start.clone()
                    out = st.gated_delta_rule(q, k, v, gate, beta, None, state, cu,
                                              has_initial_state=init, num_threads=n)
                    runs.append((out, state))
                equal &= all(torch.equal(x, y) for run in runs[1:] for x, y in zip(runs[0], run))
            print(json.dumps({"equal": equal,
                              "new_threads": len(os.listdir("/proc/self/task")) - before}))
        """
        for pool, new_threads in (("openmp", 0), ("ssmk", 1)):
            env = dict(os.environ, SSMK_POOL=pool)
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            self.assertTrue(got["equal"], pool)
            self.assertEqual(got["new_threads"], new_threads, pool)

def hybrid_layer(proj, conv_w, conv_states, A_log, a, b, dt_bias, state, init, H, K, V):
    """Conv over a qkv projection, then GDN gates and the delta rule on views of the conv output."""
    T = proj.shape[0]
    HV = a.shape[1]
    mixed = st.causal_conv1d_fwd(proj, conv_w, None, conv_states, has_initial_state=init,
                                 activation="silu")
    q = mixed[:, :H * K].view(T, H, K)
    k = mixed[:, H * K:2 * H * K].view(T, H, K)
    v = mixed[:, 2 * H * K:].view(T, HV, V)
    g, beta = st.gdn_gating(A_log, a, b, dt_bias)
    return st.gated_delta_rule(q, k, v, g, beta, None, state, has_initial_state=init, qk_l2norm=True)


class Compile(unittest.TestCase):
    H, HV, K, V, W = 2, 4, 16, 8, 4

    def inputs(self, T, dtype):
        H, HV, K, V, W = self.H, self.HV, self.K, self.V, self.W
        C = 2 * H * K + HV * V
        return dict(proj=randn(T, C, seed=70, dtype=dtype), conv_w=randn(C, W, seed=71, dtype=dtype, scale=0.5),
                    conv_states=randn(1, W - 1, C, seed=72, dtype=dtype), A_log=randn(HV, seed=73),
                    a=randn(T, HV, seed=74, dtype=dtype), b=randn(T, HV, seed=75, dtype=dtype),
                    dt_bias=randn(HV, seed=76), state=randn(1, HV, K, V, seed=77, scale=0.1),
                    init=torch.tensor([True]), H=H, K=K, V=V)

    def test_fullgraph_compile_matches_eager(self):
        torch._dynamo.reset()
        compiled = torch.compile(hybrid_layer, fullgraph=True, dynamic=False)
        for dtype in (torch.bfloat16, torch.float32):
            with self.subTest(dtype=dtype):
                e_in, c_in = self.inputs(20, dtype), self.inputs(20, dtype)
                want = hybrid_layer(**e_in)
                got = compiled(**c_in)
                close(self, got, want, dtype)
                # The in-place state updates survive compilation.
                for name in ("conv_states", "state"):
                    self.assertFalse(torch.equal(c_in[name], self.inputs(20, dtype)[name]), name)
                    torch.testing.assert_close(c_in[name], e_in[name], rtol=1e-5, atol=1e-5)

    def test_dynamic_shapes_and_errors_in_compiled_code(self):
        torch._dynamo.reset()
        compiled = torch.compile(hybrid_layer, fullgraph=True, dynamic=True)
        for T in (20, 33, 1):
            e_in, c_in = self.inputs(T, torch.float32), self.inputs(T, torch.float32)
            close(self, compiled(**c_in), hybrid_layer(**e_in), torch.float32, f"T = {T}")
        conv = torch.compile(lambda x, w: st.causal_conv1d_fwd(x, w), fullgraph=True)
        with self.assertRaises(ssmk.SsmkError) as cm:
            conv(randn(5, 16), randn(8, 4))
        self.assertIn("weight.shape[0] = 8", str(cm.exception))

    def test_opcheck(self):
        D, W = 8, 3
        x, w = randn(5, D, seed=80), randn(D, W, seed=81)
        states = randn(2, W - 1, D, seed=82)
        torch.library.opcheck(torch.ops.ssmk.causal_conv1d_fwd.default,
                              (x, w, None, states, None, torch.tensor([1]), torch.tensor([True]),
                               1, -1, torch.empty(5, D)))
        q = k = randn(6, 1, 4, seed=83)
        v = randn(6, 2, 3, seed=84)
        torch.library.opcheck(torch.ops.ssmk.gated_delta_rule.default,
                              (q, k, v, -torch.rand(6, 2, generator=gen(85)), torch.rand(6, 2, generator=gen(86)),
                               0.0, torch.zeros(1, 2, 4, 3), None, None, None, None, 1, 1e-6, -1,
                               torch.empty(6, 2, 3)))
        torch.library.opcheck(torch.ops.ssmk.gdn_gating.default,
                              (randn(3), randn(4, 3), randn(4, 3), randn(3), 1.0, 20.0,
                               torch.empty(4, 3), torch.empty(4, 3)))


if __name__ == "__main__":
    print(f"ssmk {ssmk.version()} ({ssmk.active_isa()}) from {ssmk.library_path}; torch {torch.__version__}",
          file=sys.stderr)
    unittest.main(verbosity=2)
