"""Which vision stem fits which observation shape, without importing torch.

The stems themselves live in :mod:`fwrl.agents.model`; their shape rules are
here so that ``fwrl train``, ``info``, ``sweep`` and ``bench`` can refuse a
stem that does not fit an env's observations before torch is imported (one
line, naming the stems that fit), instead of a convolution's RuntimeError.

- ``impala``: frames (C, H, W) of any size (3x3 convolutions with padding);
- ``nature``: frames of at least 36x36 (convolutions 8x8/4, 4x4/2, 3x3/1, no padding);
- ``minatar``: frames of at least 3x3 (one 3x3 convolution, no padding);
- ``mlp`` and ``popgym``: flat vectors.
"""

from __future__ import annotations

from fwrl.errors import FwrlError

STEMS = ("impala", "nature", "minatar", "mlp", "popgym")
VECTOR_STEMS = ("mlp", "popgym")
# frames whose height or width is below this get the minatar stem under stem auto
SMALL_FRAME = 32
# (kernel, stride) of each unpadded convolution of a stem, in order
_UNPADDED_CONVS: dict[str, tuple[tuple[int, int], ...]] = {
    "nature": ((8, 4), (4, 2), (3, 1)),
    "minatar": ((3, 1),),
}


def default_stem(obs_shape: tuple[int, ...]) -> str:
    """impala for frames, minatar for frames under 32 pixels high or wide, mlp for vectors."""
    if len(obs_shape) != 3:
        return "mlp"
    return "minatar" if min(obs_shape[1:]) < SMALL_FRAME else "impala"


def smallest_frame(stem: str) -> int:
    """The smallest height (and width) of a frame that ``stem``'s convolutions take (1: any)."""
    size = 1
    for kernel, stride in reversed(_UNPADDED_CONVS.get(stem, ())):
        size = (size - 1) * stride + kernel  # the input size whose output is ``size``
    return size


def misfit(stem: str, obs_shape: tuple[int, ...]) -> str | None:
    """Why ``stem`` cannot read observations of ``obs_shape`` (None where it can)."""
    is_image = len(obs_shape) == 3
    if stem in VECTOR_STEMS:
        return "it needs flat vector observations" if is_image else None
    if not is_image:
        return "it needs image observations (C, H, W)"
    least = smallest_frame(stem)
    if min(obs_shape[1:]) < least:
        return f"its convolutions need frames of at least {least}x{least}"
    return None


def fitting_stems(obs_shape: tuple[int, ...]) -> list[str]:
    """The stems that can read observations of ``obs_shape``."""
    return [stem for stem in STEMS if misfit(stem, obs_shape) is None]


def check_stem(stem: str, obs_shape: tuple[int, ...], env: str = "") -> str:
    """The stem a run uses (``auto`` resolved); a FwrlError where it does not fit ``obs_shape``,
    naming the stems that do."""
    name = default_stem(obs_shape) if stem in ("auto", None) else stem
    reason = misfit(name, obs_shape)
    if reason is not None:
        of = f"the observations of {env} ({_shape(obs_shape)})" if env else f"observations {_shape(obs_shape)}"
        fits = ", ".join(fitting_stems(obs_shape))
        raise FwrlError(f"stem {name!r} does not fit {of}: {reason}. Stems that fit: {fits} "
                        f"(or auto: {default_stem(obs_shape)}).")
    return name


def _shape(obs_shape: tuple[int, ...]) -> str:
    """``4x10x10`` (frames, C x H x W) or ``vectors of 3``."""
    if len(obs_shape) == 1:
        return f"vectors of {obs_shape[0]}"
    return "x".join(str(n) for n in obs_shape)
