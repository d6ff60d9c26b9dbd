"""The tiny models and tasks built from a seed, so that a run needs no download."""
