"""``fwrl inspect``: the arrays of what a core does per step (their shapes per core family), one
property (on a Delta Net built to retrieve the first step's write at the last step, the read
matches the first step's key most), and the command's PNG and NPZ."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fwrl.envs.registry import describe_env
from fwrl.evaluation.memory_trace import MemoryTracer, kind_of, read_match, trace_episodes
from fwrl.evaluation.playback import env_for
from fwrl.memory_modules import build_core
from fwrl.runner.agent import build_model
from fwrl.settings.config import TrainConfig

ENV = "memory:cue_delay?delay=3"  # episodes of 5 steps
FWP = {"num_layers": 2, "hidden_size": 16, "num_heads": 2, "head_dim": 8, "ff_dim": 16}
SRWM = {"num_layers": 2, "hidden_size": 16, "num_heads": 2, "head_dim": 8, "ff_dim": 16}
RNN = {"hidden_size": 12, "num_layers": 2}


def traced(core: str, options: dict, episodes: int = 2) -> list[dict]:
    torch.manual_seed(0)
    model = build_model(TrainConfig.from_dict({"env": ENV, "core": core, "core_options": options}), describe_env(ENV))
    return trace_episodes(model, env_for(ENV), episodes=episodes)


@pytest.mark.parametrize("core, options, expected", [
    ("delta_net", FWP, {"beta": (2,), "write": (2,), "norm": (2,), "query": (2, 8), "key": (2, 8), "match": "TTH"}),
    ("gated_delta_net", FWP, {"beta": (2,), "alpha": (2,), "write": (2,), "query": (2, 8), "match": "TTH"}),
    ("rdn", FWP, {"beta": (2,), "write": (2,), "key": (2, 8), "match": "TTH"}),
    ("srwm", SRWM, {"beta": (2, 4), "self_modification": (2, 4), "query": (2, 8), "key": (2, 8), "match": "TTH"}),
    ("lstm", RNN, {"input_gate": (12,), "forget_gate": (12,), "output_gate": (12,), "h_norm": (), "c_norm": ()}),
    ("gru", RNN, {"reset_gate": (12,), "update_gate": (12,), "h_norm": ()}),
])
def test_arrays_have_a_row_per_step_for_each_layer(core, options, expected):
    episodes = traced(core, options)
    assert len(episodes) == 2
    for arrays in episodes:
        T = int(arrays["length"])
        assert T == 5 and arrays["actions"].shape == (T,) and arrays["values"].shape == (T,)
        assert arrays["observations"].shape == (T, 3) and arrays["rewards"].shape == (T,)
        for layer in ("l0", "l1"):
            for name, shape in expected.items():
                value = arrays[f"{layer}/{name}"]
                if shape == "TTH":
                    assert value.shape == (T, T, options["num_heads"]), name
                    assert np.isnan(value[np.triu_indices(T, k=1)]).all()  # no read of a later key
                    assert not np.isnan(value[np.tril_indices(T)]).any()
                else:
                    assert value.shape == (T, *shape), name
        for gate in ("input_gate", "forget_gate", "update_gate", "beta", "alpha"):
            for name, value in arrays.items():
                if name.endswith("/" + gate):
                    assert ((value >= 0) & (value <= 1)).all(), name
        state = [name for name in arrays if name.startswith("state/")]
        assert state and all(arrays[name].shape == (T,) for name in state)


def test_the_first_step_writes_from_nothing():
    """Every episode starts from empty fast weights: the first step's change is the whole matrix."""
    for arrays in traced("delta_net", FWP):
        np.testing.assert_allclose(arrays["l0/write"][0], arrays["l0/norm"][0], rtol=1e-5)
    for arrays in traced("lstm", RNN):
        np.testing.assert_allclose(arrays["state/h/change"][0], arrays["state/h/norm"][0], rtol=1e-5)


def test_every_core_is_traced_at_least_by_its_state():
    from fwrl.memory_modules import core_names

    for core in ("delta_rnn", "delta_lstm", "fake_sr", "feedforward", "linear_transformer", "sr_delta_net"):
        assert core in core_names()
        options = {} if core == "feedforward" else FWP if core in ("delta_rnn", "delta_lstm", "linear_transformer") else SRWM
        (arrays,) = traced(core, options, episodes=1)
        assert arrays["length"] == 5
        if core == "sr_delta_net":  # its SRWM's own, beside its Delta Net's
            assert arrays["l0/srwm_beta"].shape == (5, 2, 4) and arrays["l0/match"].shape == (5, 5, 2)
    assert kind_of(build_core("delta_net", 8, FWP)) == "delta" and kind_of(build_core("lstm", 8, RNN)) == "lstm"


def test_the_last_read_matches_the_first_steps_key_on_a_delta_net_built_to_recall_it():
    """A one-layer, one-head Delta Net whose slow net reads the key from the input's first half and
    the query from its second: the first step shows key direction 0, the middle steps other
    directions, the last step queries direction 0. Its read at the last step matches the first
    step's key more than any other step's."""
    d, T = 4, 8
    core = build_core("delta_net", 2 * d, {"num_layers": 1, "hidden_size": 2 * d, "num_heads": 1, "head_dim": d,
                                           "ff_dim": 4, "pre_norm": False, "feature_map": "softmax"})
    with torch.no_grad():
        core.input_proj.weight.copy_(torch.eye(2 * d))
        core.input_proj.bias.zero_()
        w = torch.zeros(3 * d + 1, 2 * d)  # [q | k | v | beta] from [k-part | q-part]
        w[:d, d:] = torch.eye(d)  # q <- the second half
        w[d:2 * d, :d] = torch.eye(d)  # k <- the first half
        w[2 * d:3 * d, :d] = torch.eye(d)  # v <- the key too
        core.blocks[0].fwp.slow_net.weight.copy_(w)
    x = torch.zeros(T, 2 * d)
    x[0, 0] = 6.0  # the first step writes under key direction 0
    for t in range(1, T - 1):
        x[t, 1 + (t % (d - 1))] = 6.0  # the others under directions 1..3
    x[T - 1, d + 0] = 6.0  # the last step queries direction 0
    tracer = MemoryTracer(core)
    state = core.initial_state(1)
    with torch.inference_mode():
        for t in range(T):
            _, state = core(x[t].view(1, 1, -1), state, torch.tensor([[t == 0]]))
    arrays = tracer.episode()
    tracer.close()
    last = arrays["l0/match"][T - 1, :, 0]
    assert last.shape == (T,) and np.argmax(last) == 0
    assert last[0] > 2 * last[1:].max()
    np.testing.assert_allclose(arrays["l0/match"], read_match(arrays["l0/query"], arrays["l0/key"]))
    assert not core._forward_hooks and not core.blocks[0].fwp._forward_hooks  # closed: hooks gone


def test_cli_inspect_writes_a_png_and_the_arrays_per_episode(tmp_path):
    from cli_runs import assert_refused, run_cli, write_memory_checkpoint

    write_memory_checkpoint(tmp_path / "run")  # a fresh LSTM agent of memory:cue_delay
    code, _, err = run_cli(["inspect", tmp_path / "run", "--episodes", "2", "--out", tmp_path / "out"])
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "episode-0.npz", "episode-0.png", "episode-1.npz", "episode-1.png"]
    with np.load(tmp_path / "out" / "episode-1.npz") as arrays:
        T = int(arrays["length"])
        assert T == 12 and arrays["l0/forget_gate"].shape == (T, 16)
    assert (tmp_path / "out" / "episode-0.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for argv, needle in ([["--out", tmp_path / "run" / "checkpoint.pt"], "is a file"],
                         [["--episodes", "0"], "episodes"], [["--env", "memory:cue_delay?num_cues=3"], "actions"]):
        code, _, err = run_cli(["inspect", tmp_path / "run", *argv])
        assert_refused(code, err, needle)
    code, _, err = run_cli(["inspect", tmp_path / "nothing"])
    assert_refused(code, err, "pass a run folder")
