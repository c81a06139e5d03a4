"""The lab around the library: language-model pre-training (``train``), the paper's synthetic
tasks (``tasks``), evaluation (``eval``), the results report (``report``), the theory figures
(``theory``), the CPU demo (``demo``) and the ``srope`` command line (``cli``).

It is built on the library (``srope.ops``, ``srope.modules``, ``srope.layers``,
``srope.models``), which never imports it (``tests/test_imports.py`` checks both directions).
"""
