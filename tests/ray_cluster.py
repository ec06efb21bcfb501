"""A two-node Ray cluster on this machine for the tests of the ``ray`` backend.

A head node (``head`` resource, 1 CPU) and an env node (``envs`` resource,
2 CPUs), each ``ray start`` in its own process group and private temp dir,
token authentication with a per-session token. Teardown kills exactly those
process groups (``ray stop`` would stop every Ray on the machine). The
``ray_cluster`` fixture (``conftest.py``) starts it on first use, so a run
without Ray tests never pays for it. A test may take the cluster's head down
(``SessionCluster.lend_head``): the cluster is started again only if a later
test asks for it (the head-loss test runs last, so a plain run starts it once).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

# Ray's command line of this interpreter's Ray (not whichever ``ray`` is first on PATH: a test run
# started as ``venv/bin/python -m pytest`` without activating the venv has none there)
RAY_CLI = (sys.executable, "-m", "ray.scripts.scripts")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """A head and env nodes on this machine, each ``ray start`` in its own process group."""

    def __init__(self):
        self.env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16),
                        RAY_USAGE_STATS_ENABLED="0", RAY_agent_register_timeout_ms="120000")
        self._new_place()

    def _new_place(self) -> None:
        """A fresh temp dir and port (no process yet)."""
        self.tmp = tempfile.mkdtemp(prefix="fwrl-ray-")  # short: Ray's socket paths must stay < 108 chars
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.groups: list[int] = []

    def _ray_start(self, args: list[str]) -> int:
        proc = subprocess.Popen([*RAY_CLI, "start", *args, "--temp-dir", self.tmp, "--disable-usage-stats"],
                                env=self.env, start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        self.groups.append(proc.pid)  # the daemons it starts stay in this process group
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"ray start {' '.join(args)} failed:\n{out[-3000:]}"
        return proc.pid

    def start_head(self) -> None:
        self._ray_start(["--head", f"--port={self.port}", "--num-cpus=1", "--resources", '{"head": 1}',
                         "--include-dashboard=false"])

    def add_env_node(self) -> int:
        """Start a node with 2 CPUs and 4 ``envs``; returns its process group."""
        return self._ray_start(["--address", self.address, "--num-cpus=2", "--resources", '{"envs": 4}'])

    def kill_group(self, group: int) -> None:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def teardown(self) -> None:
        for group in reversed(self.groups):
            self.kill_group(group)
        for pid in pids_mentioning(self.tmp):  # anything that left the groups (none expected)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


def pids_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def env_nodes(ray) -> list[str]:
    return [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("envs")]


class SessionCluster(LocalCluster):
    """The session's cluster, this process connected to it as a driver (``ray.init``)."""

    def bring_up(self) -> None:
        """Start the head and an env node, and connect this process."""
        import ray

        self.start_head()
        self.node_group = self.add_env_node()
        # ray.init puts its own SIGTERM handler (exit at once) in place of the test process's; put
        # pytest's back, so a SIGTERM to the run (a CI limit) stops pytest, not one test
        self.sigterm_before = signal.getsignal(signal.SIGTERM)
        try:
            ray.init(address=self.address, logging_level="warning", log_to_driver=False)
        finally:
            signal.signal(signal.SIGTERM, self.sigterm_before)
        nodes = env_nodes(ray)
        assert len(nodes) == 1, ray.nodes()
        self.env_node = nodes[0]
        self.head_node = ray.get_runtime_context().get_node_id()
        self.head_group = self.groups[0]
        self.down = False

    def ensure_up(self) -> None:
        """Start the cluster again (same token, new port and temp dir) if a test took its head down."""
        if self.down:
            self.teardown()
            self._new_place()
            self.bring_up()

    def lend_head(self) -> None:
        """For a test that kills the head: disconnect this process first (Ray ends a driver whose head
        stays lost for 60 s), and start the cluster again for the next test that asks for it."""
        import ray

        self.down = True
        ray.shutdown()


def cluster_session():
    """Generator behind the session's cluster: start, connect this process, yield, tear down."""
    c = SessionCluster()
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_USAGE_STATS_ENABLED")}
    try:
        # Ray reads the token when it is imported: set it first (the ray tests import ray lazily)
        os.environ.update({k: c.env[k] for k in saved})
        c.bring_up()
        yield c
    finally:
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            sys.modules["ray"].shutdown()
        c.teardown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
