#!/usr/bin/env python3
"""Drives a running `sluice serve` with the official `anthropic` Python client, as Claude Code's
SDK would: `messages.create`, `messages.stream` (`text_stream` and `get_final_message`), a stop
sequence, a forced `tool_choice` tool call whose `input` validates against its `input_schema`
(streamed and not), a `tool_result` round trip, a prefilled assistant turn, structured output
(`messages.parse` with a pydantic model), `count_tokens`, and errors in Anthropic's shape (a
bad block, a wrong key). The SDK sends no sampling options (recent Claude models take none):
the server samples with the model's defaults and seed 0, so the same request gives the same
reply. Prints one line per check and exits
non-zero on the first failure.

    python tests/clients/anthropic_client.py http://127.0.0.1:PORT KEY
"""

import sys

import anthropic
from schemas import GetWeather, Review


def main() -> int:
    base, key = sys.argv[1], sys.argv[2]
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    # Claude Code names a Claude model; the server runs whatever it runs under any name.
    model = "claude-sonnet-4-5"
    ask = [{"role": "user", "content": "Tell me of Elizabeth."}]

    r = client.messages.create(model=model, max_tokens=8, messages=ask)
    assert r.type == "message" and r.role == "assistant", r
    assert [b.type for b in r.content] == ["text"], r.content
    text = r.content[0].text
    assert text and r.stop_reason == "max_tokens", r
    # Prompt tokens the prefix cache held are `cache_read_input_tokens`, the rest `input_tokens`.
    assert r.usage.output_tokens == 8, r.usage
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens > 0, r.usage
    print("messages.create:", repr(text))

    with client.messages.stream(model=model, max_tokens=8, messages=ask) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text, (streamed, text)
    assert final.content[0].text == text and final.stop_reason == "max_tokens", final
    assert final.usage.output_tokens == 8, final.usage
    print("messages.stream: same text, same final message")

    # A stop sequence from inside the greedy text ends it there.
    words = text.split()
    stop = next(w for w in words[1:] if text.index(w) > 0)
    r = client.messages.create(
        model=model, max_tokens=8, messages=ask, stop_sequences=[stop]
    )
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop, r
    assert r.content[0].text == text[: text.index(stop)], (r.content, text, stop)
    print("stop_sequences:", repr(stop))

    # A forced call of a tool: its input validates against the tool's input_schema.
    tools = [
        {
            "name": "get_weather",
            "description": "The weather in a city",
            # Closed, as a strict tool's schema is: the demo model fills in what it may.
            "input_schema": {**GetWeather.model_json_schema(), "additionalProperties": False},
        }
    ]
    weather = [{"role": "user", "content": "What is the weather in Bath?"}]
    forced = {"type": "tool", "name": "get_weather"}
    r = client.messages.create(
        model=model, max_tokens=200, messages=weather, tools=tools, tool_choice=forced
    )
    calls = [b for b in r.content if b.type == "tool_use"]
    assert len(calls) >= 1 and r.stop_reason == "tool_use", r
    assert calls[0].name == "get_weather" and calls[0].id.startswith("toolu_"), calls
    GetWeather.model_validate(calls[0].input)
    print("forced tool_use:", calls[0].input)

    with client.messages.stream(
        model=model, max_tokens=200, messages=weather, tools=tools, tool_choice=forced
    ) as s:
        final = s.get_final_message()
    streamed_calls = [b for b in final.content if b.type == "tool_use"]
    assert [(c.name, c.input) for c in streamed_calls] == [(c.name, c.input) for c in calls], (
        streamed_calls,
        calls,
    )
    print("forced tool_use streamed: same calls")

    # The round trip: the call, its result, an answer.
    history = weather + [
        {"role": "assistant", "content": r.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "sunny"}],
        },
    ]
    r = client.messages.create(model=model, max_tokens=8, messages=history, tools=tools)
    assert r.stop_reason in ("end_turn", "max_tokens", "tool_use"), r
    print("tool_result round trip:", r.stop_reason)

    # A prefilled reply goes on from the assistant's text.
    r = client.messages.create(
        model=model,
        max_tokens=6,
        messages=ask + [{"role": "assistant", "content": "Elizabeth was"}],
    )
    assert r.content[0].text and r.usage.output_tokens == 6, r
    print("prefill:", repr(r.content[0].text))

    # Structured output: the text follows the pydantic model's schema and parses.
    r = client.messages.parse(
        model=model,
        max_tokens=100,
        messages=[{"role": "user", "content": "Judge the mood."}],
        output_format=Review,
    )
    assert isinstance(r.parsed_output, Review), r
    print("messages.parse:", r.parsed_output)

    # count_tokens counts what a create of the same messages reads.
    n = client.messages.count_tokens(model=model, messages=ask)
    r = client.messages.create(model=model, max_tokens=1, messages=ask)
    assert n.input_tokens == r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0), (n, r.usage)
    print("count_tokens:", n.input_tokens)

    # Thinking is accepted (a model without a thinking mode ignores it).
    r = client.messages.create(
        model=model,
        max_tokens=4,
        messages=ask,
        thinking={"type": "enabled", "budget_tokens": 1024},
        metadata={"user_id": "test"},
    )
    assert r.content, r
    print("thinking accepted")

    try:
        client.messages.create(
            model=model,
            max_tokens=8,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}],
                }
            ],
        )
        raise AssertionError("an image block was taken")
    except anthropic.BadRequestError as e:
        assert e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body
        print("an image block: 400,", e.body["error"]["message"])

    bad = anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0)
    try:
        bad.messages.create(model=model, max_tokens=8, messages=ask)
        raise AssertionError("a wrong key was taken")
    except anthropic.AuthenticationError as e:
        assert e.body["error"]["type"] == "authentication_error", e.body
        print("a wrong key: 401")
    return 0


if __name__ == "__main__":
    sys.exit(main())
