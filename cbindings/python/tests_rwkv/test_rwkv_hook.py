"""End to end: BlinkDL's ``rwkv`` package (RWKV-7, x070) gives the same logits with ``ssmk.rwkv``
routing its time-mix recurrence to ssmk as with its own torch loop.

A tiny random-weight x070 model (2 layers, n_embd 128, head size 64, vocab 256) is written as the
``.pth`` state dict the package loads; no downloads. torch and rwkv come from PyPI, pinned in
``cbindings/python/tests_e2e/requirements.txt`` (tests/python_package.rs runs this directory in
its torch venv). ssmk is the installed package if there is one, else the source tree. Run::

    python -m unittest discover -s cbindings/python/tests_rwkv -v

Each strategy runs a 24-token prompt (``RWKV_x070_TMix_seq``) and 32 greedily generated tokens
(``RWKV_x070_TMix_one``); every other run is fed the tokens the package's own fp32 run generated,
and every step's logits are compared. ``cpu fp32``: within the f32 bound, final states too.
``cpu bf16``: the package's own bf16 run (its loop, the same tokens) drifts from its fp32 run by ``e_pkg``;
ssmk's bf16 run must stay within ``BF16_VS_PKG x e_pkg`` of the fp32 run (ssmk keeps the
recurrence in f32; the package rounds ``kk*a``, ``v k^T`` and the state it reads out to bf16).
Every routed run asserts that each time-mix call went to ssmk (none fell back); ``cpu fp16`` (not
routed) must fall back, counted, to the package's own functions with its exact logits.
"""

import os
import sys
import tempfile
import unittest

os.environ["RWKV_V7_ON"] = "1"  # rwkv.model defines its RWKV-7 code only with this set
os.environ["RWKV_JIT_ON"] = "1"
os.environ["RWKV_CUDA_ON"] = "0"

try:
    import torch
    import rwkv.model
except ImportError as e:  # pragma: no cover - the CI job installs them
    raise unittest.SkipTest(f"torch and rwkv are needed: {e}")

try:
    import ssmk  # an installed package (it finds its own library)
except ImportError:  # install-free: the source tree, with SSMK_LIBRARY or target/release/libssmk.so
    _PYTHON = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # cbindings/python
    sys.path.insert(0, _PYTHON)
    _LIB = os.path.join(_PYTHON, "..", "..", "target", "release", "libssmk.so")
    if "SSMK_LIBRARY" not in os.environ and os.path.exists(_LIB):
        os.environ["SSMK_LIBRARY"] = os.path.abspath(_LIB)
    import ssmk
import ssmk.rwkv

N_LAYER, N_EMBD, HEAD_SIZE, VOCAB = 2, 128, 64, 256
LORA = 16  # rank of the decay / iclr / value-residual / gate LoRAs
PROMPT, GENERATED = 24, 32
F32_TOL = 1e-5  # x max |logit| (measured 5e-7)
BF16_VS_PKG = 1.5  # measured 0.96: the rest of the model, in bf16 either way, dominates


def write_model(path):
    """A random x070 checkpoint with the package's key names and shapes (Linear weights
    ``[out, in]``: the loader transposes them); scales keep the activations O(1)."""
    g = torch.Generator().manual_seed(7)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g) * std

    def rand(*shape):
        return torch.rand(*shape, generator=g)

    C, H = N_EMBD, N_EMBD // HEAD_SIZE
    z = {"emb.weight": randn(VOCAB, C), "blocks.0.ln0.weight": 1 + randn(C, std=0.1),
         "blocks.0.ln0.bias": randn(C, std=0.1), "ln_out.weight": 1 + randn(C, std=0.1),
         "ln_out.bias": randn(C, std=0.1), "head.weight": randn(VOCAB, C, std=C ** -0.5)}
    for i in range(N_LAYER):
        b, att, ffn = f"blocks.{i}.", f"blocks.{i}.att.", f"blocks.{i}.ffn."
        for ln in ("ln1", "ln2"):
            z[b + ln + ".weight"], z[b + ln + ".bias"] = 1 + randn(C, std=0.1), randn(C, std=0.1)
        for mix in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):
            z[att + mix] = rand(1, 1, C)
        # w0 over [-6, 2]: decays from ~1 (slow channels) to ~0.55 (fast ones)
        z[att + "w0"] = (-6 + 8 * rand(C)).view(1, 1, C)
        z[att + "a0"], z[att + "v0"] = randn(1, 1, C), randn(1, 1, C)
        for lora in ("w", "a", "v", "g"):
            z[att + lora + "1"] = randn(C, LORA, std=C ** -0.5)
            z[att + lora + "2"] = randn(LORA, C, std=LORA ** -0.5)
        z[att + "k_k"], z[att + "k_a"] = 0.5 + rand(1, 1, C), rand(1, 1, C)
        z[att + "r_k"] = randn(H, HEAD_SIZE, std=0.1)
        for proj in ("receptance", "key", "value", "output"):
            z[att + proj + ".weight"] = randn(C, C, std=C ** -0.5)
        z[att + "ln_x.weight"], z[att + "ln_x.bias"] = 1 + randn(C, std=0.1), randn(C, std=0.1)
        z[ffn + "x_k"] = rand(1, 1, C)
        z[ffn + "key.weight"] = randn(4 * C, C, std=C ** -0.5)
        z[ffn + "value.weight"] = randn(C, 4 * C, std=(4 * C) ** -0.5)
    torch.save(z, path + ".pth")


def run(model, tokens):
    """Logits after the prompt and after each further token (``[1 + len(tokens) - PROMPT, V]``
    f32) and the final state; the prompt goes through the sequence path, the rest one by one."""
    out, state = model.forward(tokens[:PROMPT], None)
    logits = [out.float()]
    for t in tokens[PROMPT:]:
        out, state = model.forward(t, state)
        logits.append(out.float())
    return torch.stack(logits), state


def package_run(path, strategy, prompt):
    """The package's own path: the prompt, then GENERATED greedy tokens; returns
    ``(logits, state, tokens)``."""
    model = rwkv.model.RWKV(model=path, strategy=strategy)
    tokens = list(prompt)
    out, state = model.forward(tokens, None)
    logits = [out.float()]
    for _ in range(GENERATED):
        tokens.append(int(out.argmax()))
        out, state = model.forward(tokens[-1], state)
        logits.append(out.float())
    return torch.stack(logits), state, tokens


def setUpModule():
    global MODEL, tmp
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tmp = tempfile.TemporaryDirectory()
    MODEL = os.path.join(tmp.name, "rwkv7-tiny")
    write_model(MODEL)


def tearDownModule():
    ssmk.rwkv.disable()
    tmp.cleanup()


class RwkvHook(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        prompt = torch.randint(0, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(1)).tolist()
        ssmk.rwkv.disable()
        cls.ref, cls.ref_state, cls.tokens = package_run(MODEL, "cpu fp32", prompt)

    def routed_run(self, strategy):
        """The ssmk run of ``self.tokens``: every time-mix call went to ssmk, none fell back."""
        ssmk.rwkv.reset_call_counts()
        with ssmk.rwkv.enabled():
            model = rwkv.model.RWKV(model=MODEL, strategy=strategy)
            logits, state = run(model, self.tokens)
        self.assertEqual(ssmk.rwkv.call_counts(), {("RWKV_x070_TMix_seq", "ssmk"): N_LAYER,
                                                   ("RWKV_x070_TMix_one", "ssmk"): N_LAYER * GENERATED})
        return logits, state

    def test_fp32_matches_the_package(self):
        logits, state = self.routed_run("cpu fp32")
        scale = self.ref.abs().max().item()
        err = (logits - self.ref).abs().max().item()
        self.assertLessEqual(err, F32_TOL * scale, f"max |logit| {scale:.3g}")
        for i in range(N_LAYER):
            s, s_ref = state[3 * i + 1], self.ref_state[3 * i + 1]
            self.assertLessEqual((s - s_ref).abs().max().item(), F32_TOL * s_ref.abs().max().item(), i)

    def test_bf16_within_the_packages_own_drift(self):
        pkg, _ = run(rwkv.model.RWKV(model=MODEL, strategy="cpu bf16"), self.tokens)
        e_pkg = (pkg - self.ref).abs().max().item()
        logits, _ = self.routed_run("cpu bf16")
        e_ssmk = (logits - self.ref).abs().max().item()
        self.assertGreater(e_pkg, 0.0)
        self.assertLessEqual(e_ssmk, BF16_VS_PKG * e_pkg, f"package bf16 drift {e_pkg:.3g}")

    def test_fp16_falls_back_to_the_package_and_is_counted(self):
        pkg, _ = run(rwkv.model.RWKV(model=MODEL, strategy="cpu fp16"), self.tokens)
        ssmk.rwkv.reset_call_counts()
        with ssmk.rwkv.enabled():
            logits, _ = run(rwkv.model.RWKV(model=MODEL, strategy="cpu fp16"), self.tokens)
        self.assertEqual(ssmk.rwkv.call_counts(), {("RWKV_x070_TMix_seq", "fallback"): N_LAYER,
                                                   ("RWKV_x070_TMix_one", "fallback"): N_LAYER * GENERATED})
        self.assertTrue(torch.equal(logits, pkg))

    def test_disable_restores_the_package(self):
        model_before = rwkv.model.RWKV_x070_TMix_seq
        with ssmk.rwkv.enabled():
            self.assertIsNot(rwkv.model.RWKV_x070_TMix_seq, model_before)
            model = rwkv.model.RWKV(model=MODEL, strategy="cpu fp32")
        self.assertIs(rwkv.model.RWKV_x070_TMix_seq, model_before)
        ssmk.rwkv.reset_call_counts()
        logits, _ = run(model, self.tokens)  # built while enabled, run after: the package's loop
        self.assertEqual(ssmk.rwkv.call_counts(), {})
        self.assertTrue(torch.equal(logits, self.ref))


if __name__ == "__main__":
    unittest.main()
