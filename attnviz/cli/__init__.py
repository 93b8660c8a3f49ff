"""Command-line interface; ``attnviz.cli.app:main`` is the entry point."""
