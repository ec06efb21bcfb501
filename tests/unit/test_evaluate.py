"""fwrl evaluate: normalisation, protocols, reproducible episode selection, every core, CLI, eval_every."""

from __future__ import annotations

import json
import math
import threading

import numpy as np
import pytest
import torch

from fwrl.agents.checkpoint import save_checkpoint
from fwrl.agents.model import AgentNet
from fwrl.agents.optim import linear_decay_scheduler, make_optimizer
from fwrl.envs.env_group import EnvGroup, worker_seed
from fwrl.envs.registry import make_env
from fwrl.envs.step_record import StepRecord
from fwrl.envs.worker_pool import PoolSettings, StepResult
from fwrl.errors import FwrlError
from fwrl.launch.cli import main
from fwrl.evaluation import evaluate as ev
from fwrl.evaluation import scores
from fwrl.evaluation.episodes import collect_episodes, slots_per_task
from fwrl.evaluation.protocols import default_protocol, select_splits
from fwrl.evaluation.results import aggregate, task_rows
from fwrl.settings.config import TrainConfig
from fwrl.runner.agent import load_agent
from fwrl.memory_modules import core_names

CUES = 4
ENV = f"memory:cue_delay?delay=2&num_cues={CUES}"
FWP_TINY = {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "head_dim": 16, "ff_dim": 32}
TINY = {"lstm": {"hidden_size": 32}, "gru": {"hidden_size": 32}, "elstm": {"hidden_size": 32}, "feedforward": {}}


class InlinePool:
    """A pool's interface with EnvGroups stepped in this process (no spawn: fast tests)."""

    def __init__(self, env: str, num_workers: int, envs_per_worker: int, seed: int):
        self.num_workers, self.envs_per_worker = num_workers, envs_per_worker
        settings = PoolSettings(env, num_workers, envs_per_worker, seed, "test")
        self.groups = [EnvGroup(settings, w) for w in range(num_workers)]
        space = self.groups[0].envs[0].observation_space
        record = StepRecord.of(space.shape, str(space.dtype))
        self.out = [record.allocate(envs_per_worker) for _ in range(num_workers)]
        self.pending: dict[int, list] = {}
        self.closed = False

    @property
    def num_slots(self):
        return self.num_workers * self.envs_per_worker

    def start(self):
        for w, group in enumerate(self.groups):
            group.reset(self.out[w])
            self.pending[w] = []

    def wait(self, timeout=None):
        results = [StepResult(w, 0, {k: v.copy() for k, v in self.out[w].items()}, eps)
                   for w, eps in sorted(self.pending.items())]
        self.pending = {}
        return results

    def act(self, worker, actions):
        self.pending[worker] = self.groups[worker].step(actions, self.out[worker])

    def close(self):
        self.closed = True


def tiny_options(core: str) -> dict:
    return TINY.get(core, FWP_TINY)


def first_action_model(core: str = "lstm") -> AgentNet:
    """Zero policy weights: logits all equal, so greedy always takes action 0 and sampling is uniform."""
    torch.manual_seed(0)
    model = AgentNet((CUES + 1,), CUES, core, tiny_options(core), None)
    with torch.no_grad():
        model.policy.weight.zero_()
        model.policy.bias.zero_()
    return model


def cue_sequence(worker: int, slot: int, seed: int, n: int) -> list[int]:
    """The cues slot (worker, slot) of an EnvGroup shows in its first n episodes."""
    env = make_env(ENV, worker_index=worker, seed=worker_seed(seed, worker, 0, slot), mode="test")
    return [int(np.argmax(env.reset()[0][:CUES])) for _ in range(n)]


def write_checkpoint(path, model: AgentNet, core: str, options: dict, env: str = ENV, **config_keys) -> None:
    optimizer = make_optimizer(model.parameters(), lr=1e-3)
    config = TrainConfig(env=env, core=core, core_options=options, **config_keys)
    save_checkpoint(path, model=model, optimizer=optimizer, scheduler=linear_decay_scheduler(optimizer, 100, 10),
                    agent_steps=1234, updates=5, config=config.to_dict(),
                    env_info={"obs_shape": list(model.obs_shape), "obs_dtype": "float32",
                              "num_actions": model.num_actions, "task_names": ["cue_delay"]})


# ----------------------------------------------------------------------------- normalisation

def test_atari_and_dmlab_human_normalised_against_hand_values():
    assert scores.atari_human_normalised("Pong", 0.0) == pytest.approx(20.7 / 35.3)
    assert scores.atari_human_normalised("Breakout", 16.1) == pytest.approx(0.5)
    assert scores.atari_human_normalised("Breakout", 1.7) == pytest.approx(0.0)
    assert scores.normalise("atari", "Seaquest", 42054.7) == pytest.approx(1.0)
    assert scores.normalise("dmlab", "rooms_watermaze", 29.0325) == pytest.approx(0.5)
    assert scores.normalise("dmlab", "rooms_select_nonmatching_object", 65.9) == pytest.approx(1.0)
    assert scores.normalise("atari", "Tetris", 10.0) is None  # no constants: not normalised
    assert scores.normalise("memory", "cue_delay", 1.0) is None
    with pytest.raises(FwrlError, match="Pong"):
        scores.atari_human_normalised("Pongg", 1.0)


def test_procgen_min_max_with_easy_hard_and_memory_constants():
    assert scores.normalise("procgen", "bigfish", 20.5, {"distribution": "easy"}) == pytest.approx(0.5)
    assert scores.normalise("procgen", "bigfish", 20.0, {"distribution": "hard"}) == pytest.approx(0.5)
    assert scores.normalise("procgen", "maze", 7.0, {"distribution": "memory"}) == pytest.approx(0.5)  # hard
    assert scores.normalise("procgen", "starpilot", 2.5, {}) == pytest.approx(0.0)
    assert scores.normalise("procgen", "chaser", 5.0, {"distribution": "extreme"}) is None


def test_aggregates_average_normalised_scores_over_games_and_test_splits():
    def run(task, split, mean):
        env = f"procgen:{task}?distribution=easy"
        return {"task": task, "split": split, "env": env, "mean": mean, "returns": [mean - 1, mean + 1]}

    runs = [run("bigfish", "test_1000", 20.5), run("bigfish", "test_1200", 40.0),
            run("maze", "test_1000", 5.0), run("maze", "test_1200", 7.5)]
    rows = {(r["task"], r["split"]): r for r in aggregate(runs, "procgen", {"distribution": "easy"})}
    assert rows[("bigfish", "test_1000")]["normalised"] == pytest.approx(0.5)
    assert rows[("bigfish", "test_1000")]["std"] == pytest.approx(1.0)
    assert rows[("bigfish", "test")]["normalised"] == pytest.approx(0.75)  # (0.5 + 1.0) / 2
    assert rows[("maze", "test")]["normalised"] == pytest.approx(0.25)  # (0 + 0.5) / 2
    assert rows[("*", "test")]["normalised"] == pytest.approx(0.5)
    assert rows[("*", "test_1200")]["normalised"] == pytest.approx(0.75)
    assert rows[("*", "test_1200")]["median_normalised"] == pytest.approx(0.75)
    # a split's per-task rows, as fwrl plot --random and benchmarks/learning/above_random.py read them
    result = {"aggregates": aggregate(runs, "procgen", {"distribution": "easy"})}
    split, by_task = task_rows(result)
    assert split == "test_1000" and sorted(by_task) == ["bigfish", "maze"]  # no train split: the first
    assert task_rows(result, "test_1200")[1]["bigfish"]["mean"] == pytest.approx(40.0)
    with pytest.raises(KeyError, match="no split 'train'; it has test_1000, test_1200"):
        task_rows(result, "train")


def test_published_figures_match_their_setting():
    games = ("bigfish", "fruitbot", "maze", "leaper", "plunder", "starpilot")
    (srwm,) = scores.published_for("procgen", "*", "test", "srwm", games=games)
    assert srwm.value == 20.0 and srwm.metric == "normalised_x100"
    assert scores.published_for("procgen", "*", "test", "srwm", games=games[:3]) == []
    (rtrl,) = scores.published_for("dmlab", "rooms_watermaze", "test", "elstm", {"grad": "rtrl"}, 50)
    assert rtrl.value == 52.3
    (tbptt,) = scores.published_for("dmlab", "rooms_watermaze", "test", "elstm", {}, 10)  # bptt is the default
    assert tbptt.value == 15.8
    assert [p.value for p in scores.published_for("atari", "Pong", "test", "rdn")] == [21.0]
    assert scores.published_for("atari", "Pong", "test", "srwm") == []
    (gru,) = scores.published_for("popgym", "CountRecall", "test", "gru")  # Easy, the difficulty by default
    assert gru.value == 0.177 and gru.metric == "return"
    assert [p.value for p in scores.published_for("popgym", "Autoencode", "test", "gru",
                                                  env_options={"difficulty": "easy"})] == [-0.283]
    assert scores.published_for("popgym", "CountRecall", "test", "gru", env_options={"difficulty": "hard"}) == []
    assert scores.published_for("popgym", "CountRecall", "test", "srwm") == []


# ----------------------------------------------------------------------------- protocols

def test_default_protocols_per_family():
    p = default_protocol("procgen:bigfish+maze?num_levels=200")
    assert (p.episodes, p.repeats) == (200, 1)
    assert [s.name for s in p.splits] == ["train", "test_1000", "test_1200", "test_1400"]
    assert "start_level=0" in p.splits[0].env and "num_levels=200" in p.splits[0].env
    assert "start_level=1200" in p.splits[2].env and "num_levels=200" in p.splits[2].env
    memory = default_protocol("procgen:heist?distribution=memory")
    assert "num_levels=500" in memory.splits[0].env
    assert (default_protocol("atari:Pong").episodes, default_protocol("atari:Pong").repeats) == (30, 5)
    assert default_protocol("dmlab:rooms_watermaze").repeats == 3
    assert [s.name for s in default_protocol(ENV).splits] == ["test"]
    with pytest.raises(FwrlError, match="test_1000"):
        select_splits(p.splits, ["test_1600"])


def test_multi_task_evaluation_needs_a_worker_per_game():
    assert slots_per_task(2, 4, 3) == {0: 6, 1: 6}
    with pytest.raises(FwrlError, match="at least 3 workers"):
        slots_per_task(3, 2, 1)


# ----------------------------------------------------------------------------- episodes

def test_greedy_takes_argmax_and_keeps_first_episodes_per_slot_in_order():
    model, seed, n = first_action_model(), 5, 10
    pool = InlinePool(ENV, 2, 2, seed)
    (eps,) = collect_episodes(model, pool, ENV, episodes=n, greedy=True, seed=seed).values()
    assert pool.closed and len(eps) == n
    quota = math.ceil(n / 4)
    assert [(e.index, e.worker, e.slot) for e in eps] == sorted((i, w, j) for i in range(quota) for w in (0, 1)
                                                                for j in (0, 1))[:n]
    cues = {(w, j): cue_sequence(w, j, seed, quota) for w in (0, 1) for j in (0, 1)}
    # greedy always answers 0: reward 1 exactly for the episodes whose cue was 0
    assert [e.episode_return for e in eps] == [float(cues[(e.worker, e.slot)][e.index] == 0) for e in eps]
    assert all(e.length == 4 for e in eps)  # delay 2: cue, 2 blanks, query


def test_a_second_wait_before_acting_ends_at_its_timeout():
    """The acting loop waits again for more workers to join a batch before it acts (min_batch: half the
    workers), as it does once fewer are still playing (multi-task ProcGen: games finish their quotas at
    different times). No worker is stepping then: the collector's wait must end at its timeout with
    nothing, not loop forever (a 6-game random-policy evaluation hung at 489 of 600 episodes)."""
    from fwrl.evaluation.episodes import EpisodeCollector

    collector = EpisodeCollector(InlinePool(ENV, 2, 1, 0), num_tasks=1, quota={0: 3})
    collector.start()
    assert [r.worker for r in collector.wait(1.0)] == [0, 1]
    answer: list = []
    waiting = threading.Thread(target=lambda: answer.append(collector.wait(0.05)), daemon=True)
    waiting.start()
    waiting.join(5.0)
    assert not waiting.is_alive() and answer == [[]]
    for worker in (0, 1):  # acting after the empty wait: the next wait has both workers' results
        collector.act(worker, np.zeros(1, dtype=np.int64))
    assert [r.worker for r in collector.wait(1.0)] == [0, 1]


def test_sampling_differs_from_greedy_and_is_seeded():
    model, seed, n = first_action_model(), 3, 48
    greedy = collect_episodes(model, InlinePool(ENV, 2, 4, seed), ENV, episodes=n, greedy=True, seed=seed)[0]
    sample = collect_episodes(model, InlinePool(ENV, 2, 4, seed), ENV, episodes=n, greedy=False, seed=seed)[0]
    again = collect_episodes(model, InlinePool(ENV, 2, 4, seed), ENV, episodes=n, greedy=False, seed=seed)[0]
    g = [e.episode_return for e in greedy]
    s = [e.episode_return for e in sample]
    assert s == [e.episode_return for e in again]
    # same cues in both runs; greedy is right only on cue 0 (about 1/4), uniform sampling on 1/4 of all
    assert s != g
    assert 0.0 < np.mean(s) < 1.0


class Recorder(torch.nn.Module):
    """Wraps an agent and keeps the policy logits of every batched forward the inference loop makes."""

    def __init__(self, model: AgentNet):
        super().__init__()
        self.model = model
        self.logits: list[torch.Tensor] = []

    def initial_state(self, batch_size, device=None):
        return self.model.initial_state(batch_size, device)

    def forward(self, inputs, state, greedy=False):
        out, state = self.model(inputs, state, greedy=greedy)
        self.logits.append(out["policy_logits"][0].clone())
        return out, state


def replay(model: AgentNet, worker: int, slot: int, seed: int, n: int) -> tuple[list[float], torch.Tensor]:
    """One env, one slot, one step at a time, the core state carried and reset by done (the reference).

    Returns the first n episode returns and the policy logits of every step.
    """
    env = make_env(ENV, worker_index=worker, seed=worker_seed(seed, worker, 0, slot), mode="test")
    obs, _ = env.reset()
    state, reward, done, total, returns, logits = model.initial_state(1), 0.0, True, 0.0, [], []
    with torch.no_grad():
        while len(returns) < n:
            inputs = {"obs": torch.from_numpy(obs)[None, None], "reward": torch.tensor([[reward]]),
                      "done": torch.tensor([[done]])}
            out, state = model(inputs, state, greedy=True)
            logits.append(out["policy_logits"][0, 0])
            obs, reward, terminated, truncated, _ = env.step(int(out["action"][0, 0]))
            total += reward
            done = terminated or truncated
            if done:
                returns.append(total)
                total = 0.0
                obs, _ = env.reset()
    return returns, torch.stack(logits)


@pytest.mark.parametrize("core", core_names())
def test_every_core_evaluates_from_a_checkpoint_with_state_through_episodes(core, tmp_path):
    torch.manual_seed(1)
    model = AgentNet((CUES + 1,), CUES, core, tiny_options(core), None)
    write_checkpoint(tmp_path / "checkpoint.pt", model, core, tiny_options(core))
    loaded, payload, path = load_agent(tmp_path)
    assert path == tmp_path / "checkpoint.pt" and payload["agent_steps"] == 1234
    seed, recorder = 11, Recorder(loaded)
    got = collect_episodes(recorder, InlinePool(ENV, 2, 2, seed), ENV, episodes=8, greedy=True, seed=seed)[0]
    expected = {(w, j): replay(model, w, j, seed, 2) for w in (0, 1) for j in (0, 1)}
    assert [e.episode_return for e in got] == [expected[(e.worker, e.slot)][0][e.index] for e in got]
    # every step of every slot: the same logits as the one-slot replay, so the core state was carried
    # through each episode (and reset between them) exactly as the model's own recurrence does
    seen = torch.stack(recorder.logits)  # [steps, slots, actions]
    assert seen.shape == (8, 4, CUES)  # 2 episodes x 4 steps, all four slots in every batch
    for (w, j), (_, logits) in expected.items():
        torch.testing.assert_close(seen[:, 2 * w + j], logits, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- local workers, CLI

def test_evaluation_through_local_workers_is_reproducible():
    model = first_action_model()
    kwargs = dict(episodes=5, greedy=False, num_workers=2, envs_per_worker=2, seed=7, core="lstm")
    first = ev.evaluate(model, ENV, **kwargs)
    second = ev.evaluate(model, ENV, **kwargs)
    assert json.dumps(first) == json.dumps(second)
    (run,) = first["runs"]
    assert run["episodes"] == 5 and len(run["returns"]) == 5 and run["split"] == "test"
    assert first["aggregates"][0]["success"] == pytest.approx(np.mean(run["returns"]))


def test_cli_evaluate_writes_json_and_markdown(tmp_path, capsys):
    model = first_action_model()
    write_checkpoint(tmp_path / "checkpoint.pt", model, "lstm", tiny_options("lstm"))
    code = main(["evaluate", str(tmp_path), "--episodes", "3", "--num-workers", "1", "--envs-per-worker", "3",
                 "--seed", "4"])
    assert code == 0
    result = json.loads((tmp_path / "evaluation.json").read_text())
    assert result["agent_steps"] == 1234 and result["policy"] == "greedy" and result["core"] == "lstm"
    assert len(result["runs"][0]["returns"]) == 3
    md = (tmp_path / "evaluation.md").read_text()
    assert "| cue_delay | test | 3 |" in md
    assert "cue_delay" in capsys.readouterr().out
    # bad input: one paragraph, exit 2, before any worker starts
    assert main(["evaluate", str(tmp_path), "--splits", "train"]) == 2
    assert "valid choices: test" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path), "--env", "memory:cue_delay?num_cues=3"]) == 2
    assert "actions" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "nothing")]) == 2


def test_periodic_evaluator_writes_eval_metrics_rows():
    config = TrainConfig(env=ENV, core="lstm", core_options=tiny_options("lstm"), eval_every=100, eval_episodes=4)
    evaluator = ev.PeriodicEvaluator(config, torch.device("cpu"))
    model, lock = first_action_model(), threading.Lock()
    assert not evaluator.maybe_start(99, model, lock)
    assert evaluator.maybe_start(130, model, lock)
    assert not evaluator.maybe_start(150, model, lock)  # next mark is 200
    evaluator.close(wait=True)
    (row,) = evaluator.poll()
    assert row["agent_steps"] == 130
    assert 0.0 <= row["eval/test/mean_return"] <= 1.0
    assert row["eval/test/success"] == row["eval/test/mean_return"]
    assert evaluator.next_at == 200


def test_cli_evaluate_checks_where_it_writes_before_playing(tmp_path, monkeypatch, capsys, read_only):
    """An output that cannot be written is refused before any episode (a read-only run folder)."""
    run = tmp_path / "run"
    run.mkdir()
    write_checkpoint(run / "checkpoint.pt", first_action_model(), "lstm", tiny_options("lstm"))
    played = []
    monkeypatch.setattr(ev, "evaluate", lambda *a, **k: played.append(1) or pytest.fail("played episodes"))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["evaluate", str(run), "--out", str(blocker / "eval.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fwrl: error: evaluation JSON") and "not writable" in err and "--out" in err
    assert main(["evaluate", str(run), "--out", str(run)]) == 2  # a folder is not a file
    assert "it is a folder" in capsys.readouterr().err
    read_only(run)
    assert main(["evaluate", str(run)]) == 2
    assert f"{run / 'evaluation.json'} is not writable (Permission denied)" in capsys.readouterr().err
    assert not played



def test_cli_evaluate_writes_elsewhere_with_out(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_checkpoint(run / "checkpoint.pt", first_action_model(), "lstm", tiny_options("lstm"))
    out = tmp_path / "elsewhere" / "eval.json"
    assert main(["evaluate", str(run), "--episodes", "2", "--num-workers", "1", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["runs"][0]["episodes"] == 2 and out.with_suffix(".md").is_file()
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt"]


def test_cli_evaluate_refuses_a_checkpoint_its_run_folder_does_not_describe(tmp_path, capsys):
    """A run folder whose config.yaml names another env than its checkpoint's agent (a checkpoint copied
    in from another run) is refused in one line, before any episode or file."""
    from fwrl.settings.config import TrainConfig, save_config

    run = tmp_path / "run"
    run.mkdir()
    write_checkpoint(run / "checkpoint.pt", first_action_model(), "lstm", tiny_options("lstm"))
    save_config(TrainConfig(env="minatar:breakout", core="lstm"), run / "config.yaml")
    assert main(["evaluate", str(run), "--episodes", "2", "--num-workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "its run folder's config.yaml says 'minatar:breakout'" in err and "copied from another run" in err
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "config.yaml"]


def test_cli_evaluate_refuses_to_file_an_evaluation_under_another_run(tmp_path, capsys):
    """A gru checkpoint placed in an lstm run's folder: its evaluation is not written there as the lstm
    run's, whether the run ids say so (run.json, the checkpoint's run) or, for checkpoints and folders
    of fwrl before run ids, the folder's config.yaml; --out writes it elsewhere."""
    import json as _json

    from fwrl.settings.config import TrainConfig, save_config

    run = tmp_path / "lstm-run"
    run.mkdir()
    save_config(TrainConfig(env=ENV, core="lstm", core_options=tiny_options("lstm")), run / "config.yaml")
    write_checkpoint(run / "checkpoint.pt", first_action_model("gru"), "gru", tiny_options("gru"))  # no run id
    assert main(["evaluate", str(run), "--episodes", "2", "--num-workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "is an agent of core 'gru', but its run folder's config.yaml says core 'lstm'" in err, err
    assert "--out PATH" in err and err.count("\n") == 1
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "config.yaml"]

    (run / "run.json").write_text(_json.dumps({"id": "lstm-run-id"}))  # with run ids: another run's checkpoint
    payload = torch.load(run / "checkpoint.pt", weights_only=True)
    payload["run"] = {"id": "gru-run-id", "dir": "/elsewhere/gru-run"}
    payload.pop("checksum")
    from fwrl.agents.checkpoint import write_checkpoint as write_payload

    write_payload(run / "checkpoint.pt", payload)
    assert main(["evaluate", str(run / "checkpoint.pt"), "--episodes", "2", "--num-workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "is a checkpoint of another run (run gru-run-id of /elsewhere/gru-run" in err and "lstm-run-id" in err, err
    out = tmp_path / "gru-eval.json"
    assert main(["evaluate", str(run), "--episodes", "2", "--num-workers", "1", "--out", str(out)]) == 0
    assert out.is_file() and not (run / "evaluation.json").exists()
