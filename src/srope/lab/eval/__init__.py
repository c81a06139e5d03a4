"""Evaluation: held-out perplexity by position and beyond the training length
(:mod:`srope.lab.eval.perplexity`, ``srope eval``), and lm-evaluation-harness on an srope model
(:mod:`srope.lab.eval.harness`, ``srope lm-eval``). Attributes import their module on first use."""

from srope._lazy import lazy_exports

_EXPORTS = {
    **{name: "srope.lab.eval.harness" for name in ("PAPER_TASKS", "lm_eval_argv", "model_args", "run_lm_eval")},
    **{
        name: "srope.lab.eval.perplexity"
        for name in ("PositionLoss", "default_seq_lens", "evaluate_contexts", "plot_position_curves", "position_losses", "run_eval", "token_losses")
    },
}
__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = sorted(_EXPORTS)
