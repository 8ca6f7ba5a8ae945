"""The memory backend: embedded use and the conformance reference."""

from adapters.memory.inbox import MemoryInboxStore
from adapters.memory.notice import MemoryNoticeStore
from adapters.memory.policy import MemoryPolicyStore
from adapters.memory.registry import MemoryRegistry
from adapters.memory.state import MemoryState

__all__ = ["MemoryInboxStore", "MemoryNoticeStore", "MemoryPolicyStore", "MemoryRegistry", "MemoryState"]
