"""attnviz silences transformers' and huggingface_hub's progress bars and tqdm's widget warning during its own
calls only: a caller's settings (bars, per-group switches, verbosity, warning filters) are as before afterwards."""

from __future__ import annotations

import logging
import warnings

import huggingface_hub.utils as hub_utils
import pytest
from transformers.utils import logging as transformers_logging

from attnviz.common.progress import quiet_third_party

WIDGET_WARNING = "IProgress not found. Please update jupyter and ipywidgets."


@pytest.fixture
def caller_settings():
    """A caller who keeps bars on, turned one huggingface_hub group off and asked for info logs."""
    bars, verbosity = transformers_logging.is_progress_bar_enabled(), transformers_logging.get_verbosity()
    transformers_logging.enable_progress_bar()
    hub_utils.disable_progress_bars("my.group")
    transformers_logging.set_verbosity(logging.INFO)
    yield
    transformers_logging.enable_progress_bar() if bars else transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity(verbosity)


def settings() -> tuple[bool, bool, bool, int]:
    return (
        transformers_logging.is_progress_bar_enabled(),
        hub_utils.are_progress_bars_disabled(),
        hub_utils.are_progress_bars_disabled("my.group"),
        transformers_logging.get_verbosity(),
    )


def test_bars_and_the_widget_warning_are_off_inside_and_as_before_after(caller_settings):
    assert settings() == (True, False, True, logging.INFO)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_third_party():
            assert settings() == (False, True, True, logging.ERROR)
            warnings.warn(WIDGET_WARNING, stacklevel=1)
            warnings.warn("another warning", stacklevel=1)  # only the widget warning is filtered
        warnings.warn(WIDGET_WARNING, stacklevel=1)  # the caller's own filters again
    assert [str(w.message) for w in seen] == ["another warning", WIDGET_WARNING]
    assert settings() == (True, False, True, logging.INFO)


def test_settings_come_back_after_an_error_and_bars_a_caller_turned_off_stay_off(caller_settings):
    transformers_logging.disable_progress_bar()
    with pytest.raises(RuntimeError), quiet_third_party():
        raise RuntimeError("the call failed")
    assert settings() == (False, True, True, logging.INFO)


def test_loading_and_saving_a_model_leave_the_callers_bars_on(caller_settings, tiny_dirs, tmp_path, capfd):
    from attnviz.models.specs import load_model

    loaded = load_model(str(tiny_dirs["bert"]), device="cpu")
    assert settings() == (True, False, True, logging.INFO)
    assert "Loading weights" not in capfd.readouterr().err  # attnviz's load shows no transformers bar
    loaded.model.save_pretrained(tmp_path / "copy")  # the caller's own save shows its bar: their setting
    assert "Writing model shards" in capfd.readouterr().err
