"""Drives `ferrite serve` with the official `anthropic` client (its Messages API).

Usage: python anthropic_client.py BASE_URL API_KEY MODEL
Exits non-zero with a message on the first failed check.
"""

import json
import sys

import anthropic

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
client = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)
GREEDY = {"temperature": 0}  # (the client has no sampling parameters of its own)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        sys.exit(f"FAILED: {what}")
    checks += 1


ask = [{"role": "user", "content": "What is the capital of France?"}]
m = client.messages.create(model=MODEL, max_tokens=16, system="Be brief.", messages=ask, extra_body=GREEDY)
check(m.role == "assistant" and m.content and m.content[0].type == "text" and m.content[0].text, f"message: {m}")
check(m.stop_reason in ("end_turn", "max_tokens") and 0 < m.usage.output_tokens <= 16, f"stop and usage: {m}")

# Counting: the prompt's tokens, as the request renders them.
counted = client.messages.count_tokens(model=MODEL, system="Be brief.", messages=ask)
# (Usage leaves out the prompt's tokens read from the prefix cache; counting does not.)
check(counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens, f"count_tokens {counted} != {m.usage}")

# A stop sequence: the reply ends before it, and says which.
stopped = client.messages.create(model=MODEL, max_tokens=16, system="Be brief.", messages=ask,
                                 stop_sequences=["Paris", "Lyon"], extra_body=GREEDY)
check("Paris" in m.content[0].text, f"the greedy reply names Paris: {m}")
check(stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "Paris", f"stop sequence: {stopped}")
check(m.content[0].text.startswith(stopped.content[0].text) and "Paris" not in stopped.content[0].text, f"cut: {stopped}")

# Streamed: the same text, and the helper's final message.
with client.messages.stream(model=MODEL, max_tokens=16, system="Be brief.", messages=ask, extra_body=GREEDY) as s:
    text = "".join(s.text_stream)
    final = s.get_final_message()
check(text == m.content[0].text == final.content[0].text, f"streamed {text!r} != {m.content[0].text!r}")
check(final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens, f"final: {final}")

# Tool use: "any" and a named tool constrain the reply; a result sent back.
TOOLS = [{"name": "get_weather", "description": "Current weather in a city.",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                           "required": ["city"], "additionalProperties": False}}]
weather = [{"role": "user", "content": "What is the weather in Paris?"}]
m = client.messages.create(model=MODEL, max_tokens=60, messages=weather, tools=TOOLS, tool_choice={"type": "any"},
                           extra_body=GREEDY)
uses = [b for b in m.content if b.type == "tool_use"]
check(m.stop_reason == "tool_use" and uses and uses[0].name == "get_weather", f"tool use: {m}")
check(isinstance(uses[0].input.get("city"), str) and uses[0].id.startswith("toolu_"), f"tool input: {uses[0]}")
with client.messages.stream(model=MODEL, max_tokens=60, messages=weather, tools=TOOLS,
                            tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY) as s:
    for _ in s:
        pass
    streamed = s.get_final_message()
check(streamed.stop_reason == "tool_use" and streamed.content[-1].input.get("city"), f"streamed tool use: {streamed}")
loop = weather + [{"role": "assistant", "content": m.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                "content": json.dumps({"temperature": 18})}]}]
m = client.messages.create(model=MODEL, max_tokens=20, messages=loop, tools=TOOLS, extra_body=GREEDY)
check(m.stop_reason in ("end_turn", "max_tokens", "tool_use"), f"after a tool result: {m}")

# Structured output through output_config.
schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
          "additionalProperties": False}
m = client.messages.create(model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "Name a city."}],
                           output_config={"format": {"type": "json_schema", "schema": schema}}, extra_body=GREEDY)
check(isinstance(json.loads(m.content[0].text)["city"], str), f"structured output: {m}")

# Errors as the client's typed exceptions.
try:
    client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    sys.exit("FAILED: an image block was accepted")
except anthropic.BadRequestError as e:
    check("image" in str(e), f"image error: {e}")
try:
    anthropic.Anthropic(base_url=BASE, api_key="wrong", max_retries=0).messages.create(
        model=MODEL, max_tokens=5, messages=ask)
    sys.exit("FAILED: a wrong key was accepted")
except anthropic.AuthenticationError:
    checks += 1

print(f"anthropic client: {checks} checks passed")
