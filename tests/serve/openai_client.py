"""Drives `ferrite serve` with the official `openai` client, as a user would.

Usage: python openai_client.py BASE_URL API_KEY MODEL
Exits non-zero with a message on the first failed check.
"""

import concurrent.futures
import datetime
import json
import re
import sys
import typing
import urllib.request

import openai
import pydantic

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0, timeout=120)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        sys.exit(f"FAILED: {what}")
    checks += 1


def raises(exc, f):
    try:
        f()
    except exc as e:
        return e
    sys.exit(f"FAILED: expected {exc.__name__}")


def chat(content, **kw):
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


# Models.
models = client.models.list()
check([m.id for m in models.data] == [MODEL], f"models: {models}")

# Chat, non-streaming, greedy.
r = chat("What is the capital of France?", max_tokens=16)
c = r.choices[0]
check(isinstance(c.message.content, str) and c.message.content, f"chat content: {r}")
check(c.message.role == "assistant" and c.finish_reason in ("stop", "length"), f"chat choice: {c}")
check(r.usage.prompt_tokens > 5 and 0 < r.usage.completion_tokens <= 16, f"usage: {r.usage}")
check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "total_tokens")
check(r.model == MODEL and r.object == "chat.completion" and r.id, f"chat envelope: {r}")

# The same request streamed: same text, usage in the last chunk.
stream = chat("What is the capital of France?", max_tokens=16, stream=True, stream_options={"include_usage": True})
text, usage, finish = "", None, None
for chunk in stream:
    if chunk.usage:
        usage = chunk.usage
    for ch in chunk.choices:
        text += ch.delta.content or ""
        finish = ch.finish_reason or finish
check(text == c.message.content, f"stream text {text!r} != {c.message.content!r}")
check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, f"stream usage: {usage}")
check(finish == c.finish_reason, f"stream finish {finish}")

# Length limit and finish_reason.
r = chat("Count from one to one hundred in words.", max_completion_tokens=5)
check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5, f"length: {r}")

# Stop strings never appear in the output.
r = chat("List three colors, one per line.", max_tokens=40, stop=["\n"])
check("\n" not in r.choices[0].message.content, f"stop: {r.choices[0].message.content!r}")

# n > 1 with a seed: n choices, reproducible.
kw = dict(max_tokens=12, n=3, seed=7, temperature=1.0)
a = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say something."}], **kw)
b = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say something."}], **kw)
check(sorted(ch.index for ch in a.choices) == [0, 1, 2], f"n choices: {a.choices}")
check([ch.message.content for ch in a.choices] == [ch.message.content for ch in b.choices], "seeded n reproducible")
check(3 <= a.usage.completion_tokens <= 36, f"usage counts all n choices: {a.usage}")

# Logprobs with alternatives.
r = chat("Hello", max_tokens=4, logprobs=True, top_logprobs=3)
lp = r.choices[0].logprobs.content
check(len(lp) == r.usage.completion_tokens, f"logprobs count: {lp}")
for t in lp:
    check(t.logprob <= 0 and len(t.top_logprobs) == 3, f"logprob entry: {t}")
    check(abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4, f"greedy token is the top one: {t}")

# JSON mode: the output parses as an object.
r = chat("Describe a cat as JSON with keys name and age.", max_tokens=60, response_format={"type": "json_object"})
try:
    obj = json.loads(r.choices[0].message.content)
except json.JSONDecodeError as e:
    sys.exit(f"FAILED: json_object output does not parse: {r.choices[0].message.content!r}: {e}")
check(isinstance(obj, dict), "json_object gives an object")

# Structured outputs: a pydantic model through the client's parse helper
# (a strict json_schema: keys in order, an enum, a nullable, a bounded list,
# a date, a string pattern, a bounded float).
class Cat(pydantic.BaseModel):
    name: str
    age: int
    color: typing.Literal["black", "white", "orange"] | None
    toys: list[str] = pydantic.Field(max_length=2)
    born: datetime.date
    chip: str = pydantic.Field(pattern=r"^[0-9]{3}-[0-9]{4}$")
    weight_kg: float = pydantic.Field(gt=0, le=12.5)


r = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "Describe a cat as JSON."}],
                                  response_format=Cat, max_tokens=200, temperature=0)
check(isinstance(r.choices[0].message.parsed, Cat), f"json_schema output parses as the model: {r}")


# A discriminated union of models (told apart by their first property's const).
class Search(pydantic.BaseModel):
    kind: typing.Literal["search"]
    query: str


class Answer(pydantic.BaseModel):
    kind: typing.Literal["answer"]
    text: str


class Step(pydantic.BaseModel):
    thought: str
    action: Search | Answer = pydantic.Field(discriminator="kind")


r = client.chat.completions.parse(model=MODEL, response_format=Step, max_tokens=200, temperature=0, messages=[
    {"role": "user", "content": "What is the capital of France? Reply as JSON with a thought and an action."}])
check(isinstance(r.choices[0].message.parsed, Step), f"a discriminated union parses: {r}")

# vLLM's guided_regex: the reply is a whole match.
r = chat("Is the sky blue? Answer yes or no, then a number from 1 to 10.", max_tokens=20,
         extra_body={"guided_regex": r"(Yes|No), [0-9]{1,2}\."})
check(re.fullmatch(r"(Yes|No), [0-9]{1,2}\.", r.choices[0].message.content or "") is not None, f"guided_regex: {r}")
check(r.choices[0].finish_reason == "stop", f"guided_regex stops at a whole match: {r}")

# Penalties, top_k/min_p extensions and logit_bias are accepted; a banned token never appears.
req = urllib.request.Request(f"{BASE}/tokenize", data=json.dumps({"prompt": " Paris", "add_special_tokens": False}).encode(),
                             headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
banned = json.loads(urllib.request.urlopen(req).read())["tokens"]
check(len(banned) == 1, f"' Paris' is one token: {banned}")
r = chat("What is the capital of France? One word.", max_tokens=8, presence_penalty=0.5, frequency_penalty=0.5,
         logprobs=True, logit_bias={str(banned[0]): -100},
         extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1})
check(all(t.token != " Paris" for t in r.choices[0].logprobs.content), f"banned token sampled: {r}")

# Completions, plain and streamed.
r = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=8, temperature=0)
check(r.object == "text_completion" and r.choices[0].text and r.usage.completion_tokens <= 8, f"completion: {r}")
text = "".join(
    ch.choices[0].text
    for ch in client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=8, temperature=0, stream=True)
    if ch.choices
)
check(text == r.choices[0].text, f"streamed completion {text!r} != {r.choices[0].text!r}")
r = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=3, temperature=0, logprobs=2)
check(len(r.choices[0].logprobs.token_logprobs) == 3, f"completion logprobs: {r.choices[0].logprobs}")

# Function calling. SmolLM2's template shows no tools, so the server lists
# them in a system message; "required" and a named function constrain the
# reply, which must come back as calls the client parses.
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 20}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "add", "description": "Sum of two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "maximum": 1000}, "b": {"type": "integer", "maximum": 1000}},
            "required": ["a", "b"], "additionalProperties": False}}},
]


def check_call(call, names):
    check(call.type == "function" and call.id.startswith("call_"), f"call envelope: {call}")
    check(call.function.name in names, f"call name: {call}")
    args = json.loads(call.function.arguments)
    required = next(t["function"]["parameters"]["required"] for t in TOOLS if t["function"]["name"] == call.function.name)
    check(sorted(args) == sorted(required), f"call arguments: {call}")
    if call.function.name == "get_weather":
        check(isinstance(args["city"], str) and args["unit"] in ("c", "f"), f"weather arguments: {args}")
    else:
        check(all(isinstance(args[k], int) and args[k] <= 1000 for k in "ab"), f"add arguments: {args}")
    return args


ask = "What is the weather in Paris?"
r = chat(ask, tools=TOOLS, tool_choice="required", max_tokens=60)
c = r.choices[0]
check(c.finish_reason == "tool_calls" and c.message.content is None and c.message.tool_calls, f"required: {r}")
for call in c.message.tool_calls:
    check_call(call, {"get_weather", "add"})
r = chat("Add 2 and 3.", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=40)
c = r.choices[0]
check(c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, f"named: {r}")
check_call(c.message.tool_calls[0], {"add"})
# Streamed: the client assembles the call from its delta.
calls, finish = {}, None
for chunk in chat(ask, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=60, stream=True):
    for ch in chunk.choices:
        finish = ch.finish_reason or finish
        for d in ch.delta.tool_calls or []:
            slot = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
            slot["name"] += d.function.name or ""
            slot["arguments"] += d.function.arguments or ""
check(finish == "tool_calls" and len(calls) == 1, f"streamed call: {calls} {finish}")
streamed = calls[0]
check(streamed["name"] in ("get_weather", "add") and json.loads(streamed["arguments"]), f"streamed call: {streamed}")
# The call and its result sent back: the conversation goes on.
history = [
    {"role": "user", "content": ask},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "c"})}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temperature": 18, "sky": "clear"})},
]
r = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, temperature=0, max_tokens=30)
check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"after a tool result: {r}")
r = chat(ask, tools=TOOLS, tool_choice="none", max_tokens=8)
check(r.choices[0].message.tool_calls is None and r.choices[0].message.content, f"tool_choice none: {r}")

# The Responses API: the same model answers through it, whole and streamed.
ask = "What is the capital of France?"
r = client.responses.create(model=MODEL, input=ask, instructions="Be brief.", max_output_tokens=16, temperature=0)
check(r.status in ("completed", "incomplete") and r.output_text, f"responses: {r}")
check(r.usage.output_tokens <= 16 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, f"responses usage: {r.usage}")
events, text, final = [], "", None
for ev in client.responses.create(model=MODEL, input=ask, instructions="Be brief.", max_output_tokens=16, temperature=0, stream=True):
    events.append(ev)
    if ev.type == "response.output_text.delta":
        text += ev.delta
    if ev.type in ("response.completed", "response.incomplete"):
        final = ev.response
check(events[0].type == "response.created" and final is not None, f"responses stream: {[e.type for e in events]}")
check([e.sequence_number for e in events] == list(range(len(events))), "responses sequence numbers")
check(text == r.output_text == final.output_text, f"streamed response {text!r} != {r.output_text!r}")
# Logprobs through the Responses API: the chat endpoint's, for the same prompt.
r = client.responses.create(model=MODEL, input=ask, instructions="Be brief.", max_output_tokens=8, temperature=0,
                            include=["message.output_text.logprobs"], top_logprobs=3)
lp = r.output[0].content[0].logprobs
c = client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": ask}],
                                   max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
check(len(lp) == r.usage.output_tokens and all(len(t.top_logprobs) == 3 for t in lp), f"responses logprobs: {lp}")
check("".join(t.token for t in lp).startswith(r.output_text), f"responses logprob tokens: {lp}")  # (and the end token)
check([(t.token, t.logprob) for t in lp] == [(t.token, t.logprob) for t in c.choices[0].logprobs.content], "responses logprobs vs chat's")
# A conversation longer than the context (2,048 tokens): refused, or cut from its oldest turn with truncation auto.
long_turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}: " + "the sky is blue and " * 40} for i in range(24)]
long_turns.append({"role": "user", "content": "What colour is the sky?"})
raises(openai.BadRequestError, lambda: client.responses.create(model=MODEL, input=long_turns, max_output_tokens=8))
r = client.responses.create(model=MODEL, input=long_turns, max_output_tokens=8, truncation="auto", temperature=0)
check(r.status in ("completed", "incomplete") and r.truncation == "auto", f"responses truncation auto: {r}")
check(r.usage.input_tokens + 8 <= 2048 and r.usage.input_tokens > 1500, f"responses truncation kept: {r.usage}")
rtools = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
           "parameters": t["function"]["parameters"]} for t in TOOLS]
r = client.responses.create(model=MODEL, input="Weather in Paris?", tools=rtools, tool_choice="required", temperature=0)
calls = [o for o in r.output if o.type == "function_call"]
check(calls and all(c.name in ("get_weather", "add") and json.loads(c.arguments) for c in calls), f"responses call: {r.output}")
with client.responses.stream(model=MODEL, input="Weather in Paris?", tools=rtools, tool_choice="required", temperature=0) as s:
    for _ in s:
        pass
    streamed_calls = [o for o in s.get_final_response().output if o.type == "function_call"]
check(streamed_calls and json.loads(streamed_calls[0].arguments), f"streamed responses call: {streamed_calls}")
follow = [{"role": "user", "content": "Weather in Paris?"},
          {"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name, "arguments": calls[0].arguments},
          {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 degrees, clear"}]
r = client.responses.create(model=MODEL, input=follow, tools=rtools, temperature=0, max_output_tokens=20)
check(r.status in ("completed", "incomplete"), f"responses after a call: {r}")


class Town(pydantic.BaseModel):
    name: str
    country: str


p = client.responses.parse(model=MODEL, input="Name a town in France.", text_format=Town, temperature=0, max_output_tokens=60)
check(isinstance(p.output_parsed, Town) and p.output_parsed.name, f"responses parse: {p}")

# Concurrent greedy requests give what they give alone.
prompts = [f"Write one sentence about the number {i}." for i in range(12)]
alone = [chat(p, max_tokens=12).choices[0].message.content for p in prompts]
with concurrent.futures.ThreadPoolExecutor(12) as pool:
    together = list(pool.map(lambda p: chat(p, max_tokens=12).choices[0].message.content, prompts))
check(alone == together, f"batched != alone: {alone} vs {together}")

# Errors come back as the client's typed exceptions.
e = raises(openai.NotFoundError, lambda: client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}]))
check("nope" in str(e), f"unknown model message: {e}")
e = raises(openai.BadRequestError, lambda: chat("x", max_tokens=10**7))
check("context" in str(e), f"over-context message: {e}")
raises(openai.BadRequestError, lambda: chat("x", temperature=-1))
raises(openai.BadRequestError, lambda: chat("x", n=0))
raises(openai.BadRequestError, lambda: client.chat.completions.create(model=MODEL, messages=[]))
raises(openai.BadRequestError, lambda: chat("x", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}))
raises(openai.BadRequestError, lambda: client.responses.create(model=MODEL, input="x", previous_response_id="resp_1"))
bad = openai.OpenAI(base_url=f"{BASE}/v1", api_key="wrong", max_retries=0)
raises(openai.AuthenticationError, lambda: bad.models.list())

print(f"openai client: {checks} checks passed")
