"""The engine: where Dask work runs (cluster.py), and how runs are planned, trained and scored."""
