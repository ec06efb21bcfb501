"""memory:<task> family: seeded determinism, optimal policies, option checks."""

from __future__ import annotations

import numpy as np
import pytest

from fwrl.envs import describe_env, make_env
from fwrl.errors import FwrlError


def _episodes(spec: str, seed: int, num: int, policy) -> list[tuple[list[np.ndarray], float, float]]:
    """Run ``num`` episodes; policy(env, obs) -> action. Returns (obs list, return, success)."""
    env = make_env(spec, seed=seed)
    out = []
    for _ in range(num):
        obs, _ = env.reset()
        seen, ret = [obs], 0.0
        while True:
            obs, r, term, trunc, info = env.step(policy(env, obs))
            seen.append(obs)
            ret += r
            if term or trunc:
                break
        assert all(o.dtype == np.float32 and o.shape == env.observation_space.shape for o in seen)
        out.append((seen, ret, info["success"]))
    return out


def _assoc_optimal(env, obs):
    return env.answer if obs[-1] == 1.0 else 0


def _copy_optimal(env, obs):
    target = env.target
    return 0 if target is None else target


@pytest.mark.parametrize(
    "spec, policy",
    [
        ("memory:assoc_recall?n=6&num_keys=8&num_values=8", _assoc_optimal),
        ("memory:assoc_recall?n=16&num_keys=4&num_values=5&replacement=true", _assoc_optimal),
        ("memory:copy?length=4&symbols=3&delay=5", _copy_optimal),
    ],
)
def test_deterministic_under_seed_and_optimal_success(spec, policy):
    a = _episodes(spec, seed=7, num=5, policy=policy)
    b = _episodes(spec, seed=7, num=5, policy=policy)
    c = _episodes(spec, seed=8, num=5, policy=policy)
    flat = lambda eps: np.concatenate([np.stack(o) for o, _, _ in eps])  # noqa: E731
    assert np.array_equal(flat(a), flat(b))
    assert not np.array_equal(flat(a), flat(c))
    assert all(ret == pytest.approx(1.0) and succ == 1.0 for _, ret, succ in a + c)


def test_assoc_recall_observations_and_answer_from_observations_alone():
    """An agent that stores what it sees (a dict) answers every query right."""
    keys, values = 4, 5
    env = make_env(f"memory:assoc_recall?n=12&num_keys={keys}&num_values={values}&replacement=true", seed=1)
    wins = 0
    for _ in range(30):
        obs, _ = env.reset()
        memory: dict[int, int] = {}
        steps = 0
        while obs[-1] == 0.0:
            assert obs[:keys].sum() == 1 and obs[keys:-1].sum() == 1
            memory[int(obs[:keys].argmax())] = int(obs[keys:-1].argmax())  # later pairs overwrite
            obs, r, term, _, _ = env.step(0)
            assert r == 0.0 and not term
            steps += 1
        assert steps == 12 and obs[keys:-1].sum() == 0 and obs[:keys].sum() == 1
        answer = memory[int(obs[:keys].argmax())]
        _, r, term, _, info = env.step(answer)
        assert term and r == info["success"]
        wins += r
    assert wins == 30


def test_assoc_recall_without_replacement_shows_distinct_pairs():
    env = make_env("memory:assoc_recall?n=5&num_keys=5&num_values=6", seed=3)
    obs, _ = env.reset()
    keys, vals = [], []
    for _ in range(5):
        keys.append(int(obs[:5].argmax()))
        vals.append(int(obs[5:11].argmax()))
        obs, *_ = env.step(0)
    assert len(set(keys)) == 5 and len(set(vals)) == 5


def test_wrong_answers_fail():
    env = make_env("memory:assoc_recall?n=3", seed=0)
    env.reset()
    for _ in range(3):
        env.step(0)
    _, r, term, _, info = env.step((env.answer + 1) % 8)
    assert term and r == 0.0 and info["success"] == 0.0
    env = make_env("memory:copy?length=4&symbols=3&delay=2", seed=0)
    env.reset()
    ret = 0.0
    for t in range(10):
        target = env.target
        action = 0 if target is None else (target + (1 if t % 2 else 0)) % 3  # half right
        _, r, term, _, info = env.step(action)
        ret += r
    assert term and ret == pytest.approx(0.5) and info["success"] == 0.5


def test_copy_layout():
    env = make_env("memory:copy?length=3&symbols=4&delay=2", seed=5)
    obs, _ = env.reset()
    seq = [int(obs[:4].argmax())]
    for t in range(1, 8):
        obs, r, term, *_ = env.step(0)
        if t < 3:
            seq.append(int(obs[:4].argmax()))
            assert obs[-1] == 0.0
        elif t < 5:
            assert obs.sum() == 0.0  # blank delay steps
        else:
            assert obs[-1] == 1.0 and obs[:4].sum() == 0.0 and not term
    assert describe_env("memory:copy?length=3&symbols=4&delay=2").num_actions == 4


def test_cue_delay_unchanged():
    env = make_env("memory:cue_delay?delay=2&num_cues=3", seed=0)
    obs, _ = env.reset()
    cue = int(obs[:3].argmax())
    for _ in range(3):
        obs, r, term, *_ = env.step(0)
    assert obs[-1] == 1.0
    _, r, term, _, info = env.step(cue)
    assert term and r == 1.0


@pytest.mark.parametrize(
    "spec, match",
    [
        ("memory:assoc_recall?n=9", "n <= num_keys"),
        ("memory:assoc_recall?num_values=1", "2 <= num_values <= 10,000"),
        ("memory:assoc_recall?delay=3", "option for memory:assoc_recall"),
        ("memory:copy?num_cues=3", "option for memory:copy"),
        ("memory:copy?length=0", "1 <= length <= 10,000"),
        ("memory:cue_delay?delay=-1", "0 <= delay <= 1,000,000"),
        ("memory:cue_delay?delay=100000000000", "0 <= delay <= 1,000,000"),  # no episode would ever end
        ("memory:cue_delay?num_cues=1000000000", "2 <= num_cues <= 10,000"),  # a 4 GB observation per env
        ("memory:time_limit?length=10000000", "5 <= length <= 1,000,000"),
        ("memory:recall", "valid choices: assoc_recall, copy, cue_delay"),
        ("memory:copy+cue_delay", "multi-task"),
    ],
)
def test_bad_specs(spec, match):
    with pytest.raises(FwrlError, match=match):
        make_env(spec)
