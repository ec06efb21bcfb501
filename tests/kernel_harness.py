"""Shared pieces of the fused Triton kernel tests (``tests/*/test_kernels_*.py``).

The kernels run on CPU through the Triton interpreter. ``load_kernel_module``
loads a rule's fused kernel (``fwrl/kernels/<rule>/fused_recurrent.py``) from a
second copy of the ``fwrl/kernels`` package, under a private package name, with
``TRITON_INTERPRET=1`` set only while it loads: the fused modules import the
Triton helpers relatively (``from ..triton.common import ...``), so the private
copy of a kernel uses the private copy of the helpers, and one source file
serves both. The package other code imports (``fwrl.kernels``) is left compiled
for GPUs. Two private packages exist: ``_fwrl_kernels_interpreted`` (built for
the interpreter) and ``_fwrl_kernels_compiled`` (for GPUs: the compile-only sm_90
checks, and GPU runs). Each test module sets the variable per test with the
autouse ``_interpret`` fixture (imported from here). The compile-only checks
build kernels for sm_90 without a GPU, with their arguments specialised as Triton's
launcher specialises a real launch's (``launch_specialisation``), and read their
spill space with cuobjdump.

Importing it makes the interpreter's device-function calls skip re-patching
``triton.language`` inside a launch (``_skip_repatching_in_device_calls``), which
more than halves the interpreted tests' time without changing what they run.

Imported by the test modules (pytest puts ``tests/`` on ``sys.path``); its name
does not start with ``test_``, so it is not collected itself.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType

import pytest
import torch
from result_cache import cache_folder

triton = pytest.importorskip("triton")

_KERNEL_DIR = os.path.join(os.path.dirname(__file__), "..", "fwrl", "kernels")


def _private_package(name: str) -> ModuleType:
    """The package ``fwrl/kernels`` registered as ``name`` (its submodules load on import)."""
    if name not in sys.modules:
        init = os.path.join(_KERNEL_DIR, "__init__.py")
        spec = importlib.util.spec_from_file_location(name, init,
                                                      submodule_search_locations=[_KERNEL_DIR])
        package = importlib.util.module_from_spec(spec)
        sys.modules[name] = package
        spec.loader.exec_module(package)
    return sys.modules[name]


def load_kernel_module(kernel: str, interpret: bool) -> ModuleType:
    """``fwrl/kernels/<kernel>/fused_recurrent.py`` (``kernel``: a rule) from a private copy of
    the package, built for the interpreter (``interpret=True``) or for GPUs; the caller's
    ``TRITON_INTERPRET`` is restored.

    Its ``triton.common`` module is loaded into the same private package (under the same
    setting) the first time a kernel of that package imports it.
    """
    package = f"_fwrl_kernels_{'interpreted' if interpret else 'compiled'}"
    old = os.environ.pop("TRITON_INTERPRET", None)
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        _private_package(package)
        module = importlib.import_module(f"{package}.{kernel}.fused_recurrent")
    finally:
        os.environ.pop("TRITON_INTERPRET", None)
        if old is not None:
            os.environ["TRITON_INTERPRET"] = old
    common = sys.modules[f"{package}.triton.common"]
    assert common.INTERPRETED == interpret, f"{package}.triton.common was built for the other mode"
    return module


# Triton's own library (tl.sum...) is built for the interpreter when Triton was
# first imported with TRITON_INTERPRET=1; nothing can be compiled for GPUs then.
TRITON_IMPORTED_INTERPRETED = type(triton.language.standard.sum).__name__ == "InterpretedFunction"
needs_compiling_triton = pytest.mark.skipif(
    TRITON_IMPORTED_INTERPRETED,
    reason="Triton was imported with TRITON_INTERPRET=1, so it cannot compile GPU kernels",
)


def _skip_repatching_in_device_calls() -> bool:
    """Make the interpreter's device-function calls (a ``@triton.jit`` helper called from a
    kernel: ``common._softmax``, ``_matvec``...) skip re-patching ``triton.language`` where the
    running launch has already patched it; returns whether it was installed.

    Triton's interpreter patches the language (``interpreter._patch_lang``: every builtin of
    ``tl``, ``tl.tensor``, ``tl.math``, ``tl.core``, walked with ``inspect.getmembers``) once per
    launch, and again on every device-function call inside it, where every builtin it finds
    is already patched, so the call only re-sets the same attributes (Triton 3.9): over half
    the interpreter's time in these tests (the kernels call helpers per step and per tile).
    Here a device call patches only when its function sees a language module (``tl`` or
    ``tl.core`` among its globals) that the running launch did not patch, as before. The
    kernels run the same interpreted code either way (their outputs and gradients are bit
    for bit those of the unpatched interpreter). Installed only where the interpreter's source
    has the calls this relies on (Triton 3.9's); otherwise the interpreter is left as it is.
    Importing this module installs it (the dry-run subprocesses of test_kernels_benchmark.py
    import it too).
    """
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    function, executor = interpreter.InterpretedFunction, interpreter.GridExecutor
    if getattr(function, "_fwrl_skips_repatching", False):
        return True
    try:
        call_source = inspect.getsource(function.__call__)
        launch_source = inspect.getsource(executor.__call__)
    except (OSError, TypeError):
        return False
    if ("_patch_lang(self.fn)" not in call_source or "patch_scope = _patch_lang(self.fn)" not in launch_source
            or not hasattr(interpreter, "InterpreterError")):
        return False
    language = (triton.language, triton.language.core)
    patched_by_launches: list[frozenset[int]] = []  # the language modules each running launch patched
    seen: dict = {}  # function -> (size of its globals, the language modules among them)

    def languages(fn) -> frozenset[int]:
        size, found = seen.get(fn, (-1, None))
        if size != len(fn.__globals__):  # first call, or globals added since (the rewriter adds some)
            found = frozenset(id(v) for v in list(fn.__globals__.values()) if any(v is lang for lang in language))
            seen[fn] = (len(fn.__globals__), found)
        return found

    launch = executor.__call__

    def launch_and_track(self, *args, **kwargs):
        patched_by_launches.append(languages(self.fn))
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched_by_launches.pop()

    def device_call(self, *args, **kwargs):
        if not patched_by_launches or not languages(self.fn) <= patched_by_launches[-1]:
            interpreter._patch_lang(self.fn)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    executor.__call__ = launch_and_track
    function.__call__ = device_call
    function._fwrl_skips_repatching = True
    return True


SKIPS_REPATCHING = _skip_repatching_in_device_calls()


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
    from triton._C import libtriton

    if not hasattr(libtriton, "native_specialize_impl"):
        pytest.skip(f"Triton {triton.__version__} predates the launcher's native_specialize_impl, "
                    "which the checks specialise arguments with (launch_specialisation)")


# T, B, H of the benchmark's large shape (B, T, H, d) = (256, 101, 8, d), the launches the
# H100 timings are about (learner batches are multiples of 16 too; T = unroll + 1 is odd):
# the launcher marks B divisible by 16 and leaves T and H unmarked.
LAUNCH_INTS = {"T": 101, "B": 256, "H": 8}

# Element types of the pointer arguments, as Triton names them, for the stand-in tensors.
_POINTER_DTYPES = {"*fp32": torch.float32, "*bf16": torch.bfloat16, "*fp16": torch.float16,
                   "*i8": torch.int8, "*i32": torch.int32, "*i64": torch.int64}


def launch_specialisation(kernel, target, pointer_types: Mapping[str, str],
                          constexprs: Mapping[str, object], ints: Mapping[str, int]):
    """(signature, constexprs, attrs) of a launch of ``kernel`` on ``target`` with the
    integer arguments ``ints`` (name -> the value the launch passes) and, for every other
    non-constexpr argument, a 16-byte aligned tensor of ``pointer_types[name]`` (``*fp32``
    if not named).

    Each argument goes through the function Triton's launcher itself calls on every
    launch (``native_specialize_impl``, with the kernel's own do_not_specialize flags and
    annotations, as ``runtime.jit.create_function_from_signature`` does), so the kernel
    compiled here is the one a launch with these values compiles: an int whose value is a
    multiple of 16 gets ``tt.divisibility = 16`` (changing layouts and vector widths: the
    delta rule's DK/DV), an int equal to 1 becomes a constant, one of 2**31 or more is i64;
    pointers are aligned (the wrappers pass only such tensors: ``common.aligned``).
    """
    from triton._C.libtriton import native_specialize_impl
    from triton.compiler import make_backend
    from triton.runtime.jit import MockTensor

    backend = make_backend(target)
    unknown = set(ints) - set(kernel.arg_names)
    assert not unknown, f"{kernel.fn.__name__} has no arguments {sorted(unknown)}"
    signature, consts, attrs = {}, dict(constexprs), {}
    for i, param in enumerate(kernel.params):
        name = param.name
        if name in constexprs:
            signature[name] = "constexpr"
            attrs[(i,)] = backend.parse_attr("")  # none, as the launcher gives constants
            continue
        arg = (ints[name] if name in ints
               else MockTensor(_POINTER_DTYPES[pointer_types.get(name, "*fp32")]))
        specialise = not param.do_not_specialize
        kind, spec = native_specialize_impl(backend, arg, param.is_const, specialise,
                                            not param.do_not_specialize_on_alignment)
        if param.annotation_type:  # an annotated argument keeps its annotated type
            kind = param.annotation_type
            if kind == "u1" or kind[:2] in ("fp", "bf") or not specialise:
                spec = None
        if kind == "constexpr":
            signature[name] = "constexpr"
            consts[name] = spec
            spec = ""
        else:
            signature[name] = kind
        if isinstance(spec, str):
            attrs[(i,)] = backend.parse_attr(spec)
    return signature, consts, attrs


class Sm90Build:
    """What the checks read of one sm_90 build: the cubin's resource usage (``cuobjdump
    -res-usage``: REG, STACK, LOCAL, ...) and the TTGIR (``asm["ttgir"]``, as a compiled kernel
    has it)."""

    def __init__(self, resources: Mapping[str, str], ttgir: str):
        self.resources = dict(resources)
        self.asm = {"ttgir": ttgir}


# Builds are kept (result_cache.py), keyed by everything that decides them (compile_sm90), so an
# sm_90 check compiles again only when the kernels, this harness or Triton changed.
SM90_CACHE = cache_folder("sm90")
_HARNESS = Path(__file__).resolve()


@functools.cache
def _sources_digest() -> str:
    """The kernel package's sources and this harness: a change to any of them is a new build."""
    digest = hashlib.sha256()
    for path in sorted(Path(_KERNEL_DIR).resolve().rglob("*.py")) + [_HARNESS]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def compile_sm90(
    kernel,
    pointer_types: Mapping[str, str],
    constexprs: Mapping[str, object],
    num_warps: int,
    ints: Mapping[str, int],
    maxnreg: int | None = None,
) -> Sm90Build:
    """Compile a ``@triton.jit`` kernel for sm_90 as a launch would: arguments named in
    ``constexprs`` are constants, those in ``ints`` take the value a launch passes
    (name -> value: ``LAUNCH_INTS`` and the kernel's own sizes), the rest are tensors of
    ``pointer_types`` (``*fp32`` if not named), all specialised the way Triton's launcher
    specialises them (``launch_specialisation``).

    The options are those of every launch (``common.launch_options`` of the kernel's
    own package copy: importing ``fwrl.kernels.triton.common`` here, under the tests'
    TRITON_INTERPRET=1, would build the module GPU code imports for the interpreter).

    The build's resource usage and TTGIR are cached in :data:`SM90_CACHE` (where caching is on)
    under a key of the
    kernel sources, this harness, Triton's version, the kernel and every argument here, and
    the launch options (a register cap included): the same key is the same build.
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    package = kernel.fn.__module__.partition(".")[0]  # the private copy of fwrl/kernels
    launch_options = sys.modules[f"{package}.triton.common"].launch_options
    options = launch_options(num_warps, maxnreg)  # maxnreg: the kernel's own cap, as its launches pass it
    what = repr((kernel.fn.__module__.partition(".")[2], kernel.fn.__name__, sorted(pointer_types.items()),
                 sorted((k, repr(v)) for k, v in constexprs.items()), num_warps, sorted(ints.items()),
                 sorted((k, repr(v)) for k, v in options.items()), triton.__version__, _sources_digest()))
    path = SM90_CACHE / f"{hashlib.sha256(what.encode()).hexdigest()}.json" if SM90_CACHE is not None else None
    try:
        saved = json.loads(path.read_text())
        return Sm90Build(saved["resources"], saved["ttgir"])
    except (AttributeError, OSError, ValueError, KeyError):
        pass
    target = GPUTarget("cuda", 90, 64)
    signature, consts, attrs = launch_specialisation(kernel, target, pointer_types, constexprs,
                                                     ints)
    source = ASTSource(kernel, signature, constexprs=consts, attrs=attrs)
    compiled = triton.compile(source, target=target, options=options)
    build = Sm90Build(_resource_usage(compiled), compiled.asm["ttgir"])
    if path is not None:
        _save(path, {"key": what, "resources": build.resources, "ttgir": build.asm["ttgir"]})
    return build


def _save(path: Path, data: dict) -> None:
    """Write ``path`` atomically (xdist workers may build the same key at once); a cache that
    cannot be written is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        pass


def _resource_usage(compiled) -> dict[str, str]:
    """``cuobjdump -res-usage`` of a compiled kernel's cubin (REG, STACK, SHARED, LOCAL...)."""
    tool = triton.knobs.nvidia.cuobjdump.path
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    return dict(item.split(":", 1) for item in out.split() if ":" in item)


def stack_and_local_bytes(build: Sm90Build) -> tuple[int, int]:
    """Spill space of an sm_90 build, read from its cubin with cuobjdump."""
    return int(build.resources["STACK"]), int(build.resources["LOCAL"])


def registers(build: Sm90Build) -> int:
    """Registers per thread of an sm_90 build, read from its cubin with cuobjdump."""
    return int(build.resources["REG"])
