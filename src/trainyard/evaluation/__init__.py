"""Evaluation: paired comparisons of a model against a baseline, evaluation runs, the promotion gate."""
