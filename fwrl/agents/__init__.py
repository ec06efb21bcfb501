"""The IMPALA agent and its learning.

- ``vtrace``: V-trace targets and policy-gradient advantages
  (Espeholt et al. 2018, Sec. 4, Eq. 1).
- ``losses``: the IMPALA loss (policy gradient + baseline + entropy, summed
  over T x B) on a rollout batch in the ``[T+1, B, ...]`` format.
- ``optim``: RMSProp, the linear learning-rate decay driven by the agent-step
  count, global-norm gradient clipping.

Importing this package imports nothing heavy; import the submodules you need.
"""
