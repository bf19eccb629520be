"""The engine: planning runs (plan.py), scheduling their work on Dask (evaluate.py), run records
(records.py)."""
