"""The head atlas (``attnviz report``): from loading a model to the written page."""
