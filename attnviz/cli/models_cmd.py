"""``attnviz models`` (what can be loaded here) and ``attnviz cache clear`` (free the conversion cache)."""

from __future__ import annotations

import typer

cache_app = typer.Typer(
    help="attnviz's cache of converted GGUF models.\n\nExample:\n\n  attnviz cache clear",
    no_args_is_help=True,
)


def models() -> None:
    """List the models attnviz can load: shipped names, the Hugging Face cache, converted GGUF files.

    Examples:

      attnviz models

      attnviz heatmap "The cat sat." --model smollm2
    """
    from rich.markup import escape
    from rich.table import Table

    from attnviz.cli.console import product_console
    from attnviz.common.cache import cache_root
    from attnviz.models.inventory import (
        conversion_cache_entries,
        directory_size,
        hub_cache_dir,
        hub_cache_models,
        human_size,
        shipped_models,
    )

    def table(title, entries, empty):
        result = Table(title=title, title_justify="left", show_lines=False)
        result.add_column("name", overflow="fold")
        result.add_column("size", justify="right", no_wrap=True)
        result.add_column("what · where", overflow="fold")
        for entry in entries:
            where = f"\n[dim]{escape(entry.location)}[/dim]" if entry.location else ""
            result.add_row(entry.spec, human_size(entry.size_bytes), escape(entry.description) + where)
        if not entries:
            result.add_row("—", "", empty)
        return result

    console = product_console()  # the tables are the product: stdout
    console.print(table("Shipped (--model NAME)", shipped_models(), "none"))
    console.print(table(f"Hugging Face cache ({hub_cache_dir()})", hub_cache_models(), "no models cached"))
    conversions = conversion_cache_entries()
    console.print(table(f"Converted GGUF files ({cache_root() / 'gguf'})", conversions, "empty"))
    if conversions:
        size = human_size(directory_size(cache_root() / "gguf"))  # folders may share files (hard links)
        console.print(f"{size} in all; free it with: attnviz cache clear", highlight=False)


@cache_app.command("clear")
def clear() -> None:
    """Remove attnviz's converted GGUF models (they are rebuilt on the next load, about a minute each).

    Example:

      attnviz cache clear
    """
    from attnviz.cli.console import console
    from attnviz.common.cache import cache_root
    from attnviz.common.wording import plural
    from attnviz.models.inventory import clear_conversion_cache, human_size

    folders, freed = clear_conversion_cache()
    console.print(f"removed {plural(folders, 'converted model')} from {cache_root() / 'gguf'}", highlight=False)
    print(f"{freed} bytes freed ({human_size(freed)})")


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.add_typer(cache_app, name="cache")
