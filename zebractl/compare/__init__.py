"""`zebractl compare`: parity reports of two runs (:mod:`.report`, :mod:`.render`)."""
