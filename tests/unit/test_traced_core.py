"""The acting step from a TorchScript trace (``fwrl.agents.traced_core``, ``--acting-trace``).

For every core that steps in Python: the traced step gives the eager step's outputs and states bit
for bit over a run of steps with rows resetting (none, some, all), and sees an in-place change of the
weights (a publish); a core whose trace would differ runs eagerly with one warning; what is not a
T = 1 step without autograd is the core's own call; the setting's rule and refusals.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from fwrl.agents.traced_core import TracedCoreStep, traced_acting
from fwrl.errors import FwrlError
from fwrl.memory_modules import build_core

D_IN, B = 5, 6
FWP = dict(num_layers=2, hidden_size=8, num_heads=2, head_dim=4, ff_dim=8)
CORES = {
    "linear_transformer": FWP, "delta_net": FWP, "rdn": FWP, "delta_rnn": FWP, "delta_lstm": FWP,
    "srwm": FWP, "fake_sr": FWP, "sr_delta_net": FWP, "gated_delta_net": FWP,
    "gated_delta_net:writes=2": {**FWP, "writes": 2},
    "elstm": {"hidden_size": 8}, "elstm:rtrl": {"hidden_size": 8, "grad": "rtrl"},
    "gru": {"hidden_size": 8}, "gru:layers=2": {"hidden_size": 8, "num_layers": 2},
}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _resets(step: int, B: int = B) -> torch.Tensor:
    """Row patterns that the steps cycle through: none, one, several, every row."""
    done = torch.zeros(1, B, dtype=torch.bool)
    if step % 4 == 1:
        done[0, B // 2] = True
    elif step % 4 == 2:
        done[0, ::2] = True
    elif step % 4 == 3:
        done[:] = True
    return done


@pytest.mark.parametrize("B", [1, 2, 6])
@pytest.mark.parametrize("name", list(CORES))
def test_the_traced_step_is_the_eager_step_bit_for_bit(name, B):
    torch.manual_seed(0)
    core = build_core(name.split(":")[0], D_IN, dict(CORES[name])).eval()
    assert core.python_recurrence
    traced = TracedCoreStep(core, name)
    g = torch.Generator().manual_seed(1)
    eager_state = core.initial_state(B)
    traced_state = {k: v.clone() for k, v in eager_state.items()}
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the eager step
        for step in range(9):
            x, done = torch.randn(1, B, D_IN, generator=g), _resets(step, B)
            if step == 5:  # a publish: the weights change in place
                for p in core.parameters():
                    p.add_(0.05 * torch.randn(p.shape, generator=g))
            out, eager_state = core(x, eager_state, done)
            traced_out, traced_state = traced(x, traced_state, done)
            assert torch.equal(out, traced_out), step
            assert eager_state.keys() == traced_state.keys()
            for key in eager_state:
                assert torch.equal(eager_state[key], traced_state[key]), (step, key)
    assert list(traced._traces.values())[0] is not None  # it ran from a trace, not eagerly
    assert len(traced._traces) == 1  # one shape, one trace


class _AllResetShortcut(nn.Module):
    """A core whose Python branches on its input's values beyond "some row resets": a trace of it
    would bake in the branch of its example."""

    def forward(self, x, state, done):
        h = state["h"]
        if bool(done.all()):
            h = torch.zeros_like(h)
        else:
            h = h * (~done[0]).to(h.dtype).unsqueeze(-1) + 1.0
        return x + h.unsqueeze(0), {"h": h}


def test_a_core_whose_trace_differs_runs_eagerly_with_one_warning():
    core = _AllResetShortcut()
    traced = TracedCoreStep(core, "shortcut")
    state = {"h": torch.ones(B, D_IN)}
    x = torch.zeros(1, B, D_IN)
    with torch.inference_mode(), pytest.warns(RuntimeWarning, match="shortcut core runs eagerly.*differs"):
        out, new = traced(x, state, torch.ones(1, B, dtype=torch.bool))
    assert torch.equal(new["h"], torch.zeros(B, D_IN))  # the eager answer
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        out, new = traced(x, state, _resets(1))
    assert torch.equal(new["h"][0], torch.full((D_IN,), 2.0)) and list(traced._traces.values()) == [None]


def test_sequences_and_autograd_call_the_core_itself():
    calls = []

    class Counting(nn.Module):
        def forward(self, x, state, done):
            calls.append(x.shape[0])
            return x * 2, state

    traced = TracedCoreStep(Counting())
    state = {"h": torch.zeros(B, 1)}
    traced(torch.ones(3, B, D_IN), state, torch.zeros(3, B, dtype=torch.bool))  # T = 3
    traced(torch.ones(1, B, D_IN, requires_grad=True), state, torch.zeros(1, B, dtype=torch.bool))  # autograd
    assert calls == [3, 1] and not traced._traces
    with torch.no_grad():
        traced(torch.ones(1, B, D_IN), state, torch.zeros(1, B, dtype=torch.bool))
        traced(torch.ones(1, B + 1, D_IN), {"h": torch.zeros(B + 1, 1)}, torch.zeros(1, B + 1, dtype=torch.bool))
    assert len(traced._traces) == 2  # a trace per batch size


def test_the_setting_is_on_for_python_stepped_cores_on_the_cpu():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    rdn, lstm = build_core("rdn", D_IN, dict(FWP)), build_core("lstm", D_IN, {"hidden_size": 8})
    gru = build_core("gru", D_IN, {"hidden_size": 8})  # on the CPU its step is kernels/gru/cpu.py's calls
    assert traced_acting("auto", cpu, rdn) and not traced_acting("auto", cpu, lstm)  # lstm, feedforward
    assert traced_acting("auto", cpu, gru) and not traced_acting("auto", cuda, gru)
    assert not traced_acting("auto", cuda, rdn) and not traced_acting("off", cpu, rdn)
    assert traced_acting("on", cpu, lstm)
    with pytest.raises(FwrlError, match="acting_trace=on traces the acting step on the CPU.*inference_graph"):
        traced_acting("on", cuda, rdn)
    with pytest.raises(FwrlError, match="unknown acting_trace 'yes'.*auto, off, on"):
        traced_acting("yes", cpu, rdn)


def test_a_trace_that_differs_by_round_off_only_is_used():
    """At a 257-wide input (POPGym's multi-task observations) TorchScript's ``addmm`` rounds the GRU's
    input product differently from eager's (~6e-8, every seed tried): the trace is still the step's,
    and is used, with its outputs within float round-off of the eager step's."""
    torch.manual_seed(0)
    core = build_core("gru", 257, {"hidden_size": 16}).eval()
    traced = TracedCoreStep(core, "gru")
    g = torch.Generator().manual_seed(1)
    eager_state = core.initial_state(4)
    traced_state = {k: v.clone() for k, v in eager_state.items()}
    bitwise = True
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the eager step
        for step in range(6):
            x, done = torch.randn(1, 4, 257, generator=g), _resets(step, 4)
            out, eager_state = core(x, eager_state, done)
            traced_out, traced_state = traced(x, traced_state, done)
            bitwise &= torch.equal(out, traced_out)
            torch.testing.assert_close(traced_out, out, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(traced_state["h"], eager_state["h"], rtol=1e-5, atol=1e-6)
    assert list(traced._traces.values())[0] is not None  # it ran from a trace
    if bitwise:
        pytest.skip("this machine's BLAS rounds the traced and eager products alike: nothing to tell apart")
