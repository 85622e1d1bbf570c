"""Checkpoint conversion between zebractl (Megatron layout) and Hugging Face / FLA formats."""
