"""How the command line words the library's errors: library parameter names become flags."""

from __future__ import annotations

from attnviz.common.errors import AttnvizError, ParameterError

#: library parameter name -> the option that sets it, where it is not ``--`` + the name with dashes
FLAG_NAMES = {
    "learning_rate": "--lr",
    "out": "--out",
    "texts": "--data",
    "patched": "--what",
    "targets": "--target",
    "min_score": "--min-score",
    "importance": "--importance",
    "max_new_tokens": "--generate",
    "layers": "--layer",
    "heads": "--head",
    # the sizes of a toy model (attnviz train)
    "num_heads": "--heads",
    "num_layers": "--layers",
    "num_decoder_layers": "--layers",
    "vocab_size": "--symbols",
    "num_symbols": "--symbols",
    "max_positions": "--lengths",
    "num_features": "--features",
}


def flag_for(parameter: str) -> str:
    """The command-line option of a library parameter (``batch_size`` -> ``--batch-size``)."""
    return FLAG_NAMES.get(parameter, "--" + parameter.replace("_", "-"))


def error_message(exc: AttnvizError) -> str:
    """The text of the one ``error:`` line the CLI prints for ``exc``."""
    if isinstance(exc, ParameterError):
        return exc.formatted(flag_for)
    return str(exc)
