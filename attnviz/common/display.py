"""Inline display in notebooks: the mixin that gives attnviz's results a ``_repr_html_``.

The results (captures, statistics, flags, head functions) live in layers below the renderers, so
they cannot import them. As with the model loaders (``models/specs.py``), the renderer is named as
``"module:function"`` and imported only when a notebook asks for the HTML; it is
:func:`attnviz.render.inline.notebook_html`.
"""

from __future__ import annotations

import importlib

#: the function that turns a result into the HTML a notebook shows
RENDERER = "attnviz.render.inline:notebook_html"


class NotebookDisplay:
    """Shows the object inline in Jupyter, VS Code and Colab (``attnviz.show(obj)`` gives the view to save)."""

    def _repr_html_(self) -> str:
        module, _, function = RENDERER.partition(":")
        return getattr(importlib.import_module(module), function)(self)
