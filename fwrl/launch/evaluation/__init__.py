"""Evaluation: protocols (splits), episodes, results and published scores."""
