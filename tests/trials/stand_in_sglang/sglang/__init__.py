"""Stand-in for SGLang (see ../README.md): no engine, only the surface the backend uses."""

__version__ = "0.5.17+stand-in"
