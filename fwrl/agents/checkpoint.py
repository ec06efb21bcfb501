"""Checkpoints: atomic saves, ``weights_only`` loads, exact resume.

A checkpoint holds plain tensors, numbers, strings, lists and dicts only, so
``torch.load(path, weights_only=True)`` can read it (nothing is unpickled
beyond torch's safe set). It carries the model, the optimiser, the LR
schedule, the agent-step count and the RNG states of torch, numpy and python.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fwrl import __version__
from fwrl.errors import FwrlError
from fwrl.utils.checkpoint_files import check_checkpoint_file, load_error
from fwrl.utils.files import atomic_write

FORMAT = "fwrl-checkpoint-v1"


def rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_payload(*, model, optimizer, scheduler, agent_steps: int, updates: int, config: dict[str, Any],
                       env_info: dict[str, Any], progress: dict[str, Any] | None = None,
                       run: dict[str, str] | None = None) -> dict[str, Any]:
    """Everything a checkpoint holds, its tensors copied to the CPU: training may go on (and change
    the weights in place) while the copy is written. ``progress``: counters a resumed run continues
    (``elapsed_seconds``, ``episodes``). ``run``: the identity of the run that wrote it (``id``, and
    ``dir``, its folder then; :mod:`fwrl.runner.rundir`), which a resume and an evaluation into a run
    folder check against the folder's own; checkpoints of fwrl versions before it have none."""
    payload = {
        "format": FORMAT,
        "fwrl_version": __version__,
        "agent_steps": int(agent_steps),
        "updates": int(updates),
        "config": config,
        "env_info": env_info,
        "progress": dict(progress or {}),
        "model": host_copy(model.state_dict()),
        "optimizer": host_copy(optimizer.state_dict()),
        "scheduler": scheduler.state_dict(),
        "rng": rng_state(),
    }
    if run is not None:
        payload["run"] = dict(run)
    return payload


def host_copy(value: Any) -> Any:
    """``value`` with every tensor in it (in dicts, lists and tuples) copied to the host."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: host_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(host_copy(v) for v in value)
    return value


def payload_digest(payload: dict[str, Any]) -> str:
    """sha256 of everything ``payload`` holds but its ``checksum``: every tensor's dtype, shape and bytes
    and every other value, in a fixed order. Written with the checkpoint and checked when it is read,
    so bytes damaged on disk inside a tensor (which the zip archive's structure does not notice) are
    refused instead of loaded."""
    digest = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().to("cpu").contiguous()
            digest.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(value, dict):
            digest.update(f"D{len(value)}".encode())
            for key in sorted(value, key=repr):
                digest.update(repr(key).encode())
                feed(value[key])
        elif isinstance(value, (list, tuple)):
            digest.update(f"L{len(value)}".encode())
            for item in value:
                feed(item)
        else:
            digest.update(f"V{value!r}".encode())

    feed({key: value for key, value in payload.items() if key != "checksum"})
    return digest.hexdigest()


def write_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` with its checksum (:func:`payload_digest`) atomically (temporary file, fsync,
    rename, directory fsync)."""
    payload = {**payload, "checksum": payload_digest(payload)}

    def save(f) -> None:
        try:
            torch.save(payload, f)
        except RuntimeError as exc:  # torch's zip writer words a full disk "file write failed" or "unexpected pos"
            full = "write failed" in str(exc) or _free_bytes(Path(path).parent) < _tensor_bytes(payload)
            error = errno.ENOSPC if full else errno.EIO
            raise OSError(error, f"{os.strerror(error)} while writing the checkpoint "
                                 f"({str(exc).splitlines()[0][:120]})", str(path)) from None

    atomic_write(Path(path), save)


def _free_bytes(folder: Path) -> float:
    """Bytes free for this user on ``folder``'s file system (inf where it cannot be told)."""
    try:
        stat = os.statvfs(folder)
    except OSError:
        return float("inf")
    return stat.f_bavail * stat.f_frsize


def _tensor_bytes(value: Any) -> int:
    """The bytes of every tensor in ``value`` (what a checkpoint of it needs on disk, at least)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def save_checkpoint(path: Path, **parts: Any) -> None:
    """:func:`checkpoint_payload` of ``parts``, written to ``path``."""
    write_checkpoint(path, checkpoint_payload(**parts))


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint safely; a corrupt or foreign file is a FwrlError."""
    path = Path(path)
    check_checkpoint_file(path)  # missing, empty, not a zip archive (a metrics.csv), cut short
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises many kinds for corrupt or unsafe files
        raise load_error(path, exc) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise FwrlError(
            f"{path} is not an fwrl checkpoint (expected format {FORMAT!r}, "
            f"found {payload.get('format') if isinstance(payload, dict) else type(payload).__name__!r})."
        )
    if "checksum" in payload and payload_digest(payload) != payload["checksum"]:  # older ones have none
        kept = sorted(path.parent.glob("checkpoint-*.pt"), key=lambda p: p.stat().st_mtime)
        earlier = [p for p in kept if p != path]
        offer = (f" An earlier checkpoint of the run is kept: {earlier[-1]} (copy it to {path.name} to resume "
                 "from it)." if earlier else " The run keeps no earlier checkpoint (--milestone-interval keeps some).")
        raise FwrlError(f"{path} is damaged: its tensors do not match the checksum written with them (bytes changed "
                        f"on disk after it was written), so it is refused rather than loaded.{offer}")
    return payload


def load_model_weights(model: torch.nn.Module, state_dict: dict[str, Any], source: str) -> None:
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        detail = lines[1] if len(lines) > 1 else lines[0] if lines else type(exc).__name__  # the first mismatch
        raise FwrlError(
            f"the weights in {source} do not fit this model ({detail[:300]}); "
            "was it trained with another env, core, stem or core options?"
        ) from None
