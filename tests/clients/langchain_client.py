#!/usr/bin/env python3
"""Drives a running `sluice serve` through LangChain (`langchain-openai`'s `ChatOpenAI`, the
agent framework's OpenAI chat model, unchanged): a reply, a stream, structured output with a
pydantic model (both of LangChain's methods: a JSON schema, and a forced function call), and
an agent step — a forced tool call, the tool run, its result sent back and answered. Prints one
line per check and exits non-zero on the first failure.

    python tests/clients/langchain_client.py http://127.0.0.1:PORT/v1
"""

import sys

import openai
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from schemas import GetWeather, Person, Verdict

calls = []


@tool(args_schema=GetWeather)
def get_weather(city: str, unit: str) -> str:
    """The weather in a city."""
    calls.append((city, unit))
    return f"Rain in {city}, 12 degrees {unit}."


def main() -> int:
    # The served model's name, as the server lists it.
    name = openai.OpenAI(base_url=sys.argv[1], api_key="unused").models.list().data[0].id

    def chat(max_tokens):
        return ChatOpenAI(
            base_url=sys.argv[1], api_key="unused", model=name, temperature=0, max_tokens=max_tokens, max_retries=0
        )

    llm = chat(12)

    reply = llm.invoke("Tell me of Elizabeth.")
    assert isinstance(reply.content, str) and reply.content, reply
    print("invoke:", repr(reply.content))
    streamed = "".join(c.content for c in llm.stream("Tell me of Elizabeth."))
    assert streamed == reply.content, (streamed, reply.content)
    print("stream: same text")

    p = chat(160).with_structured_output(Person, method="json_schema").invoke("Describe a person in Bath.")
    assert isinstance(p, Person), p
    print("with_structured_output(Person, method='json_schema'):", p.model_dump_json())
    # By function calling the template writes the schema into the prompt, which the demo
    # model's 512 positions must also hold: a smaller model. `strict=True`, as LangChain
    # documents for OpenAI, adds `additionalProperties: false`: without it the schema allows
    # any further key, and this model, having filled the required ones, writes more.
    v = chat(60).with_structured_output(Verdict, method="function_calling", strict=True).invoke("How is Mr. Darcy?")
    assert isinstance(v, Verdict), v
    print("with_structured_output(Verdict, method='function_calling'):", v.model_dump_json())

    # One agent step: the model must call the tool; the tool runs; its answer goes back.
    ask = HumanMessage("What is the weather in Bath?")
    ai = chat(60).bind_tools([get_weather], tool_choice="get_weather", strict=True).invoke([ask])
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "get_weather", ai
    GetWeather.model_validate(ai.tool_calls[0]["args"])
    result = get_weather.invoke(ai.tool_calls[0])
    assert calls, "the tool did not run"
    final = llm.bind_tools([get_weather]).invoke([ask, ai, result])
    assert final.response_metadata.get("finish_reason") in ("stop", "length", "tool_calls"), final
    print("agent step: called", ai.tool_calls[0]["args"], "then answered", repr(final.content))
    return 0


if __name__ == "__main__":
    sys.exit(main())
