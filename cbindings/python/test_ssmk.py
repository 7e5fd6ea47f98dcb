"""Tests of the ctypes binding; standard library only (numpy paths run when numpy is installed).

Run: SSMK_LIBRARY=/path/to/libssmk.so python3 cbindings/python/test_ssmk.py
"""

import array
import ctypes
import math
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ssmk  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import numpy
except ImportError:
    numpy = None


def header_text():
    with open(os.path.join(ROOT, "include", "ssmk.h")) as f:
        return f.read()


class FakeTorchTensor:
    """Duck-typed like a torch tensor: what the binding reads from one."""

    class _Device:
        type = "cpu"

    def __init__(self, storage, shape, stride, dtype):
        self.storage, self.shape, self._stride, self.dtype = storage, shape, stride, dtype
        self.device = self._Device()

    def data_ptr(self):
        return ctypes.addressof((ctypes.c_char * len(memoryview(self.storage).cast("B"))).from_buffer(self.storage))

    def stride(self):
        return self._stride


class Surface(unittest.TestCase):
    def test_every_header_function_has_a_signature(self):
        declared = set(re.findall(r"\b(ssmk_\w+)\(", "\n".join(
            l for l in header_text().splitlines() if not l.lstrip().startswith("*"))))
        missing = declared - set(ssmk.SIGNATURES)
        self.assertFalse(missing, f"functions without argtypes: {sorted(missing)}")
        for name in declared:
            fn = getattr(ssmk.lib, name)
            self.assertIsNotNone(fn.argtypes, name)

    def test_version_and_status_strings(self):
        macros = dict(re.findall(r"#define SSMK_VERSION_(MAJOR|MINOR|PATCH) (\d+)", header_text()))
        self.assertEqual(ssmk.version(), f"{macros['MAJOR']}.{macros['MINOR']}.{macros['PATCH']}")
        self.assertIn(ssmk.active_isa(), ("scalar", "avx2", "avx512", "avx512_bf16", "neon"))
        for code in (ssmk.OK, ssmk.ERR_NULL_POINTER, ssmk.ERR_OUT_OF_BOUNDS, ssmk.ERR_PANIC):
            self.assertTrue(ssmk.status_str(code).startswith("SSMK_"))
        self.assertEqual(ssmk.status_str(7), "unknown ssmk status")

    def test_context(self):
        with ssmk.Context(2) as ctx:
            self.assertEqual(ctx.num_threads, 2)
        self.assertIsNone(ctx.handle)


    def test_context_left_open_at_exit_closes_quietly(self):
        # A context still open when the interpreter exits is destroyed by `__del__` after the
        # module's globals are cleared; that must not print an ignored exception.
        import subprocess

        # Teardown clears the module's globals (`lib` among them) before such a context goes,
        # in an order that depends on the other modules loaded: clear it by hand.
        code = "import ssmk\nkeep = ssmk.Context(2)\nssmk.lib = None\ndel keep\n"
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(__file__))))
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertEqual(run.stderr, "")


class Memory(unittest.TestCase):
    def test_batch_memcpy_overlapping_equals_memmove(self):
        pool = bytearray(range(256)) * 64
        want = bytearray(pool)
        base = ctypes.addressof((ctypes.c_char * len(pool)).from_buffer(pool))
        entries = [(100, 0, 3000), (0, 50, 500), (9000, 9100, 4000)]
        for d, s, n in entries:
            want[d:d + n] = want[s:s + n]
        with ssmk.Context(2) as ctx:
            ssmk.batch_memcpy([base + e[0] for e in entries], [base + e[1] for e in entries],
                              [e[2] for e in entries], ctx=ctx)
        self.assertEqual(pool, want)
        ssmk.batch_memcpy([], [], [])

    def test_batch_memcpy_null_is_refused(self):
        buf = bytearray(8)
        base = ctypes.addressof((ctypes.c_char * 8).from_buffer(buf))
        with self.assertRaises(ssmk.SsmkError) as cm:
            ssmk.batch_memcpy([base, None], [base + 4, base], [4, 2])
        self.assertEqual(cm.exception.status, ssmk.ERR_NULL_POINTER)
        self.assertIn("dst[1]", cm.exception.message)
        self.assertEqual(buf, bytearray(8))

    def test_zero_blocks_with_array_array(self):
        cache = array.array("f", [1.0] * 32)
        ids = array.array("q", [3, 1, 3])
        ssmk.zero_blocks(ssmk.tensor(cache, shape=(4, 8)), ids)
        self.assertEqual(list(cache), [0.0 if b in (1, 3) else 1.0 for b in range(4) for _ in range(8)])

    def test_zero_blocks_error_names_argument_and_writes_nothing(self):
        cache = array.array("f", [1.0] * 32)
        with self.assertRaises(ssmk.SsmkError) as cm:
            ssmk.zero_blocks(ssmk.tensor(cache, shape=(4, 8)), array.array("i", [0, 4]))
        self.assertEqual(cm.exception.status, ssmk.ERR_OUT_OF_BOUNDS)
        self.assertIn("block_ids[1] = 4", cm.exception.message)
        self.assertEqual(list(cache), [1.0] * 32)

    def test_bf16_memoryview_and_strided_views(self):
        # K and V interleaved in one bf16 buffer [blocks=3, 2, 4]; zero block 2 of V only.
        raw = array.array("H", [ssmk.bf16_bits(1.5)] * 24)
        v = ssmk.tensor(memoryview(raw), dtype="bfloat16", shape=(3, 4), strides=(8, 1), byte_offset=8)
        ssmk.zero_blocks_multi([v], array.array("i", [2]))
        got = [ssmk.bf16_value(b) for b in raw]
        want = [0.0 if (i // 8 == 2 and (i % 8) >= 4) else 1.5 for i in range(24)]
        self.assertEqual(got, want)

    def test_read_only_buffer_is_refused(self):
        with self.assertRaises(ValueError):
            ssmk.tensor(b"\x00" * 8, dtype="uint8")

    def test_torch_like_objects(self):
        storage = array.array("f", [2.0] * 12)
        t = FakeTorchTensor(storage, (3, 4), (4, 1), "torch.float32")
        ssmk.zero_blocks(t, FakeTorchTensor(array.array("q", [1]), (1,), (1,), "torch.int64"))
        self.assertEqual(list(storage), [2.0] * 4 + [0.0] * 4 + [2.0] * 4)

    @unittest.skipIf(numpy is None, "numpy not installed")
    def test_numpy_arrays(self):
        cache = numpy.ones((5, 3, 4), dtype=numpy.float16)
        ssmk.zero_blocks(cache, numpy.array([4, 0], dtype=numpy.int32))
        self.assertTrue((cache[[0, 4]] == 0).all() and (cache[1:4] == 1).all())
        # A non-contiguous numpy view (every other block) is described through its strides.
        view = cache[::2]
        cache[:] = 1
        ssmk.zero_blocks(view, numpy.array([1], dtype=numpy.int64))
        self.assertTrue((cache[2] == 0).all() and (cache[[0, 1, 3, 4]] == 1).all())
        bits = numpy.full((2, 8), ssmk.bf16_bits(3.0), dtype=numpy.uint16)
        ssmk.zero_blocks(ssmk.tensor(bits, dtype="bfloat16"), numpy.array([1]))
        self.assertTrue((bits[1] == 0).all() and (bits[0] == ssmk.bf16_bits(3.0)).all())


def silu(v):
    return v / (1.0 + math.exp(-v))


class Conv(unittest.TestCase):
    T, D, W = 7, 12, 4

    def inputs(self):
        T, D, W = self.T, self.D, self.W
        x = array.array("f", [math.sin(0.3 * i) for i in range(T * D)])
        w = array.array("f", [math.cos(0.2 * i) * 0.5 for i in range(D * W)])
        states = array.array("f", [math.sin(0.1 * i) for i in range(2 * (W - 1) * D)])
        return x, w, states

    def test_fwd_matches_python_reference_and_updates_state(self):
        T, D, W = self.T, self.D, self.W
        x, w, states = self.inputs()
        initial = list(states)
        out = array.array("f", [0.0] * (T * D))
        ssmk.causal_conv1d_fwd(
            ssmk.tensor(x, shape=(T, D)), ssmk.tensor(w, shape=(D, W)), ssmk.tensor(out, shape=(T, D)),
            conv_states=ssmk.tensor(states, shape=(2, W - 1, D)),
            cache_indices=array.array("q", [1]), has_initial_state=array.array("B", [1]),
            activation=ssmk.ACTIVATION_SILU, ctx=ssmk.Context(2))
        hist = lambda rel, c: x[rel * D + c] if rel >= 0 else initial[((1 * (W - 1)) + (W - 1 + rel)) * D + c]
        for t in range(T):
            for c in range(D):
                acc = sum(w[c * W + k] * hist(t + k - (W - 1), c) for k in range(W))
                self.assertAlmostEqual(out[t * D + c], silu(acc), delta=1e-5 * (1 + abs(acc)))
        for j in range(W - 1):
            for c in range(D):
                self.assertEqual(states[((W - 1) + j) * D + c], x[(T - (W - 1) + j) * D + c])
        self.assertEqual(list(states[: (W - 1) * D]), initial[: (W - 1) * D], "slot 0 untouched")

    def test_fwd_error_names_argument_and_writes_nothing(self):
        T, D, W = self.T, self.D, self.W
        x, w, states = self.inputs()
        out = array.array("f", [5.0] * (T * D))
        before = list(states)
        with self.assertRaises(ssmk.SsmkError) as cm:
            ssmk.causal_conv1d_fwd(
                ssmk.tensor(x, shape=(T, D)), ssmk.tensor(w, shape=(D, W)), ssmk.tensor(out, shape=(T, D)),
                conv_states=ssmk.tensor(states, shape=(2, W - 1, D)), cache_indices=array.array("q", [2]))
        self.assertEqual(cm.exception.status, ssmk.ERR_OUT_OF_BOUNDS)
        self.assertIn("cache_indices[0] = 2", cm.exception.message)
        self.assertEqual(list(states), before)
        self.assertEqual(list(out), [5.0] * (T * D))

    def test_update_and_short_conv(self):
        D, W = self.D, 3
        x = array.array("f", [math.cos(0.4 * i) for i in range(2 * D)])
        w = array.array("f", [math.sin(0.6 * i) for i in range(D * W)])
        states = array.array("f", [0.25] * (2 * (W - 1) * D))
        out = array.array("f", [0.0] * (2 * D))
        ssmk.causal_conv1d_update(ssmk.tensor(x, shape=(2, D)), ssmk.tensor(states, shape=(2, W - 1, D)),
                                  ssmk.tensor(w, shape=(D, W)), ssmk.tensor(out, shape=(2, D)))
        for b in range(2):
            for c in range(D):
                want = w[c * W] * 0.25 + w[c * W + 1] * 0.25 + w[c * W + 2] * x[b * D + c]
                self.assertAlmostEqual(out[b * D + c], want, delta=1e-5)
        # ShortConv: f32 so the composition is easy to write here exactly.
        T = 5
        bcx = array.array("f", [math.sin(0.21 * i) for i in range(T * 3 * D)])
        fused = array.array("f", [0.0] * (T * D))
        ssmk.short_conv(ssmk.tensor(bcx, shape=(T, 3 * D)), ssmk.tensor(w, shape=(D, W)),
                        ssmk.tensor(fused, shape=(T, D)))
        bx = array.array("f", [bcx[t * 3 * D + c] * bcx[t * 3 * D + 2 * D + c] for t in range(T) for c in range(D)])
        y = array.array("f", [0.0] * (T * D))
        ssmk.causal_conv1d_fwd(ssmk.tensor(bx, shape=(T, D)), ssmk.tensor(w, shape=(D, W)),
                               ssmk.tensor(y, shape=(T, D)))
        composed = array.array("f", [bcx[t * 3 * D + D + c] * y[t * D + c] for t in range(T) for c in range(D)])
        self.assertEqual(fused.tobytes(), composed.tobytes())


class GatedDeltaNet(unittest.TestCase):
    def test_gating_matches_formula(self):
        N, HV = 2, 3
        a_log = array.array("f", [0.2, -0.4, 0.0])
        dt = array.array("f", [0.1, 0.0, 30.0])
        a = array.array("f", [math.sin(i) for i in range(N * HV)])
        b = array.array("f", [math.cos(i) for i in range(N * HV)])
        g = array.array("f", [0.0] * (N * HV))
        beta = array.array("f", [0.0] * (N * HV))
        ssmk.gdn_gating(a_log, ssmk.tensor(a, shape=(N, HV)), ssmk.tensor(b, shape=(N, HV)), dt,
                        ssmk.tensor(g, shape=(N, HV)), ssmk.tensor(beta, shape=(N, HV)))
        for n in range(N):
            for h in range(HV):
                x = a[n * HV + h] + dt[h]
                sp = x if x > 20 else math.log1p(math.exp(x))
                self.assertAlmostEqual(g[n * HV + h], -math.exp(a_log[h]) * sp, delta=1e-5 * (1 + abs(sp)))
                self.assertAlmostEqual(beta[n * HV + h], 1 / (1 + math.exp(-b[n * HV + h])), delta=1e-6)

    def test_kda_gating_matches_formula(self):
        N, HV, K = 2, 2, 3
        a_log = array.array("f", [0.3, -0.2])
        dt = array.array("f", [0.1 * i - 0.2 for i in range(HV * K)])
        a = array.array("f", [4 * math.sin(0.7 * i) for i in range(N * HV * K)])
        g = array.array("f", [0.0] * (N * HV * K))
        for lower in (0.0, -5.0):
            ssmk.kda_gating(a_log, ssmk.tensor(a, shape=(N, HV, K)), ssmk.tensor(g, shape=(N, HV, K)),
                            dt_bias=ssmk.tensor(dt, shape=(HV, K)), lower_bound=lower)
            for i in range(N * HV * K):
                h, k = i // K % HV, i % K
                x, e = a[i] + dt[h * K + k], math.exp(a_log[h])
                want = -e * (x if x > 20 else math.log1p(math.exp(x))) if lower == 0 else lower / (1 + math.exp(-e * x))
                self.assertAlmostEqual(g[i], want, delta=1e-5 * (1 + abs(want)))
        with self.assertRaises(ssmk.SsmkError) as cm:
            ssmk.kda_gating(a_log, ssmk.tensor(a, shape=(N, HV, K)), ssmk.tensor(g, shape=(N, HV, K)),
                            lower_bound=1.0)
        self.assertEqual(cm.exception.status, ssmk.ERR_INVALID_ARGUMENT)
        self.assertIn("lower_bound = 1", cm.exception.message)

    def test_delta_rule_first_token_from_zero_state(self):
        # From a zero state: S = k (x) beta v, o = scale * (k . q) * beta * v.
        K, V = 4, 2
        q = array.array("f", [0.5, -1.0, 2.0, 0.25])
        k = array.array("f", [1.0, 0.5, -0.5, 2.0])
        v = array.array("f", [3.0, -1.0])
        out = array.array("f", [0.0] * V)
        state = array.array("f", [9.0] * (K * V))
        ssmk.gated_delta_rule(ssmk.tensor(q, shape=(1, 1, K)), ssmk.tensor(k, shape=(1, 1, K)),
                              ssmk.tensor(v, shape=(1, 1, V)), ssmk.tensor(array.array("f", [-0.3]), shape=(1, 1)),
                              ssmk.tensor(array.array("f", [0.5]), shape=(1, 1)), ssmk.tensor(out, shape=(1, 1, V)),
                              state=ssmk.tensor(state, shape=(1, 1, K, V)), scale=0.5)
        kq = sum(a * b for a, b in zip(k, q))
        for j in range(V):
            self.assertAlmostEqual(out[j], 0.5 * kq * 0.5 * v[j], delta=1e-5)
        for i in range(K):
            for j in range(V):
                self.assertAlmostEqual(state[i * V + j], k[i] * 0.5 * v[j], delta=1e-6)


    def test_kda_delta_rule_matches_per_channel_recurrence(self):
        # Two tokens with one decay per key channel (g [T, HV, K]) against the recurrence in Python.
        import math

        T, K, V = 2, 3, 2
        q = [0.5, -1.0, 2.0, 0.25, 1.5, -0.5]
        k = [1.0, 0.5, -0.5, -0.25, 2.0, 1.0]
        v = [3.0, -1.0, 0.5, 2.0]
        g = [-0.1, -2.0, -20.0, -0.5, -0.01, -3.0]
        beta = [0.5, 0.8]
        out = array.array("f", [0.0] * (T * V))
        ssmk.gated_delta_rule(ssmk.tensor(array.array("f", q), shape=(T, 1, K)),
                              ssmk.tensor(array.array("f", k), shape=(T, 1, K)),
                              ssmk.tensor(array.array("f", v), shape=(T, 1, V)),
                              ssmk.tensor(array.array("f", g), shape=(T, 1, K)),
                              ssmk.tensor(array.array("f", beta), shape=(T, 1)),
                              ssmk.tensor(out, shape=(T, 1, V)), scale=1.0)
        S = [[0.0] * V for _ in range(K)]
        for t in range(T):
            kt, qt = k[t * K:(t + 1) * K], q[t * K:(t + 1) * K]
            for i in range(K):
                S[i] = [x * math.exp(g[t * K + i]) for x in S[i]]
            for j in range(V):
                kv = sum(S[i][j] * kt[i] for i in range(K))
                delta = beta[t] * (v[t * V + j] - kv)
                for i in range(K):
                    S[i][j] += kt[i] * delta
                want = sum(S[i][j] * qt[i] for i in range(K))
                self.assertAlmostEqual(out[t * V + j], want, delta=1e-5)


def mamba2_reference(x, dt, A, B, C, D, z, dt_bias, dt_min, dt_max, softplus, h, T, NH, P, G, N):
    """Per-token Mamba-2 recurrence in float64 from state ``h`` ([NH][P][N] lists, updated); ``A``
    holds NH rates, or NH * N (``[NH, N]``, one per state channel: Mamba-1)."""
    out = []
    for t in range(T):
        for hd in range(NH):
            g = hd // (NH // G)
            d = dt[t * NH + hd] + dt_bias[hd]
            if softplus:
                d = d if d > 20 else math.log1p(math.exp(d))
            d = min(max(d, dt_min), dt_max)
            rates = A[hd * N:(hd + 1) * N] if len(A) == NH * N else [A[hd]] * N  # [NH, N]: Mamba-1
            a = [math.exp(d * r) for r in rates]
            b = B[(t * G + g) * N:(t * G + g + 1) * N]
            c = C[(t * G + g) * N:(t * G + g + 1) * N]
            for p in range(P):
                xv = x[(t * NH + hd) * P + p]
                row = h[hd][p]
                for n in range(N):
                    row[n] = a[n] * row[n] + d * xv * b[n]
                y = sum(row[n] * c[n] for n in range(N)) + D[hd] * xv
                zv = z[(t * NH + hd) * P + p]
                out.append(y * silu(zv))
    return out


class Mamba2(unittest.TestCase):
    NH, P, G, N, S = 4, 3, 2, 16, 3

    def inputs(self, T, seed):
        NH, P, G, N = self.NH, self.P, self.G, self.N
        f = lambda n, k, a: array.array("f", [a * math.sin(k * (i + seed) + 0.3) for i in range(n)])
        return dict(x=f(T * NH * P, 0.37, 1.0), dt=f(T * NH, 0.53, 2.0), B=f(T * G * N, 0.71, 1.0),
                    C=f(T * G * N, 0.29, 1.0), z=f(T * NH * P, 0.43, 3.0))

    def call(self, T, v, state, out, **kw):
        NH, P, G, N = self.NH, self.P, self.G, self.N
        ssmk.mamba2_scan(
            ssmk.tensor(v["x"], shape=(T, NH, P)), ssmk.tensor(v["dt"], shape=(T, NH)), self.A,
            ssmk.tensor(v["B"], shape=(T, G, N)), ssmk.tensor(v["C"], shape=(T, G, N)),
            ssmk.tensor(out, shape=(out.buffer_info()[1] // (NH * P), NH, P)), D=self.D,
            z=ssmk.tensor(v["z"], shape=(T, NH, P)), dt_bias=self.dt_bias,
            state=ssmk.tensor(state, shape=(self.S, NH, P, N)), **kw)

    def setUp(self):
        self.A = array.array("f", [-math.exp(0.7 * i) for i in range(self.NH)])
        self.D = array.array("f", [1.0, -0.5, 0.25, 2.0])
        self.dt_bias = array.array("f", [-4.0, -3.0, -2.5, -3.5])

    def test_prefill_then_decode_matches_recurrence(self):
        # 70 tokens (a chunk boundary and a tail) plus a padded 3-token sequence, dt clamped;
        # then one decode step from the carried state with no limit.
        NH, P, G, N, S = self.NH, self.P, self.G, self.N, self.S
        T = 73
        v = self.inputs(T, 0)
        slot = NH * P * N
        state = array.array("f", [0.5 * math.cos(0.17 * i) for i in range(S * slot)])
        initial = list(state)
        out = array.array("f", [7.0] * (T * NH * P))
        dt_min, dt_max = 0.005, 0.08
        self.call(T, v, state, out, dt_min=dt_min, dt_max=dt_max, flags=ssmk.MAMBA2_DT_SOFTPLUS,
                  cu_seqlens=array.array("i", [0, 70, 73]), state_indices=array.array("q", [2, -1]),
                  has_initial_state=array.array("B", [1, 1]), pad_slot_id=-1, ctx=ssmk.Context(2))
        h = [[[initial[2 * slot + (hd * P + p) * N + n] for n in range(N)] for p in range(P)] for hd in range(NH)]
        want = mamba2_reference(v["x"], v["dt"], self.A, v["B"], v["C"], self.D, v["z"], self.dt_bias,
                                dt_min, dt_max, True, h, 70, NH, P, G, N)
        for i, w in enumerate(want):
            self.assertAlmostEqual(out[i], w, delta=2e-4 * (1 + abs(w)), msg=f"prefill out[{i}]")
        self.assertEqual(list(out[70 * NH * P:]), [0.0] * (3 * NH * P), "padded rows are zeros")
        flat = [e for hd in h for row in hd for e in row]
        for i, w in enumerate(flat):
            self.assertAlmostEqual(state[2 * slot + i], w, delta=2e-4 * (1 + abs(w)), msg=f"state[{i}]")
        self.assertEqual(list(state[:2 * slot]), initial[:2 * slot], "slots 0 and 1 untouched")

        # Decode: state carried from the prefill's slot, compared with the reference's state.
        d = self.inputs(1, 70)
        h = [[[state[2 * slot + (hd * P + p) * N + n] for n in range(N)] for p in range(P)] for hd in range(NH)]
        out1 = array.array("f", [0.0] * (NH * P))
        self.call(1, d, state, out1, flags=ssmk.MAMBA2_DT_SOFTPLUS, state_indices=array.array("i", [2]),
                  has_initial_state=array.array("B", [1]))
        want = mamba2_reference(d["x"], d["dt"], self.A, d["B"], d["C"], self.D, d["z"], self.dt_bias,
                                -math.inf, math.inf, True, h, 1, NH, P, G, N)
        for i, w in enumerate(want):
            self.assertAlmostEqual(out1[i], w, delta=2e-5 * (1 + abs(w)), msg=f"decode out[{i}]")
        flat = [e for hd in h for row in hd for e in row]
        for i, w in enumerate(flat):
            self.assertAlmostEqual(state[2 * slot + i], w, delta=2e-5 * (1 + abs(w)), msg=f"decode state[{i}]")

    def test_bad_inputs_are_refused_and_write_nothing(self):
        NH, P, N, S = self.NH, self.P, self.N, self.S
        v = self.inputs(2, 0)
        state = array.array("f", [0.25] * (S * NH * P * N))
        out = array.array("f", [7.0] * (2 * NH * P))
        cases = [
            (ssmk.ERR_INVALID_ARGUMENT, dict(dt_min=0.1, dt_max=0.01)),  # dt_min > dt_max
            (ssmk.ERR_INVALID_ARGUMENT, dict(dt_max=math.nan)),
            (ssmk.ERR_OUT_OF_BOUNDS, dict(state_indices=array.array("i", [0, 3]))),  # slot 3 of 3
            (ssmk.ERR_INVALID_ARGUMENT, dict(state_indices=array.array("i", [1, 1]))),  # same slot twice
        ]
        for status, kw in cases:
            with self.subTest(kw=kw):
                with self.assertRaises(ssmk.SsmkError) as cm:
                    self.call(2, v, state, out, cu_seqlens=array.array("i", [0, 1, 2]), **kw)
                self.assertEqual(cm.exception.status, status)
                self.assertTrue(cm.exception.message)
                self.assertEqual(list(state), [0.25] * (S * NH * P * N))
                self.assertEqual(list(out), [7.0] * (2 * NH * P))

    def test_per_channel_A_is_mamba1(self):
        """``A [NH, N]``: a Mamba-1 layer of NH channels (P = 1, one group) whose x, dt and z are
        channel-major (``[NH, T]`` memory, tokens contiguous), from a zero state."""
        NH, N, T = 6, 4, 21
        f = lambda n, k, a: array.array("f", [a * math.sin(k * i + 0.3) for i in range(n)])
        x, dt, z = f(NH * T, 0.37, 1.0), f(NH * T, 0.53, 2.0), f(NH * T, 0.43, 3.0)
        B, C = f(T * N, 0.71, 1.0), f(T * N, 0.29, 1.0)
        A = array.array("f", [-(n + 1) * (1 + 0.1 * c) for c in range(NH) for n in range(N)])
        D = array.array("f", [0.5 * c - 1 for c in range(NH)])
        dt_bias = array.array("f", [-3.0 + 0.2 * c for c in range(NH)])
        state = array.array("f", [9.0] * (NH * N))
        out = array.array("f", [7.0] * (NH * T))  # channel-major too
        cm = dict(shape=(T, NH, 1), strides=(1, T, 1))
        ssmk.mamba2_scan(ssmk.tensor(x, **cm), ssmk.tensor(dt, shape=(T, NH), strides=(1, T)),
                         ssmk.tensor(A, shape=(NH, N)), ssmk.tensor(B, shape=(T, 1, N)),
                         ssmk.tensor(C, shape=(T, 1, N)), ssmk.tensor(out, **cm), D=D, z=ssmk.tensor(z, **cm),
                         dt_bias=dt_bias, flags=ssmk.MAMBA2_DT_SOFTPLUS, state=ssmk.tensor(state, shape=(1, NH, 1, N)))
        tm = lambda v: array.array("f", [v[c * T + t] for t in range(T) for c in range(NH)])  # noqa: E731
        h = [[[0.0] * N] for _ in range(NH)]
        want = mamba2_reference(tm(x), tm(dt), A, B, C, D, tm(z), dt_bias, -math.inf, math.inf, True, h,
                                T, NH, 1, 1, N)
        for t in range(T):
            for c in range(NH):
                w = want[t * NH + c]
                self.assertAlmostEqual(out[c * T + t], w, delta=2e-5 * (1 + abs(w)), msg=f"out[{t}, {c}]")
        for i, w in enumerate(e for hd in h for row in hd for e in row):
            self.assertAlmostEqual(state[i], w, delta=2e-5 * (1 + abs(w)), msg=f"state[{i}]")
        with self.assertRaises(ssmk.SsmkError) as cm_err:  # A [NH, N'] with N' != N
            ssmk.mamba2_scan(ssmk.tensor(x, **cm), ssmk.tensor(dt, shape=(T, NH), strides=(1, T)),
                             ssmk.tensor(A, shape=(NH * 2, N // 2)), ssmk.tensor(B, shape=(T, 1, N)),
                             ssmk.tensor(C, shape=(T, 1, N)), ssmk.tensor(out, **cm))
        self.assertEqual(cm_err.exception.status, ssmk.ERR_INVALID_ARGUMENT)
        self.assertIn("A", cm_err.exception.message)


if __name__ == "__main__":
    unittest.main(verbosity=2)
