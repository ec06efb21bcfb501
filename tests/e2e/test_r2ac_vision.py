"""R2AC (Paper 004)'s pretrained-vision protocol: a tiny source run, then a run started with
``--load-vision-from`` its checkpoint and ``--freeze-vision`` (through the CLI), continued with
``--resume``. Its stem equals the source's and never changes, while the eLSTM core trains. The
RTRL-vs-TBPTT learning claim is ``tests/learning/test_r2ac.py``."""

from __future__ import annotations

from pathlib import Path

import torch

from fwrl.agents.checkpoint import load_checkpoint
from fwrl.launch.cli import main as cli_main
from fwrl.settings.config import build_config
from fwrl.runner.train import train


TINY = ["--preset", "quickstart", "--core", "elstm", "--elstm-grad", "rtrl", "--core-opt", "hidden_size=16",
        "--num-workers", "1", "--envs-per-worker", "4", "--batch-size", "4", "--unroll-length", "10",
        "--checkpoint-interval", "1e9", "--log-interval", "60"]


def _params(path: Path, prefix: str) -> dict[str, torch.Tensor]:
    model = load_checkpoint(path)["model"]
    params = {k: v for k, v in model.items() if k.startswith(prefix)}
    assert params, f"no {prefix}* tensors in {path}"
    return params


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_load_and_freeze_vision(tmp_path):
    source = build_config("quickstart", {"core": "elstm", "core_options": {"hidden_size": 16, "grad": "bptt"},
                                         "num_workers": 1, "envs_per_worker": 4, "batch_size": 4,
                                         "unroll_length": 10, "total_steps": 400, "seed": 5,
                                         "checkpoint_interval": 1e9, "log_interval": 60.0})
    train(source, tmp_path / "source")
    source_stem = _params(tmp_path / "source" / "checkpoint.pt", "stem.")

    runs = ["--runs-dir", str(tmp_path)]
    ckpt = tmp_path / "frozen" / "checkpoint.pt"
    assert cli_main(["train", *TINY, *runs, "--name", "frozen", "--seed", "1", "--total-steps", "400",
                     "--load-vision-from", str(tmp_path / "source" / "checkpoint.pt"), "--freeze-vision"]) == 0
    stem_1, core_1 = _params(ckpt, "stem."), _params(ckpt, "core.")
    assert _same(stem_1, source_stem), "the stem is not the source checkpoint's (other seed, so not by chance)"

    assert cli_main(["train", *runs, "--name", "frozen", "--resume", "--total-steps", "800"]) == 0
    payload = load_checkpoint(ckpt)
    assert payload["agent_steps"] == 800 and payload["config"]["freeze_vision"] is True
    assert _same(_params(ckpt, "stem."), source_stem), "the frozen stem changed during training"
    core_2 = _params(ckpt, "core.")
    changed = [k for k in core_1 if not torch.equal(core_1[k], core_2[k])]
    for key in ("core.W_z", "core.W_f", "core.b_f", "core.out_gate.weight"):
        assert key in changed, f"{key} did not train (changed: {changed})"
