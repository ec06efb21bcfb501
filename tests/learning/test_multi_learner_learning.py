"""Several learner ranks learn like one (``fwrl train --learners 2``, gloo on the CPU); the runs'
mechanics (one folder, resume across rank counts, a killed rank) are in
``tests/e2e/test_multi_learner_runs.py``."""

from cli_runs import metrics_rows, train_cli


def test_two_ranks_learn_the_cue_like_one(tmp_path):
    """The quickstart task (memory:cue_delay?delay=10) with two learner ranks, each with one worker of
    the preset's two and the preset's batch: success >= 0.9 within 300k global agent steps, like the
    single-learner test (first of seeds 1-3)."""
    from learning_attempts import reaches

    def success(seed: int) -> float:
        name = f"s{seed}"
        result = train_cli("--preset", "quickstart", "--learners", "2", "--num-threads", "1", "--seed", str(seed),
                        "--runs-dir", str(tmp_path), "--name", name, "--log-interval", "10", timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        rows = [r for r in metrics_rows(tmp_path / name) if r["mean_success"] not in ("", "nan")]
        assert int(rows[-1]["agent_steps"]) >= 300_000
        return float(rows[-1]["mean_success"])

    passed, scores = reaches(success, 0.9)
    assert passed, f"two-rank success {scores} after 300k steps"
