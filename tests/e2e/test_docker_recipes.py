"""The container and cluster recipes under docker/ stay runnable.

- docker/install.sh (the one install path of every image) installs fwrl into a
  fresh virtualenv without system site packages, torch by ``--torch <version>``
  as README's commands install it, and its smoke test passes;
- the YAML manifests parse, and every ``fwrl ...`` command in the manifests and
  the SLURM script parses with the real CLI parser;
- every file a Dockerfile copies exists, and every Dockerfile installs through
  docker/install.sh, with the base image, torch's source and the extras as build args.

docker/smoke.sh builds and runs them for real (tests/e2e/test_container_smoke.py, opt-in).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fwrl.launch.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile*"))
MANIFESTS = [DOCKER / "ray-cluster.yaml", DOCKER / "kuberay-rayjob.yaml", DOCKER / "kuberay-rayjob-multi-learner.yaml"]
SCRIPTS = [DOCKER / "slurm-train.sh"]


def _logical_lines(text: str) -> list[str]:
    """Lines with shell backslash-continuations and folded YAML scalars joined."""
    return text.replace("\\\n", " ").splitlines()


def _fwrl_commands(text: str) -> list[list[str]]:
    """Every ``fwrl <subcommand> ...`` invocation in ``text``, as argv lists."""
    commands = []
    for line in _logical_lines(text):
        for match in re.finditer(r"(^|[\s\"'(])fwrl ((?:train|info|evaluate|bench|plot)(?=\s|$).*)", line):
            quote, rest = match.group(1), match.group(2)
            if quote in ('"', "'"):  # a command inside a quoted string ends at the closing quote
                rest = rest.split(quote, 1)[0]
            argv = shlex.split(rest.split(" #")[0], comments=False)
            commands.append([a for a in argv if a != "$@"])
    return commands


def _yaml_strings(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for v in node.values() for s in _yaml_strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _yaml_strings(v)]
    return []


def test_recipe_files_exist():
    for path in (*MANIFESTS, *SCRIPTS, DOCKER / "install.sh", DOCKER / "README.md",
                 DOCKER / "Dockerfile", DOCKER / "Dockerfile.cpu", DOCKER / "Dockerfile.dmlab"):
        assert path.is_file(), path
    for path in (DOCKER / "install.sh", *SCRIPTS):
        assert path.stat().st_mode & 0o111, f"{path} is not executable"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifests_parse_and_their_fwrl_commands_parse(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs and all(isinstance(d, dict) for d in docs)
    # commands in the manifest's values (what runs) and in its comments (what users type)
    found = [c for s in (s for d in docs for s in _yaml_strings(d)) for c in _fwrl_commands(s)]
    found += _fwrl_commands(path.read_text())
    assert found, f"{path.name} references no fwrl command"
    for argv in found:
        build_parser().parse_args(argv)


def test_kuberay_job_runs_fwrl_train_on_the_ray_backend():
    (job,) = yaml.safe_load_all((DOCKER / "kuberay-rayjob.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    args = build_parser().parse_args(shlex.split(job["spec"]["entrypoint"])[1:])
    assert args.command == "train" and args.backend == "ray"
    workers = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert any("envs" in w["rayStartParams"].get("resources", "") for w in workers)


def test_kuberay_multi_learner_job_gives_each_rank_a_gpu():
    (job,) = yaml.safe_load_all((DOCKER / "kuberay-rayjob-multi-learner.yaml").read_text())
    args = build_parser().parse_args(shlex.split(job["spec"]["entrypoint"])[1:])
    (head,) = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]
    assert args.command == "train" and args.backend == "ray" and int(args.learners) > 1
    assert head["resources"]["limits"]["nvidia.com/gpu"] == int(args.learners)


def test_ray_cluster_workers_offer_the_envs_resource():
    cfg = yaml.safe_load((DOCKER / "ray-cluster.yaml").read_text())
    assert any("envs" in c for c in cfg["worker_start_ray_commands"])
    assert any("--include-dashboard=false" in c for c in cfg["head_start_ray_commands"])


def test_slurm_script_is_valid_bash_and_runs_fwrl_train_with_ray():
    text = (DOCKER / "slurm-train.sh").read_text()
    subprocess.run(["bash", "-n", str(DOCKER / "slurm-train.sh")], check=True)
    commands = _fwrl_commands(text)
    assert commands
    for argv in commands:
        args = build_parser().parse_args(argv)
        assert args.command in ("train", "info", "evaluate", "bench", "plot")
    assert any(build_parser().parse_args(a).command == "train" and "ray" in a for a in commands)
    assert r'{\"envs\": ' in text and "--head" in text
    # the multi-learner form: torchrun starts the ranks of `python -m fwrl train` on every learner node
    launch = [line for line in _logical_lines(text)
              if line.lstrip().removeprefix("exec ").startswith("srun") and "torchrun" in line]
    assert launch and "--rdzv-backend=c10d" in launch[0] and "--nproc-per-node=" in launch[0]
    argv = [a for a in shlex.split(launch[0].split(" -m fwrl ", 1)[1]) if a != "$@"]
    args = build_parser().parse_args(argv)
    assert args.command == "train" and args.backend == "ray"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_copy_existing_files_and_use_install_sh(path):
    text = "\n".join(_logical_lines(path.read_text()))
    copies = [line.split()[1:-1] for line in text.splitlines() if line.startswith("COPY ")]
    assert copies, f"{path.name} copies nothing"
    for sources in copies:
        for src in sources:
            if src.startswith("--"):  # COPY --from=<stage>: not from the build context
                break
            assert (ROOT / src).exists(), f"{path.name} copies {src}, which does not exist"
    assert "docker/install.sh" in text, f"{path.name} does not install through docker/install.sh"


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cpu"])
def test_dockerfiles_take_what_varies_as_build_args(name):
    """Base image, torch source, extras and pip's indexes are build args (a local base and a local
    wheel folder work where no registry can be reached); a CA bundle comes as the secret pip_cert."""
    text = "\n".join(_logical_lines((DOCKER / name).read_text()))
    args = set(re.findall(r"^ARG (\w+)", text, re.M))
    assert {"BASE", "TORCH", "EXTRAS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"} <= args
    assert re.search(r"^FROM \$\{BASE\}", text, re.M)
    install = next(line for line in text.splitlines() if "docker/install.sh --python" in line)
    assert '--torch "${TORCH}"' in install and '--extras "${EXTRAS}"' in install
    assert "--mount=type=secret,id=pip_cert" in install
    assert not re.search(r"^ENV .*PIP_(INDEX_URL|EXTRA_INDEX_URL|FIND_LINKS|CERT)", text, re.M)


def test_install_script_installs_fwrl_into_a_fresh_virtualenv(tmp_path):
    """docker/install.sh on a copy of the sources, into a new virtualenv without system site packages.

    The venv is made by this interpreter's ``venv`` module, which bases it on the real
    interpreter even when the tests themselves run in a virtualenv; torch is installed the
    way README.md's commands do, ``pip install torch==<this torch's version>`` from pip's
    configured indexes (a local wheel on the CPU machines).

    Installing torch and the extras' dependencies again is what ``.ci/run`` has just done in
    its own fresh virtualenv (README's command), so by default the new venv shares them: a
    ``.pth`` file puts this run's site-packages after the venv's own, install.sh finds torch and
    the dependencies satisfied there and installs fwrl itself into the new venv, which imports
    it from there. ``FWRL_FRESH_INSTALL_TEST=1`` shares nothing (every package from the indexes).
    """
    import sysconfig

    import torch

    shared = os.environ.get("FWRL_FRESH_INSTALL_TEST") != "1"
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    shutil.copytree(ROOT / "fwrl", src / "fwrl", ignore=ignore)
    shutil.copytree(DOCKER, src / "docker", ignore=ignore)
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(ROOT / name, src / name)
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}  # only the new venv
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    isolated = subprocess.run([str(python), "-c", "import sys; print(sys.prefix != sys.base_prefix)"],
                              capture_output=True, text=True, check=True, env=env).stdout.strip()
    assert isolated == "True"
    assert subprocess.run([str(python), "-c", "import torch"], capture_output=True, env=env).returncode != 0, \
        "the fresh virtualenv sees a torch it did not install"
    if shared:
        own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, env=env).stdout.strip()
        ours = sorted({sysconfig.get_paths()[key] for key in ("purelib", "platlib")})
        (Path(own) / "fwrl-test-shared.pth").write_text("".join(f"{path}\n" for path in ours))
        seen = subprocess.run([str(python), "-c", "import torch; print(torch.__file__)"], capture_output=True,
                              text=True, check=True, env=env).stdout.strip()
        assert any(seen.startswith(path) for path in ours), f"torch came from {seen}, not the shared packages"
    version = torch.__version__.split("+")[0]
    extras = "ray" if shutil.which("ray") or _importable("ray") else ""
    done = subprocess.run([str(src / "docker" / "install.sh"), "--python", str(python), "--torch", version,
                           "--extras", extras], capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "install.sh: done" in done.stdout and f"torch {version}" in done.stdout
    where = subprocess.run([str(python), "-c", "import fwrl; print(fwrl.__file__)"], capture_output=True,
                           text=True, cwd="/", check=True, env=env).stdout.strip()
    assert where.startswith(str(venv)), f"fwrl imported from {where}, not from the new virtualenv"
    for bad_torch in ("cu", "2.x1"):
        bad = subprocess.run([str(src / "docker" / "install.sh"), "--torch", bad_torch], capture_output=True,
                             text=True, env=env)
        assert bad.returncode == 2 and "--torch" in bad.stderr


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
