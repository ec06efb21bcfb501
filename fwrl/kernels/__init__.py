"""Fast-weight recurrences, one folder per rule (as flash-linear-attention's ``fla/ops``).

Each rule's folder ``fwrl/kernels/<rule>/`` holds:

- ``__init__.py``: the rule's backends declared once (``RULE``, a ``dispatch.KernelRule``) and
  its one public function made from them (``from fwrl.kernels.rdn import rdn``), the entry point
  the memory modules call. It takes the reference's arguments (per-step pre-activations, an
  initial state and a per-step reset mask) and returns the per-step outputs and the final state,
  so a whole rollout is one call; it runs the fused kernel where it can, the CPU path on CPU
  tensors, otherwise the reference (``dispatch`` chooses);
- ``naive.py``: the PyTorch reference, a per-step loop that defines the maths (with the
  paper's equation numbers);
- ``fused_recurrent.py``: the fused Triton kernel, its autograd wrapper and ``supports(...)``
  (whether the kernel takes given inputs, and if not why);
- ``cpu.py``: the CPU path, the default for CPU tensors: the reference's maths in a few batched
  torch calls per step (``delta_rule`` learns in chunked form, ``chunk.py``).

The rules: ``delta_rule`` (sum / delta rule, paper 001), ``rdn``, ``delta_rnn`` and
``delta_lstm`` (paper 000), ``srwm`` (paper 002; its split kernel, W^y's rows over programs,
is ``srwm/fused_recurrent_split.py``) and ``elstm_rtrl`` (paper 004; PyTorch only, no backend to
choose: its ``naive.py`` the reference, ``recurrence.py`` what the eLSTM core runs on every device).

Shared by the rules, and importing none of them: this package (``GRAD_MODES``),
``feature_maps`` (phi of queries and keys), ``dispatch`` (the backend choice),
``triton.common`` (the Triton helpers of every fused kernel), ``cpu_common`` (those of the CPU
paths) and ``cpu_delta_chunks`` (the chunk-wide delta-rule writes of the fast RNNs' CPU paths).
Importing a rule does not import Triton; its fused kernel does, when a call may use it.
"""

from fwrl.errors import unknown_choice

# The gradient modes every fast-weight rule takes: ``full`` back-propagates through the
# carried state across the sequence; ``step`` cuts the gradient through it at every step
# (the original authors' RL code ran one step at a time with a detached state).
GRAD_MODES = ("full", "step")


def check_grad_mode(grad_mode: str) -> None:
    """Raise the error that lists ``GRAD_MODES`` for any other ``grad_mode``."""
    if grad_mode not in GRAD_MODES:
        raise unknown_choice("gradient mode", grad_mode, GRAD_MODES)
