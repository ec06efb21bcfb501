"""Fused Triton kernels for the fast-weight recurrences (one launch per rollout).

Each kernel module (``delta_rule``, ``srwm``, ``rdn``, ``delta_rnn``,
``delta_lstm``) exposes ``<name>_triton(...)`` with the signature of the
matching reference in ``fwrl.kernels.reference`` and ``supports(...) -> str |
None`` (``None`` when the kernel can run on those inputs, otherwise the reason
and what would avoid it), which ``fwrl.kernels.dispatch`` uses to fall back
to the reference. ``common`` holds the Triton helpers and Python utilities
they share; the kernel modules import it relatively, so a copy of this package
loaded under another name (the interpreter tests do) is self-consistent.

Importing this package does not import Triton; the kernel modules do.
"""
