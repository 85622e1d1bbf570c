"""`zebractl eval`: lm-eval-harness on offline benchmark data (:mod:`.tasks`, :mod:`.harness`)."""
