"""Learning tests (slow): the LSTM agent solves a task that needs memory; feedforward cannot.

``memory:cue_delay?delay=10`` shows a cue at step 0 and asks for it 11 steps
later; chance success is 0.5. Runs the quickstart preset's settings.
"""

from learning_attempts import reaches

from fwrl.settings.config import build_config
from fwrl.runner.train import train



def _train(tmp_path, core: str, total_steps: int, seed: int = 1):
    config = build_config("quickstart", {"core": core, "total_steps": total_steps, "seed": seed,
                                         "log_interval": 10.0, "checkpoint_interval": 1e9})
    return train(config, tmp_path / core)


def test_lstm_remembers_cue_over_ten_steps(tmp_path):
    passed, scores = reaches(lambda seed: _train(tmp_path / str(seed), "lstm", 300_000, seed).mean_success, 0.9)
    assert passed, f"LSTM success {scores} after 300k steps"


def test_feedforward_stays_at_chance(tmp_path):
    result = _train(tmp_path, "feedforward", 150_000)
    assert 0.35 <= result.mean_success <= 0.65, f"feedforward success {result.mean_success:.3f}"
