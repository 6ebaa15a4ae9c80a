"""Real pretrained models: one attention layer of a transformers model as a scenario."""
