"""Pydantic models the client scripts ask `sluice serve` for: nested objects, bounded strings
and numbers, enums and arrays, so that even the demo model's output completes and validates."""

from typing import Annotated, Literal

import pydantic


class Address(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=12)
    zip: int = pydantic.Field(ge=10000, le=99999)


class Person(pydantic.BaseModel):
    """A person."""

    name: str = pydantic.Field(max_length=16)
    age: int = pydantic.Field(ge=0, le=120)
    mood: Literal["happy", "sad", "calm"]
    tags: list[Annotated[str, pydantic.Field(max_length=8)]] = pydantic.Field(min_length=1, max_length=3)
    address: Address


class Verdict(pydantic.BaseModel):
    """A verdict."""

    mood: Literal["happy", "sad", "calm"]
    score: int = pydantic.Field(ge=0, le=9)


class GetWeather(pydantic.BaseModel):
    """The weather in a city."""

    city: str = pydantic.Field(max_length=12)
    unit: Literal["celsius", "fahrenheit"]


class Review(pydantic.BaseModel):
    """A review, in choices alone: the `anthropic` SDK moves bounds (lengths, minimum and
    maximum) out of the schema it sends and into descriptions, which no grammar reads."""

    mood: Literal["happy", "sad", "calm"]
    stars: Literal[1, 2, 3, 4, 5]
    recommend: bool
