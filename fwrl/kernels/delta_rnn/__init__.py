"""Delta RNN (a fast RNN), paper 000 Sec. 3.1 Eq. 12: ``delta_rnn``. CPU tensors take
``cpu`` (the same maths: W and R's write vectors chunk-wide, only the recurrent read step by step,
a hand-derived backward)."""

from fwrl.kernels.dispatch import KernelRule, kernel_function

from .cpu import delta_rnn_cpu
from .naive import delta_rnn_reference

RULE = KernelRule(name="delta_rnn", title="Delta RNN", reference=delta_rnn_reference, cpu=delta_rnn_cpu,
                  fused=f"{__name__}.fused_recurrent")
delta_rnn = kernel_function(RULE)
