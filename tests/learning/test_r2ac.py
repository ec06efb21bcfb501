"""R2AC (Paper 004): the RTRL-vs-TBPTT learning claim. The pretrained-vision protocol it uses is
checked on its own in ``tests/e2e/test_r2ac_vision.py``."""

from __future__ import annotations

import csv
from pathlib import Path

from learning_attempts import SEEDS, reaches

from fwrl.settings.config import build_config
from fwrl.runner.train import train


def _cue_delay_run(tmp_path: Path, name: str, grad: str, delay: int, unroll: int, steps: int, vision: str = "",
                   seed: int = 1):
    """The settings of ``benchmarks/r2ac_cue_delay.py`` (eLSTM H=64, forget bias 2, lr 2e-3, batch 8)."""
    config = build_config("quickstart", {
        "env": f"memory:cue_delay?delay={delay}", "core": "elstm",
        "core_options": {"hidden_size": 64, "grad": grad, "forget_bias": 2.0}, "unroll_length": unroll,
        "total_steps": steps, "seed": seed, "checkpoint_interval": 1e9, "log_interval": LOG_INTERVAL,
        "load_vision_from": vision, "freeze_vision": bool(vision)})
    return train(config, tmp_path / name)


LOG_INTERVAL = 5.0  # seconds between metrics rows; each row holds the success of the last 100 episodes
STEPS_AT_DELAY_40 = 200_000  # per RTRL and per TBPTT run (same budget for both)
TBPTT_SEEDS = SEEDS[:2]
GAP = 0.15  # RTRL's success above the mean of TBPTT's, at the same budget


def _final_success(run_dir: Path, rows: int = 3) -> float:
    """Mean success over the last ``rows`` metrics rows (each the last 100 episodes): about the
    last 300 episodes, where the train result's single window of 100 swings by +-0.05 alone."""
    with open(run_dir / "metrics.csv", newline="") as f:
        values = [float(r["mean_success"]) for r in csv.DictReader(f) if r["mean_success"] not in ("", "nan")]
    assert values, f"no mean_success in {run_dir / 'metrics.csv'}"
    return sum(values[-rows:]) / len(values[-rows:])


def test_rtrl_learns_delay_40_with_unroll_10_far_above_tbptt(tmp_path):
    """Paper 004's claim at small scale: the cue is 41 steps before the query, rollouts are 10 steps.

    Stem pretrained by TBPTT (T=40, delay 10) and frozen, as in the paper's
    DMLab protocol; then 200k steps each. Benchmark run at 100k (seeds 1, 2):
    RTRL 0.97, 0.92; TBPTT 0.57 (chance 0.5). 100k left too little margin in
    CI (RTRL 0.71 / 0.55 / 0.73 on seeds 1-3 in one run; 0.94 / 0.81 / 0.83 /
    0.58 on seeds 1-4 in another); at 200k RTRL reached 0.97 / 0.82 / 0.99 /
    1.00 on seeds 1-4 and TBPTT 0.61 / 0.37 / 0.54 on seeds 1-3, then 0.73 on
    seed 1 in a later CI run (RTRL 0.99 there). TBPTT is not at chance: its
    readout learns to use what the state still holds of the cue, and holding
    information over 10 steps, which TBPTT does train, carries some over 40.
    What it lacks is the gradient that writes the cue for the query, so the
    claim is a gap: RTRL solves the task and TBPTT, averaged over two seeds,
    stays at least 0.15 below (observed gaps 0.26 to 0.45 per seed).
    """
    passed, scores = reaches(
        lambda seed: _cue_delay_run(tmp_path, f"pretrain-{seed}", "bptt", 10, 40, 300_000, seed=seed).mean_success,
        0.9)
    assert passed, f"TBPTT pretraining (delay 10, T=40) reached {scores}"
    vision = str(tmp_path / f"pretrain-{SEEDS[len(scores) - 1]}" / "checkpoint.pt")

    def delay_40(grad: str, seed: int) -> float:
        _cue_delay_run(tmp_path, f"{grad}-{seed}", grad, 40, 10, STEPS_AT_DELAY_40, vision, seed)
        return _final_success(tmp_path / f"{grad}-{seed}")

    passed, rtrl = reaches(lambda seed: delay_40("rtrl", seed), 0.85)
    assert passed, f"RTRL T=10 success {rtrl} at delay 40"
    bptt = [delay_40("bptt", seed) for seed in TBPTT_SEEDS]
    tbptt_mean = sum(bptt) / len(bptt)
    assert rtrl[-1] - tbptt_mean >= GAP, (
        f"RTRL T=10 success {rtrl[-1]:.2f} at delay 40 is not {GAP} above TBPTT's mean {tbptt_mean:.2f} "
        f"(seeds {TBPTT_SEEDS}: {bptt}; chance 0.5)")
