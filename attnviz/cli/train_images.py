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
    """Train, measure (accuracy; where the class token looks) and save; prints what it measured."""
    if task == "caption":
        train_caption_task(out, width, heads, layers, mlp_width, steps, batch_size, learning_rate, seed, eval_examples)
        return
    from attnviz.cli.console import console
    from attnviz.toy.odd_patch import (
        OddPatchModelSettings,
        check_odd_patch_output,
        save_odd_patch,
        train_odd_patch,
    )
    from attnviz.toy.training import TrainingSettings

    defaults = OddPatchModelSettings()
    model_settings = OddPatchModelSettings(
        width=width or defaults.width,
        num_heads=heads or defaults.num_heads,
        num_layers=layers or defaults.num_layers,
        mlp_width=mlp_width or defaults.mlp_width,
    ).validate()
    settings = TrainingSettings(
        steps=steps or DEFAULT_STEPS,
        batch_size=batch_size,
        learning_rate=learning_rate,
        seed=seed,
        eval_examples=eval_examples,
    ).validate()
    out = check_odd_patch_output(out if out is not None else Path(f"toy-{task}"))
    console.print(
        f"training [bold]{task}[/bold]: ViT, {layers_and_heads([model_settings.num_heads] * model_settings.num_layers)}, "
        f"width {model_settings.width}, 32×32 images in 4×4 patches of 8×8, {plural(settings.steps, 'step')}",
        highlight=False,
    )
    result = train_odd_patch(settings, model_settings, description=f"training {task}")
    console.print(
        f"held-out accuracy [bold]{result.accuracy:.2%}[/bold] of {settings.eval_examples} fresh images; the last "
        f"layer's class-token attention (max over heads) peaks on the odd patch in {result.attention_hits:.2%} "
        f"(trained in {result.seconds:.0f} s)",
        highlight=False,
    )
    console.print(f"saved {save_odd_patch(result, out)}", highlight=False)


def train_caption_task(out, width, heads, layers, mlp_width, steps, batch_size, learning_rate, seed, eval_examples):
    """Train the toy captioner (``--layers``: decoder layers), measure it on fresh images and save it."""
    from attnviz.cli.console import console
    from attnviz.toy.caption import CaptionModelSettings, save_captioner, train_captioner
    from attnviz.toy.odd_patch import check_odd_patch_output
    from attnviz.toy.training import TrainingSettings

    defaults = CaptionModelSettings()
    model_settings = CaptionModelSettings(
        width=width or defaults.width,
        num_heads=heads or defaults.num_heads,
        decoder_layers=layers or defaults.decoder_layers,
        mlp_width=mlp_width or defaults.mlp_width,
    ).validate()
    settings = TrainingSettings(
        steps=steps or CAPTION_STEPS,
        batch_size=batch_size,
        learning_rate=learning_rate,
        seed=seed,
        eval_examples=eval_examples,
    ).validate()
    out = check_odd_patch_output(out if out is not None else Path("toy-caption"))
    console.print(
        f"training [bold]caption[/bold]: ViT encoder {model_settings.encoder_layers} layers + GPT-2 decoder "
        f"{model_settings.decoder_layers} layer(s), {model_settings.num_heads} heads, width {model_settings.width}, "
        f"32×32 images in 4×4 patches of 8×8, {plural(settings.steps, 'step')}",
        highlight=False,
    )
    result = train_captioner(settings, model_settings, description="training caption")
    console.print(
        f"held-out: [bold]{result.accuracy:.2%}[/bold] of {settings.eval_examples} fresh images captioned exactly; "
        f"the last decoder layer's cross-attention (max over heads) peaks on the word's patch for "
        f"{result.peak_hits:.2%} of the colour words (trained in {result.seconds:.0f} s)",
        highlight=False,
    )
    console.print(f"saved {save_captioner(result, out)}", highlight=False)
