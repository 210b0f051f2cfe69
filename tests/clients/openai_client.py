#!/usr/bin/env python3
"""Drives a running `sluice serve` with the official `openai` Python client (its defaults, as an
agent framework would): chat and completions, streamed and not, log-probabilities, several
choices, tools in the request and a tool-call history, the structured-output helper
(`chat.completions.parse` with a pydantic model, and a forced call of a pydantic tool) and a
tool round trip (call, tool result, answer). Prints one line per check and exits non-zero on
the first failure.

    python tests/clients/openai_client.py http://127.0.0.1:PORT/v1
"""

import json
import sys

import openai
from schemas import GetWeather, Person


def main() -> int:
    client = openai.OpenAI(base_url=sys.argv[1], api_key="unused", max_retries=0)
    models = client.models.list()
    name = models.data[0].id
    print("models:", name)

    r = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "Tell me of Elizabeth."}],
        max_tokens=8,
        temperature=0,
    )
    text = r.choices[0].message.content
    assert r.choices[0].message.role == "assistant" and text, r
    assert r.usage.completion_tokens == 8, r.usage
    print("chat:", repr(text))

    stream = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "Tell me of Elizabeth."}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage = [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                parts.append(c.delta.content)
    assert "".join(parts) == text, (parts, text)
    assert usage is not None and usage.completion_tokens == 8, usage
    print("chat stream: same text")

    r = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "Tell me of Elizabeth."}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 4, content
    for e in content:
        assert len(e.top_logprobs) == 3, e
        assert e.top_logprobs[0].token == e.token and e.logprob <= 0, e
    print("logprobs: 3 alternatives per token, greedy on top")

    r = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=6,
        temperature=0.9,
        seed=3,
        n=2,
    )
    assert [c.index for c in r.choices] == [0, 1], r.choices
    print("n=2:", [c.message.content for c in r.choices])

    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    r = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "What is the weather in Bath?"}],
        tools=tools,
        max_tokens=8,
        temperature=0,
    )
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls"), r
    print("tools accepted:", r.choices[0].finish_reason)
    history = [
        {"role": "user", "content": "What is the weather in Bath?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Bath"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Rain, 12 degrees."},
    ]
    r = client.chat.completions.create(model=name, messages=history, tools=tools, max_tokens=8, temperature=0)
    assert r.choices[0].message.role == "assistant", r
    print("tool history answered")

    r = client.completions.create(
        model=name, prompt="It is a truth universally acknowledged", max_tokens=6, temperature=0, logprobs=2
    )
    assert len(r.choices[0].logprobs.tokens) == 6, r.choices[0].logprobs
    print("completions:", repr(r.choices[0].text))

    try:
        client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "x"}], max_tokens=2, frobnicate=1
        )
    except TypeError:
        pass  # the client itself refuses unknown keyword arguments
    try:
        client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "x"}], max_tokens=2, extra_body={"frobnicate": 1}
        )
        raise AssertionError("an unknown field was accepted")
    except openai.BadRequestError as e:
        assert "frobnicate" in str(e), e
    print("unknown field: 400 naming it")

    # The structured-output helper: the SDK turns the pydantic model into a strict JSON schema
    # (nested models as `$defs` and `$ref`) and validates the reply into an instance.
    r = client.chat.completions.parse(
        model=name,
        messages=[{"role": "user", "content": "Describe a person in Bath."}],
        response_format=Person,
        max_tokens=160,
        temperature=0,
    )
    person = r.choices[0].message.parsed
    assert isinstance(person, Person), r
    print("parse(response_format=Person):", person.model_dump_json())

    # A forced call of a pydantic tool, parsed by the SDK, answered, and the answer read.
    weather = openai.pydantic_function_tool(GetWeather)
    ask = [{"role": "user", "content": "What is the weather in Bath?"}]
    r = client.chat.completions.parse(
        model=name,
        messages=ask,
        tools=[weather],
        tool_choice={"type": "function", "function": {"name": "GetWeather"}},
        max_tokens=60,
        temperature=0,
    )
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", r
    call = msg.tool_calls[0]
    args = call.function.parsed_arguments
    assert isinstance(args, GetWeather), call
    print("forced tool call:", call.function.name, args.model_dump_json())
    history = ask + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude={"function": {"parsed_arguments"}})]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"rain": True, "degrees": 12})},
    ]
    r = client.chat.completions.create(model=name, messages=history, tools=[weather], max_tokens=12, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason in ("stop", "length", "tool_calls"), r
    assert r.usage.prompt_tokens > 0, r.usage
    print("tool round trip answered:", repr(r.choices[0].message.content))
    return 0


if __name__ == "__main__":
    sys.exit(main())
