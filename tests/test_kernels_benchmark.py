"""``fwrl bench kernels`` stays runnable: its dry run on the CPU, every core, both dtypes.

The dry run goes through the CLI in a subprocess started with
``TRITON_INTERPRET=1``, so the fused kernels run in Triton's interpreter (this
process's Triton is built for GPUs); its JSON must hold a timed, accurate row
for the reference and for every Triton variant of every core.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from fwrl.kernels import benchmark

pytest.importorskip("triton")

REPO = os.path.join(os.path.dirname(__file__), "..")
# |output - float64 reference| allowed at the dry-run shape: fp32 kernels agree to
# rounding; bf16 inputs (and the bf16 reference, computed in bf16) to bf16 rounding.
TOLERANCE = {"fp32": 1e-5, "bf16": 5e-2}


def test_dry_run_times_every_core_on_cpu(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.path.abspath(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "fwrl.launch.cli", "bench", "kernels", "--dry-run", "--core", "all",
         "--dtype", "fp32", "bf16", "--split", "2", "--json-path", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["device"] == "cpu (dry run)"
    rows = report["results"]
    expected = {(core, dtype, impl) for core in benchmark.CORES for dtype in ("fp32", "bf16")
                for impl in (["reference", "triton[split=2]"] if core == "delta_rule"
                             else ["reference", "triton"])}
    assert {(r["core"], r["dtype"], r["impl"]) for r in rows} == expected
    for r in rows:
        label = f"{r['core']} {r['dtype']} {r['impl']}"
        assert "skipped" not in r, f"{label}: {r['skipped']}"
        assert r["shape"] == list(benchmark.DRY_RUN_SHAPE)
        for key in ("fwd_ms", "fwd_bwd_ms"):
            assert math.isfinite(r[key]) and r[key] > 0, label
        assert r["max_abs_error"] < TOLERANCE[r["dtype"]], label
        if r["impl"].startswith("triton["):
            assert r["programs_per_head"] == int(r["split"])


def test_needs_a_gpu_without_dry_run():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(benchmark.FwrlError, match="--dry-run"):
        benchmark.main(["--core", "rdn"])


def test_segments_for_fla():
    """Episode segments of each row for fla's variable-length inputs (batch-major)."""
    reset = torch.tensor([[True, False, False],
                          [False, False, True],
                          [False, True, False],
                          [True, False, False]])  # [T = 4, B = 3]
    lengths, first, from_w0, last = benchmark._segments(reset)
    # row 0: [0, 3) [3, 4); row 1: [0, 2) [2, 4); row 2: [0, 1) [1, 4)
    assert lengths == [3, 1, 2, 2, 1, 3]
    assert first == [0, 2, 4] and last == [1, 3, 5]
    assert from_w0 == [1, 2]  # row 0 resets at step 0: its first segment starts from zero


def test_every_core_has_preset_shapes_and_inputs():
    for core in benchmark.CORES:
        assert benchmark.CORE_SHAPES[core]
        *tensors, reset = benchmark._inputs(core, (2, 3, 1, 4), torch.bfloat16, "cpu")
        assert tensors[0].dtype == torch.bfloat16 and reset.shape == (3, 2)
        outs = benchmark.REFERENCES[core](*(t.double() for t in tensors), reset)
        assert all(torch.isfinite(torch.as_tensor(o)).all() for o in outs)
