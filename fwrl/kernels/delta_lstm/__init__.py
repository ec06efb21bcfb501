"""Delta LSTM (a fast LSTM), paper 000 App. A.2 Eq. 36-40: ``delta_lstm``. CPU tensors take
``cpu`` (the same maths: the six matrices' write vectors chunk-wide, only the reads and the cell
step by step, a hand-derived backward)."""

from fwrl.kernels.dispatch import KernelRule, kernel_function

from .cpu import delta_lstm_cpu
from .naive import delta_lstm_reference

RULE = KernelRule(name="delta_lstm", title="Delta LSTM", reference=delta_lstm_reference, cpu=delta_lstm_cpu,
                  fused=f"{__name__}.fused_recurrent")
delta_lstm = kernel_function(RULE)
