"""tokenmill: raw web text to training-ready token shards, and a trainer that streams them."""

__version__ = "0.1.0"
