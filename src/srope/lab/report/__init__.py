"""``srope report``: the paper's numbers beside ours, per experiment.

- :mod:`srope.lab.report.paper`: the paper's values, claims and protocols (one checked-in table).
- :mod:`srope.lab.report.collect`: finds result files (``srope synth``, ``srope train`` / ``sweep-lr``,
  ``srope eval``, lm-eval, ``srope demo``) and turns them into one record per trained model
  (:mod:`~srope.lab.report.records`), by way of :mod:`~srope.lab.report.collect_synth` (synthetic tasks,
  demo) and :mod:`~srope.lab.report.collect_lm` (language modelling).
- :mod:`srope.lab.report.rows` groups those records into table rows (mean ± sd over seeds);
  :mod:`srope.lab.report.verdicts` holds what every verdict shares (the verdict, "A beats B", a
  valid test) and :mod:`srope.lab.report.cells` the tables' cells. Each synthetic task's page
  (markdown, verdict rule, thresholds and validity, figure, table of result folders) lives beside
  the task, in the module its registration names (``srope.lab.tasks.copying_report``,
  ``mqar_report``, ``state_tracking_report``, ``mad_report``); the LM page is
  :mod:`~srope.lab.report.page_lm`; all share :mod:`~srope.lab.report.page`, which lists them.
  :mod:`srope.lab.report.folders` tabulates ``srope synth`` result folders one by one
  (``srope report --by-folder``, and what ``srope synth`` prints).
  :mod:`srope.lab.report.build` builds every page (the tasks' through the task registry) and the index;
  :mod:`srope.lab.report.plots` draws the figures with their shared helpers; :mod:`srope.lab.report.write` writes them.
- :mod:`srope.lab.report.cli`: the argument parser and handler for ``srope report``.

Importing this package imports nothing heavy.
"""
