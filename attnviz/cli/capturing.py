"""What ``heatmap`` and ``capture`` share: loading and capturing, the summary line (their options:
:mod:`attnviz.cli.option_groups`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnviz.common.wording import layers_and_heads, plural

if TYPE_CHECKING:
    from attnviz.cli.option_groups import RunOptions


def capture_text(text, target, model, running: RunOptions, device_map=None, generation=None, **recording):
    """Load ``model`` and capture ``text`` (with ``generation``: while the model continues it); ``running``: the
    command's ``--max-length``, ``--no-truncate``, ``--device`` and ``--dtype``.

    ``recording``: ``layers``, ``heads``, ``stacks`` and ``max_bytes`` of :func:`attnviz.captures.attention_capture.capture`
    (a generation records every layer).
    """
    from attnviz.captures.attention_capture import capture
    from attnviz.cli.console import console
    from attnviz.common.progress import status
    from attnviz.models.specs import load_model

    with status(f"loading {model}"):
        loaded = load_model(model, device=running.device, dtype=running.dtype, device_map=device_map)
    if generation is None:
        return capture(
            loaded, text, target=target, max_length=running.max_length, truncate=not running.no_truncate, **recording
        )
    from attnviz.captures.writing import generate

    with status(f"generating up to {generation['max_new_tokens']} tokens"):
        result = generate(loaded, text, max_length=running.max_length, truncate=not running.no_truncate, **generation)
    console.print(
        f"[bold]generated:[/bold] {result.text!r} ({plural(len(result.token_ids), 'token')})", highlight=False
    )
    return result.capture


def print_summary(result, stack) -> None:
    """One line on stderr: the model, its kind, the tokens, layers and heads of ``stack``."""
    from attnviz.cli.console import console
    from attnviz.common.wording import plural

    stack = stack or result.stacks[0]
    queries, keys = result.axis_tokens(stack)
    picture = result.encoder_decoder and result.image_grid is not None  # a captioner's or Mllama's picture
    kind = "causal" if result.causal else "encoder-decoder" if result.encoder_decoder else "bidirectional"
    size = stack_size(result, stack)
    console.print(
        f"[bold]{result.model}[/bold] ({'image → text' if picture else kind}) · "
        f"{plural(len(keys), 'picture token' if picture and stack == 'cross' else 'token')}"
        + (f" → {plural(len(queries), 'target token')}" if stack in ("cross", "decoder") else "")
        + f" · {stack} attention: {size}",
        highlight=False,
    )


def stack_size(result, stack: str) -> str:
    """``6 layers × 12 heads`` of ``stack`` as the model has them (a pruned model's layers differ); for a capture
    of some layers only, the model's size, then the layers and heads the capture holds (numbered as the model's)."""
    from attnviz.common.wording import plural

    size = layers_and_heads(result.head_counts(stack))
    identity = result.identity
    if identity is not None and identity.is_subset():
        held = result.recorded_layers(stack)
        heads = sum(result.head_counts(stack)[layer] for layer in held)
        model_counts = identity.model_layout.get(stack) or identity.model_heads.get(stack)
        model_size = layers_and_heads(model_counts or [0] * len(result.head_counts(stack)))
        size = (
            f"{model_size.replace(' × 0 heads', '')}, recorded: {'layer' if len(held) == 1 else 'layers'} "
            f"{', '.join(map(str, held))} ({plural(heads, 'head')})"
        )
    return size


def max_bytes_value(text: str) -> int:
    """``--max-bytes`` text -> bytes (one ``error:`` line for a size that is not one)."""
    from attnviz.cli.sizes import parse_byte_size

    return parse_byte_size(text, "--max-bytes")


def load_quietly(model, device, dtype):
    """Load ``model`` under a status line."""
    from attnviz.cli.console import console
    from attnviz.models.specs import load_model

    with console.status(f"loading {model}"):
        return load_model(model, device=device, dtype=dtype)


def print_page_summary(loaded, result, stack) -> None:
    """The summary line of a page (whose capture may hold no patterns: a long page is streamed)."""
    if result.patterns:
        print_summary(result, stack)
        return
    from attnviz.cli.console import console

    stack = stack or loaded.stacks()[0]
    keys = result.axis_tokens(stack)[1]
    console.print(
        f"[bold]{result.model}[/bold] · {plural(len(keys), 'token')} · {loaded.num_layers(stack)} layers × "
        f"{loaded.num_heads(stack)} heads · long input: the page keeps each query's strongest keys "
        "and a pooled overview (see the page's notes)",
        highlight=False,
    )


def check_weighting(weighting: str, *, query, image, generate, view: str, from_capture) -> bool:
    """Whether ``heatmap`` draws norm-based attention; refuses what it does not apply to before any model loads."""
    from attnviz.common.errors import InputError

    if weighting != "norm":
        return False
    if from_capture is not None:
        raise InputError("--weighting applies when a model runs: a saved capture holds the weighting it was made with")
    for given, what in ((query, "--query"), (image, "--image"), (generate, "--generate")):
        if given is not None:
            raise InputError(f"--weighting norm draws the heads of a text: {what} does not apply")
    if view != "heads":
        raise InputError(f"--weighting norm draws the heads view: --view {view} goes through the weights")
    return True
