"""attnviz calls its libraries the supported way: no FutureWarning or DeprecationWarning comes out of its calls.

``tests/conftest.py`` fails any test during which such a warning is raised with attnviz's code on the stack; this
file checks the check itself, and generation (which passes the key/value cache to transformers every step).
"""

from __future__ import annotations

import warnings

import pytest

import attnviz


def test_generation_passes_the_cache_the_supported_way(tiny_models):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = attnviz.generate(tiny_models["llama"], "The cat sat", max_new_tokens=3)
    assert len(result.token_ids) == 3
    assert not [w for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))]


def test_a_deprecation_raised_under_attnviz_fails_the_test():
    """A warning raised deep in a library (attributed to the library, not to attnviz) while attnviz called it."""

    def library_call():
        warnings.warn("`old` is deprecated", FutureWarning, stacklevel=1)

    attnviz_code = {"__name__": "attnviz.example", "library_call": library_call}
    with pytest.raises(FutureWarning, match="triggered by attnviz.example"):
        exec("library_call()", attnviz_code)  # noqa: S102 (a frame whose module is attnviz's)
    with pytest.warns(FutureWarning):  # called from anywhere else, it stays a warning
        library_call()
