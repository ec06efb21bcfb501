"""Keep third-party import noise (legacy gym's deprecation notice, ALE banners) out of the terminal."""

from __future__ import annotations

import contextlib
import io
import os
import warnings


def silence_env_noise() -> None:
    """Filter the warnings env libraries print on import and use."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*Gym has been unmaintained.*")
    warnings.filterwarnings("ignore", module="gym.*")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")


@contextlib.contextmanager
def quiet_import():
    """Swallow what a noisy module prints to stdout/stderr while it is imported."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield


def plain_fwrl_warnings() -> None:
    """Show fwrl's own warnings as one line, ``fwrl: warning: ...`` (no file, line or source);
    other libraries' warnings keep Python's format."""
    if getattr(warnings.formatwarning, "fwrl_plain", False):
        return
    python_format = warnings.formatwarning

    def format_warning(message, category, filename, lineno, line=None):
        if category.__module__.startswith("fwrl."):
            return f"fwrl: warning: {message}\n"
        return python_format(message, category, filename, lineno, line)

    format_warning.fwrl_plain = True
    warnings.formatwarning = format_warning
