"""One vector per sample, made once per (model, cube) and shared by the families that read it
(embedding probes, heads) and by `cryocube embed`: extraction and its store (`embed`), the
NeuCo-Bench submission files (`submission`)."""
