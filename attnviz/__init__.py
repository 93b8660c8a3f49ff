"""attnviz: see what a transformer's attention heads do, and which of them matter."""

__version__ = "0.1.0"
