#!/usr/bin/env python3
"""Drives a running `sluice serve` with the official `ollama` Python client, as Open WebUI or an
editor would: `list`, `show`, `ps`, `chat` (whole and streamed), `generate` (whole, streamed,
and continued from its `context`), `format` with a pydantic model's schema, a tool call (tools
from a Python function, the reply's `tool_calls` with arguments as an object) and its round
trip, and errors (a bad option, a wrong key). Prints one line per check and exits non-zero on
the first failure.

    python tests/clients/ollama_client.py http://127.0.0.1:PORT KEY
"""

import json
import sys

import ollama
from schemas import GetWeather, Person


def get_weather(city: str, unit: str) -> str:
    """The weather in a city.

    Args:
      city: The city.
      unit: celsius or fahrenheit.
    """
    return "sunny"


def main() -> int:
    host, key = sys.argv[1], sys.argv[2]
    client = ollama.Client(host=host, headers={"Authorization": f"Bearer {key}"})

    models = client.list().models
    name = models[0].model
    assert models[0].size > 0 and models[0].details.format, models
    info = client.show(name)
    assert "completion" in info.capabilities and info.template, info
    assert client.ps().models[0].context_length > 0
    print("list/show/ps:", name, info.capabilities)

    ask = [{"role": "user", "content": "Tell me of Elizabeth."}]
    opts = {"num_predict": 8, "temperature": 0}
    r = client.chat(model=name, messages=ask, options=opts)
    text = r.message.content
    assert r.done and r.done_reason == "length" and text, r
    assert r.eval_count == 8 and r.prompt_eval_count > 0 and r.total_duration > 0, r
    print("chat:", repr(text))

    parts = list(client.chat(model=name, messages=ask, options=opts, stream=True))
    assert "".join(p.message.content for p in parts) == text, parts
    assert parts[-1].done and parts[-1].eval_count == 8 and not any(p.done for p in parts[:-1])
    print("chat stream:", len(parts), "parts, same text")

    g = client.generate(model=name, prompt="Tell me of Elizabeth.", options=opts)
    assert g.done and g.response == text and g.context, g
    streamed = list(client.generate(model=name, prompt="Tell me of Elizabeth.", options=opts, stream=True))
    assert "".join(p.response for p in streamed) == text and streamed[-1].context == g.context
    more = client.generate(model=name, prompt="And then?", context=g.context, options=opts)
    assert more.context[: len(g.context)] == g.context and more.response, more
    print("generate: same text as chat; stream the same; continued from its context")

    # format: the reply follows a pydantic model's JSON schema.
    r = client.chat(
        model=name,
        messages=[{"role": "user", "content": "Describe a person."}],
        format=Person.model_json_schema(),
        options={"num_predict": 200, "temperature": 0},
    )
    print("format:", Person.model_validate_json(r.message.content))

    # A tool call. A model of random weights calls no tool of its own accord, and Ollama's API
    # has no way to force one: the assistant's reply is begun with the call's opening tag
    # (continued, as Ollama continues a last assistant message) and `format` holds the rest to
    # a call of get_weather.
    call = {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "arguments": {**GetWeather.model_json_schema(), "additionalProperties": False},
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    weather = [{"role": "user", "content": "What is the weather in Bath?"}]
    r = client.chat(
        model=name,
        messages=weather + [{"role": "assistant", "content": "<tool_call>\n"}],
        tools=[get_weather],
        format=call,
        options={"num_predict": 100, "temperature": 0},
    )
    calls = r.message.tool_calls
    assert calls and calls[0].function.name == "get_weather", r
    GetWeather.model_validate(calls[0].function.arguments)
    print("tool call:", dict(calls[0].function.arguments))
    streamed = list(
        client.chat(
            model=name,
            messages=weather + [{"role": "assistant", "content": "<tool_call>\n"}],
            tools=[get_weather],
            format=call,
            options={"num_predict": 100, "temperature": 0},
            stream=True,
        )
    )
    streamed_calls = [c for p in streamed for c in (p.message.tool_calls or [])]
    assert [c.function for c in streamed_calls] == [c.function for c in calls], streamed_calls
    print("tool call streamed: same calls")

    # Its round trip: the call, the tool's answer, a reply.
    history = weather + [
        r.message,
        {"role": "tool", "content": get_weather(**calls[0].function.arguments), "tool_name": "get_weather"},
    ]
    r = client.chat(model=name, messages=history, tools=[get_weather], options=opts)
    assert r.done, r
    print("tool round trip:", r.done_reason)

    try:
        client.chat(model=name, messages=ask, options={"temperature": "hot"})
        raise AssertionError("a bad option was taken")
    except ollama.ResponseError as e:
        assert e.status_code == 400 and "options.temperature" in e.error, (e.status_code, e.error)
        print("a bad option: 400,", e.error)

    bad = ollama.Client(host=host, headers={"Authorization": "Bearer wrong"})
    try:
        bad.list()
        raise AssertionError("a wrong key was taken")
    except ollama.ResponseError as e:
        assert e.status_code == 401, e
        print("a wrong key: 401,", json.dumps(e.error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
