"""``srope report``: the paper's numbers beside ours, per experiment.

- :mod:`srope.lab.report.paper`: the paper's values, claims and protocols (one checked-in table).
- :mod:`srope.lab.report.collect`: finds result files (``srope synth``, ``srope train`` / ``sweep-lr``,
  ``srope eval``, lm-eval, ``srope demo``) and turns them into one record per trained model.
- :mod:`srope.lab.report.build`: groups those records into table rows (mean ± sd over seeds),
  applies each experiment's verdict rule and builds each page's markdown and the index;
  :mod:`srope.lab.report.plots` draws the pages' figures; :mod:`srope.lab.report.write` writes them.
- :mod:`srope.lab.report.cli`: the argument parser and handler for ``srope report``.

Importing this package imports nothing heavy.
"""
