"""Safe file output: destinations checked early, inputs never touched, writes atomic."""
