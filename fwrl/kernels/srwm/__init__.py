"""Self-referential weight matrix (SRWM), paper 002 Eq. 5-8 with App. A's rates: ``srwm``.

The recurrence of the SRWM, Fake SR and SR-DeltaNet cores; its fused kernel takes
``fused_recurrent_split`` (W^y's rows over programs) where the whole matrix does not fit
one program. CPU tensors take ``cpu`` (the same maths in fewer, larger calls).
"""

from fwrl.kernels.dispatch import KernelRule, kernel_function

from .cpu import srwm_cpu
from .naive import srwm_reference

RULE = KernelRule(name="srwm", title="SRWM", reference=srwm_reference, cpu=srwm_cpu,
                  fused=f"{__name__}.fused_recurrent")
srwm = kernel_function(RULE)
