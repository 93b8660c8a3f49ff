"""Matplotlib figures that leave the caller's matplotlib alone.

Every figure attnviz draws is a :class:`matplotlib.figure.Figure` made directly, never through
pyplot: no backend is chosen (a notebook keeps its own), no rcParams change, and no global list of
open figures grows. A notebook shows the returned figure; :func:`attnviz.render.heatmap.save_figure`
writes it.
"""

from __future__ import annotations

import functools
from typing import Any

from attnviz.models.names import full_model_name


@functools.cache
def _figure_class():  # defined on first use: matplotlib is imported only when a figure is drawn
    from matplotlib.figure import Figure

    class NotebookFigure(Figure):
        """A :class:`~matplotlib.figure.Figure` a notebook shows as PNG even where pyplot was never imported
        (where it was, IPython's own figure display is used; either way it shows once)."""

        def _repr_png_(self) -> bytes:
            return figure_png(self)

        # Labels in scripts the default font lacks get an installed font that has them, before any layout or
        # drawing measures them (attnviz.render.fonts); matplotlib's per-glyph warnings are not shown.
        def draw(self, renderer):
            from attnviz.render.fonts import fit_fonts, quiet_missing_glyphs

            fit_fonts(self)
            with quiet_missing_glyphs():
                return super().draw(renderer)

        def tight_layout(self, *args, **kwargs):
            from attnviz.render.fonts import fit_fonts, quiet_missing_glyphs

            fit_fonts(self)
            with quiet_missing_glyphs():
                return super().tight_layout(*args, **kwargs)

    return NotebookFigure


def new_figure(**kwargs: Any):
    """An empty figure (``figsize``, ``layout``, … as :class:`~matplotlib.figure.Figure` takes them)."""
    return _figure_class()(**kwargs)


def subplots(rows: int = 1, columns: int = 1, *, figsize: tuple[float, float], squeeze: bool = True, layout=None):
    """``(figure, axes)`` as ``pyplot.subplots`` returns them, without pyplot."""
    figure = new_figure(figsize=figsize, layout=layout)
    return figure, figure.subplots(rows, columns, squeeze=squeeze)


def titled(figure, title: str, *, fontsize: float, top: float):
    """``figure`` with ``title`` above its panels, which tight layout fits into the height below ``top`` (a
    fraction of the figure's height: the rest is the title's)."""
    figure.suptitle(title, fontsize=fontsize)
    figure.tight_layout(rect=(0, 0, 1, top))
    return figure


def colormap(name: str) -> Any:
    """The registered matplotlib colour map called ``name``."""
    import matplotlib

    return matplotlib.colormaps[name]


def figure_png(figure, *, dpi: int = 100) -> bytes:
    """The figure as PNG bytes (for inline display), drawn by matplotlib's Agg canvas without pyplot."""
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def model_title(capture: Any) -> str:
    """``all-MiniLM-L6-v2 (minilm)``: the model's own name, and the spec it was loaded by when that differs."""
    full = full_model_name(capture.model)
    return full if full == capture.model else f"{full} ({capture.model})"
