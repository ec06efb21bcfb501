"""The GRU's CPU path (``fwrl/kernels/gru/cpu.py``) against its reference (``naive.py``) and ``nn.GRU``.

float64, every episode-start pattern (none, at step 0, in the middle, everywhere), one step and an
unroll: the outputs, the final state and the gradient of every input and weight equal the
reference's to 1e-12; gradcheck; without autograd (acting) the same outputs; and the core's two
device paths agree: its CPU path and ``nn.GRU`` over the segments between episode starts (what it
runs on CUDA), forward and backward.
"""

from __future__ import annotations

import pytest
import torch

from fwrl.kernels.gru import gru_cpu, gru_reference
from fwrl.memory_modules import build_core
from fwrl.memory_modules.base import run_in_segments

PATTERNS = ("none", "start", "mid", "everywhere")


def _resets(T: int, B: int, pattern: str) -> torch.Tensor:
    reset = torch.zeros(T, B, dtype=torch.bool)
    if pattern == "start":
        reset[0] = True
    elif pattern == "mid":
        reset[T // 2, 0] = True
        reset[T // 2: T // 2 + 3, 1] = True
    elif pattern == "everywhere":
        reset[:] = True
    return reset


def _inputs(T: int, B: int = 3, D: int = 5, H: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()  # noqa: E731
    return make(T, B, D), make(B, H), [make(3 * H, D), make(3 * H, H), make(3 * H), make(3 * H)]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("T", [1, 9])
def test_cpu_path_equals_the_reference_forward_and_backward(pattern, T):
    x, h0, weights = _inputs(T)
    reset = _resets(T, 3, pattern)
    y, h = gru_cpu(x, h0, reset, *weights)
    y_ref, h_ref = gru_reference(x, h0, reset, *weights)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(h, h_ref, rtol=0, atol=1e-12)
    g = torch.Generator().manual_seed(1)
    wy, wh = torch.randn(y.shape, generator=g, dtype=y.dtype), torch.randn(h.shape, generator=g, dtype=h.dtype)
    grads = torch.autograd.grad((y * wy).sum() + (h * wh).sum(), [x, h0, *weights])
    grads_ref = torch.autograd.grad((y_ref * wy).sum() + (h_ref * wh).sum(), [x, h0, *weights])
    for got, want in zip(grads, grads_ref):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    if pattern == "everywhere":  # no gradient reaches the initial state through a reset at step 0
        assert grads[1].abs().max() == 0


def test_gradcheck_with_episode_starts():
    x, h0, weights = _inputs(6, B=2, D=3, H=2)
    reset = _resets(6, 2, "mid")
    assert torch.autograd.gradcheck(lambda *a: gru_cpu(a[0], a[1], reset, *a[2:]), (x, h0, *weights))


def test_only_the_final_state_or_only_the_outputs_carry_a_loss():
    x, h0, weights = _inputs(7)
    reset = _resets(7, 3, "mid")
    for pick in (0, 1):
        out, ref = gru_cpu(x, h0, reset, *weights)[pick], gru_reference(x, h0, reset, *weights)[pick]
        for got, want in zip(torch.autograd.grad(out.sum(), [x, h0, *weights]),
                             torch.autograd.grad(ref.sum(), [x, h0, *weights])):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("T", [1, 5])
def test_without_autograd_the_same_outputs(T):
    x, h0, weights = _inputs(T)
    reset = _resets(T, 3, "mid" if T > 1 else "start")
    with torch.no_grad():
        y, h = gru_cpu(x, h0, reset, *weights)
    y_grad, h_grad = gru_cpu(x, h0, reset, *weights)
    torch.testing.assert_close(y, y_grad.detach(), rtol=0, atol=0)
    torch.testing.assert_close(h, h_grad.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("layers", [1, 2])
def test_the_core_cpu_path_equals_nn_gru_over_segments(layers):
    """What the core runs on CPU tensors against what it runs on CUDA (``nn.GRU`` over the segments
    between episode starts), here on the CPU: outputs, final state and every parameter's gradient."""
    torch.manual_seed(0)
    core = build_core("gru", 6, {"hidden_size": 5, "num_layers": layers}).double()
    x = torch.randn(11, 4, 6, dtype=torch.float64, requires_grad=True)
    done = torch.zeros(11, 4, dtype=torch.bool)
    done[0, 1] = done[3, 0] = done[3, 2] = done[7, 3] = done[8, 3] = True
    h0 = torch.randn(4, layers, 5, dtype=torch.float64)
    y, state = core(x, {"h": h0}, done)
    y_seg, state_seg = run_in_segments(core.gru, x, {"h": h0}, done, ("h",))
    torch.testing.assert_close(y, y_seg, rtol=0, atol=1e-12)
    torch.testing.assert_close(state["h"], state_seg["h"], rtol=0, atol=1e-12)
    params = [x, *core.gru.parameters()]
    loss = lambda out, s: (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum() \
        + s["h"].pow(2).sum()  # noqa: E731
    for got, want in zip(torch.autograd.grad(loss(y, state), params),
                         torch.autograd.grad(loss(y_seg, state_seg), params)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
