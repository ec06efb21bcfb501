"""Process-tree helpers of the tests that kill runs and check nothing is left behind (Linux /proc)."""

from __future__ import annotations

import subprocess


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    kids = {int(x) for x in out.split()}
    for kid in list(kids):
        kids |= descendants(kid)
    return kids


def children(pid: int) -> list[int]:
    """The direct children of ``pid``."""
    return [int(x) for x in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
