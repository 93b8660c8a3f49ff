"""``attnviz train odd-patch`` and ``attnviz train caption``: train the toy ViT of :mod:`attnviz.toy.odd_patch` or
the toy captioner of :mod:`attnviz.toy.caption`, and save it."""

from __future__ import annotations

from pathlib import Path

from attnviz.common.wording import layers_and_heads, plural

#: steps ``attnviz train odd-patch`` takes without --steps
DEFAULT_STEPS = 3000
#: steps ``attnviz train caption`` takes without --steps
CAPTION_STEPS = 1500


def train_image_task(task, out, width, heads, layers, mlp_width, steps, batch_size, learning_rate, seed, eval_examples):
    """Train, measure (accuracy; where the class token or the caption's words look) and save; prints what it measured.

    ``task`` is ``odd-patch`` or ``caption`` (whose ``layers`` are decoder layers); options left out (``None``)
    take the task's defaults."""
    from attnviz.cli.console import console
    from attnviz.toy.odd_patch import check_odd_patch_output
    from attnviz.toy.training import TrainingSettings

    if task == "caption":
        from attnviz.toy.caption import CaptionModelSettings, save_captioner, train_captioner

        model_settings = _given_or_default(
            CaptionModelSettings, width=width, num_heads=heads, decoder_layers=layers, mlp_width=mlp_width
        )
        default_steps, train, save = CAPTION_STEPS, train_captioner, save_captioner
    else:
        from attnviz.toy.odd_patch import OddPatchModelSettings, save_odd_patch, train_odd_patch

        model_settings = _given_or_default(
            OddPatchModelSettings, width=width, num_heads=heads, num_layers=layers, mlp_width=mlp_width
        )
        default_steps, train, save = DEFAULT_STEPS, train_odd_patch, save_odd_patch
    settings = TrainingSettings(
        steps=steps if steps is not None else default_steps,  # 0 is refused, as by the token tasks
        batch_size=batch_size,
        learning_rate=learning_rate,
        seed=seed,
        eval_examples=eval_examples,
    ).validate()
    out = check_odd_patch_output(out if out is not None else Path(f"toy-{task}"))
    console.print(
        f"training [bold]{task}[/bold]: {_model_words(task, model_settings)}, "
        f"32×32 images in 4×4 patches of 8×8, {plural(settings.steps, 'step')}",
        highlight=False,
    )
    result = train(settings, model_settings, description=f"training {task}")
    console.print(_measured_words(task, result, settings.eval_examples), highlight=False)
    console.print(f"saved {save(result, out)}", highlight=False)


def _given_or_default(settings_class, **given):
    """``settings_class`` with the values given, each left out (``None``) taking the class's default; validated."""
    defaults = settings_class()
    return settings_class(
        **{name: value if value is not None else getattr(defaults, name) for name, value in given.items()}
    ).validate()


def _model_words(task, model_settings) -> str:
    """The trained model's shape, as the headline before training says it."""
    if task == "caption":
        return (
            f"ViT encoder {model_settings.encoder_layers} layers + GPT-2 decoder {model_settings.decoder_layers} "
            f"layer(s), {model_settings.num_heads} heads, width {model_settings.width}"
        )
    heads = layers_and_heads([model_settings.num_heads] * model_settings.num_layers)
    return f"ViT, {heads}, width {model_settings.width}"


def _measured_words(task, result, eval_examples: int) -> str:
    """What training measured on fresh held-out images (rich markup)."""
    if task == "caption":
        return (
            f"held-out: [bold]{result.accuracy:.2%}[/bold] of {eval_examples} fresh images captioned exactly; "
            f"the last decoder layer's cross-attention (max over heads) peaks on the word's patch for "
            f"{result.peak_hits:.2%} of the colour words (trained in {result.seconds:.0f} s)"
        )
    return (
        f"held-out accuracy [bold]{result.accuracy:.2%}[/bold] of {eval_examples} fresh images; the last "
        f"layer's class-token attention (max over heads) peaks on the odd patch in {result.attention_hits:.2%} "
        f"(trained in {result.seconds:.0f} s)"
    )
