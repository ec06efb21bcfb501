"""Sum rule (Linear Transformer) and delta rule (Delta Net), paper 001 Eq. 20-25: ``delta_rule``."""

from fwrl.kernels.dispatch import KernelRule, kernel_function

from .cpu import delta_rule_cpu
from .naive import delta_rule_reference

RULE = KernelRule(name="delta_rule", title="delta rule", reference=delta_rule_reference, cpu=delta_rule_cpu,
                  fused=f"{__name__}.fused_recurrent")
delta_rule = kernel_function(RULE)
