"""``srope demo``: Selective RoPE learns parity and extrapolates; NoPE and RoPE do not.

The paper's Fig. 7 claim (§5.4), small enough for a laptop CPU. The same one-layer GLA
(:class:`srope.models.SRopeForCausalLM`) is trained three times on the S2 word problem
(parity, tagged: after every bit, predict the parity so far; the data come from
:mod:`srope.lab.tasks.state_tracking`), once per position encoding: NoPE, RoPE and Selective
RoPE. The three runs share everything except the position encoding: the model size (up
to the encoding's own parameters), the initial values of every shared weight, the training
batches, the number of steps, the length curriculum and the learning-rate schedule. Each
model (in the CPU preset, the moving average of its weights over the last stage) is then
scored on fresh sequences (checked not to occur in training) at the training length and at
4x it.

``seq_acc`` is the fraction of sequences with every position right (the authors' sequence
accuracy). The curve at length ``t`` is the fraction whose first ``t`` positions are right,
which for a causal model is the sequence accuracy on fresh length-``t`` sequences.

Presets (:data:`PRESETS`): ``"cpu"`` (the default: a small GLA that fits the CPU time
budget) and ``"cuda"`` (the authors' state-tracking GLA: hidden 384, 12 heads, expand_k 1,
short conv, with the CPU preset's Selective RoPE options and a longer schedule; seeds 0-2
on an H200). Both train up to length 128 and evaluate at 512. Why the recipe looks the way
it does is in :data:`CPU`'s comment (the numbers and the diagnosis). Both presets'
Selective RoPE starts its ω map with ``projection_gain`` 8 (so that the rotation pairs
start with a spread of angle steps and one can find parity) and trains with
``phase_noise`` 0.1 (so that the learned steps become precise enough to extrapolate):
regularisers of ours, not the paper's (README, "Demo", has the full demos).

Modules: :mod:`~srope.lab.demo.config` (:class:`DemoConfig`, the presets),
:mod:`~srope.lab.demo.data` (the training stream, the evaluation sets),
:mod:`~srope.lab.demo.model` (the model, its learned angle steps),
:mod:`~srope.lab.demo.training` (one model's optimiser and training),
:mod:`~srope.lab.demo.evaluation` (predictions, scores, targets),
:mod:`~srope.lab.demo.workers` (the three models, in worker processes),
:mod:`~srope.lab.demo.report` (tables and plots) and :mod:`~srope.lab.demo.run` (the entry
points). Their public names are importable from ``srope.lab.demo``.
"""

from srope.lab.demo.config import CPU, CUDA, DEVICES, GROUP, LABELS, POSITIONS, PRESETS, DemoConfig
from srope.lab.demo.data import eval_sets, train_batches
from srope.lab.demo.evaluation import check_targets, predict, score
from srope.lab.demo.model import build_model, encoding_input, parity_angles
from srope.lab.demo.report import PLOT_PURPOSE, format_seed_table, format_table, plot, plot_seeds
from srope.lab.demo.run import PLOT_FILE, RESULTS_FILE, check_args, default_workers, run_demo, run_demo_seeds
from srope.lab.demo.training import make_optimizer, train_model
from srope.lab.demo.workers import train_one

__all__ = [
    "CPU", "CUDA", "DEVICES", "GROUP", "LABELS", "PLOT_FILE", "PLOT_PURPOSE", "POSITIONS", "PRESETS", "RESULTS_FILE", "DemoConfig",
    "build_model", "check_args", "check_targets", "default_workers", "encoding_input", "eval_sets", "format_seed_table",
    "format_table", "make_optimizer", "parity_angles", "plot", "plot_seeds", "predict", "run_demo", "run_demo_seeds", "score",
    "train_batches", "train_model", "train_one",
]
