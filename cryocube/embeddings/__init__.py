"""One vector per sample, made once per (model, cube) and shared by the families that read it and
`cryocube embed`: extraction and its store (`embed`), NeuCo-Bench submissions (`submission`)."""
