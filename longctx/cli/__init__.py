"""Command modules for ``python -m longctx``; each exposes ``register(subparsers)``."""
