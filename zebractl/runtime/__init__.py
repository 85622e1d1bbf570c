"""Process-level runtime: distributed init and the compatibility patches megatron-core needs here."""
