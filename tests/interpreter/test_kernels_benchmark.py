"""``fwrl bench kernels`` stays runnable: its dry run on the CPU, every core, both dtypes.

The dry run goes through the CLI in a subprocess started with
``TRITON_INTERPRET=1``, so the fused kernels run in Triton's interpreter (this
process's Triton is built for GPUs); its JSON must hold a timed, accurate row
for the reference and for every Triton variant of every core. The subprocess
runs the CLI module as ``python -m fwrl.launch.cli`` does (``runpy``), after
importing ``kernel_harness``, whose interpreter device calls skip re-patching the
language (``kernel_harness._skip_repatching_in_device_calls``: the same kernels, in
about half the time).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from fwrl.launch.bench import kernels as benchmark

pytest.importorskip("triton")

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
TESTS = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# ``python -m fwrl.launch.cli`` (runpy.run_module, as -m runs it), with kernel_harness imported first
CLI = [sys.executable, "-c",
       f"import runpy, sys; sys.path.insert(0, {TESTS!r}); import kernel_harness; "
       "runpy.run_module('fwrl.launch.cli', run_name='__main__', alter_sys=True)"]
# |output - float64 reference| allowed at the dry-run shape: fp32 kernels agree to
# rounding; bf16 inputs (and the bf16 reference, computed in bf16) to bf16 rounding.
TOLERANCE = {"fp32": 1e-5, "bf16": 5e-2}


def test_dry_run_times_every_core_on_cpu(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.path.abspath(REPO))
    proc = subprocess.run(
        [*CLI, "bench", "kernels", "--dry-run", "--core", "all",
         "--dtype", "fp32", "bf16", "--split", "2", "--json-path", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["device"] == "cpu (dry run)"
    rows = report["results"]
    expected = {(core, dtype, impl) for core in benchmark.CORES for dtype in ("fp32", "bf16")
                for impl in (["reference", "triton[split=2]"] if core in ("delta_rule", "gated_delta_rule")
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
        assert "maxnreg" not in r, label  # no --maxnreg: no cap, rows as before it existed


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


# --------------------------------------------------------------------------- --maxnreg


@pytest.mark.parametrize("bad", ["300", "23", "0", "-128", "12.5", "abc"])
def test_maxnreg_names_a_bad_value_and_the_range(bad):
    with pytest.raises(benchmark.FwrlError, match=rf"--maxnreg.*{bad!r}.*\[24, 255\]"):
        benchmark.main(["--core", "rdn", "--dry-run", "--maxnreg", "128", bad])


def test_maxnreg_parses_and_defaults_to_no_cap():
    assert benchmark._parser().parse_args([]).maxnreg is None
    caps = benchmark._parser().parse_args(["--maxnreg", "255", "128", "24"]).maxnreg
    assert caps == [255, 128, 24]
    assert benchmark._capped("triton", 128) == "triton[maxnreg=128]"
    assert benchmark._capped("triton[split=auto]", 96) == "triton[split=auto,maxnreg=96]"


def test_register_cap_caps_launch_options_and_restores_them():
    common = pytest.importorskip("fwrl.kernels.triton.common")
    assert common.REGISTER_CAP_RANGE == benchmark.MAXNREG_RANGE
    default = {w: common.launch_options(w) for w in (1, 4, 8, 16)}
    assert [default[w]["maxnreg"] for w in (1, 4, 8, 16)] == [255, 255, 255, 128]
    with common.register_cap(128):
        assert common.launch_options(8) == dict(default[8], maxnreg=128)
        assert common.launch_options(16)["maxnreg"] == 128
        with common.register_cap(96):  # contexts nest
            assert common.launch_options(4)["maxnreg"] == 96
        assert common.launch_options(4)["maxnreg"] == 128
    with common.register_cap(168):  # a cap above a block's share leaves the share
        assert common.launch_options(16)["maxnreg"] == 128
        assert common.launch_options(8)["maxnreg"] == 168
    with common.register_cap(None):
        assert common.launch_options(8) == default[8]
    # a kernel's own cap (the delta rule's 128), which a register_cap replaces: the A/B's 255 is uncapped
    assert common.launch_options(8, 128)["maxnreg"] == 128 and common.launch_options(16, 200)["maxnreg"] == 128
    with common.register_cap(255):
        assert common.launch_options(8, 128)["maxnreg"] == 255
    with common.register_cap(96):
        assert common.launch_options(8, 128)["maxnreg"] == 96
    with pytest.raises(RuntimeError, match="inside"):
        with common.register_cap(64):
            assert common.launch_options(8)["maxnreg"] == 64
            raise RuntimeError("inside")
    assert {w: common.launch_options(w) for w in default} == default  # restored, also after raising
    for bad in (23, 256, 128.0, True, "128"):
        with pytest.raises(ValueError, match=r"\[24, 255\]"):
            with common.register_cap(bad):
                pass
    assert {w: common.launch_options(w) for w in default} == default


def test_maxnreg_rows_cap_the_forward_and_the_backward(monkeypatch):
    """Every launch of a capped row runs under its cap, the backward autograd runs
    outside the runner included; the rows are labelled and carry the cap."""
    common = pytest.importorskip("fwrl.kernels.triton.common")
    seen = []

    class Probe(torch.autograd.Function):  # stands in for a fused kernel's launches
        @staticmethod
        def forward(ctx, x):
            seen.append(("forward", common.launch_options(8)["maxnreg"]))
            return 2 * x

        @staticmethod
        def backward(ctx, g):
            seen.append(("backward", common.launch_options(8)["maxnreg"]))
            return 2 * g

    monkeypatch.setattr(benchmark, "_uncapped_triton_runners", lambda core, args, inputs: {
        "triton[split=auto]": (lambda x, reset: (Probe.apply(x),), "", dict(split="auto"))})
    monkeypatch.setattr(benchmark, "_inputs", lambda core, shape, dtype, device, seed=0: (
        torch.randn(3, 2, 4), torch.zeros(3, 2, dtype=torch.bool)))
    monkeypatch.setitem(benchmark.REFERENCES, "rdn", lambda x, reset, **kwargs: (2 * x,))
    args = benchmark._parser().parse_args(["--core", "rdn", "--maxnreg", "128", "96", "128"])
    args.impls, args.repeats, args.warmup = ["reference", "triton"], 1, 0
    rows = benchmark._bench_shape("rdn", (2, 3, 1, 4), "fp32", torch.float32,
                                  torch.device("cpu"), args)
    assert [(r["impl"], r.get("maxnreg")) for r in rows] == [
        ("reference", None), ("triton[split=auto,maxnreg=128]", 128),
        ("triton[split=auto,maxnreg=96]", 96)]
    assert all(r["split"] == "auto" and r["max_abs_error"] == 0 for r in rows[1:])
    assert {kind for kind, _ in seen} == {"forward", "backward"}
    assert {cap for _, cap in seen} == {128, 96}  # never the default 255
    assert common.launch_options(8)["maxnreg"] == 255


def test_maxnreg_dry_run_labels_the_triton_rows(tmp_path):
    """The CLI end to end (kernels in the interpreter, which ignores the cap): one row per
    split and cap, labelled with both; cores without splits get triton[maxnreg=N]."""
    out = tmp_path / "bench.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.path.abspath(REPO))
    proc = subprocess.run(
        [*CLI, "bench", "kernels", "--dry-run", "--core",
         "delta_rule", "rdn", "--dtype", "fp32", "--split", "auto", "2", "--maxnreg", "255",
         "128", "--json-path", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["results"]
    assert [(r["core"], r["impl"], r.get("maxnreg")) for r in rows] == [
        ("delta_rule", "reference", None),
        ("delta_rule", "triton[split=auto,maxnreg=255]", 255),
        ("delta_rule", "triton[split=auto,maxnreg=128]", 128),
        ("delta_rule", "triton[split=2,maxnreg=255]", 255),
        ("delta_rule", "triton[split=2,maxnreg=128]", 128),
        ("rdn", "reference", None),
        ("rdn", "triton[maxnreg=255]", 255),
        ("rdn", "triton[maxnreg=128]", 128),
    ]
    for r in rows:
        assert "skipped" not in r and r["max_abs_error"] < TOLERANCE["fp32"], r
