"""Is a file an fwrl checkpoint at all? Answered from its bytes, without importing torch.

``torch.save`` writes a zip archive; a file that is not one (a ``metrics.csv``
passed by mistake, an empty or truncated file) is refused here with what it
is, before torch is imported, and :func:`load_error` words what ``torch.load``
refused (a file holding objects beyond plain tensors, numbers and strings)
without passing on torch's own advice to load it unsafely.
"""

from __future__ import annotations

import errno
import os
import zipfile
from pathlib import Path

from fwrl.errors import FwrlError

ZIP_MAGIC = b"PK\x03\x04"


def missing(path: Path) -> str:
    """Why ``path`` cannot be opened although it was named: it does not exist, or it is a symbolic link
    that leads nowhere (a loop, or a target that is gone)."""
    if path.is_symlink():
        try:
            path.resolve(strict=True)
        except RuntimeError:  # Python 3.11: a loop
            return "is a symbolic link in a loop"
        except OSError as exc:
            return "is a symbolic link in a loop" if exc.errno == errno.ELOOP else \
                f"is a symbolic link to {os.readlink(path)}, which does not exist"
    return "does not exist"


def checkpoint_of(source: Path) -> Path:
    """The checkpoint of a run folder (its ``checkpoint.pt``) or a checkpoint file; a FwrlError
    where there is none."""
    source = Path(source)
    if not source.exists():
        raise FwrlError(f"{source} {missing(source)}; pass a run folder of fwrl train or a checkpoint file.")
    if source.is_dir():
        path = source / "checkpoint.pt"
        if not path.is_file():
            raise FwrlError(f"{source} holds no checkpoint.pt; pass a run folder of fwrl train or a checkpoint "
                            "file.")
        return path
    return source


def check_checkpoint_file(path: Path) -> None:
    """A FwrlError where ``path`` cannot be a checkpoint: missing, empty, not a zip archive (saying
    when it is text), or a zip archive cut short."""
    path = Path(path)
    if not path.is_file():
        raise FwrlError(f"checkpoint {path} {missing(path)}.")
    with path.open("rb") as f:
        head = f.read(512)
    if not head:
        raise FwrlError(f"{path} is empty (0 bytes), not a checkpoint; fwrl train writes checkpoint.pt in the run "
                        "folder.")
    if not head.startswith(ZIP_MAGIC):
        what = "a text file" if _is_text(head) else "not a zip archive"
        raise FwrlError(f"{path} is {what}, not an fwrl checkpoint (torch.save writes a zip archive); pass a run "
                        "folder or its checkpoint.pt.")
    if not zipfile.is_zipfile(path):
        raise FwrlError(f"{path} is not a readable fwrl checkpoint: a damaged or truncated checkpoint (its zip "
                        "archive has no end); use another checkpoint of the run (checkpoint-<steps>.pt), or train "
                        "it again.")


def load_error(path: Path, exc: BaseException) -> FwrlError:
    """What ``torch.load(path, weights_only=True)`` refused, in fwrl's words (never torch's advice to
    load with ``weights_only=False``)."""
    import re

    name = type(exc).__name__
    text = str(exc)
    if "unsupported global" in text.lower():  # "Unsupported global: GLOBAL x", "unsupported GLOBAL x whose module .. is blocked"
        found = re.search(r"GLOBAL ([\w.]+)", text)
        which = f" (it names {found.group(1)})" if found else ""
        return FwrlError(f"{path} holds Python objects beyond tensors, numbers and strings{which}, or pickle "
                         "instructions that would build them, so it is not an fwrl checkpoint: refused unread (fwrl "
                         "loads checkpoints only with torch.load(weights_only=True), which runs no code from the "
                         "file).")
    return FwrlError(f"{path} is not a readable fwrl checkpoint ({name}): it may be damaged or truncated; use "
                     "another checkpoint of the run (checkpoint-<steps>.pt), or train it again.")


def _is_text(head: bytes) -> bool:
    """Whether the first bytes of a file read as text (UTF-8; a character cut at the end is no matter)."""
    text = head.decode("utf-8", errors="replace")
    return text.count("\ufffd") <= 3 and all(c.isprintable() or c in "\r\n\t\ufffd" for c in text)
