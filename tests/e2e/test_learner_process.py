"""The learner's update in a process of its own (``--learner-process``, fwrl.agents.learner_process):
the same maths as the learner thread's, bit for bit; its failures named; a run trained with it
checkpoints the optimiser's state it trained and resumes from it."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from fwrl.agents.learner import Learner, LearnerSettings
from fwrl.agents.learner_process import UpdateProcess
from fwrl.agents.optim import linear_decay_scheduler, make_optimizer
from fwrl.agents.policy_weights import PolicyWeights, acting_copy
from fwrl.agents.rollouts import Batch
from fwrl.envs.registry import describe_env
from fwrl.errors import FwrlError
from fwrl.runner.agent import build_model, resolve_core_options
from fwrl.settings.config import TrainConfig
from tests.cli_runs import train_cli

T, B = 5, 3


def _learner(core: str, process: bool, device: str = "cpu") -> tuple[Learner, object]:
    config = TrainConfig(env="memory:cue_delay", core=core, unroll_length=T, batch_size=B,
                         core_options={"hidden_size": 16, "num_heads": 2, "head_dim": 8, "ff_dim": 32, "num_layers": 1}
                         if core != "lstm" else {"hidden_size": 16})
    info = describe_env(config.env)
    config = resolve_core_options(config, info)
    torch.manual_seed(0)
    model = build_model(config, info).to(device)
    optimizer = make_optimizer(model.parameters(), lr=1e-3, bias_correction=True)
    scheduler = linear_decay_scheduler(optimizer, total_steps=10_000, steps_per_update=T * B)
    settings = LearnerSettings()
    update = UpdateProcess(model, optimizer, scheduler, settings, None, 1) if process else None
    learner = Learner(model, PolicyWeights(acting_copy(model)), optimizer, scheduler, settings, None,
                      process=update)
    return learner, info


def _batch(info, seed: int, learner: Learner) -> Batch:
    g = torch.Generator().manual_seed(seed)
    tensors = {"obs": torch.randn(T + 1, B, *info.obs_shape, generator=g),
               "reward": torch.randn(T + 1, B, generator=g),
               "done": torch.rand(T + 1, B, generator=g) < 0.2,
               "truncated": torch.zeros(T + 1, B, dtype=torch.bool),
               "bootstrap_value": torch.zeros(T + 1, B),
               "action": torch.randint(info.num_actions, (T + 1, B), generator=g),
               "policy_logits": torch.randn(T + 1, B, info.num_actions, generator=g),
               "baseline": torch.randn(T + 1, B, generator=g)}
    state = {name: torch.randn(value.shape, generator=g)
             for name, value in learner.model.initial_state(B).items()}
    tensors, state = ({name: value.to(learner.device) for name, value in part.items()} for part in (tensors, state))
    return Batch(tensors, state, versions=[[0] * (T + 1)], widths=[B])


@pytest.mark.parametrize("core", ["srwm", "lstm"])
def test_the_update_process_trains_like_the_learner_thread_bit_for_bit(core):
    here, info = _learner(core, process=False)
    there, _ = _learner(core, process=True)
    there.start()
    try:
        for seed in range(3):  # three updates: the optimiser's state and the schedule carry across them
            expected = here.update_batch(_batch(info, seed, here))
            got = there.update_batch(_batch(info, seed, there))
            assert got.keys() == expected.keys()
            assert all(got[k] == expected[k] for k in expected), (got, expected)
            for (name, a), b in zip(here.model.state_dict().items(), there.model.state_dict().values()):
                assert torch.equal(a, b), name  # the parent's weights are the ones the process trained
            for a, b in zip(here.weights.model.parameters(), there.weights.model.parameters()):
                assert torch.equal(a, b)  # and published to the acting copy
        assert there.timer.collect()[0]["learner_forward"] > 0  # the process's stage times came back
        there.sync()
        mine, theirs = here.optimizer.state_dict(), there.optimizer.state_dict()
        assert mine["param_groups"] == theirs["param_groups"]
        for index, state in mine["state"].items():
            for key, value in state.items():
                assert torch.equal(value, theirs["state"][index][key]), (index, key)
        assert here.scheduler.state_dict() == there.scheduler.state_dict()
        assert there.stats.updates == 3 and there.stats.agent_steps == 3 * T * B
    finally:
        there.close()
    assert not there.process.running


def test_a_failing_or_dead_update_process_is_named():
    learner, info = _learner("srwm", process=True)
    learner.start()
    try:
        batch = _batch(info, 0, learner)
        broken = Batch({**batch.tensors, "obs": batch.tensors["obs"][..., :1]}, batch.initial_state,
                       batch.versions, batch.widths)
        with pytest.raises(FwrlError, match=r"(?s)update process failed during 'update'.*Traceback"):
            learner.update_batch(broken)
        assert learner.update_batch(batch)["grad_norm"] > 0  # it serves on after an error
        os.kill(learner.process._process.pid, signal.SIGKILL)
        with pytest.raises(FwrlError, match=r"update process died \(exit code -9\) during 'update'"):
            learner.update_batch(batch)
    finally:
        learner.process.close()


def test_a_stop_while_it_starts_kills_it_untrained():
    import threading

    learner, _ = _learner("lstm", process=True)
    stop = threading.Event()
    stop.set()
    before = [p.clone() for p in learner.model.parameters()]
    assert learner.start(stop) is False  # said at once: a Ctrl-C during start-up does not wait for it
    process = learner.process._process
    learner.close()  # nothing to sync: it never trained
    assert not process.is_alive() and not learner.process.running
    assert all(torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))


def test_refused_where_it_cannot_serve():
    from fwrl.runner.concurrency import update_process

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert update_process("auto", cpu, 1, 100_000) and not update_process("auto", cpu, 1, 99_999)
    assert not update_process("auto", cuda, 1, 10**9) and not update_process("auto", cpu, 2, 10**9)
    assert update_process("on", cpu, 1, 10) and not update_process("off", cpu, 1, 10**9)
    assert update_process("on", cuda, 1, 10)  # asked for: the GPU suite times it (tests/unit/test_gpu_data_path.py)
    assert not update_process("auto", cpu, 1, 10**9, max_seconds=59) and update_process("auto", cpu, 1, 10**9, 60)
    assert not update_process("auto", cpu, 1, 10**9, python_recurrence=False)  # lstm, feedforward
    with pytest.raises(FwrlError, match="device is mps: use learner_process=auto"):
        update_process("on", torch.device("mps"), 1, 10)
    with pytest.raises(FwrlError, match="trains CPU or CUDA models; this one is on meta"):
        UpdateProcess(torch.nn.Linear(2, 2, device="meta"), None, None, None, None, 1)
    with pytest.raises(FwrlError, match="this run has 2"):
        update_process("on", cpu, 2, 10)
    with pytest.raises(FwrlError, match="valid choices: auto, off, on"):
        update_process("yes", cpu, 1, 10)


def test_a_run_with_the_update_process_checkpoints_what_it_trained_and_resumes(tmp_path):
    common = ["--preset", "quickstart", "--core", "srwm", "--learner-process", "on", "--runs-dir", str(tmp_path),
              "--name", "run", "--num-workers", "1", "--envs-per-worker", "4", "--batch-size", "4",
              "--unroll-length", "10", "--device", "cpu", "--num-threads", "1"]
    done = train_cli(*common, "--total-steps", "400")
    assert done.returncode == 0, done.stderr[-2000:]
    first = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    assert first["updates"] == 10
    steps = {int(s["step"]) for s in first["optimizer"]["state"].values()}
    assert steps == {10}, steps  # the optimiser's state as the process left it, not the parent's untouched copy
    assert first["scheduler"]["agent_steps"] == 400
    done = train_cli("--runs-dir", str(tmp_path), "--name", "run", "--total-steps", "800", "--resume")
    assert done.returncode == 0, done.stderr[-2000:]
    second = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    assert second["updates"] == 20 and {int(s["step"]) for s in second["optimizer"]["state"].values()} == {20}
    assert any(not torch.equal(first["model"][k], second["model"][k]) for k in first["model"])
