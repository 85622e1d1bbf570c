"""`zebractl generate` and `zebractl chat`: sampling from a trained model with its generation cache
(:mod:`zebractl.generate.engine`) and multi-turn conversations over one cache
(:mod:`zebractl.generate.chat`)."""
