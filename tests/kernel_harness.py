"""Shared pieces of the fused Triton kernel tests (``tests/test_kernels_*.py``).

The kernels run on CPU through the Triton interpreter. ``load_kernel_module``
loads the whole ``fwrl/kernels/triton`` package (the shared ``common`` module
included) a second time, under a private package name, with
``TRITON_INTERPRET=1`` set only while it loads: the kernel modules import their
helpers relatively (``from .common import ...``), so the private copy of a
kernel uses the private copy of the helpers, and one source file serves both.
The package other code imports (``fwrl.kernels.triton``) is left compiled for
GPUs. Two private packages exist: ``_fwrl_triton_interpreted`` (built for the
interpreter) and ``_fwrl_triton_compiled`` (for GPUs: the compile-only sm_90
checks, and GPU runs). Each test module sets the variable per test with the
autouse ``_interpret`` fixture (imported from here). The compile-only checks
build kernels for sm_90 without a GPU and read their spill space with cuobjdump.

Imported by the test modules (pytest puts ``tests/`` on ``sys.path``); its name
does not start with ``test_``, so it is not collected itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from types import ModuleType

import pytest
import torch

triton = pytest.importorskip("triton")

_KERNEL_DIR = os.path.join(os.path.dirname(__file__), "..", "fwrl", "kernels", "triton")


def _private_package(name: str) -> ModuleType:
    """The package ``fwrl/kernels/triton`` registered as ``name`` (its submodules load on import)."""
    if name not in sys.modules:
        init = os.path.join(_KERNEL_DIR, "__init__.py")
        spec = importlib.util.spec_from_file_location(name, init,
                                                      submodule_search_locations=[_KERNEL_DIR])
        package = importlib.util.module_from_spec(spec)
        sys.modules[name] = package
        spec.loader.exec_module(package)
    return sys.modules[name]


def load_kernel_module(kernel: str, interpret: bool) -> ModuleType:
    """``fwrl/kernels/triton/<kernel>.py`` from a private copy of the package, built for the
    interpreter (``interpret=True``) or for GPUs; the caller's ``TRITON_INTERPRET`` is restored.

    Its ``common`` module is loaded into the same private package (under the same
    setting) the first time a kernel of that package imports it.
    """
    package = f"_fwrl_triton_{'interpreted' if interpret else 'compiled'}"
    old = os.environ.pop("TRITON_INTERPRET", None)
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        _private_package(package)
        module = importlib.import_module(f"{package}.{kernel}")
    finally:
        os.environ.pop("TRITON_INTERPRET", None)
        if old is not None:
            os.environ["TRITON_INTERPRET"] = old
    common = sys.modules[f"{package}.common"]
    assert common.INTERPRETED == interpret, f"{package}.common was built for the other mode"
    return module


# Triton's own library (tl.sum...) is built for the interpreter when Triton was
# first imported with TRITON_INTERPRET=1; nothing can be compiled for GPUs then.
TRITON_IMPORTED_INTERPRETED = type(triton.language.standard.sum).__name__ == "InterpretedFunction"
needs_compiling_triton = pytest.mark.skipif(
    TRITON_IMPORTED_INTERPRETED,
    reason="Triton was imported with TRITON_INTERPRET=1, so it cannot compile GPU kernels",
)


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    """Run every test of the importing module under the Triton interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def resets(T: int, B: int, pattern: str) -> torch.Tensor:
    """[T, B] episode starts: ``none``, ``start`` (step 0), ``mid`` (row 0 once, row 1 on
    consecutive steps) or ``everywhere``."""
    reset = torch.zeros(T, B, dtype=torch.bool)
    if pattern == "start":
        reset[0] = True
    elif pattern == "mid":
        reset[T // 2, 0] = True
        reset[T // 2 : T // 2 + 3, 1 % B] = True
    elif pattern == "everywhere":
        reset[:] = True
    return reset


def run_with_grads(
    fn: Callable[..., Sequence[torch.Tensor]],
    inputs: Sequence[torch.Tensor],
    reset: torch.Tensor,
    grads: Sequence[torch.Tensor | None],
    dtype: torch.dtype | None = None,
    **kwargs,
) -> list[torch.Tensor]:
    """The outputs of ``fn(*inputs, reset)`` followed by the gradient of
    sum_i <out_i, grads_i> (``None`` entries left out) for every input (zeros where unused)."""
    leaves = [t.detach().to(dtype or t.dtype).requires_grad_() for t in inputs]
    outs = fn(*leaves, reset, **kwargs)
    loss = sum((o.double() * g).sum() for o, g in zip(outs, grads) if g is not None)
    d = torch.autograd.grad(loss, leaves, allow_unused=True)
    d = [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, d)]
    return [o.detach() for o in outs] + list(d)


def assert_all_close(
    names: Sequence[str],
    ref: Sequence[torch.Tensor],
    got: Sequence[torch.Tensor],
    *,
    atol: float = 2e-5,
    rtol: float = 1e-4,
    label: str = "",
) -> None:
    """Each of ``got`` is finite and close to ``ref`` (compared in float64), named in failures."""
    for name, r, g in zip(names, ref, got):
        assert torch.isfinite(g).all(), f"{label}: {name} is not finite"
        torch.testing.assert_close(g.double(), r.double(), atol=atol, rtol=rtol,
                                   msg=lambda m: f"{label}: {name}: {m}")


# --------------------------------------------------------------------------- sm_90 compile checks


def skip_without_sm90_toolchain() -> None:
    """Skip the calling test where this Triton install cannot build and inspect sm_90 code."""
    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip("this Triton build has no NVIDIA backend, so it cannot compile for sm_90")
    for tool in ("ptxas", "cuobjdump"):
        if not os.path.exists(getattr(triton.knobs.nvidia, tool).path):
            pytest.skip(f"this Triton install lacks {tool}, needed to build and inspect sm_90 code")


def compile_sm90(
    kernel,
    pointer_types: Mapping[str, str],
    constexprs: Mapping[str, object],
    num_warps: int,
    ints: Collection[str],
):
    """Compile a ``@triton.jit`` kernel for sm_90: arguments named in ``constexprs`` are
    constants, those in ``ints`` are i32, the rest pointers (``pointer_types`` or ``*fp32``).

    Pointers are marked 16-byte aligned, as Triton's launcher specialises them for
    tensors whose address is (the wrappers pass only such tensors: ``common.aligned``);
    the options are those of every launch (``common.launch_options`` of the kernel's
    own package copy: importing ``fwrl.kernels.triton`` here, under the tests'
    TRITON_INTERPRET=1, would build the package GPU code imports for the interpreter).
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    package = kernel.fn.__module__.rpartition(".")[0]
    launch_options = sys.modules[f"{package}.common"].launch_options

    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ints:
            signature[name] = "i32"
        else:
            signature[name] = pointer_types.get(name, "*fp32")
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 64),
                          options=launch_options(num_warps))


def stack_and_local_bytes(compiled) -> tuple[int, int]:
    """Spill space of a compiled kernel, read from its cubin with cuobjdump."""
    tool = triton.knobs.nvidia.cuobjdump.path
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    usage = dict(item.split(":", 1) for item in out.split() if ":" in item)
    return int(usage["STACK"]), int(usage["LOCAL"])
