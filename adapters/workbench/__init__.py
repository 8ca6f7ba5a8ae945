"""Workbench (in-process) sessions: session tools and prompts through a host's ``PromptQueue``."""

from adapters.workbench.session import PromptQueue, SessionMessaging, SessionTool, format_prompt

__all__ = ["PromptQueue", "SessionMessaging", "SessionTool", "format_prompt"]
