"""Evaluation families: what a kind of evaluation needs, fits, maps, reduces and scores."""
