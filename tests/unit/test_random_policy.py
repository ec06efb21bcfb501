"""The uniform-random policy (``fwrl.evaluation.random_policy``, ``benchmarks/random_policy.py``):
zero logits, every action drawn alike, played under the env's evaluation protocol."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from fwrl.evaluation.random_policy import evaluate_random_policy, uniform_policy

ROOT = Path(__file__).resolve().parents[2]


def test_the_policy_draws_every_action_alike():
    model = uniform_policy("minatar:breakout")
    T, B = 1, 6000
    inputs = {"obs": torch.rand(T, B, *model.obs_shape), "reward": torch.zeros(T, B),
              "done": torch.zeros(T, B, dtype=torch.bool)}
    with torch.no_grad():
        out, _ = model(inputs, model.initial_state(B))
    assert torch.equal(out["policy_logits"], torch.zeros_like(out["policy_logits"]))
    counts = torch.bincount(out["action"].flatten(), minlength=model.num_actions).double()
    expected = B / model.num_actions
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 25.0, counts  # 2 degrees of freedom (3 actions): p < 1e-5 of a wrong failure


def test_a_memory_task_scores_chance_under_its_protocol(tmp_path):
    """cue_delay: two cues, one right answer; a random policy succeeds about half of the time."""
    result = evaluate_random_policy("memory:cue_delay", episodes=60, num_workers=2, envs_per_worker=2, seed=3)
    [row] = result["aggregates"]
    assert result["policy"] == "uniform random" and row["episodes"] == 60
    assert 0.25 <= row["success"] <= 0.75, row  # 0.5 +- 3.9 standard errors of 60 coin flips (0.065 each)


def test_the_benchmark_writes_json_and_a_table(tmp_path):
    out = tmp_path / "rp" / "random_policy"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "random_policy.py"), "--env", "memory:cue_delay",
                           "--episodes", "8", "--num-workers", "1", "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.with_suffix(".json").read_text())
    table = out.with_suffix(".md").read_text()
    assert record["policy"] == "uniform random" and "| cue_delay | test | 8 |" in table


def test_the_benchmark_refuses_an_unknown_env_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "random_policy.py"), "--env", "nosuch:game",
                           "--out", str(tmp_path / "x")], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("random_policy: error:") and "nosuch" in done.stderr
    assert not (tmp_path / "x.json").exists()
