"""Gated delta rule (Gated DeltaNet, Yang, Kautz & Hatamizadeh, ICLR 2025, Eq. 10): ``gated_delta_rule``."""

from fwrl.kernels.dispatch import KernelRule, kernel_function

from .cpu import gated_delta_rule_cpu
from .naive import gated_delta_rule_reference

RULE = KernelRule(name="gated_delta_rule", title="gated delta rule", reference=gated_delta_rule_reference,
                  cpu=gated_delta_rule_cpu, fused=f"{__name__}.fused_recurrent")
gated_delta_rule = kernel_function(RULE)
