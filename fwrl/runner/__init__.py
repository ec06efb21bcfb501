"""Training: preflight checks, the run loop, learner ranks, the agent, checkpoints, metrics, progress, run folders."""
