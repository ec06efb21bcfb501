"""Recurrent Delta Net (RDN), paper 000 Sec. 3.2 Eq. 15-18: ``rdn`` (reference ``naive``, Triton
``fused_recurrent`` on CUDA, ``cpu`` on the CPU)."""

from fwrl.kernels.dispatch import KernelRule, kernel_function

from .cpu import rdn_cpu
from .naive import rdn_reference

RULE = KernelRule(name="rdn", title="RDN", reference=rdn_reference, cpu=rdn_cpu,
                  fused=f"{__name__}.fused_recurrent")
rdn = kernel_function(RULE)
