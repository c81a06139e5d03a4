"""Evaluation: held-out perplexity by position and beyond the training length
(:mod:`srope.eval.perplexity`, ``srope eval``), and lm-evaluation-harness on an srope model
(:mod:`srope.eval.harness`, ``srope lm-eval``)."""

from srope.eval.harness import PAPER_TASKS, lm_eval_argv, model_args, run_lm_eval
from srope.eval.perplexity import PositionLoss, default_seq_lens, evaluate_contexts, plot_position_curves, position_losses, run_eval, token_losses

__all__ = [
    "PAPER_TASKS",
    "PositionLoss",
    "default_seq_lens",
    "evaluate_contexts",
    "lm_eval_argv",
    "model_args",
    "plot_position_curves",
    "position_losses",
    "run_eval",
    "run_lm_eval",
    "token_losses",
]
