"""Time limits, learnt: V-trace bootstraps where an episode was cut (the unit checks are in
``tests/unit/test_truncation.py``), so values see past the limit, and a capped CartPole reaches
its maximum return."""

import torch

R, G = 1.0, 0.9  # constant reward per step, discount


def test_learned_values_see_past_the_time_limit_only_with_bootstrapping(tmp_path):
    """memory:time_limit (reward 1 per step, always cut after 10 steps, discount 0.9): with
    bootstrapping every value approaches 1 / (1 - 0.9) = 10; treating the cut as the end, values
    of a few steps' reward (phase averages of 1 .. 6.5) instead."""
    from fwrl.settings.config import TrainConfig
    from fwrl.runner.agent import load_agent
    from fwrl.runner.train import train

    length = 10
    obs = torch.eye(4)[[t % 4 for t in range(length + 1)]].view(length + 1, 1, 4)  # + the final obs
    reward = torch.ones(length + 1, 1)
    reward[0] = 0.0
    values = {}
    for mode in ("bootstrap", "terminate"):
        config = TrainConfig(env=f"memory:time_limit?length={length}", core="feedforward", num_workers=2,
                             envs_per_worker=8, batch_size=8, unroll_length=20, total_steps=40_000,
                             learning_rate=2e-3, discount=G, truncation=mode, device="cpu", num_threads=1,
                             log_interval=5.0)
        train(config, tmp_path / mode)
        model, _, _ = load_agent(tmp_path / mode)
        with torch.no_grad():
            out, _ = model({"obs": obs, "reward": reward, "done": torch.zeros(length + 1, 1, dtype=torch.bool)},
                           model.initial_state(1))
        values[mode] = out["baseline"][:, 0]
    print({mode: [round(v, 2) for v in vs.tolist()] for mode, vs in values.items()})
    torch.testing.assert_close(values["bootstrap"], torch.full((length + 1,), R / (1 - G)), atol=0.5, rtol=0)
    assert values["terminate"].max() < 7.0 and values["terminate"][length - 1] < 5.0


def test_cartpole_reaches_the_maximum_return(tmp_path):
    """gym:CartPole-v1 (episodes cut at 500 steps) with the mlp stem and no memory: the mean return
    of the last 100 episodes reaches 500 within 600k agent steps (about a minute here). Measured:
    first at 437k / 507k / 460k steps on seeds 1-3; with --truncation terminate 536k / 500k."""
    import csv

    from learning_attempts import reaches

    from fwrl.settings.config import TrainConfig
    from fwrl.runner.train import train

    def best(seed: int) -> float:
        config = TrainConfig(env="gym:CartPole-v1", core="feedforward", stem="mlp", num_workers=2, envs_per_worker=8,
                             batch_size=32, unroll_length=20, total_steps=600_000, learning_rate=2e-3,
                             entropy_cost=0.001, device="cpu", num_threads=1, log_interval=5.0, seed=seed)
        train(config, tmp_path / str(seed))
        rows = list(csv.DictReader((tmp_path / str(seed) / "metrics.csv").open()))
        return max(float(r["mean_return"]) for r in rows if r["mean_return"] not in ("", "nan"))

    passed, scores = reaches(best, 500.0)
    assert passed, f"best mean return {scores} within 600k steps"
