"""Packages whose public names are imported on first use, so that importing a package stays cheap.

The command line imports the library's closed sets (statistic names, presets, tasks …) from small
modules; a package ``__init__`` that imported everything eagerly would pull torch and transformers in
with them. Each package ``__init__`` therefore maps its public names to the modules defining them::

    __getattr__, __dir__ = lazy_exports(__name__, {"compute_statistics": "attnviz.stats.compute"})

A public name must not also be the name of a submodule of the same package: importing the submodule
would set the package attribute to the module and hide the name (``tests/unit/test_layers.py`` checks).

A name that left the package's public surface keeps working for one release: ``deprecated`` maps it to
``(module, attribute, what to use instead)``, and each use warns with a :class:`DeprecationWarning` that says so.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], deprecated: Mapping[str, tuple[str, str, str]] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: each name in ``exports`` is imported from its module on first use;
    each name in ``deprecated`` (old name -> ``(module, attribute, instead)``) too, with a warning at every use."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None and deprecated and name in deprecated:
            module, attribute, instead = deprecated[name]
            warnings.warn(
                f"{package}.{name} is deprecated and goes in the next release: use {instead}",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(module), attribute)  # not cached: every use warns
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(exports) | set(vars(sys.modules[package])))

    return __getattr__, __dir__


def exports_by_module(modules: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """The ``exports`` of :func:`lazy_exports` (public name -> module) from each module's public names."""
    return {name: module for module, names in modules.items() for name in names}
