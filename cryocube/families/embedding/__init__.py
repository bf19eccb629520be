"""The embedding family: one vector per sample, scored by cheap probes (NeuCo-Bench / Embed2Scale, PANGAEA)."""
