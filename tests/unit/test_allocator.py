"""fwrl.utils.allocator: glibc's thresholds fixed once for the learner process."""

import platform
import sys

import pytest

from fwrl.utils import allocator


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="mallopt's thresholds are glibc's (Linux)")
def test_keep_freed_memory_sets_glibc_thresholds_once(monkeypatch):
    calls = []
    real = allocator.ctypes.CDLL

    class Recording:
        def __init__(self, name):
            self._libc = real(name)

        @property
        def mallopt(self):
            mallopt = self._libc.mallopt

            def record(option, value):
                calls.append((option, value))
                return mallopt(option, value)

            record.argtypes = record.restype = None
            return record

    monkeypatch.setattr(allocator, "_done", False)
    monkeypatch.setattr(allocator.ctypes, "CDLL", Recording)
    assert allocator.keep_freed_memory() is True
    assert calls == [(allocator.M_MMAP_THRESHOLD, allocator.MMAP_THRESHOLD),
                     (allocator.M_TRIM_THRESHOLD, allocator.TRIM_THRESHOLD)]
    assert allocator.keep_freed_memory() is True and len(calls) == 2  # once per process


def test_keep_freed_memory_is_a_no_op_off_linux(monkeypatch):
    monkeypatch.setattr(allocator, "_done", False)
    monkeypatch.setattr(allocator.sys, "platform", "darwin")
    assert allocator.keep_freed_memory() is False
