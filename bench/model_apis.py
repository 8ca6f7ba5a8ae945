"""The fake model APIs of ``bench/workbench.py`` in a process of their own, as a model API is in
production: answering and recording requests (JSON parsing of whole conversations, on threads that
hold the GIL) then costs the host's event loop nothing, and the latency measured is relay's and the
SDKs', not the fake's.

``ModelAPIs`` starts ``python bench/model_apis.py``, which runs ``tests.fake_openai.FakeOpenAI`` and
``tests.fake_anthropic.FakeAnthropic`` on free loopback ports, prints their base URLs as one JSON line,
and then answers each ``texts`` line on its stdin with one JSON line: every text each fake received
(``Recorded.text``) so far. It exits when its stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Self

ROOT = Path(__file__).resolve().parents[1]


class ModelAPIs:
    """The child process; ``openai`` and ``anthropic`` are the fakes' base URLs once entered."""

    def __init__(self) -> None:
        self.openai = self.anthropic = ""
        self._child: subprocess.Popen[str] | None = None

    def __enter__(self) -> Self:
        self._child = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._child.stdout is not None
        urls = json.loads(self._child.stdout.readline())
        self.openai, self.anthropic = urls["openai"], urls["anthropic"]
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        child.stdout.close()

    def _texts(self) -> dict[str, str]:
        child = self._child
        assert child is not None and child.stdin is not None and child.stdout is not None
        child.stdin.write("texts\n")
        child.stdin.flush()
        return dict(json.loads(child.stdout.readline()))

    async def texts(self, api: str) -> str:
        """Every text the fake ``api`` (``openai`` or ``anthropic``) received so far, one string."""
        return (await asyncio.to_thread(self._texts))[api]


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from tests.fake_anthropic import FakeAnthropic
    from tests.fake_openai import FakeOpenAI

    with FakeOpenAI() as openai, FakeAnthropic() as anthropic:
        print(json.dumps({"openai": openai.base_url, "anthropic": anthropic.base_url}), flush=True)
        fakes = {"openai": openai, "anthropic": anthropic}
        for line in sys.stdin:
            if line.strip() == "texts":
                texts = {name: "\n".join(r.text() for r in list(f.requests)) for name, f in fakes.items()}
                print(json.dumps(texts), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
