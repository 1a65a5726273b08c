"""Shared pytest fixtures; server helpers live in ``tests/servers.py``."""
