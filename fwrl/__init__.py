"""fwrl: IMPALA / V-trace agents whose memory is a fast-weight programmer.

Importing the package is cheap and does not import torch: env worker
processes import only ``fwrl.envs``.
"""

__version__ = "0.1.0"
