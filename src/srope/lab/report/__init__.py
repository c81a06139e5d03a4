"""``srope report``: the paper's numbers beside ours, per experiment.

- :mod:`srope.lab.report.paper`: the paper's values, claims and protocols (one checked-in table).
- :mod:`srope.lab.report.collect`: finds result files (``srope synth``, ``srope train`` / ``sweep-lr``,
  ``srope eval``, lm-eval, ``srope demo``) and turns them into one record per trained model
  (:mod:`~srope.lab.report.records`), by way of :mod:`~srope.lab.report.collect_synth` (synthetic tasks,
  demo) and :mod:`~srope.lab.report.collect_lm` (language modelling).
- :mod:`srope.lab.report.rows` groups those records into table rows (mean ± sd over seeds);
  :mod:`srope.lab.report.verdicts` holds each experiment's verdict rule and :mod:`srope.lab.report.cells`
  the tables' cells; one module per experiment page (:mod:`~srope.lab.report.page_copying`, ``page_mqar``,
  ``page_state_tracking``, ``page_mad``, ``page_lm``, sharing :mod:`~srope.lab.report.page`) builds its
  markdown; :mod:`srope.lab.report.build` builds every page and the index;
  :mod:`srope.lab.report.plots` draws the pages' figures; :mod:`srope.lab.report.write` writes them.
- :mod:`srope.lab.report.cli`: the argument parser and handler for ``srope report``.

Importing this package imports nothing heavy.
"""
