"""Observation and action layouts: any supported gymnasium space -> the fixed arrays the model takes.

Env workers hand the learner at most two observation arrays per slot:

- ``obs``: either a uint8 ``(C, H, W)`` image for the vision stem, or a flat
  float32 ``(D,)`` vector for the MLP stem;
- ``obs_extra``: a flat float32 ``(E,)`` vector fed beside the stem's
  features; only when the observation is a ``Dict`` / ``Tuple`` holding an
  image *and* other entries (``E = 0`` otherwise: no ``obs_extra``).

How each space is turned into those (:func:`build_obs_layout`):

- ``Box`` image: 3-D with a channel axis of 1, 3 or 4 first (CHW) or last
  (HWC; wins when both fit, gymnasium's convention), or a 2-D uint8 ``HxW``
  (one channel). uint8 is kept; a floating Box with finite bounds in [0, 1]
  is scaled by 255, one with bounds in [0, 255] is taken as is; both are
  rounded and clipped to uint8. Resized (area average) only when asked
  (option ``size=HxW``). Any other ``Box`` is a vector.
- vectors: ``Box`` (any shape, flattened, cast to float32), ``MultiBinary``
  (flattened 0/1), ``Discrete`` (one-hot of ``n``, shifted by ``start``),
  ``MultiDiscrete`` (one one-hot per component, concatenated).
- ``Dict`` / ``Tuple`` (nested too): the image entry becomes ``obs`` and
  every other entry is flattened as above and concatenated, in the space's
  key order (gymnasium sorts ``Dict`` keys; ``Tuple`` by index), into
  ``obs_extra``. Which entry is the image: ``image_key`` (a key path such as
  ``pixels``, ``camera/rgb`` or ``0`` for a Tuple), by default the one image
  entry when there is exactly one; ``image_key=none`` or no image entry at
  all: every entry is flattened into ``obs``. Two or more image entries and
  no ``image_key`` is an error naming them.

Actions (:func:`build_action_layout`): ``Discrete(n)`` gives ``action_dims =
(n,)``, ``MultiDiscrete(nvec)`` gives ``action_dims = nvec`` flattened; the
agent's actions are 0-based indices (``start`` is added back here). Workers
take actions as int arrays ``[K]`` when ``len(action_dims) == 1``, else
``[K, len(action_dims)]``. Any other action space is an error naming it.

:class:`FwrlAdapter` applies both layouts to an env. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import gymnasium as gym
import numpy as np

from fwrl.envs.step_record import OBS, OBS_EXTRA
from fwrl.envs.wrappers import resize_frame
from fwrl.errors import FwrlError

LAYOUT_VERSION = 1
NO_IMAGE = "none"  # image_key value: flatten every entry into obs
SUPPORTED_OBS = (
    "Box (an image: HWC/CHW with 1, 3 or 4 channels, or HxW uint8; else a vector), MultiBinary, "
    "Discrete, MultiDiscrete, and Dict / Tuple of these"
)
SUPPORTED_ACTIONS = "Discrete(n) and MultiDiscrete(nvec)"
WRAPPER_HINT = ("Turn it into one of these with your own wrapper: --env-wrapper MODULE:CALLABLE (a callable taking "
                "the env and returning a gymnasium.Env).")
FLAT_SPACES = (gym.spaces.Box, gym.spaces.MultiBinary, gym.spaces.Discrete, gym.spaces.MultiDiscrete)
CHANNELS = (1, 3, 4)

Path = tuple  # key path into a Dict / Tuple observation: ("camera", "rgb"), (0,), () for the root


def path_text(path: Path) -> str:
    """``("camera", "rgb")`` -> ``"camera/rgb"``; the root is ``""``."""
    return "/".join(str(p) for p in path)


# ----------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class ImageEntry:
    """The image entry: how its raw value becomes uint8 ``(C, H, W)``."""

    path: Path
    source_shape: tuple[int, ...]
    source_dtype: str
    channels_last: bool  # HWC (or HW) source; else CHW
    scale: float  # multiply floats by this before rounding (255 for [0, 1] images, 1 otherwise)
    size: tuple[int, int]  # output H, W

    @property
    def shape(self) -> tuple[int, int, int]:
        c = 1 if len(self.source_shape) == 2 else (self.source_shape[-1] if self.channels_last
                                                   else self.source_shape[0])
        return (c, *self.size)

    @property
    def identity(self) -> bool:
        """The raw value already is uint8 CHW of the output size."""
        return (self.source_dtype == "uint8" and not self.channels_last and len(self.source_shape) == 3
                and tuple(self.source_shape[1:]) == self.size)

    def encode(self, value: Any) -> np.ndarray:
        x = np.asarray(value)
        if x.dtype != np.uint8:
            x = np.clip(np.rint(x.astype(np.float32) * self.scale), 0, 255).astype(np.uint8)
        if x.ndim == 3 and not self.channels_last:
            x = x.transpose(1, 2, 0)  # CHW -> HWC for the resize
        x = resize_frame(x, *self.size)
        if x.ndim == 2:
            return x[None]
        return np.ascontiguousarray(x.transpose(2, 0, 1))

    def describe(self) -> dict[str, Any]:
        return {"key": path_text(self.path), "kind": "image", "source_shape": list(self.source_shape),
                "source_dtype": self.source_dtype, "channels_last": self.channels_last, "scale": self.scale,
                "shape": list(self.shape)}


@dataclass(frozen=True)
class FlatEntry:
    """One entry flattened into a float32 vector at ``offset`` (``size`` values)."""

    path: Path
    kind: str  # box | multi_binary | discrete | multi_discrete
    source_shape: tuple[int, ...]
    offset: int
    size: int
    nvec: tuple[int, ...] = ()  # discrete: (n,); multi_discrete: the flattened nvec
    start: tuple[int, ...] = ()  # the matching starts
    source_dtype: str = ""

    def write(self, value: Any, out: np.ndarray) -> None:
        """Write this entry's flattened value into ``out[offset: offset + size]``."""
        if self.kind == "discrete" and isinstance(value, (int, np.integer)):  # a step's most common entry
            i = int(value) - self.start[0]  # plain ints: numpy's per-call costs are the most of this entry's time
            if not 0 <= i < self.size:
                raise ValueError(f"observation entry {path_text(self.path)!r}: value {i} outside 0..{self.size - 1}")
            out[self.offset: self.offset + self.size] = 0.0
            out[self.offset + i] = 1.0
            return
        part = out[self.offset: self.offset + self.size]
        if self.kind in ("box", "multi_binary"):
            part[:] = np.asarray(value, dtype=np.float32).reshape(-1)
            return
        part[:] = 0.0
        index = np.asarray(value, dtype=np.int64).reshape(-1) - np.asarray(self.start, np.int64)
        base = 0
        for i, n in zip(index, self.nvec):
            if not 0 <= i < n:
                raise ValueError(f"observation entry {path_text(self.path)!r}: value {i} outside 0..{n - 1}")
            part[base + i] = 1.0
            base += n

    def describe(self) -> dict[str, Any]:
        out = {"key": path_text(self.path), "kind": self.kind, "source_shape": list(self.source_shape),
               "offset": self.offset, "size": self.size}
        if self.nvec:
            out["nvec"] = list(self.nvec)
            out["start"] = list(self.start)
        return out


def image_form(space: gym.Space, chw: bool = False) -> tuple[bool, float] | None:
    """``(channels_last, scale)`` if ``space`` is an image Box (module docstring), else None.

    ``chw``: a 3-D uint8 Box is a CHW image whatever its number of channels (a family whose
    frames have game-specific channels, such as MinAtar's 4 to 10, says so).
    """
    if not isinstance(space, gym.spaces.Box):
        return None
    shape = tuple(space.shape)
    if chw and len(shape) == 3 and space.dtype == np.uint8:
        return False, 1.0
    if space.dtype == np.uint8:
        scale = 1.0
    elif np.issubdtype(space.dtype, np.floating):
        low, high = np.asarray(space.low), np.asarray(space.high)
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and low.min() >= 0):
            return None
        if high.max() <= 1.0:
            scale = 255.0
        elif high.max() <= 255.0:
            scale = 1.0
        else:
            return None
    else:
        return None
    if len(shape) == 2 and space.dtype == np.uint8:
        return True, scale
    if len(shape) == 3:
        if shape[2] in CHANNELS:
            return True, scale
        if shape[0] in CHANNELS:
            return False, scale
    return None


def _flat_entry(path: Path, space: gym.Space, offset: int, what: str) -> FlatEntry:
    shape = tuple(space.shape) if space.shape is not None else ()
    if isinstance(space, gym.spaces.Box):
        return FlatEntry(path, "box", shape, offset, int(np.prod(shape, dtype=np.int64)),
                         source_dtype=str(space.dtype))
    if isinstance(space, gym.spaces.MultiBinary):
        return FlatEntry(path, "multi_binary", shape, offset, int(np.prod(shape, dtype=np.int64)))
    if isinstance(space, gym.spaces.Discrete):
        return FlatEntry(path, "discrete", (), offset, int(space.n), (int(space.n),), (int(space.start),))
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = tuple(int(n) for n in np.asarray(space.nvec).reshape(-1))
        start = tuple(int(s) for s in np.asarray(space.start).reshape(-1))
        return FlatEntry(path, "multi_discrete", shape, offset, sum(nvec), nvec, start)
    where = f" (entry {path_text(path)!r})" if path else ""
    raise FwrlError(f"{what} has observation space {space}{where}, which fwrl does not support; "
                    f"supported: {SUPPORTED_OBS}. {WRAPPER_HINT}")


def _leaves(space: gym.Space, path: Path = ()) -> list[tuple[Path, gym.Space]]:
    """The non-composite entries of ``space`` in a fixed order (Dict key order, Tuple index)."""
    if isinstance(space, gym.spaces.Dict):
        return [leaf for key, sub in space.spaces.items() for leaf in _leaves(sub, (*path, key))]
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for i, sub in enumerate(space.spaces) for leaf in _leaves(sub, (*path, i))]
    return [(path, space)]


def _get(value: Any, path: Path) -> Any:
    for key in path:
        value = value[key]
    return value


# ----------------------------------------------------------------------------- observation layout


@dataclass(frozen=True)
class ObsLayout:
    """How one env's observations become ``obs`` (and ``obs_extra``)."""

    image: ImageEntry | None
    flat: tuple[FlatEntry, ...]  # into obs_extra when there is an image, else into obs
    composite: bool  # the raw observation is a Dict / Tuple
    dropped: tuple[str, ...] = ()  # Dict / Tuple entries fwrl cannot encode (e.g. a Text mission), left out

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return self.image.shape if self.image is not None else (self._flat_size,)

    @property
    def obs_dtype(self) -> str:
        return "uint8" if self.image is not None else "float32"

    @property
    def extra_size(self) -> int:
        """Length of ``obs_extra`` (0: none)."""
        return self._flat_size if self.image is not None else 0

    @property
    def _flat_size(self) -> int:
        return sum(e.size for e in self.flat)

    @property
    def identity(self) -> bool:
        """Observations already have the output form (no adapter needed)."""
        if self.composite:
            return False
        if self.image is not None:
            return self.image.identity
        (entry,) = self.flat
        return entry.kind == "box" and len(entry.source_shape) == 1 and entry.source_dtype == "float32"

    def encode(self, observation: Any) -> np.ndarray | dict[str, np.ndarray]:
        """The raw observation -> ``obs`` array, or ``{"obs": ..., "obs_extra": ...}`` with extras."""
        flat = np.empty(self._flat_size, np.float32)
        for entry in self.flat:
            entry.write(_get(observation, entry.path), flat)
        if self.image is None:
            return flat
        image = self.image.encode(_get(observation, self.image.path))
        if not self.flat:
            return image
        return {OBS: image, OBS_EXTRA: flat}

    def spaces(self) -> gym.Space:
        """The adapted observation space (a Box, or a Dict of ``obs`` and ``obs_extra``)."""
        if self.image is not None:
            obs = gym.spaces.Box(0, 255, self.image.shape, np.uint8)
        else:
            obs = gym.spaces.Box(-np.inf, np.inf, (self._flat_size,), np.float32)
        if self.extra_size == 0:
            return obs
        return gym.spaces.Dict({OBS: obs, OBS_EXTRA: gym.spaces.Box(-np.inf, np.inf, (self.extra_size,),
                                                                          np.float32)})

    def describe(self) -> dict[str, Any]:
        """JSON-able description (for checkpoints): what ``obs`` and ``obs_extra`` hold, entry by entry."""
        flat = [e.describe() for e in self.flat]
        obs = ({"kind": "image", "shape": list(self.obs_shape), "dtype": "uint8", "entries": [self.image.describe()]}
               if self.image is not None else
               {"kind": "vector", "shape": list(self.obs_shape), "dtype": "float32", "entries": flat})
        out = {"version": LAYOUT_VERSION, "obs": obs,
               "obs_extra": {"size": self.extra_size, "entries": flat if self.image is not None else []}}
        if self.dropped:
            out["dropped"] = list(self.dropped)
        return out

    def dropped_message(self, what: str = "the env") -> str:
        """The warning for the entries left out ('' when none was)."""
        if not self.dropped:
            return ""
        return (f"{what}: observation entries {', '.join(self.dropped)} cannot be encoded (supported: "
                f"{SUPPORTED_OBS}); training without them. To use them, encode them with your own wrapper: "
                "--env-wrapper MODULE:CALLABLE.")


def build_obs_layout(space: gym.Space, *, image_key: str | None = None, size: tuple[int, int] | None = None,
                     what: str = "the env", chw: bool = False) -> ObsLayout:
    """The layout of ``space`` (module docstring); FwrlError naming the space or keys when it cannot be laid out.

    ``image_key``: path of the image entry of a Dict / Tuple observation, ``"none"`` for no image,
    None to pick the one image entry. ``size``: resize the image to ``(H, W)``. ``what`` names the
    env in messages. ``chw``: uint8 3-D Boxes are CHW images with any number of channels
    (:func:`image_form`).
    """
    composite = isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple))
    leaves = _leaves(space)
    images = {path_text(p): (p, s) for p, s in leaves if image_form(s, chw) is not None}
    if image_key is not None and not composite and image_key != NO_IMAGE:
        raise FwrlError(f"option image_key={image_key!r} applies only to Dict or Tuple observations, but {what} "
                        f"observes {space}.")
    if image_key == NO_IMAGE:
        chosen = None
    elif image_key is not None:
        if image_key not in images:
            keys = [path_text(p) for p, _ in leaves]
            raise FwrlError(
                f"option image_key={image_key!r}: {what} has no image entry of that name; its entries: "
                f"{', '.join(keys)}; image entries: {', '.join(images) or 'none'} "
                f"(an image is a Box HWC/CHW with 1, 3 or 4 channels, or HxW uint8)."
            )
        chosen = images[image_key]
    elif len(images) > 1:
        raise FwrlError(
            f"{what} observes several image entries ({', '.join(images)}); choose the one for the vision "
            f"stem with the env option image_key=KEY (the others are flattened into obs_extra), or "
            f"image_key={NO_IMAGE} to flatten them all."
        )
    else:
        chosen = next(iter(images.values()), None)
    image = None
    if chosen is not None:
        path, img_space = chosen
        channels_last, scale = image_form(img_space, chw)
        shape = tuple(img_space.shape)
        hw = shape[:2] if channels_last else shape[1:]
        image = ImageEntry(path, shape, str(img_space.dtype), channels_last, scale,
                           tuple(size) if size is not None else tuple(int(d) for d in hw))
    elif size is not None:
        raise FwrlError(f"option size applies only to image observations, but {what} observes {space} "
                        "(no image entry is used).")
    flat, offset, dropped = [], 0, []
    for path, sub in leaves:
        if chosen is not None and path == chosen[0]:
            continue
        if composite and not isinstance(sub, FLAT_SPACES):  # e.g. a Text mission beside the image
            dropped.append(f"{path_text(path)} ({type(sub).__name__})")
            continue
        entry = _flat_entry(path, sub, offset, what)
        flat.append(entry)
        offset += entry.size
    if image is None and offset == 0:
        left_out = f" (fwrl cannot encode its entries {', '.join(dropped)})" if dropped else ""
        raise FwrlError(f"{what} has observation space {space}, which holds no values fwrl can use{left_out}; "
                        f"supported: {SUPPORTED_OBS}. {WRAPPER_HINT}")
    return ObsLayout(image, tuple(flat), composite, tuple(dropped))


def trivial_obs_layout(obs_shape: Sequence[int], obs_dtype: str) -> dict[str, Any]:
    """Description of an observation that is already in the output form (families that
    describe themselves without making an env, e.g. ProcGen, DMLab)."""
    shape = tuple(int(d) for d in obs_shape)
    if len(shape) == 3:
        return ObsLayout(ImageEntry((), shape, "uint8", False, 1.0, shape[1:]), (), False).describe()
    size = int(np.prod(shape, dtype=np.int64))
    return ObsLayout(None, (FlatEntry((), "box", shape, 0, size, source_dtype=obs_dtype),), False).describe()


# ----------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class ActionLayout:
    """The agent's 0-based action indices -> the env's action."""

    dims: tuple[int, ...]
    start: tuple[int, ...]
    source_shape: tuple[int, ...] | None  # MultiDiscrete nvec shape; None for Discrete
    space_text: str = field(default="", compare=False)

    @property
    def identity(self) -> bool:
        return self.source_shape is None and self.start == (0,)

    def convert(self, action: Any) -> Any:
        if self.source_shape is None:
            return int(np.asarray(action).reshape(())) + self.start[0]
        a = np.asarray(action, dtype=np.int64).reshape(-1) + np.asarray(self.start, np.int64)
        return a.reshape(self.source_shape)

    def space(self) -> gym.Space:
        if len(self.dims) == 1 and self.source_shape is None:
            return gym.spaces.Discrete(self.dims[0])
        return gym.spaces.MultiDiscrete(np.asarray(self.dims, np.int64))


def build_action_layout(space: gym.Space, what: str = "the env") -> ActionLayout:
    """The action layout of ``space``; FwrlError naming it unless it is Discrete or MultiDiscrete."""
    if isinstance(space, gym.spaces.Discrete):
        return ActionLayout((int(space.n),), (int(space.start),), None, str(space))
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec)
        if nvec.size == 0:
            raise FwrlError(f"{what} has the empty action space {space}; supported: {SUPPORTED_ACTIONS}.")
        return ActionLayout(tuple(int(n) for n in nvec.reshape(-1)),
                            tuple(int(s) for s in np.asarray(space.start).reshape(-1)), tuple(nvec.shape),
                            str(space))
    raise FwrlError(f"{what} has action space {space}, which fwrl agents do not support; supported: "
                    f"{SUPPORTED_ACTIONS}.")


# ----------------------------------------------------------------------------- the adapter


class FwrlAdapter(gym.Wrapper):
    """Applies an :class:`ObsLayout` and an :class:`ActionLayout` to ``env`` (the last wrapper of
    every env fwrl makes whose spaces are not already in the output form).

    Observations: an array (``obs``) or ``{"obs": ..., "obs_extra": ...}``; actions: an int
    (one action dim) or an int array ``[len(action_dims)]`` of 0-based indices.
    """

    def __init__(self, env: gym.Env, obs_layout: ObsLayout, action_layout: ActionLayout):
        super().__init__(env)
        self.obs_layout = obs_layout
        self.action_layout = action_layout
        self.observation_space = obs_layout.spaces()
        self.action_space = action_layout.space()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        return self.obs_layout.encode(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(self.action_layout.convert(action))
        return self.obs_layout.encode(obs), reward, terminated, truncated, info
