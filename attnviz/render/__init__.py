"""Rendering: figures from tensors and labels. Nothing here loads a model."""
