"""``attnviz train odd-patch``: train the toy ViT of :mod:`attnviz.toy.odd_patch` and save it."""

from __future__ import annotations

from pathlib import Path

from attnviz.common.wording import layers_and_heads, plural

#: steps ``attnviz train odd-patch`` takes without --steps
DEFAULT_STEPS = 3000


def train_image_task(task, out, width, heads, layers, mlp_width, steps, batch_size, learning_rate, seed, eval_examples):
    """Train, measure (accuracy; where the class token looks) and save; prints what it measured."""
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
