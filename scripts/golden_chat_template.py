#!/usr/bin/env python3
"""Golden outputs for ferrite's chat-template renderer.

Renders real-world chat templates with Python jinja2 configured the way
transformers' `apply_chat_template` configures it (sandboxed environment,
trim_blocks + lstrip_blocks, loop controls, a `tojson` that is
`json.dumps(ensure_ascii=False)`, `raise_exception`, `strftime_now`, the
`{% generation %}` tag), and writes templates, inputs and expected strings (or
the expected error) to tests/fixtures/chat_template/*.json.

Run with the reference venv:  /work/refvenv/bin/python scripts/golden_chat_template.py
"""

import json
import os
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "chat_template")


# --- the environment, as transformers.utils.chat_template_utils builds it ----

class AssistantTracker(Extension):
    # transformers records assistant spans here; the rendered text is the body.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_render", [], [], None, None)
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(template, messages, add_generation_prompt, bos, eos, tools=None, kwargs=None):
    compiled = make_env().from_string(template)
    return compiled.render(messages=messages, tools=tools, documents=None,
                           add_generation_prompt=add_generation_prompt,
                           bos_token=bos, eos_token=eos, **(kwargs or {}))


# --- templates ---------------------------------------------------------------

def smollm2_template():
    """ChatML as shipped in SmolLM2-135M-Instruct's GGUF."""
    path = os.path.expanduser("~/.ferrite/models/smollm2.gguf")
    home = os.environ.get("FERRITE_HOME")
    if home:
        path = os.path.join(home, "models", "smollm2.gguf")
    try:
        from gguf import GGUFReader
        field = GGUFReader(path).fields["tokenizer.chat_template"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except Exception:  # no model file: the same text, hardcoded
        return (
            "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
            "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
            "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
            "{{ '<|im_start|>assistant\n' }}{% endif %}")


GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")

QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}")

# Mistral v0.3-style: system message folded into the last user turn.
MISTRAL_V3 = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

# Llama 3.1-style function calling: tools in the first user message, one
# JSON call per assistant turn, results in the ipython role.
LLAMA31_TOOLS = """{{- bos_token }}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# Qwen3-style thinking: earlier replies' reasoning dropped, and with
# `enable_thinking` false (a keyword argument) an empty block opened and
# closed in the generation prompt.
QWEN3_THINKING = """{%- for message in messages %}
    {%- if message.role == "assistant" %}
        {%- set content = message.content %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

# SmolLM3-style assistant masking tags: must render like plain text.
GENERATION_TAGS = """{%- for message in messages %}
    {%- if message.role == "assistant" %}
        {{- "<|im_start|>assistant\\n" }}
        {%- generation %}
        {{- message.content + "<|im_end|>\\n" }}
        {%- endgeneration %}
    {%- else %}
        {{- "<|im_start|>" + message.role + "\\n" + message.content + "<|im_end|>\\n" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- "<|im_start|>assistant\\n" }}
{%- endif %}
"""

# Not a model's template: the Python-compatibility corners templates lean on.
PYCOMPAT = """{%- set ns = namespace(users=0, last="") %}
{%- for m in messages %}
    {%- if m.role == "user" %}{% set ns.users = ns.users + 1 %}{% set ns.last = m.content %}{% endif %}
{%- endfor %}
users={{ ns.users }} last={{ ns.last.strip() }}
{% for m in messages %}
  {{ loop.index }}: {{ m.role.title() }} {{ m.role.upper() }} starts_u={{ m.role.startswith("u") }} ends_t={{ m.role.endswith("t") }}
  words={{ m.content.split() | length }} first={{ (m.content.split() or ["-"])[0] }} strip={{ m.content.strip(" !.") }}
  replaced={{ m.content.replace("a", "A") }} cap={{ m.content.strip().capitalize() }} lstrip=[{{ m.content.lstrip() }}] rstrip=[{{ m.content.rstrip() }}]
  {%- if m.content is string and m.content | length > 20 %} long{% endif %}
  {%- if loop.index > 2 %}{% break %}{% endif %}
{% endfor %}
{{ messages | tojson }}
{{ messages[0] | tojson(indent=2) }}
{{ {"b": [1, 2.5, none, true, false], "a": {"nested": "é\\n\\"q\\" <tag> & 'x' \\t/"}, "c": []} | tojson }}
{{ {"b": 1, "a": [1, 2], "e": {}} | tojson(sort_keys=true) }}
{{ {"k": [1, {"x": "y"}], "z": {}} | tojson(indent=4) }}
{{ [1, "two", 3.0, 1e20, 0.1, -0.0, 12345678901234567890] | tojson }}
{{ {"a": [1, 2]} | tojson(separators=(",", ":")) }}
{{ "\\u00e9\\u4f60" | tojson(ensure_ascii=true) }}
{{ messages[0].content | tojson }}
none={{ none }} true={{ true }} false={{ false }} undefined=[{{ not_defined }}] missing=[{{ messages[0].missing }}]
{%- if messages[0].missing is not defined %} missing-is-undefined{% endif %}
{%- if tools is none %} tools-none{% endif %}
{%- for x in not_defined %}never{% endfor %}
{{ messages | map(attribute="role") | join(",") }} {{ messages | selectattr("role", "equalto", "user") | list | length }}
{{ messages[-1].content | trim }}|{{ messages[1:] | length }}|{{ (messages | last).role }}
{% if add_generation_prompt %}GEN{% endif %}
"""


# --- message lists -------------------------------------------------------------

def m(role, content):
    return {"role": role, "content": content}


MESSAGE_LISTS = {
    "single_user": [m("user", "Hello!")],
    "system_user": [m("system", "You are terse."), m("user", "What is 2+2?")],
    "multi_turn": [
        m("system", "You are a helpful assistant."),
        m("user", "Hi there"),
        m("assistant", "Hello! How can I help you today?"),
        m("user", "Tell me a joke about cats."),
    ],
    "multi_turn_no_system": [
        m("user", "first question"),
        m("assistant", "  first answer  "),
        m("user", "second question"),
        m("assistant", "second answer"),
    ],
    "non_ascii": [
        m("user", "  Grüße aus Köln! 你好，世界 🌍 — naïve café \"quoted\"\n  "),
        m("assistant", "Merci ! Ça va très bien. 日本語もOK ✓"),
        m("user", "tab\there\nnew line and a backslash \\ end"),
    ],
    "bad_order": [m("user", "one"), m("user", "two")],
    "assistant_first": [m("assistant", "I speak first"), m("user", "ok")],
}

# Function calling: the tools offered (OpenAI's shape, as transformers takes
# them) and conversations with calls and results (arguments as objects, as
# the server hands them to templates).
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Sum of two numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}},
]


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


TOOL_MESSAGE_LISTS = {
    "tools_offered": [m("user", "What's the weather in Paris?")],
    "tools_with_system": [m("system", "You are terse."), m("user", "Add 2 and 3.")],
    "one_call_round_trip": [
        m("user", "Weather in Paris?"),
        {"role": "assistant", "content": "", "tool_calls": [call("call_1", "get_weather", {"city": "Paris"})]},
        {"role": "tool", "content": "{\"temp\": 18, \"sky\": \"clear\"}", "tool_call_id": "call_1",
         "name": "get_weather"},
    ],
    "two_calls_round_trip": [
        m("user", "Weather in Köln, and 2+3?"),
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            call("call_1", "get_weather", {"city": "Köln", "unit": "c"}),
            call("call_2", "add", {"a": 2, "b": 3.5})]},
        {"role": "tool", "content": "18", "tool_call_id": "call_1", "name": "get_weather"},
        {"role": "tool", "content": "5.5", "tool_call_id": "call_2", "name": "add"},
        m("assistant", "18 degrees; 5.5."),
        m("user", "Thanks!"),
    ],
}

# Conversations with earlier reasoning, rendered with and without keyword arguments.
THINKING_LISTS = {
    "thought_before": [m("user", "2+2?"), m("assistant", "<think>\nFour, surely.\n</think>\n\n4"),
                       m("user", "And 3+3?")],
}
KWARGS = [None, {"enable_thinking": False}, {"enable_thinking": True, "unused": [1, "x"]}]

# Templates rendered with TOOLS and the tool conversations (besides the plain lists).
TOOL_TEMPLATES = [
    ("qwen2_5_tools", lambda: QWEN25, "", "<|im_end|>"),
    ("llama3_1_tools", lambda: LLAMA31_TOOLS, "<|begin_of_text|>", "<|eot_id|>"),
]

TEMPLATES = [
    ("chatml_smollm2", smollm2_template, "<|im_start|>", "<|im_end|>"),
    ("gemma3", lambda: GEMMA3, "<bos>", "<eos>"),
    ("llama3", lambda: LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
    ("qwen2_5", lambda: QWEN25, "", "<|im_end|>"),
    ("mistral", lambda: MISTRAL, "<s>", "</s>"),
    ("mistral_v3", lambda: MISTRAL_V3, "<s>", "</s>"),
    ("generation_tags", lambda: GENERATION_TAGS, "", "<|im_end|>"),
    ("pycompat", lambda: PYCOMPAT, "<s>", "</s>"),
]


def main():
    os.makedirs(OUT, exist_ok=True)
    tool_runs = [(name, get, bos, eos, TOOL_MESSAGE_LISTS, TOOLS, [None]) for name, get, bos, eos in TOOL_TEMPLATES]
    thinking_run = [("qwen3_thinking", lambda: QWEN3_THINKING, "", "<|im_end|>", THINKING_LISTS, None, KWARGS)]
    for name, get_template, bos, eos, lists, tools, kwargs_list in [
            (name, get, bos, eos, MESSAGE_LISTS, None, [None]) for name, get, bos, eos in TEMPLATES
    ] + tool_runs + thinking_run:
        template = get_template()
        cases = []
        for list_name, messages in lists.items():
            for agp in (False, True):
                for kwargs in kwargs_list:
                    case = {"name": f"{list_name}/agp={str(agp).lower()}",
                            "messages": messages, "add_generation_prompt": agp}
                    if kwargs is not None:
                        case["name"] += f"/kwargs={json.dumps(kwargs)}"
                        case["kwargs"] = kwargs
                    if tools is not None:
                        case["tools"] = tools
                    try:
                        case["expected"] = render(template, messages, agp, bos, eos, tools, kwargs)
                    except TemplateError as e:
                        case["expected_error"] = str(e)
                    cases.append(case)
        fixture = {"name": name, "jinja2_version": jinja2.__version__,
                   "template": template, "bos_token": bos, "eos_token": eos,
                   "cases": cases}
        path = os.path.join(OUT, f"{name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(fixture, f, ensure_ascii=False, indent=1)
            f.write("\n")
        n_err = sum("expected_error" in c for c in cases)
        print(f"{path}: {len(cases)} cases ({n_err} expected errors)")


if __name__ == "__main__":
    main()
