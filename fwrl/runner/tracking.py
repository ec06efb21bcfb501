"""Experiment tracking in Weights & Biases (``fwrl train --wandb``), beside metrics.csv and TensorBoard.

One W&B run per fwrl run: the config (``config.yaml``'s settings), every metrics row (the
periodic evaluations' ``eval/...`` rows among them) with ``agent_steps`` as the step of every chart,
the episode videos of ``--video-every``, and the tables of ``fwrl evaluate`` on the run (with its
videos, into the same W&B run). Its files live in the run folder (``<run>/wandb``); the W&B run's
id is kept there (``<run>/wandb/run-id``), so ``fwrl train --resume`` and ``fwrl evaluate``
continue the same W&B run. Project ``--wandb-project`` (default fwrl), group ``--wandb-group``;
a sweep's cells (run folders ``SWEEP/runs/<cell>`` of a folder with a ``sweep.yaml``) are grouped
by the sweep folder's name unless a group is given, and named by their cell.

Offline: ``WANDB_MODE=offline`` logs into ``<run>/wandb`` with no network; ``wandb sync
<run>/wandb/offline-run-*`` uploads it later. Online, a missing login is refused before the run
starts (:func:`check_wandb`); so is a missing ``wandb`` package (the ``wandb`` extra). Rows a
killed run logged after its last checkpoint stay in W&B (metrics.csv drops them on ``--resume``):
W&B keeps what it was sent.

Nothing here imports wandb (or torch) at module level: :func:`check_wandb` answers first.
"""

from __future__ import annotations

import importlib.util
import math
import netrc
import os
import secrets
import string
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import urlparse

from fwrl.errors import FwrlError, missing_dependency
from fwrl.utils.files import atomic_write_text

WANDB_FOLDER = "wandb"  # in the run folder: W&B's own files and the run id
RUN_ID_FILE = "run-id"
MODES = ("online", "offline", "disabled", "dryrun")  # dryrun: W&B's old name of offline
DEFAULT_HOST = "https://api.wandb.ai"
SWEEP_MANIFEST = "sweep.yaml"  # fwrl.launch.sweep.plan.MANIFEST (a higher layer)


def wandb_mode() -> str:
    """W&B's mode as ``WANDB_MODE`` sets it (default online); an unknown one is refused."""
    mode = os.environ.get("WANDB_MODE", "online").strip().lower() or "online"
    if mode not in MODES:
        raise FwrlError(f"WANDB_MODE={mode!r} is not a W&B mode; valid choices: {', '.join(MODES)} "
                        "(offline: log into the run folder, wandb sync uploads it later).")
    return "offline" if mode == "dryrun" else mode


def _logged_in() -> bool:
    """Whether W&B has credentials here for its host: ``WANDB_API_KEY``, an identity token file, or
    the host's entry in the netrc file ``wandb login`` writes (``NETRC`` or ``~/.netrc``)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or DEFAULT_HOST).hostname or ""
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def check_wandb() -> str:
    """W&B can track a run here: the package is installed and, online, a login is found; returns
    the mode. One FwrlError saying what to do otherwise, before anything starts."""
    if importlib.util.find_spec("wandb") is None:
        raise missing_dependency("wandb", "wandb", "--wandb (Weights & Biases tracking)")
    mode = wandb_mode()
    if mode == "online" and not _logged_in():
        host = urlparse(os.environ.get("WANDB_BASE_URL") or DEFAULT_HOST).hostname
        raise FwrlError(f"--wandb logs to Weights & Biases online, but no W&B login for {host} was found here (no "
                        "WANDB_API_KEY, no entry in ~/.netrc): run `wandb login` first, or set WANDB_MODE=offline "
                        "to log into the run folder with no network (`wandb sync` uploads it later).")
    return mode


def new_run_id() -> str:
    """A W&B run id: 8 random lowercase letters and digits (W&B's own form)."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def sweep_group(run_dir: Path) -> str:
    """The sweep folder's name where ``run_dir`` is a sweep's cell (``SWEEP/runs/<cell>``), else ''."""
    run_dir = Path(run_dir).resolve()
    sweep = run_dir.parent.parent
    return sweep.name if run_dir.parent.name == "runs" and (sweep / SWEEP_MANIFEST).is_file() else ""


def _scalar(value: Any) -> float | int | None:
    """A metrics row's value as W&B takes it: numbers (NaN included), not text or blanks."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    try:
        return float(value)  # numpy scalars
    except (TypeError, ValueError):
        return None


class WandbTracker:
    """The W&B run of one fwrl run (module docstring): :meth:`log_row`, :meth:`log_videos`,
    :meth:`log_evaluation`, :meth:`close`. Built by rank 0 only, after :func:`check_wandb`."""

    def __init__(self, run_dir: Path, settings: Mapping[str, Any], *, project: str = "fwrl", group: str = "",
                 resume: bool = True, job_type: str = "train"):
        import wandb

        self.wandb = wandb
        self.run_dir = Path(run_dir)
        folder = self.run_dir / WANDB_FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / RUN_ID_FILE
        run_id = id_file.read_text().strip() if resume and id_file.is_file() else ""
        if not run_id:
            run_id = new_run_id()
            atomic_write_text(id_file, run_id + "\n")
        try:
            self.run = wandb.init(project=project, group=group or sweep_group(self.run_dir) or None,
                                  name=self.run_dir.name, id=run_id, resume="allow", dir=str(self.run_dir),
                                  config=dict(settings), job_type=job_type,
                                  settings=wandb.Settings(console="off", quiet=True, silent=True))
        except Exception as exc:  # noqa: BLE001 - W&B's own errors (network, login, server): one line
            raise FwrlError(f"W&B could not start its run for {self.run_dir} ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else 'no message'}); check `wandb login` and the "
                            "network, or set WANDB_MODE=offline.") from None
        self.run.define_metric("agent_steps")
        self.run.define_metric("*", step_metric="agent_steps")

    def log_row(self, row: Mapping[str, Any]) -> None:
        """One metrics row: its numbers (with ``agent_steps``, the charts' step)."""
        values = {key: v for key, v in ((k, _scalar(v)) for k, v in row.items()) if v is not None}
        if "agent_steps" in values:
            self.run.log(values)

    def log_videos(self, videos: Sequence[Any], agent_steps: int, key: str = "video") -> None:
        """Episode videos (:class:`fwrl.evaluation.video.Video`) at ``agent_steps``: one entry per task
        and split (``video/<task>/<split>``)."""
        logged: dict[str, Any] = {"agent_steps": agent_steps}
        for v in videos:
            caption = f"{v.task} {v.split} episode {v.episode}: return {v.episode_return:.4g}, {v.length} steps"
            logged[f"{key}/{v.task}/{v.split}"] = self.wandb.Video(str(v.path), caption=caption, format="mp4")
        if len(logged) > 1:
            self.run.log(logged)

    def log_evaluation(self, result: Mapping[str, Any]) -> None:
        """An evaluation's aggregates (``fwrl evaluate``'s table) as a W&B table, its videos beside it."""
        rows = result.get("aggregates", [])
        columns = ["task", "split", "repeats", "episodes", "mean", "std", "normalised", "success"]
        table = self.wandb.Table(columns=columns, data=[[r.get(c) for c in columns] for r in rows])
        steps = int(result.get("agent_steps", 0))
        self.run.log({"evaluation/table": table, "agent_steps": steps})
        self.run.summary["evaluation"] = {f"{r['task']}/{r['split']}": r["mean"] for r in rows
                                          if isinstance(r.get("mean"), (int, float)) and not math.isnan(r["mean"])}
        from types import SimpleNamespace

        videos = [SimpleNamespace(path=v["path"], task=v["task"], split=v["split"], episode=v["episode"],
                                  episode_return=v["return"], length=v["length"]) for v in result.get("videos", [])]
        self.log_videos(videos, steps, key="evaluation/video")

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def tracked_run(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` is tracked in W&B (it holds a W&B run id)."""
    return (Path(run_dir) / WANDB_FOLDER / RUN_ID_FILE).is_file()
