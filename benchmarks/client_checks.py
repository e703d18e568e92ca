"""Real client libraries against a running server: does what an agent, editor or SDK sends work?

    python benchmarks/client_checks.py --base-url http://127.0.0.1:8000 [--only NAME ...]

Each check uses the client as its users do (the official SDKs, agent frameworks, an editor's FIM
request) and prints one line: PASS / FAIL / SKIP (the library is not installed), the check's name and
what it saw. The clients are not radixserve's dependencies: run it from an environment that has them
(`pip install openai anthropic ollama openai-agents "pydantic-ai-slim[openai]" instructor langchain
langchain-openai langgraph litellm httpx`). Meant for a real instruct model with tools and FIM tokens
(../shared/MODELS.md's Qwen2.5-Coder-1.5B-Instruct); greedy where the client lets us ask for it.
Nothing here is a test of the suite: a small model may answer a prompt without the tool it was offered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import traceback

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}
ASK = "What is the weather in Paris right now? Use the tool."
CHECKS = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def _weather(city: str) -> str:
    """Get the current weather in a city."""
    return json.dumps({"city": city, "temperature_c": 21, "sky": "sunny"})


@check
def openai_chat(base, model):
    from openai import OpenAI
    c = OpenAI(base_url=f"{base}/v1", api_key="x")
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}],
                                  max_tokens=16, temperature=0)
    return bool(r.choices[0].message.content), r.choices[0].message.content


@check
def openai_tools_auto(base, model):
    from openai import OpenAI
    c = OpenAI(base_url=f"{base}/v1", api_key="x")
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": ASK}],
                                  tools=[WEATHER_TOOL], temperature=0, max_tokens=96)
    calls = r.choices[0].message.tool_calls or []
    ok = bool(calls) and calls[0].function.name == "get_weather" and \
        json.loads(calls[0].function.arguments).get("city", "").lower() == "paris"
    return ok, [(t.function.name, t.function.arguments) for t in calls] or r.choices[0].message.content


@check
def openai_tools_stream(base, model):
    from openai import OpenAI
    c = OpenAI(base_url=f"{base}/v1", api_key="x")
    s = c.chat.completions.create(model=model, messages=[{"role": "user", "content": ASK}],
                                  tools=[WEATHER_TOOL], temperature=0, max_tokens=96, stream=True)
    name, args, content = "", "", ""
    for chunk in s:
        d = chunk.choices[0].delta if chunk.choices else None
        if d and d.tool_calls:
            name += d.tool_calls[0].function.name or ""
            args += d.tool_calls[0].function.arguments or ""
        if d and d.content:
            content += d.content
    return name == "get_weather" and "paris" in args.lower(), (name, args, content)


HISTORY = [{"role": "user", "content": ASK},
           {"role": "assistant", "content": None, "tool_calls": [{
               "id": "call_1", "type": "function",
               "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": _weather("Paris")}]


@check
def openai_tool_history_render(base, model):
    """The call history reaches the template as an object, not a string quoted again."""
    import httpx
    r = httpx.post(f"{base}/v1/chat/completions/render", timeout=30,
                   json={"model": model, "messages": HISTORY, "tools": [WEATHER_TOOL]})
    prompt = r.json()["prompt"]
    line = next((ln for ln in prompt.splitlines() if '"arguments"' in ln and "Paris" in ln), "")
    return '"arguments": {"city": "Paris"}' in line, line


@check
def openai_tool_history_answer(base, model):
    """A finished round trip: the model answers from the tool's result (the model's choice)."""
    from openai import OpenAI
    c = OpenAI(base_url=f"{base}/v1", api_key="x")
    r = c.chat.completions.create(model=model, messages=HISTORY, tools=[WEATHER_TOOL],
                                  temperature=0, max_tokens=64)
    m = r.choices[0].message
    return "21" in (m.content or ""), m.content or [(t.function.name, t.function.arguments)
                                                   for t in m.tool_calls or []]


@check
def openai_fim_suffix(base, model):
    from openai import OpenAI
    c = OpenAI(base_url=f"{base}/v1", api_key="x")
    r = c.completions.create(model=model, prompt="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n",
                             max_tokens=32, temperature=0)
    text = r.choices[0].text
    return text.lstrip().startswith("return a + b"), (r.choices[0].finish_reason, text)


@check
def llamacpp_infill(base, model):
    import httpx
    t = time.perf_counter()
    r = httpx.post(f"{base}/infill", json={"input_prefix": "def is_even(n):\n    ",
                                           "input_suffix": "\n", "n_predict": 32,
                                           "temperature": 0}, timeout=120)
    body = r.json()
    return r.status_code == 200 and "return" in body.get("content", ""), \
        (r.status_code, body.get("content"), f"{time.perf_counter() - t:.2f} s")


@check
def tokenizer_info(base, model):
    import httpx
    r = httpx.get(f"{base}/tokenizer_info", timeout=30)
    body = r.json()
    return r.status_code == 200 and "tokenizer_class" in body, sorted(body)[:8]


@check
def anthropic_tools(base, model):
    import anthropic
    c = anthropic.Anthropic(base_url=base, api_key="x")
    r = c.messages.create(model=model, max_tokens=96, extra_body={"temperature": 0},  # 2.x: no kwarg
                          tools=[{"name": "get_weather", "description": "Get the weather",
                                  "input_schema": WEATHER_TOOL["function"]["parameters"]}],
                          messages=[{"role": "user", "content": ASK}])
    uses = [b for b in r.content if b.type == "tool_use"]
    return bool(uses) and uses[0].name == "get_weather", [b.model_dump() for b in r.content]


@check
def anthropic_image_refused(base, model):
    import anthropic
    c = anthropic.Anthropic(base_url=base, api_key="x")
    try:
        c.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "text", "text": "what is this?"}]}])
    except anthropic.BadRequestError as exc:
        msg = exc.body.get("error", {}).get("message", "") if isinstance(exc.body, dict) else str(exc)
        return "image" in msg and len(msg) < 300, msg
    return False, "accepted"


@check
def ollama_tools(base, model):
    import ollama
    c = ollama.Client(host=base)
    r = c.chat(model=model, messages=[{"role": "user", "content": ASK}], tools=[WEATHER_TOOL],
               options={"temperature": 0})
    calls = r.message.tool_calls or []
    return bool(calls) and calls[0].function.name == "get_weather", \
        [(t.function.name, t.function.arguments) for t in calls] or r.message.content


@check
def ollama_generate_suffix(base, model):
    import ollama
    c = ollama.Client(host=base)
    r = c.generate(model=model, prompt="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n",
                   options={"temperature": 0, "num_predict": 32})
    return "return" in r.response, r.response


@check
def ollama_version(base, model):
    import httpx
    v = httpx.get(f"{base}/api/version").json()["version"]
    return tuple(int(x) for x in v.split(".")[:2]) >= (0, 5), v


@check
def langchain_bind_tools(base, model):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return _weather(city)

    llm = ChatOpenAI(base_url=f"{base}/v1", api_key="x", model=model, temperature=0)
    msg = llm.bind_tools([get_weather]).invoke(ASK)
    return bool(msg.tool_calls) and msg.tool_calls[0]["name"] == "get_weather", msg.tool_calls


@check
def langgraph_react_agent(base, model):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    seen = []

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        seen.append(city)
        return _weather(city)

    llm = ChatOpenAI(base_url=f"{base}/v1", api_key="x", model=model, temperature=0)
    agent = create_react_agent(llm, [get_weather])
    out = agent.invoke({"messages": [("user", ASK)]}, {"recursion_limit": 6})
    return bool(seen) and "21" in out["messages"][-1].content, (seen, out["messages"][-1].content)


@check
def openai_agents_sdk(base, model):
    from agents import (Agent, OpenAIChatCompletionsModel, Runner, function_tool,
                        set_tracing_disabled)
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    seen = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        seen.append(city)
        return _weather(city)

    m = OpenAIChatCompletionsModel(model=model, openai_client=AsyncOpenAI(base_url=f"{base}/v1",
                                                                          api_key="x"))
    agent = Agent(name="weather", instructions="Answer with the tools.", model=m, tools=[get_weather])
    out = asyncio.run(Runner.run(agent, ASK, max_turns=4))
    return bool(seen) and "21" in str(out.final_output), (seen, out.final_output)


@check
def pydantic_ai_agent(base, model):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    seen = []
    m = OpenAIChatModel(model, provider=OpenAIProvider(base_url=f"{base}/v1", api_key="x"))
    agent = Agent(m, system_prompt="Answer with the tools.")

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        seen.append(city)
        return _weather(city)

    out = agent.run_sync(ASK)
    return bool(seen) and "21" in out.output, (seen, out.output)


@check
def instructor_structured(base, model):
    import instructor
    from openai import OpenAI
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str

    c = instructor.from_openai(OpenAI(base_url=f"{base}/v1", api_key="x"), mode=instructor.Mode.JSON_SCHEMA)
    r = c.chat.completions.create(model=model, response_model=City, temperature=0, max_tokens=64,
                                  messages=[{"role": "user", "content": "Paris: which city and country?"}])
    return r.name.lower() == "paris", r.model_dump()


@check
def litellm_completion(base, model):
    import litellm
    r = litellm.completion(model=f"openai/{model}", api_base=f"{base}/v1", api_key="x", temperature=0,
                           max_tokens=16, messages=[{"role": "user", "content": "Say hi."}])
    return bool(r.choices[0].message.content), r.choices[0].message.content


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="the served model's name (default: the first listed)")
    ap.add_argument("--only", nargs="*", default=None, choices=sorted(CHECKS))
    args = ap.parse_args()
    import httpx
    model = args.model or httpx.get(f"{args.base_url}/v1/models").json()["data"][0]["id"]
    passed = failed = skipped = 0
    for name in args.only or CHECKS:
        t = time.perf_counter()
        try:
            ok, seen = CHECKS[name](args.base_url, model)
            word = "PASS" if ok else "FAIL"
        except ImportError as exc:
            word, seen = "SKIP", f"not installed: {exc.name}"
        except Exception as exc:  # noqa: BLE001 - a client's failure is the check's result
            word, seen = "FAIL", f"{type(exc).__name__}: {exc}"
            traceback.print_exc(limit=2, file=sys.stderr)
        passed += word == "PASS"
        failed += word == "FAIL"
        skipped += word == "SKIP"
        print(f"{word} {name} ({time.perf_counter() - t:.1f} s): {str(seen)[:300]}", flush=True)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
