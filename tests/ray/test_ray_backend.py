"""The ``ray`` worker backend on a two-node Ray cluster on this machine, and crash/resume.

Ray tests skip when ray is not installed (``pip install 'fwrl[ray]'``). The
cluster (``tests/ray_cluster.py``): a head node and an env node (``envs``
resource), shared by this session's Ray tests (the worker fault tests of
``test_worker_faults.py`` run on it too).
The learner-SIGKILL test uses the local backend and needs no Ray.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from fwrl.envs.worker_pool import PoolSettings
from fwrl.errors import FwrlError
from ray_cluster import env_nodes

HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (pip install 'fwrl[ray]')")

ENV = "memory:cue_delay?delay=3"


# --------------------------------------------------------------------------- cluster

@pytest.fixture
def cluster(ray_cluster):
    """The session's two-node Ray cluster (``tests/ray_cluster.py``)."""
    return ray_cluster


@needs_ray
def test_the_cluster_leaves_sigterm_to_the_test_run(cluster):
    """Connecting this process to the cluster (ray.init) does not take SIGTERM from pytest: a SIGTERM
    to a test run (a CI limit) stops the run, not the one test in progress with a SystemExit."""
    assert signal.getsignal(signal.SIGTERM) is cluster.sigterm_before


def _drive(pool, rounds: int, seed: int = 0) -> dict[int, list]:
    """Step every worker ``rounds`` times with a fixed action schedule; per-worker results."""
    rng = np.random.default_rng(seed)
    schedule = rng.integers(0, pool.info.num_actions, size=(rounds + 1, pool.num_slots))
    seen: dict[int, list] = {w: [] for w in range(pool.num_workers)}
    deadline = time.monotonic() + 120
    while min(len(v) for v in seen.values()) < rounds + 1:
        assert time.monotonic() < deadline, {w: len(v) for w, v in seen.items()}
        for r in pool.wait(1.0):
            step = len(seen[r.worker])
            seen[r.worker].append({k: np.array(getattr(r, k)) for k in ("obs", "reward", "done", "task")}
                                  | {"episodes": r.episodes, "restarted": r.restarted, "life": r.life})
            if step < rounds:
                pool.act(r.worker, schedule[step, pool.slots_of(r.worker)])
    return seen


# --------------------------------------------------------------------------- pool behaviour

def test_missing_ray_is_a_clear_error(monkeypatch):
    from fwrl.envs.backends import make_pool

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(FwrlError, match=r"pip install -e '\.\[ray\]'"):
        make_pool("ray", PoolSettings(ENV, 1, 1))


@needs_ray
def test_ray_pool_matches_local_pool_and_runs_on_env_node(cluster):
    """Same seeds and actions -> the same observations, rewards and episodes as the local backend."""
    from fwrl.envs.backends import make_pool

    rounds = 25
    with make_pool("ray", PoolSettings(ENV, 2, 3, seed=5), address=cluster.address, verbose=False) as pool:
        ray_seen = _drive(pool, rounds)
        assert pool.resource == "envs"
        assert pool.placement() == {0: cluster.env_node, 1: cluster.env_node}
        assert all(p["node_id"] == cluster.env_node for p in pool.placements)
    with make_pool("local", PoolSettings(ENV, 2, 3, seed=5)) as local:
        local_seen = _drive(local, rounds)
    for w in range(2):
        assert ray_seen[w][0]["done"].all() and not ray_seen[w][0]["restarted"]
        for a, b in zip(ray_seen[w], local_seen[w]):
            for key in ("obs", "reward", "done", "task"):
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)
            assert [(e.episode_return, e.episode_step) for e in a["episodes"]] == \
                [(e.episode_return, e.episode_step) for e in b["episodes"]]
    episodes = [e for w in range(2) for s in ray_seen[w] for e in s["episodes"]]
    assert episodes and all(e.episode_step == 5 for e in episodes)  # cue, 3 blanks, query


@needs_ray
def test_replay_matches_acting_through_ray_workers(cluster):
    """Acting through Ray actors into the rollout store: every stored rollout, replayed from its
    initial state, reproduces the outputs acting computed (``tests/e2e/test_acting_into_the_store.py`` does the
    same through local workers)."""
    from rollout_replay import assert_replay_matches, collect
    from worker_backends import Backend

    model, rollouts, _, _ = collect("lstm", {"hidden_size": 16}, 8, backend=Backend("ray", cluster.address))
    assert assert_replay_matches(model, rollouts), "episodes of 4 steps must end inside rollouts of 6"


@needs_ray
def test_killed_actor_is_replaced_with_a_restarted_result(cluster):
    import ray

    from fwrl.envs.backends import make_pool

    with make_pool("ray", PoolSettings(ENV, 2, 2, seed=1), address=cluster.address, verbose=False) as pool:
        _drive(pool, 3)
        first = pool.actor(0)
        ray.kill(first)
        for w in range(2):
            pool.act(w, np.zeros(2, np.int64))
        deadline, got = time.monotonic() + 120, None
        while got is None:
            assert time.monotonic() < deadline, pool.errors
            for r in pool.wait(1.0):
                if r.worker == 0 and r.restarted:
                    got = r
                else:  # ray.kill is asynchronous: a step sent just before may still answer
                    assert not r.restarted and r.life == 0
                    pool.act(r.worker, np.zeros(2, np.int64))
        assert got.restarted and got.life == 1 and got.done.all()
        assert pool.restarts == 1 and "actor died" in pool.errors[0]
        assert pool.actor(0) is not first
        assert pool.placement()[0] == cluster.env_node


@needs_ray
def test_missing_custom_resource_names_the_choices(cluster):
    from fwrl.envs.ray_workers import RayWorkerPool

    pool = RayWorkerPool(PoolSettings(ENV, 1, 1), address=cluster.address, resource="gpu_envs", verbose=False)
    with pytest.raises(FwrlError, match=r"'gpu_envs'.*envs"):
        pool.start()
    pool.close()


@needs_ray
def test_more_workers_than_the_cluster_holds_are_refused_in_one_line(cluster):
    """Ray would keep the workers past the cluster's capacity waiting for a resource without a word:
    the pool refuses them at start, naming what it can hold."""
    from fwrl.envs.ray_workers import RayWorkerPool

    pool = RayWorkerPool(PoolSettings(ENV, 99, 1), address=cluster.address, verbose=False)
    with pytest.raises(FwrlError, match=r"can hold \d+ env worker\(s\) at once \(each asks for 1 'envs'.*"
                                        r"not the 99 asked for: use --num-workers \d+ or fewer"):
        pool.start()
    pool.close()


@needs_ray
def test_a_private_ray_places_more_workers_than_cores():
    """``--ray-address local`` on a machine with fewer cores than workers: every worker is placed (the
    private Ray gets a logical CPU per worker) and steps, as local processes would."""
    workers = (os.cpu_count() or 1) + 2
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    done = subprocess.run([sys.executable, "-m", "fwrl.launch.cli", "bench", "envs", "--env", ENV,
                           "--num-workers", str(workers), "--envs-per-worker", "1", "--backend", "ray",
                           "--ray-address", "local", "--seconds", "1", "--warmup", "0"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{workers} x 1 (ray backend)" in done.stdout


# --------------------------------------------------------------------------- fwrl train

def _train_cmd(runs: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "fwrl.launch.cli", "train", "--runs-dir", str(runs), "--name", "r", *extra]


_TINY = ["--env", ENV, "--core", "lstm", "--num-workers", "2", "--envs-per-worker", "4", "--batch-size", "4",
         "--unroll-length", "10", "--device", "cpu", "--num-threads", "1", "--log-interval", "0.5",
         "--checkpoint-interval", "1"]


def _metrics_steps(run: Path) -> list[int]:
    path = run / "metrics.csv"
    if not path.exists():
        return []
    with path.open() as f:
        return [int(row["agent_steps"]) for row in csv.DictReader(f)]


def _wait_for(predicate, timeout: float, proc: subprocess.Popen | None = None, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"fwrl train exited ({proc.returncode}) while waiting for {what}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _check_resume(runs: Path, extra: list[str], target: int, saved_config: dict) -> None:
    """``--resume`` continues from the checkpoint with a monotonic step count and the same config (run
    through fwrl's main in this process, run_cli: no interpreter and torch start-up; on the ray backend
    this process, the session cluster's driver, is the run's)."""
    from cli_runs import run_cli

    run = runs / "r"
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    # rows a killed run wrote after its checkpoint was taken are dropped on resume (those steps are acted
    # again): the first metrics_rows rows, the count the checkpoint recorded (a row of a step at or before
    # the checkpoint's can be written just after the snapshot, and is dropped too)
    kept = _metrics_steps(run)[:ckpt["progress"]["metrics_rows"]]
    code, _, err = run_cli(["train", "--runs-dir", runs, "--name", "r", "--resume", "--total-steps", target, *extra])
    assert code == 0, err[-3000:]
    steps = _metrics_steps(run)
    new = steps[len(kept):]
    assert steps[:len(kept)] == kept, "resume changed the rows up to the checkpoint"
    assert new and new[0] >= ckpt["agent_steps"] and new == sorted(new) and new[-1] >= target
    final = torch.load(run / "checkpoint.pt", weights_only=True)
    assert final["agent_steps"] >= target and final["updates"] > ckpt["updates"]
    resumed_config = yaml.safe_load((run / "config.yaml").read_text())
    assert {k: v for k, v in resumed_config.items() if k not in ("total_steps", "backend", "ray_address")} == \
        {k: v for k, v in saved_config.items() if k not in ("total_steps", "backend", "ray_address")}


@needs_ray
def test_train_on_cluster_survives_env_node_loss_then_resumes(cluster, tmp_path):
    """Workers run on the env node; the node is killed mid-run; a new env node takes the
    replaced actors and training finishes; ``--resume`` continues it."""
    runs, run = tmp_path / "runs", tmp_path / "runs" / "r"
    env = dict(cluster.env, PYTHONUNBUFFERED="1")
    ray_flags = ["--backend", "ray", "--ray-address", cluster.address]
    err_path = tmp_path / "train.err"
    with err_path.open("w") as err:
        proc = subprocess.Popen(_train_cmd(runs, *_TINY, *ray_flags, "--total-steps", "3000"), env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        old = cluster.env_node
        _wait_for(lambda: _read(err_path).count(f"runs on node {old}") == 2, 180, proc, "placement on the env node")
        _wait_for(lambda: any(s > 0 for s in _metrics_steps(run)), 120, proc, "training steps")
        assert proc.poll() is None, "the run finished before the env node was killed; raise --total-steps"
        cluster.kill_group(cluster.node_group)
        cluster.node_group = cluster.add_env_node()  # seconds: the run loses its actors meanwhile
        _wait_for(lambda: _read(err_path).count("restarts: actor died") >= 2, 60, proc, "actor loss")
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = _read(err_path)
    assert proc.returncode == 0, log[-3000:]
    import ray

    _wait_for(lambda: len(env_nodes(ray)) == 1, 60, what="Ray's word that the killed node is gone")
    (new,) = env_nodes(ray)
    cluster.env_node = new  # the session's later ray tests run on the new node
    assert new != old and log.count(f"runs on node {new}") >= 2, log[-3000:]
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    assert ckpt["agent_steps"] >= 3000
    with (run / "metrics.csv").open() as f:
        assert int(list(csv.DictReader(f))[-1]["worker_restarts"]) >= 2
    steps = _metrics_steps(run)
    assert steps == sorted(steps)
    saved_config = yaml.safe_load((run / "config.yaml").read_text())
    assert saved_config["backend"] == "ray"
    _check_resume(runs, ray_flags, ckpt["agent_steps"] + 400, saved_config)


def test_learner_sigkill_leaves_a_loadable_checkpoint_and_resumes(tmp_path):
    """SIGKILL of the learner mid-run: checkpoint.pt loads with weights_only=True; --resume goes on."""
    runs, run = tmp_path / "runs", tmp_path / "runs" / "r"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with (tmp_path / "train.err").open("w") as err:
        proc = subprocess.Popen(_train_cmd(runs, *_TINY, "--total-steps", "10000000"), env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        _wait_for(lambda: (run / "checkpoint.pt").exists() and max(_metrics_steps(run), default=0) > 0,
                  180, proc, "a checkpoint")
        time.sleep(1.5)  # let it train (and checkpoint) some more, then kill it hard
        assert proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    assert ckpt["agent_steps"] > 0 and ckpt["format"] == "fwrl-checkpoint-v1"
    saved_config = yaml.safe_load((run / "config.yaml").read_text())
    assert ckpt["config"] == saved_config
    _check_resume(runs, [], ckpt["agent_steps"] + 400, saved_config)


@needs_ray
def test_a_lost_ray_head_stops_the_run_with_a_final_checkpoint_and_one_line(cluster, tmp_path):
    """The cluster's head (its GCS) is killed mid-run: within HEAD_LOST_SECONDS and well before Ray's
    own 60 s end of the driver, the run stops with a final checkpoint and one fwrl line naming the
    head, exit status 69 (the workers' cluster is gone; --resume later). The session's cluster, lent
    for it: this process disconnects first, and a later test that asks for the cluster gets a new one
    (none does in a plain run: this test is the session's last that uses it)."""
    from fwrl.envs.ray_workers import HEAD_LOST_SECONDS

    runs, run = tmp_path / "runs", tmp_path / "runs" / "r"
    err_path = tmp_path / "train.err"
    cluster.lend_head()
    env = dict(cluster.env, PYTHONUNBUFFERED="1")
    with err_path.open("w") as err:
        proc = subprocess.Popen(_train_cmd(runs, *_TINY, "--backend", "ray", "--ray-address", cluster.address,
                                           "--total-steps", "10000000"), env=env, stdout=subprocess.DEVNULL,
                                stderr=err)
    try:
        _wait_for(lambda: (run / "checkpoint.pt").exists() and any(s > 0 for s in _metrics_steps(run)), 240, proc,
                  "training steps and a checkpoint")
        before = torch.load(run / "checkpoint.pt", weights_only=True)["agent_steps"]
        killed = time.monotonic()
        cluster.kill_group(cluster.head_group)
        proc.wait(timeout=55)  # Ray itself would end the driver after 60 s, without a checkpoint
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
        for group in cluster.groups:  # the env node too: the cluster is started again when next asked for
            cluster.kill_group(group)
    log = _read(err_path)
    assert proc.returncode == 69, log[-3000:]
    # silence counts from the head's last answer, up to one probe (1 s) before the kill; the exit skips
    # Ray's own shutdown, which waits on the lost head (fwrl.launch.exits.end_process)
    assert HEAD_LOST_SECONDS - 1.5 <= took < HEAD_LOST_SECONDS + 20, (took, log[-2000:])
    assert "Traceback" not in log, log[-3000:]
    fwrl_errors = [line for line in log.splitlines() if line.startswith("fwrl: error:")]
    assert len(fwrl_errors) == 1 and "the Ray cluster's head at" in fwrl_errors[0], log[-3000:]
    assert f"--ray-address {cluster.address})" in fwrl_errors[0] or f"head at {cluster.address}" in fwrl_errors[0]
    assert torch.load(run / "checkpoint.pt", weights_only=True)["agent_steps"] >= before  # the final checkpoint
