"""The fake chat-completions API answers in the shapes OpenAI-compatible clients parse: one JSON object,
or ``chat.completion.chunk`` SSE events ending in ``[DONE]``, tool calls included; it records every
request, lists models, and fails on request (the Copilot SDK drives it for real in the Workbench tests)."""

from __future__ import annotations

import json
from typing import Any

import httpx2

from tests.fake_openai import FakeOpenAI, Text, ToolUse, tool_results

TOOLS = [{"type": "function", "function": {"name": "send_agent_message", "parameters": {"type": "object"}}}]


def _chat(api: FakeOpenAI, **body: Any) -> httpx2.Response:
    request = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, **body}
    return httpx2.post(f"{api.base_url}/v1/chat/completions", json=request, timeout=10)


def _events(response: httpx2.Response) -> list[Any]:
    lines = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_a_scripted_tool_call_then_text_non_streaming() -> None:
    with FakeOpenAI() as api:
        api.reply(ToolUse("send_agent_message", {"to": "bob"}))
        first = _chat(api).json()
        (choice,) = first["choices"]
        assert first["object"] == "chat.completion" and choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"]
        assert call["type"] == "function" and call["function"]["name"] == "send_agent_message"
        assert json.loads(call["function"]["arguments"]) == {"to": "bob"}
        result = {"role": "tool", "tool_call_id": call["id"], "content": '{"id": "env_x"}'}
        messages = [{"role": "user", "content": "hi"}, choice["message"], result]
        second = _chat(api, messages=messages).json()
        assert second["choices"][0]["message"] == {"role": "assistant", "content": "OK."}
        assert second["choices"][0]["finish_reason"] == "stop"
        recorded = api.conversation()
        assert len(recorded) == 2 and tool_results(recorded[1]) == [
            {"tool_call_id": call["id"], "content": '{"id": "env_x"}'}
        ]
        assert recorded[1].last_user_text() == '{"id": "env_x"}'


def test_streaming_chunks_carry_text_tool_calls_and_usage() -> None:
    with FakeOpenAI() as api:
        api.reply(Text("thinking"), ToolUse("send_agent_message", {"to": "bob"}))
        response = _chat(api, stream=True, stream_options={"include_usage": True})
        assert response.headers["content-type"] == "text/event-stream"
        chunks = _events(response)
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert deltas[0] == {"role": "assistant", "content": ""}
        assert "".join(d.get("content") or "" for d in deltas) == "thinking"
        calls = [t for d in deltas for t in d.get("tool_calls", [])]
        assert calls[0]["function"]["name"] == "send_agent_message" and calls[0]["id"].startswith("call_")
        assert json.loads("".join(t["function"]["arguments"] for t in calls)) == {"to": "bob"}
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 15


def test_models_errors_and_scripted_failures() -> None:
    with FakeOpenAI(fail_first=1) as api:
        assert _chat(api).status_code == 500
        assert _chat(api).status_code == 200
        listed = httpx2.get(f"{api.base_url}/v1/models", timeout=10).json()
        assert {m["id"] for m in listed["data"]} == {"gpt-4.1", "fake-model"}
        missing = httpx2.post(f"{api.base_url}/v1/embeddings", json={}, timeout=10)
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
        assert [r.path for r in api.requests] == [
            "/v1/chat/completions", "/v1/chat/completions", "/v1/models", "/v1/embeddings",
        ]  # fmt: skip
