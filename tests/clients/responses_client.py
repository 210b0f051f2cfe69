#!/usr/bin/env python3
"""Drives a running `sluice serve` with the official `openai` Python client's Responses API, as
Codex would: `responses.create` (text, and its stream of events with their sequence numbers),
a forced function call (streamed and not) among tool types the server skips, a
`function_call_output` round trip, `text.format` json_schema through `responses.parse` with a
pydantic model, and the stateless server's 400 for `previous_response_id`. Prints one line per
check and exits non-zero on the first failure.

    python tests/clients/responses_client.py http://127.0.0.1:PORT/v1 KEY
"""

import json
import sys

import openai
from schemas import GetWeather, Person


def main() -> int:
    client = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
    model = "gpt-5-codex"
    ask = "Tell me of Elizabeth."

    r = client.responses.create(model=model, input=ask, max_output_tokens=8, temperature=0)
    text = r.output_text
    assert r.object == "response" and text, r
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
    assert r.usage.output_tokens == 8 and r.usage.input_tokens > 0, r.usage
    assert [o.type for o in r.output] == ["message"], r.output
    print("responses.create:", repr(text))

    events = list(
        client.responses.create(
            model=model, input=ask, max_output_tokens=8, temperature=0, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete", kinds
    assert [e.sequence_number for e in events] == list(range(len(events))), events
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == text and events[-1].response.output_text == text, (deltas, text)
    assert "response.output_item.done" in kinds and "response.output_text.done" in kinds, kinds
    print("stream:", len(events), "events, same text")

    # A forced function call; the other tool types Codex sends are skipped, not refused.
    tools = [
        {"type": "web_search"},
        {
            "type": "function",
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {**GetWeather.model_json_schema(), "additionalProperties": False},
            "strict": True,
        },
    ]
    weather = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Bath?"}]}]
    forced = {"type": "function", "name": "get_weather"}
    r = client.responses.create(
        model=model, input=weather, tools=tools, tool_choice=forced, max_output_tokens=200
    )
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) >= 1 and r.status == "completed", r
    assert calls[0].name == "get_weather" and calls[0].call_id, calls
    GetWeather.model_validate_json(calls[0].arguments)
    print("forced function_call:", calls[0].arguments)

    events = list(
        client.responses.create(
            model=model,
            input=weather,
            tools=tools,
            tool_choice=forced,
            max_output_tokens=200,
            stream=True,
        )
    )
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert args == calls[0].arguments, (args, calls[0].arguments)
    assert [(d.name, d.arguments) for d in done] == [(c.name, c.arguments) for c in calls], done
    print("forced function_call streamed: same calls")

    # The round trip: the call, its output, an answer.
    history = weather + [
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"},
    ]
    r = client.responses.create(
        model=model, input=history, tools=tools, max_output_tokens=8, temperature=0
    )
    assert r.output, r
    print("function_call_output round trip:", r.status)

    # Structured output: text.format json_schema, parsed into the pydantic model.
    r = client.responses.parse(
        model=model,
        input="Describe a person.",
        text_format=Person,
        max_output_tokens=200,
        instructions="Answer in JSON.",
        store=False,
        reasoning={"effort": "low"},
    )
    assert isinstance(r.output_parsed, Person), r
    print("responses.parse:", r.output_parsed)

    try:
        client.responses.create(model=model, input="Hi", previous_response_id="resp_1")
        raise AssertionError("previous_response_id was taken")
    except openai.BadRequestError as e:
        assert "stateless" in e.body["message"], e.body
        print("previous_response_id: 400")

    bad = openai.OpenAI(base_url=sys.argv[1], api_key="wrong", max_retries=0)
    try:
        bad.responses.create(model=model, input="Hi")
        raise AssertionError("a wrong key was taken")
    except openai.AuthenticationError as e:
        print("a wrong key: 401", json.dumps(e.body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
