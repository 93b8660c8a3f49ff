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

    def __repr__(self) -> str:
        """The class and its plain fields (names, counts, flags): the tensors are for code, the view for eyes."""
        import dataclasses

        plain = (str, int, float, bool, type(None))
        names: list[str] = [field.name for field in dataclasses.fields(self)] if dataclasses.is_dataclass(self) else []
        shown = [f"{name}={getattr(self, name)!r}" for name in names if isinstance(getattr(self, name), plain)]
        return f"{type(self).__name__}({', '.join(shown)})"

    def _repr_html_(self) -> str:
        module, _, function = RENDERER.partition(":")
        return getattr(importlib.import_module(module), function)(self)
