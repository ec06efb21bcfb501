"""Fused Triton kernels for the fast-weight recurrences (one launch per rollout).

Each module exposes ``<name>_triton(...)`` with the signature of the matching
reference in ``fwrl.kernels.reference`` and ``supports(...) -> str | None``
(``None`` when the kernel can run on those inputs, otherwise the reason), which
``fwrl.kernels.dispatch`` uses to fall back to the reference.

Importing this package does not import Triton; the kernel modules do.
"""
