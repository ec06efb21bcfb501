"""Which backend runs each rule (``fwrl.kernels.dispatch``), and how it says so.

CUDA inputs that fall back to the reference must warn (once per layer and
reason) with the reason and what would avoid it; CPU inputs must not warn; the
first call of every layer logs its backend at INFO. The CUDA path is reached on
CPU by patching the device check (``dispatch._on_cuda``); the Triton path by
handing dispatch the interpreted kernel modules (``kernel_harness``).
"""

from __future__ import annotations

import logging
import sys
import warnings

import pytest
import torch

from fwrl.errors import FwrlError
from fwrl.kernels import dispatch
from fwrl.kernels.delta_rule import delta_rule
from fwrl.kernels.delta_rule.naive import delta_rule_reference
from fwrl.kernels.rdn import rdn
from fwrl.kernels.rdn.naive import rdn_reference
from fwrl.memory_modules import build_core
from kernel_harness import load_kernel_module

LOGGER = "fwrl.kernels"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """Every test starts with nothing announced, under FWRL_KERNELS=auto."""
    dispatch.forget_announcements()
    monkeypatch.setenv("FWRL_KERNELS", "auto")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    yield
    dispatch.forget_announcements()


def _rdn_inputs(d=8, dtype=torch.float32, T=2, B=1, H=1):
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    return [randn(T, B, H, d), randn(T, B, H, d), randn(T, B, H, d), randn(T, B, H),
            randn(H, d, d), randn(H, d, d), randn(H, d, d), randn(H, d),
            randn(B, H, d, d), randn(B, H, d)], torch.zeros(T, B, dtype=torch.bool)


def _fallbacks(record):
    return [w for w in record if issubclass(w.category, dispatch.KernelFallbackWarning)]


def test_cpu_runs_the_cpu_path_without_a_warning(caplog):
    inputs, reset = _rdn_inputs()
    caplog.set_level(logging.INFO, logger=LOGGER)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        y, _, _ = rdn(*inputs, reset, layer="core.blocks.0.fwp")
    torch.testing.assert_close(y, rdn_reference(*inputs, reset)[0], rtol=1e-5, atol=1e-6)
    assert _fallbacks(record) == []
    logs = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(logs) == 1
    assert "core.blocks.0.fwp" in logs[0] and "rdn runs on cpu" in logs[0]
    assert "[2, 1, 1, 8] float32 on cpu" in logs[0]


def test_cuda_fallback_warns_once_per_layer_and_reason(monkeypatch, caplog):
    monkeypatch.setattr(dispatch, "_on_cuda", lambda x: True)
    caplog.set_level(logging.INFO, logger=LOGGER)
    inputs, reset = _rdn_inputs(dtype=torch.float64)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            rdn(*inputs, reset, layer="a")
        rdn(*inputs, reset, layer="b")
        big, reset_big = _rdn_inputs(d=128)
        rdn(*big, reset_big, layer="a")
        wide = inputs[:8] + [torch.zeros(1, 1, 8, 16, dtype=torch.float64), inputs[9]]
        rdn(*wide, reset, feature_map="dpfp-1", layer="a")  # 16 key features
    messages = [str(w.message) for w in _fallbacks(record)]
    assert len(messages) == 4, messages  # a: dtype, b: dtype, a: head dim, a: dpfp
    dtype_a, dtype_b, head_a, dpfp_a = messages
    for text in messages:
        assert "FWRL_KERNELS=reference" in text and "runs the PyTorch reference on CUDA" in text
    assert "layer a" in dtype_a and "layer b" in dtype_b
    assert "dtype torch.float64" in dtype_a and "use float32, bfloat16 or float16" in dtype_a
    assert "head dim 128" in head_a and "head_dim of at most 64" in head_a
    assert "'dpfp-1'" in dpfp_a and "use feature_map" in dpfp_a
    logs = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    # One INFO line per (layer, backend, device): a and b, each once.
    assert len(logs) == 2 and all("runs on reference" in m for m in logs)


def test_reference_chosen_on_purpose_is_silent(monkeypatch, caplog):
    monkeypatch.setattr(dispatch, "_on_cuda", lambda x: True)
    monkeypatch.setenv("FWRL_KERNELS", "reference")
    caplog.set_level(logging.INFO, logger=LOGGER)
    inputs, reset = _rdn_inputs(dtype=torch.float64)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        rdn(*inputs, reset, layer="a")
    assert _fallbacks(record) == []
    assert any("FWRL_KERNELS=reference" in r.getMessage() for r in caplog.records)


def test_triton_not_importable_says_how_to_install(monkeypatch):
    monkeypatch.setattr(dispatch, "_on_cuda", lambda x: True)

    monkeypatch.setitem(sys.modules, "triton", None)  # Triton not installed: importing it raises ImportError
    monkeypatch.delitem(sys.modules, "fwrl.kernels.delta_rule.fused_recurrent", raising=False)
    q = torch.randn(2, 1, 1, 8)
    W0 = torch.zeros(1, 1, 8, 8)
    with pytest.warns(dispatch.KernelFallbackWarning, match=r"pip install -e '\.\[kernels\]'"):
        delta_rule(q, q, q, q[..., 0], W0, torch.zeros(2, 1, dtype=torch.bool),
                            layer="lt")
    monkeypatch.setenv("FWRL_KERNELS", "triton")
    with pytest.raises(FwrlError, match="Triton is not importable"):
        delta_rule(q, q, q, q[..., 0], W0, torch.zeros(2, 1, dtype=torch.bool))


def test_fallback_message_names_layer_reason_and_remedy():
    text = dispatch.fallback_message("srwm", "core.blocks.1.fwp", "head dim 128 is too large "
                                     "(use a head_dim of at most 64)")
    assert text.startswith("fwrl.kernels: layer core.blocks.1.fwp: the srwm recurrence")
    assert "because head dim 128 is too large (use a head_dim of at most 64)" in text
    assert "set FWRL_KERNELS=reference" in text


def test_triton_path_is_logged_and_does_not_warn(monkeypatch, caplog):
    """The interpreted kernel module handed to dispatch: supported inputs run Triton."""
    interpreted = load_kernel_module("delta_rule", interpret=True)
    fused = dispatch.Fused(interpreted.delta_rule_triton, interpreted.supports)
    monkeypatch.setattr(dispatch, "_load_fused", lambda load: (fused, None))
    monkeypatch.setattr(dispatch, "_on_cuda", lambda x: True)  # CPU tensors would take the CPU path
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    caplog.set_level(logging.INFO, logger=LOGGER)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 1, 1, 16, generator=g) for _ in range(3))
    beta, W0 = torch.randn(2, 1, 1, generator=g), torch.zeros(1, 1, 16, 16)
    reset = torch.zeros(2, 1, dtype=torch.bool)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        y, _ = delta_rule(q, k, v, beta, W0, reset, layer="dn")
        delta_rule(q, k, v, beta, W0, reset, layer="dn")
    assert _fallbacks(record) == []
    torch.testing.assert_close(y, delta_rule_reference(q, k, v, beta, W0, reset)[0],
                               atol=1e-6, rtol=1e-5)
    logs = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(logs) == 1 and "layer dn: delta_rule runs on triton" in logs[0]


@pytest.mark.parametrize("core_name", ["delta_net", "rdn", "delta_rnn", "delta_lstm", "srwm",
                                       "sr_delta_net", "gated_delta_net"])
def test_cores_name_their_layers(core_name, caplog):
    """Each fast-weight layer of a core is its own key: two layers, two INFO lines."""
    options = dict(num_layers=2, hidden_size=8, num_heads=2, head_dim=4, ff_dim=8)
    core = build_core(core_name, 5, options)
    caplog.set_level(logging.INFO, logger=LOGGER)
    for _ in range(2):
        core(torch.randn(2, 1, 5), core.initial_state(1), torch.zeros(2, 1, dtype=torch.bool))
    logs = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    layers = {m.split(":")[0] for m in logs}
    expected = 4 if core_name == "sr_delta_net" else 2  # SR-DeltaNet: SRWM + delta rule
    assert len(logs) == expected and len(layers) == 2, logs
    assert all("Layer@0x" in m for m in logs)


# --------------------------------------------------------------------------- GPU only


def _kernel_and_args(core):
    """The compiled ``<core>_triton`` (of ``fwrl/kernels/<core>/fused_recurrent.py``) with flat
    outputs, and its inputs at a small shape."""
    from fwrl.launch.bench import kernels as benchmark

    fn = getattr(load_kernel_module(core, interpret=False), f"{core}_triton")
    if core == "srwm":
        fn = benchmark._flat_srwm(fn)
    *tensors, reset = benchmark._inputs(core, (4, 9, 2, 16), torch.float32, "cuda", seed=3)
    reset[0, 0] = reset[4, 1] = reset[5, 1] = True  # episode ends inside: replays in backward
    return fn, tensors, reset


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("core", ["delta_rule", "gated_delta_rule", "srwm", "rdn", "delta_rnn", "delta_lstm"])
def test_cuda_call_has_no_host_sync_and_is_graph_capturable(core):
    """Forward and backward of a whole call, with resets inside: no device-to-host copy
    (sync debug mode "error"), and the same gradients when captured in a CUDA graph."""
    fn, tensors, reset = _kernel_and_args(core)
    leaves = [t.clone().requires_grad_() for t in tensors]

    def step():
        outs = fn(*leaves, reset)
        loss = sum((o.float() * (i + 1)).sum() for i, o in enumerate(outs))
        return torch.autograd.grad(loss, leaves)

    eager = step()  # compiles the kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager, captured):  # cuBLAS (dR, dS GEMMs) may pick another algorithm
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


def test_the_cpu_path_is_not_taken_under_a_cuda_graph_capture(monkeypatch, caplog):
    """FWRL_KERNELS=cpu on CUDA tensors runs a rule's CPU path, except while a CUDA graph is being
    captured (it reads the reset steps on the host, which a capture cannot hold): then the choice is
    auto's (here the reference: no Triton for these inputs)."""
    monkeypatch.setenv("FWRL_KERNELS", "cpu")
    monkeypatch.setattr(dispatch, "_on_cuda", lambda x: True)
    monkeypatch.setattr(dispatch, "_load_fused", lambda load: (None, "Triton is not importable (test)"))
    caplog.set_level(logging.INFO, logger=LOGGER)
    inputs, reset = _rdn_inputs()
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rdn(*inputs, reset, layer="free")
        capturing[0] = True
        rdn(*inputs, reset, layer="captured")
    logs = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any("layer free: rdn runs on cpu" in m for m in logs), logs
    assert any("layer captured: rdn runs on reference" in m for m in logs), logs
