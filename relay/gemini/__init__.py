"""Gemini CLI (``@google/gemini-cli``) on the host tier: ``relay setup gemini`` (``setup``), the
launcher ``relay run gemini`` (``relay.launch``) and its ``AfterAgent`` hook (``hook``)."""
