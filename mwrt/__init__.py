"""mwrt: a master-worker remote-tensor runtime."""

__version__ = "0.1.0"
