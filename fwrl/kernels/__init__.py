"""Fast-weight recurrences: PyTorch references (the maths) and fused Triton kernels.

Public entry points live in ``fwrl.kernels.dispatch``; each takes per-step
pre-activations, an initial state and a per-step reset mask, and returns the
per-step outputs and the final state, so a whole rollout is one call.
"""

from fwrl.kernels.dispatch import delta_rule, kernel_backend  # noqa: F401
