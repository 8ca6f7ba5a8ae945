"""Codex (``@openai/codex``) on the host tier: ``relay setup codex`` (``setup``) and the waiter its
hooks start (``waiter``), which wakes an idle Codex session with ``codex queue``."""
