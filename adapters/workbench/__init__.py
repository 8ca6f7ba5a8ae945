"""Workbench (in-process) sessions: session tools and prompts through a host's ``PromptQueue``."""

from adapters.workbench.session import (
    PromptQueue,
    SessionMessaging,
    SessionTool,
    format_prompt,
    prompt_envelope_id,
)

__all__ = ["PromptQueue", "SessionMessaging", "SessionTool", "format_prompt", "prompt_envelope_id"]
