"""Evaluation: protocols (splits), episodes, results and published scores, whole evaluations and the
periodic one of a training run."""
