"""Foundation: typed errors, progress reporting, text sources, token labels, data parallelism."""
