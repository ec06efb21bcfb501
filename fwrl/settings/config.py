"""Training configuration: one settings model, presets and YAML files, command-line overrides.

:class:`TrainConfig` defines every training setting once (type, default,
valid range, help); ``fwrl train`` generates its flags from it
(``fwrl.launch.flags``). A config is built from layers, later ones winning:
defaults, the env family's defaults (``family_defaults``: the learning suite's
settings, per core), a preset (a packaged name or a YAML file), ``--config FILE``,
then flags. A layer that picks another ``core`` drops the core options gathered
so far (they belong to the old core). A preset or ``--config`` file may hold
``per_core: {CORE: {KEY: VALUE}}``: a run of that core takes those settings right
after the file's own, under every later layer (``merge_with_per_core``).

A run's ``config.yaml`` is this model as a mapping. Core options whose default
changed (``CHANGED_CORE_DEFAULTS``) are always written out, so a saved config
without one predates the change and is read back with the old value
(:func:`saved_settings`): a checkpoint keeps the model it was trained as.
``--resume`` reloads it;
only the keys in ``RESUMABLE_CHANGES`` may differ on the command line (more
steps, other worker counts, logging), everything that shapes the model or the
learning problem must stay the same.

The config is flat for the user (one flag and one YAML key per setting), but no
part of the runtime reads it field by field: each takes its own typed section,
made here (:meth:`TrainConfig.pool_settings` for the env workers,
:meth:`TrainConfig.learner_settings` for the learner), and the runner the rest.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

import yaml
from pydantic import Field, field_validator, model_validator

from fwrl.envs.backends import BACKENDS
from fwrl.envs.spec import parse_env_spec
from fwrl.errors import FwrlError, unknown_choice
from fwrl.utils.files import atomic_write_text
from fwrl.utils.settings import Settings, parse_value, redefault, show
from fwrl.utils.yaml_files import read_yaml

if TYPE_CHECKING:
    from fwrl.agents.update_step import LearnerSettings
    from fwrl.envs.worker_pool import PoolSettings

STEM_CHOICES = ("impala", "nature", "minatar", "mlp", "popgym", "auto")
INIT_CHOICES = ("torch", "orthogonal")
STEM_PRECISIONS = ("float32", "bfloat16")  # fwrl.agents.model.STEM_PRECISIONS (a test keeps them equal)  # fwrl.agents.model.INITS  # fwrl.agents.model.STEMS and auto (a test keeps them equal)
# Upper bounds of the integer budgets: beyond them a run is a typo (1e100 agent steps trained with a
# learning rate that never moved); IMPALA's largest runs were 10^10 frames.
MAX_STEPS = 10**12
MAX_EPISODES = 10**6
MAX_REPEATS = 1000
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:[0-9]+)?|mps")
THREADS_HELP = ("torch threads of the learner; 0: the allowed cores minus one per local env worker "
                "(at most half of the cores)")


def check_device(name: str) -> str:
    """``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``; other names raise ValueError."""
    if not DEVICE_PATTERN.fullmatch(name):
        raise ValueError("a device is auto, cpu, cuda, cuda:N or mps")
    return name


class TrainConfig(Settings):
    """Every setting of a training run (PAPERS.md §4 defaults). One field per line."""

    env: str = Field("atari:Pong", min_length=1, description="env spec, e.g. atari:Pong or memory:cue_delay?delay=10")
    core: str = Field("lstm", min_length=1, description="memory core, one of those fwrl info --cores lists")
    core_options: dict[str, Any] = Field(default_factory=dict, description="options of the core, given as --core-opt KEY=VALUE")
    stem: Literal[STEM_CHOICES] = Field("auto", description="vision stem; auto: impala for frames, minatar for frames under 32x32, mlp for vectors (popgym: POPGym's baselines' 128-wide encoder for vectors)")
    stem_precision: Literal[STEM_PRECISIONS] = Field("float32", description="precision the stem computes in (autocast; its weights and gradients, the core and the heads stay float32): bfloat16 about halves a frame stem's time on CPUs with native bf16 (AVX512-BF16, AMX) and on GPUs, and is slower elsewhere (measured: benchmarks/results/cpu_cores/stem_precision.md)")
    env_wrappers: list[str] = Field(default_factory=list, description="module:callable wrapping every env in every worker, applied in order")
    sticky_actions: bool = Field(False, description="Atari: sticky actions, repeat_action_probability 0.25; the env option sticky=true")
    full_action_space: bool = Field(False, description="Atari: all 18 actions; the env option full_action_space=true")
    backend: Literal[BACKENDS] = Field("local", description="env worker backend: local processes or Ray actors")
    ray_address: str = Field("auto", min_length=1, description="with --backend ray: auto (running cluster), HOST:PORT or local")
    num_workers: int = Field(4, ge=1, description="env worker processes or Ray actors")
    envs_per_worker: int = Field(2, ge=1, description="envs stepped by each worker")
    worker_splits: int = Field(1, ge=1, description="local backend: each worker process steps its envs in this many splits in turn (double-buffered sampling: it steps one split while the learner acts for another); must divide envs_per_worker")
    step_timeout: float = Field(60.0, gt=0, description="seconds an env worker may take per step before it is restarted")
    batch_size: int = Field(32, ge=1, description="rollouts per learner update, B")
    unroll_length: int = Field(50, ge=1, description="agent steps per rollout, T")
    total_steps: int = Field(50_000_000, ge=1, le=MAX_STEPS, description="agent-step budget; the learning rate decays linearly to 0 over it")
    max_seconds: float = Field(0.0, ge=0, description="time limit of a session: stop with a checkpoint this many seconds after the command started, start-up and stop included; 0: no limit")
    learning_rate: float = Field(6e-4, gt=0, description="RMSProp learning rate")
    rmsprop_alpha: float = Field(0.99, ge=0, lt=1, description="RMSProp smoothing constant")
    rmsprop_eps: float = Field(0.01, gt=0, description="RMSProp epsilon, added outside the square root")
    rmsprop_momentum: float = Field(0.0, ge=0, lt=1, description="RMSProp momentum")
    rmsprop_bias_correction: bool = Field(False, description="divide RMSProp's square average by 1 - alpha^n at update n (Adam's correction): no 10x first steps from the average starting at 0")
    grad_norm_clip: float = Field(40.0, gt=0, description="clip the global gradient norm to this")
    entropy_cost: float = Field(0.01, ge=0, description="weight of the entropy regulariser")
    baseline_cost: float = Field(0.5, ge=0, description="weight of the baseline loss")
    discount: float = Field(0.99, ge=0, le=1, description="discount factor gamma")
    reward_clip: float = Field(1.0, gt=0, description="rewards are clipped to [-x, x] in the loss")
    truncation: Literal["auto", "bootstrap", "terminate"] = Field("auto", description="episodes cut by a time limit: bootstrap from the final observation's value, or end the return there; auto: terminate on atari (the torchbeast protocol), else bootstrap")
    device: str = Field("auto", description="learner device: auto, cpu, cuda, cuda:N or mps")
    num_threads: int = Field(0, ge=0, description=THREADS_HELP)
    inference_graph: bool | None = Field(None, description="replay the acting step (state gather and scatter, forward, store writes) as CUDA graphs, one per batch size (CUDA only); default: on where a learner rank acts on a CUDA device with one acting thread, else off (measured: README, fwrl train)")
    acting_batch_wait: float = Field(0.004, ge=0, le=1, description="seconds an acting thread waits, once a worker is ready, for more (until half its workers are) before it acts: larger forwards, fewer calls; 0: act on whoever is ready (dynamic batching)")
    acting_priority: Literal["normal", "high"] = Field("normal", description="CUDA priority of the acting streams: high schedules the acting step's kernels ahead of the learner's queued ones on a shared GPU; normal until the GPU suite's A/B shows high faster (README, fwrl train)")
    acting_staging: Literal["pack", "shared"] = Field("pack", description="how an acting call stages the observations of the ready env workers: pack them into one upload, or read them from the arrays the local backend's workers share with the learner (no copy on the CPU; on CUDA one copy per run of workers from that memory, pinned); pack until the GPU suite's A/B shows shared faster (README, fwrl train)")
    acting_threads: int = Field(0, ge=0, description="acting threads of each learner rank, each serving its own slice of the env workers with its own forward (and CUDA stream); 0: the default, 1 (more speed up a compute-bound forward and slow an overhead-bound one: README, fwrl train)")
    acting_trace: Literal["auto", "on", "off"] = Field("auto", description="run the core's acting step (T = 1, no autograd) from a TorchScript trace per batch size on the CPU: the same calls, the same results to float round-off, without their Python (checked against the eager step before use; a core that does not match runs eagerly, with a warning); auto: on on the CPU for a core that steps in Python (all but feedforward, lstm, gru); on is refused off the CPU, where CUDA graphs do this (inference_graph)")
    learner_process: Literal["auto", "on", "off"] = Field("auto", description="run the learner's update (forward, backward, optimiser) in a process of its own, off the acting thread's GIL (one learner rank, on the CPU or a CUDA device, where the model's memory is shared with it); auto: on for CPU runs of a core that steps through the unroll in Python (all but feedforward, lstm, gru), with at least 100,000 agent steps and no time limit under 60 s, where its start (2-3 s) pays (measured: README, fwrl train)")
    learners: int = Field(1, ge=1, description="learner ranks started on this machine (torch.distributed, gradients summed); under torchrun or SLURM the launcher's ranks count instead")
    dist_timeout: float = Field(300.0, gt=0, description="seconds a learner rank waits in a collective before it gives up (a rank died)")
    dist_backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="torch.distributed backend of the learner ranks; auto: nccl with one GPU per rank, else gloo")
    init: Literal[INIT_CHOICES] = Field("torch", description="initialisation of the stem and heads: torch "
                                        "(PyTorch's defaults) or orthogonal (gain sqrt 2, heads 0.01 / 1)")
    load_vision_from: str = Field("", description="checkpoint whose vision stem to load, R2AC protocol")
    freeze_vision: bool = Field(False, description="do not train the vision stem")
    seed: int = Field(1, ge=0, lt=2**32, description="random seed")
    checkpoint_interval: float = Field(600.0, gt=0, description="seconds between checkpoint.pt writes")
    milestone_interval: int = Field(0, ge=0, le=MAX_STEPS, description="agent steps between kept checkpoint-<steps>.pt; 0: none")
    log_interval: float = Field(5.0, gt=0, description="seconds between metrics rows")
    log_every_steps: int = Field(0, ge=0, le=MAX_STEPS, description="also a metrics row every this many agent steps (a short run's curves get their points by its steps, not only by seconds); 0: by log_interval's seconds alone")
    eval_every: int = Field(0, ge=0, le=MAX_STEPS, description="agent steps between evaluations written to metrics.csv; 0: none")
    eval_episodes: int = Field(10, ge=0, le=MAX_EPISODES, description="episodes per task and split of each --eval-every evaluation")
    video_every: int = Field(0, ge=0, le=MAX_STEPS, description="updates between episode videos: a greedy episode of the first task and split, recorded beside the run into <run>/videos (and logged to W&B with wandb); 0: none")
    wandb: bool = Field(False, description="track the run in Weights & Biases (the wandb extra): the config, every metrics row and the videos, its files in <run>/wandb; WANDB_MODE=offline logs there with no network (wandb sync uploads it later)")
    wandb_project: str = Field("fwrl", min_length=1, description="W&B project of the run (with wandb)")
    wandb_group: str = Field("", description="W&B group of the run (with wandb); default: a sweep's cells are grouped by the sweep folder's name, other runs by none")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "") -> "TrainConfig":
        """Validate a mapping of settings (strings or typed values); ``source`` names where it came from."""
        return cls.parse(data, what="setting", source=f"in {source}" if source else "")

    @field_validator("device")
    @classmethod
    def _device(cls, name: str) -> str:
        return check_device(name)

    @model_validator(mode="after")
    def _across_settings(self) -> "TrainConfig":
        self._check_core()
        self._fold_atari_flags()
        if self.eval_every > 0 and self.eval_episodes < 1:
            raise FwrlError(f"setting eval_episodes={self.eval_episodes} is not valid with eval_every="
                            f"{self.eval_every}: each evaluation needs at least 1 episode (or eval_every 0: none).")
        if self.envs_per_worker % self.worker_splits:
            divisors = [d for d in range(1, self.envs_per_worker + 1) if self.envs_per_worker % d == 0]
            raise FwrlError(f"setting worker_splits={self.worker_splits} does not divide envs_per_worker="
                            f"{self.envs_per_worker} (each split steps the same number of envs): use one of "
                            f"{', '.join(map(str, divisors))}.")
        if self.worker_splits > 1 and self.backend != "local":
            raise FwrlError(f"setting worker_splits={self.worker_splits} is for the local backend (splits of one "
                            f"worker process), not backend={self.backend!r}: use worker_splits 1 and more workers.")
        if self.acting_staging == "shared" and self.backend != "local":
            raise FwrlError(f"setting acting_staging='shared' reads the arrays the local backend's workers share "
                            f"with the learner, not backend={self.backend!r}'s (its results arrive as copies): use "
                            f"acting_staging 'pack'.")
        if self.freeze_vision and not self.load_vision_from:
            raise FwrlError("setting freeze_vision=true freezes a vision stem loaded by load_vision_from, which is "
                            "not set: it would train the core on a random stem. Give --load-vision-from CKPT or "
                            "drop --freeze-vision.")
        per_rank = self.num_workers // self.learners
        if per_rank >= 1 and self.acting_threads > per_rank:
            ranks = f" shared by {self.learners} learner ranks ({per_rank} each)" if self.learners > 1 else ""
            raise FwrlError(f"setting acting_threads={self.acting_threads} is more than the env workers of a learner: "
                            f"num_workers={self.num_workers}{ranks}; each acting thread serves its own workers: use "
                            f"1..{per_rank}, or 0 for the default (1).")
        return self

    # ------------------------------------------------------------- the sections each part takes

    def bootstraps_truncation(self) -> bool:
        """Whether V-trace bootstraps where a time limit cut an episode (``truncation``): ``auto``
        keeps the torchbeast protocol on Atari (the 108k-frame cap ends the episode) and
        bootstraps everywhere else."""
        if self.truncation == "auto":
            return parse_env_spec(self.env).family != "atari"
        return self.truncation == "bootstrap"

    def learner_settings(self) -> "LearnerSettings":
        """The learner's section: the loss, the clips, the truncation protocol."""
        from fwrl.agents.update_step import LearnerSettings

        return LearnerSettings(discount=self.discount, baseline_cost=self.baseline_cost,
                               entropy_cost=self.entropy_cost, reward_clip=self.reward_clip,
                               grad_norm_clip=self.grad_norm_clip, bootstrap_truncation=self.bootstraps_truncation())

    def pool_settings(self, num_workers: int | None = None, seed: int | None = None,
                      mode: str = "train") -> "PoolSettings":
        """The env workers' section (``num_workers`` and ``seed``: a learner rank's own, where they
        differ from the run's). With ``worker_splits`` S the pool's workers are the splits: S per
        process, ``envs_per_worker / S`` envs each."""
        from fwrl.envs.worker_pool import PoolSettings

        s = self.worker_splits
        return PoolSettings(self.env, (self.num_workers if num_workers is None else num_workers) * s,
                            self.envs_per_worker // s, self.seed if seed is None else seed, mode,
                            self.step_timeout, tuple(self.env_wrappers), worker_splits=s)

    def backend_options(self) -> dict[str, Any]:
        """The options of the worker backend (``make_pool``'s keywords)."""
        return {"address": self.ray_address} if self.backend == "ray" else {}

    def _check_core(self) -> None:
        """The core exists; its options are valid for it (kept as given, typed). An unknown core, an
        unknown option and a value of the wrong type or range are refused from the catalogue, before
        torch is imported (``fwrl.settings.core_catalog``); the registry's config class then
        checks the options together and types them."""
        from fwrl.settings.core_catalog import check_core_options, core_names

        if self.core not in core_names():
            raise unknown_choice("core", self.core, core_names())
        check_core_options(self.core, self.core_options)
        from fwrl.memory_modules import core_config_class

        options = core_config_class(self.core).from_options(self.core_options, core=self.core)
        pinned = auto_core_options(type(options))
        self.core_options = {key: getattr(options, key) for key in (*self.core_options, *pinned)}

    def _fold_atari_flags(self) -> None:
        """``sticky_actions`` / ``full_action_space`` and the env spec's options say the same."""
        spec = parse_env_spec(self.env)
        flags = {"sticky": "sticky_actions", "full_action_space": "full_action_space"}
        if spec.family != "atari":
            given = [name for name in flags.values() if getattr(self, name)]
            if given:
                raise FwrlError(f"setting {given[0]}=true applies to atari envs only, not env={self.env!r}.")
            return
        add = {}
        for option, name in flags.items():
            if option in spec.options:
                in_spec = parse_value(bool, spec.options[option], f"env option {option}={show(spec.options[option])}")
                if getattr(self, name) and not in_spec:
                    raise FwrlError(f"setting {name}=true contradicts {option}={spec.options[option]} in "
                                    f"env={self.env!r}.")
                setattr(self, name, in_spec)
            elif getattr(self, name):
                add[option] = "true"
        if add:
            self.env = spec.with_options(**add).text


class EvaluateConfig(Settings):
    """Settings of ``fwrl evaluate`` (the run's own config comes from its checkpoint)."""

    env: str | None = Field(None, min_length=1, description="env spec to evaluate on; default: the run's env")
    episodes: int | None = Field(None, ge=1, le=MAX_EPISODES, description="episodes per task, split and repeat; default: atari 30, procgen 200, others 100")
    repeats: int | None = Field(None, ge=1, le=MAX_REPEATS, description="repeats; default: atari 5, dmlab 3, others 1")
    policy: Literal["greedy", "sample"] = Field("greedy", description="argmax or sampled actions")
    splits: str | None = Field(None, min_length=1, description="comma-separated splits; procgen: train,test_1000,test_1200,test_1400")
    num_workers: int | None = Field(None, ge=1, description="env worker processes; default: the CPU cores, at most 8")
    envs_per_worker: int = redefault(TrainConfig, "envs_per_worker", 1)
    seed: int = redefault(TrainConfig, "seed", 0)
    device: str = redefault(TrainConfig, "device", "cpu")
    backend: Literal[BACKENDS] = redefault(TrainConfig, "backend", "local")
    ray_address: str = redefault(TrainConfig, "ray_address", "auto")
    step_timeout: float = redefault(TrainConfig, "step_timeout", 60.0)
    out: str | None = Field(None, min_length=1, description="JSON path, the markdown table beside it; default: <run>/evaluation.json or <checkpoint>.eval.json")
    video: str | None = Field(None, min_length=1, description="folder to write an MP4 of the first --video-episodes episodes of every task and split into (named by task, split, episode and return)")
    video_episodes: int | None = Field(None, ge=1, le=MAX_EPISODES, description="with --video: episodes recorded per task and split (default 1)")

    @field_validator("device")
    @classmethod
    def _device(cls, name: str) -> str:
        return check_device(name)


class InspectConfig(Settings):
    """Settings of ``fwrl inspect`` (the run's own config comes from its checkpoint)."""

    env: str | None = Field(None, min_length=1, description="env spec to play; default: the run's env (its first task; ProcGen: its last test split)")
    episodes: int = Field(1, ge=1, le=1000, description="episodes to play, each plotted (PNG) and saved (NPZ)")
    policy: Literal["greedy", "sample"] = Field("greedy", description="argmax or sampled actions")
    seed: int = redefault(TrainConfig, "seed", 0)
    device: str = redefault(TrainConfig, "device", "cpu")
    out: str | None = Field(None, min_length=1, description="folder of episode-<k>.png and episode-<k>.npz; default: <run>/inspect or <checkpoint>.inspect")

    @field_validator("device")
    @classmethod
    def _device(cls, name: str) -> str:
        return check_device(name)


MAX_PLOT_PIXELS = 10_000  # per side: 10000 x 10000 RGBA is 400 MB in memory


def parse_size(text: str) -> tuple[int, int]:
    """``fwrl plot --size``: WIDTHxHEIGHT in pixels, each from 100 to :data:`MAX_PLOT_PIXELS`."""
    w, sep, h = text.lower().partition("x")
    try:
        size = (int(w), int(h))
    except ValueError:
        size = (0, 0)
    if not sep or min(size) < 100 or max(size) > MAX_PLOT_PIXELS:
        raise FwrlError(f"--size {text!r} is not WIDTHxHEIGHT in pixels (each from 100 to {MAX_PLOT_PIXELS}), "
                        "e.g. 1200x800.")
    return size


class PlotConfig(Settings):
    """Settings of ``fwrl plot``."""

    metric: str = Field("mean_return", min_length=1, description="metrics.csv column")
    by: Literal["run", "task"] = Field("run", description="task: one panel per task of multi-task runs, from the columns return/<task>")
    smooth: int = Field(1, ge=1, description="moving average over K points")
    out: str | None = Field(None, min_length=1, description="PNG path; default: <run>/<metric>.png for one run, ./<metric>.png for several")
    size: str = Field("1200x800", description="WIDTHxHEIGHT in pixels, each from 100 to 10000")
    random: str | None = Field(None, min_length=1, description="a random policy's JSON (benchmarks/random_policy.py, its train split where it has one): a dashed line at each task's random return, with --by task")

    @field_validator("size")
    @classmethod
    def _size(cls, text: str) -> str:
        parse_size(text)
        return text


class BenchConfig(Settings):
    """The measuring window of ``fwrl bench throughput`` and ``fwrl bench envs``."""

    seconds: float = Field(60.0, gt=0, description="measured seconds after the warm-up")
    warmup: float = Field(15.0, ge=0, description="seconds run before the measurement starts")
    ceiling_seconds: float = Field(10.0, ge=0, description="throughput: seconds of random-action stepping on the same workers first, the env ceiling; 0: skip it")
    json_path: str | None = Field(None, min_length=1, description="throughput: also write the results and the config to this JSON file")
    profile_path: str | None = Field(None, min_length=1, description="throughput: after the measured window, run profile_seconds more under torch.profiler (left out of the figures) and write its report to this file (markdown: per acting call, each stage's time and the CUDA launches, copies and syncs; the ops by CPU and device time)")
    profile_seconds: float = Field(5.0, gt=0, description="throughput: seconds --profile-path profiles, after the measured window (whole log intervals of 1 s)")
    acting_only: bool = Field(False, description="throughput: no updates, each batch handed back to the store unread (agent steps/s: the acting path's rate with no learner work beside it; one learner rank)")


# core option whose default changed to auto (None, resolved by the stem) -> the value every run had
# before (output_scale 1; head_init, new: the agent's init scheme before it existed; the SRWM cores'
# input_map softmax and pre_norm off). It applies to a core only where that option is auto: the other
# fast-weight cores' pre_norm stays True.
CHANGED_CORE_DEFAULTS: dict[str, Any] = {"output_scale": 1.0, "head_init": "agent", "input_map": "softmax",
                                         "pre_norm": False}

def auto_core_options(config_class: type) -> list[str]:
    """The options of ``CHANGED_CORE_DEFAULTS`` that are auto (default None) in a core's config class."""
    fields = config_class.model_fields
    return [key for key in CHANGED_CORE_DEFAULTS if key in fields and fields[key].default is None]


RESUMABLE_CHANGES = {
    "total_steps", "max_seconds", "num_workers", "envs_per_worker", "worker_splits", "step_timeout", "device", "num_threads",
    "checkpoint_interval", "milestone_interval", "log_interval", "log_every_steps", "backend", "ray_address",
    "eval_every", "eval_episodes", "video_every", "wandb", "wandb_project", "wandb_group", "inference_graph", "acting_trace", "acting_batch_wait", "acting_priority", "acting_staging", "acting_threads", "learner_process", "learners", "dist_timeout", "dist_backend",
}


# ----------------------------------------------------------------------- presets and YAML files

def preset_names() -> list[str]:
    folder = resources.files("fwrl.settings") / "presets"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def read_settings_file(path: Path, what: str = "config file") -> dict[str, Any]:
    """The settings of a YAML file (a mapping of TrainConfig keys); unknown keys are errors."""
    path = Path(path)
    return _settings_mapping(read_yaml(path, what), f"{what} {path}")


def _settings_mapping(data: Any, source: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FwrlError(f"{source} is not a mapping of settings (KEY: VALUE lines), got {type(data).__name__}.")
    for key in data:
        if key not in TrainConfig.model_fields and key != PER_CORE:
            valid = ", ".join([*TrainConfig.model_fields, PER_CORE])
            raise FwrlError(f"unknown setting {key!r} in {source}; valid choices: {valid}.")
    if PER_CORE in data:
        _check_per_core(data[PER_CORE], source)
    return dict(data)


# A preset's or config file's settings for particular cores: {CORE: {KEY: VALUE}}, which a run of that core
# takes over the file's own (a later layer, --config or a flag, still wins). The popgym preset's rate, chosen
# on the GRU, is one the fast-weight cores cannot learn at (benchmarks/results/learning/popgym-cpu/lr-screen).
PER_CORE = "per_core"


def _check_per_core(value: Any, source: str) -> None:
    from fwrl.settings.core_catalog import core_names  # without importing torch

    if not isinstance(value, dict):
        raise FwrlError(f"{PER_CORE} in {source} is not a mapping of cores to settings (CORE: {{KEY: VALUE}}).")
    for core, settings in value.items():
        if core not in core_names():
            raise unknown_choice("core", core, core_names(), f"in {PER_CORE} of {source}")
        if not isinstance(settings, dict):
            raise FwrlError(f"{PER_CORE}.{core} in {source} is not a mapping of settings (KEY: VALUE).")
        for key in settings:
            if key not in TrainConfig.model_fields or key == "core":
                valid = ", ".join(k for k in TrainConfig.model_fields if k != "core")
                raise FwrlError(f"unknown setting {key!r} in {PER_CORE}.{core} of {source}; valid choices: {valid}.")


def merge_with_per_core(layers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``merge_settings(layers)`` where a layer's ``per_core`` settings for the core the layers end on
    apply right after that layer: over its own settings, under every later layer's."""
    plain = [{k: v for k, v in layer.items() if k != PER_CORE} for layer in layers]
    core = env_and_core(merge_settings(plain))[1]
    expanded: list[Mapping[str, Any]] = []
    for layer, own in zip(layers, plain):
        expanded.append(own)
        chosen = (layer.get(PER_CORE) or {}).get(core)
        if chosen:
            expanded.append({"core": core, **chosen})
    return merge_settings(expanded)


def load_preset(name: str) -> dict[str, Any]:
    """A packaged preset by name, or a YAML file of one's own by path."""
    if name in preset_names():
        text = (resources.files("fwrl.settings") / "presets" / f"{name}.yaml").read_text()
        return _settings_mapping(yaml.safe_load(text), f"preset {name}")
    if name.endswith((".yaml", ".yml")) or "/" in name or Path(name).is_file():
        return read_settings_file(Path(name), "preset file")
    raise unknown_choice("preset (or a path to a YAML file)", name, preset_names())


def merge_settings(layers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Later layers win; a layer that picks another core drops the core options gathered so far."""
    data: dict[str, Any] = {}
    for layer in layers:
        layer = dict(layer)
        options = layer.pop("core_options", None)
        if options is not None and not isinstance(options, Mapping):
            raise FwrlError(f"setting core_options={show(options)} is not valid: a mapping of core options "
                            "(KEY: VALUE) is needed.")
        if "core" in layer and layer["core"] != data.get("core", TrainConfig.model_fields["core"].default):
            data.pop("core_options", None)
        per_core = layer.pop(PER_CORE, None)
        if per_core:  # merged core by core: a --config file's entry for a core adds to its preset's
            merged = dict(data.get(PER_CORE, {}))
            for core, settings in per_core.items():
                merged[core] = {**merged.get(core, {}), **settings}
            data[PER_CORE] = merged
        data.update(layer)
        if options:
            data["core_options"] = {**data.get("core_options", {}), **options}
    return data


def layered_settings(preset: str | None, overrides: Mapping[str, Any], config_file: Path | None = None,
                     base: Mapping[str, Any] | None = None, family: bool = True) -> dict[str, Any]:
    """The settings of ``base`` < ``preset`` < ``config_file`` < ``overrides``, merged, not validated;
    with ``family``, the env family's defaults fill what none of them sets
    (:mod:`fwrl.settings.family_defaults`)."""
    layers = [dict(base or {})]
    if preset:
        layers.append(load_preset(preset))
    if config_file is not None:
        layers.append(read_settings_file(config_file))
    layers.append(dict(overrides))
    merged = merge_with_per_core(layers)
    if family:
        from fwrl.settings.family_defaults import family_defaults

        merged.update(family_defaults(merged, *env_and_core(merged)))
    return merged


def env_and_core(settings: Mapping[str, Any]) -> tuple[Any, Any]:
    """The env and core of merged settings (the defaults where they set none)."""
    return (settings.get("env", TrainConfig.model_fields["env"].default),
            settings.get("core", TrainConfig.model_fields["core"].default))


def build_config(preset: str | None, overrides: Mapping[str, Any], config_file: Path | None = None,
                 base: Mapping[str, Any] | None = None) -> TrainConfig:
    """The config of ``base`` < ``preset`` < ``config_file`` < ``overrides``, over the env family's
    defaults (see the module docstring)."""
    return TrainConfig.from_dict(layered_settings(preset, overrides, config_file, base))


def check_env_first(settings: Mapping[str, Any], installed: bool = True) -> None:
    """Check the env of merged settings (spec, family, games, options and, with ``installed``, the
    libraries its workers need: ``fwrl.envs.registry.check_installed``) before the config is
    validated, which imports torch for the core's options: a misspelt env or a missing library is
    said at once. An explicit stem is checked against the env's observations too (``auto`` always
    fits). Values that are not a spec string are left to the config's own check."""
    env = settings.get("env", TrainConfig.model_fields["env"].default)
    if isinstance(env, str) and env:
        from fwrl.envs.registry import check_installed, resolve

        check_installed(env) if installed else resolve(env)
        check_stem_first(env, settings.get("stem"), settings.get("env_wrappers") or ())


def check_stem_first(env: str, stem: Any, wrappers: Sequence[str] = ()) -> None:
    """A stem named explicitly fits the observations of ``env`` (one FwrlError naming the stems
    that fit: :func:`fwrl.agents.stem_shapes.check_stem`); ``auto`` and values that are not a stem
    are left to the config's own check."""
    if stem in STEM_CHOICES and stem != "auto" and isinstance(wrappers, (list, tuple)):
        from fwrl.agents.stem_shapes import check_stem
        from fwrl.envs.registry import describe_env

        check_stem(stem, describe_env(env, wrappers=tuple(wrappers)).obs_shape, env)


def check_resume(saved: TrainConfig, overrides: Mapping[str, Any]) -> TrainConfig:
    """The saved config with the allowed overrides; other differences are an error."""
    new = TrainConfig.from_dict(merge_settings([saved.to_dict(), overrides]))
    bad = changed_settings(saved, new)
    if bad:
        details = ", ".join(f"{k} (run has {getattr(saved, k)!r})" for k in bad)
        raise FwrlError(
            f"cannot resume with a different {details}: these settings define the model or the "
            f"learning problem. Settings that may change on resume: {', '.join(sorted(RESUMABLE_CHANGES))}. "
            "Start a new run (another --name) to change the others."
        )
    return new


def changed_settings(saved: TrainConfig, new: TrainConfig) -> list[str]:
    """The settings that define the model or the learning problem (all but ``RESUMABLE_CHANGES``)
    whose values differ between ``saved`` and ``new``; ``core_options`` where the same core's differ."""
    bad = [key for key in TrainConfig.model_fields
           if key not in RESUMABLE_CHANGES and key != "core_options" and getattr(new, key) != getattr(saved, key)]
    if new.core == saved.core and _core_settings(new) != _core_settings(saved):
        bad.append("core_options")
    return bad


def _core_settings(config: TrainConfig) -> dict[str, Any]:
    from fwrl.memory_modules import core_config_class

    return core_config_class(config.core).from_options(config.core_options).to_dict()


def config_yaml(config: TrainConfig) -> str:
    """The config as the YAML of a run's config.yaml."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False)


def save_config(config: TrainConfig, path: Path) -> None:
    atomic_write_text(path, config_yaml(config))


def read_config(path: Path) -> TrainConfig:
    """A run's config.yaml (also one written by older fwrl versions)."""
    data = read_yaml(path, "run config")
    if not isinstance(data, dict):
        raise FwrlError(f"run config {path} is not a mapping of settings.")
    return TrainConfig.from_dict(saved_settings(data), source=str(path))


def saved_settings(data: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a saved run (config.yaml or a checkpoint's config) with the old value of each
    core option in ``CHANGED_CORE_DEFAULTS`` that the run did not record (it predates the change)."""
    from fwrl.memory_modules import core_config_class, core_names

    data = dict(data)
    core = data.get("core", TrainConfig.model_fields["core"].default)
    if core not in core_names():
        return data  # TrainConfig names the unknown core
    options = dict(data.get("core_options") or {})
    for key in auto_core_options(core_config_class(core)):
        if key not in options:
            options[key] = CHANGED_CORE_DEFAULTS[key]
    data["core_options"] = options
    return data
