"""Keep the memory of freed tensors in the process: no page faults for the next tensor of that size.

On Linux, glibc's malloc gives large blocks (above a threshold that adapts up to 32 MB) their own
``mmap`` and returns them to the system when freed, and trims the top of its heap beyond a second
threshold. A CPU training loop allocates and frees tensors of a few MB at every step (activations,
state updates, gradients); each new one then costs a page fault and the kernel zeroing every 4 KB page
of it. One RTRL acting step of the eLSTM (B 16: two 2 MB sensitivity tensors) took 3.3-3.9 ms that way
and 0.6 ms with the thresholds fixed high, where freed blocks stay in the heap and are reused.

:func:`keep_freed_memory` sets both thresholds (``mallopt``; Linux with glibc only, a no-op elsewhere).
The process then holds on to its peak heap instead of returning it between steps. PyTorch's own
advice for CPU training is a caching allocator (jemalloc, tcmalloc) preloaded at start; this does the
same for glibc's allocator without a preload or a dependency.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 256 * 1024 * 1024  # blocks below this come from the heap (and stay there when freed)
TRIM_THRESHOLD = 1024 * 1024 * 1024  # free memory at the heap's top kept up to this

_done = False


def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds high for this process (once); True where it took effect."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _done
