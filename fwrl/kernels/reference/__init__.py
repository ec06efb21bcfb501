"""Plain PyTorch per-step loops that define the maths of every recurrence."""
