"""Pydantic schemas of presets, recipes and reports (no heavy imports here)."""
