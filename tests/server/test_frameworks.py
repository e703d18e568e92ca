"""The frameworks agents are written with, unchanged, against a real ``radixserve serve`` on
the embedded model: LangChain's ChatOpenAI / ChatAnthropic / ChatOllama (bind_tools, a forced
tool call, the ToolMessage round trip) and litellm's openai, text-completion, ollama and
ollama_chat providers."""

from __future__ import annotations

import os

import pytest
from server_proc import ServerProc

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import

from langchain_anthropic import ChatAnthropic  # noqa: E402
from langchain_core.messages import HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_ollama import ChatOllama  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402


@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"It is sunny and 21 C in {city}."


@pytest.fixture(scope="module")
def server():
    s = ServerProc("--served-model-name", "smol")
    yield s
    assert s.stop() == 0


def round_trip(chat, forced):
    """A tool-calling turn (forced to call get_weather), the tool's result sent back as a
    ToolMessage, and the model's answer to that: what every agent loop does."""
    question = HumanMessage("What is the weather in Paris? Use the tool.")
    called = chat.bind_tools([get_weather], tool_choice=forced).invoke([question])
    assert called.tool_calls and called.tool_calls[0]["name"] == "get_weather"
    call = called.tool_calls[0]
    assert isinstance(call["args"], dict) and call["id"]
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    answer = chat.bind_tools([get_weather]).invoke([question, called, result])
    assert isinstance(answer.content, str | list)
    return answer


def test_langchain_chat_openai(server):
    chat = ChatOpenAI(model="smol", base_url=f"{server.url}/v1", api_key="unused",
                      temperature=0, max_tokens=40, max_retries=0)
    assert chat.invoke("Say hi.").content
    round_trip(chat, "get_weather")
    round_trip(chat, "required")
    streamed = "".join(c.content for c in chat.stream("Count to three."))
    assert streamed


def test_langchain_chat_anthropic(server):
    chat = ChatAnthropic(model="smol", base_url=server.url, api_key="unused", temperature=0,
                         max_tokens=40, max_retries=0)
    assert chat.invoke("Say hi.").content
    round_trip(chat, "get_weather")
    round_trip(chat, "any")


def test_langchain_chat_ollama(server):
    chat = ChatOllama(model="smol", base_url=server.url, temperature=0, num_predict=40)
    assert chat.invoke("Say hi.").content
    # Ollama has no tool_choice: the round trip itself with a call written by hand
    from langchain_core.messages import AIMessage

    question = HumanMessage("What is the weather in Paris?")
    called = AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"},
                                        "id": "call_1"}])
    result = ToolMessage(get_weather.invoke({"city": "Paris"}), tool_call_id="call_1")
    answer = chat.bind_tools([get_weather]).invoke([question, called, result])
    assert isinstance(answer.content, str)


@pytest.mark.parametrize("provider", ["openai", "ollama", "ollama_chat"])
def test_litellm_providers(server, provider):
    import litellm

    base = f"{server.url}/v1" if provider == "openai" else server.url
    reply = litellm.completion(model=f"{provider}/smol", api_base=base, api_key="unused",
                               messages=[{"role": "user", "content": "Say hi."}],
                               temperature=0, max_tokens=12)
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens > 0
    parts = litellm.completion(model=f"{provider}/smol", api_base=base, api_key="unused",
                               messages=[{"role": "user", "content": "Say hi."}],
                               temperature=0, max_tokens=12, stream=True)
    assert "".join(p.choices[0].delta.content or "" for p in parts)


def test_litellm_text_completion(server):
    import litellm

    reply = litellm.text_completion(model="openai/smol", api_base=f"{server.url}/v1",
                                    api_key="unused", prompt="The capital of France is",
                                    temperature=0, max_tokens=8)
    assert "Paris" in reply.choices[0].text
