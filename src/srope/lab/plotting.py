"""matplotlib, an optional dependency (``pip install 'srope[plot]'``, part of ``[lm]``).

Every plot of the lab gets matplotlib here, when it draws: ``import srope.lab...`` never needs
it, and a missing one is a one-line error naming the extra (``srope COMMAND: error: ...``).
"""

from __future__ import annotations

from srope._lazy import optional_import

EXTRA = "plot"


def require(purpose: str) -> None:
    """Raise :class:`srope._lazy.MissingDependency` (naming ``srope[plot]``) unless matplotlib
    imports; commands that train before they plot call it first, so they fail at once."""
    optional_import("matplotlib", extra=EXTRA, purpose=purpose)


def pyplot(purpose: str):
    """``matplotlib.pyplot`` on the Agg backend (files only, no display)."""
    matplotlib = optional_import("matplotlib", extra=EXTRA, purpose=purpose)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure(purpose: str, **options):
    """A ``matplotlib.figure.Figure(**options)`` on an Agg canvas (no pyplot, no global state)."""
    require(purpose)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**options)
    FigureCanvasAgg(fig)
    return fig
