"""The settings of ``fwrl sweep`` itself (how cells run), apart from the training settings of the grid."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fwrl.utils.settings import Settings

EXECUTORS = ("local", "ray", "slurm")


class SweepConfig(Settings):
    """How ``fwrl sweep`` runs the cells of its grid. One field per line."""

    grid: str | None = Field(None, min_length=1, description="YAML file of the grid: a list is an axis, anything else a setting common to every cell")
    executor: Literal[EXECUTORS] = Field("local", description="where cells run: local processes, Ray tasks on a cluster, or one SLURM job array")
    parallel: int = Field(0, ge=0, description="cells run at once (local), or the array's %N throttle (slurm); 0: local: the cores / (num_workers + 1), slurm: no throttle")
    evaluate: bool = Field(False, description="evaluate each finished cell with fwrl evaluate and its family's protocol (evaluation.json in the run folder); recorded in sweep.yaml, so that running the sweep again without it still evaluates (--no-evaluate: off)")
    eval_episodes: int | None = Field(None, ge=1, description="episodes per task, split and repeat of that evaluation; default: the family's protocol (or what sweep.yaml records)")
    dry_run: bool = Field(False, description="show what would run (slurm: print the array script) and start nothing")
    status: bool = Field(False, description="show the state of every cell and exit")
    ray_address: str = Field("auto", min_length=1, description="ray executor: the cluster, auto (running cluster), HOST:PORT, ray://HOST:PORT, or local (a private Ray on this machine)")
    cell_cpus: float = Field(0.0, ge=0, description="ray and slurm: CPUs of each cell; 0: its num_workers + 1")
    cell_gpus: float = Field(0.0, ge=0, description="ray and slurm: GPUs of each cell (slurm: --gres=gpu:N)")
