"""zebractl: declarative pretraining of Zebra hybrid recurrent-attention language models."""

__version__ = "0.1.0"
