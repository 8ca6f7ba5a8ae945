"""Implementations of relay's ports: storage backends and provider address types."""
