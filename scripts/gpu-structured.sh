#!/usr/bin/env bash
# Structured outputs on a GPU: SmolLM2 (GGUF, at $1) through `ferrite run
# --device cuda --json-schema` and through `serve --device cuda` with
# json_schema (a pattern and a date among its properties), guided_choice,
# guided_regex, guided_grammar and plain requests in flight together (the
# constrained ones sample on the host, the others on the device). Each
# output is checked to parse as the schema asks. Usage:
#   scripts/gpu-structured.sh MODEL.gguf   (BIN from scripts/gpu-bin.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu-bin.sh
source scripts/gpu-bin.sh
model=$1
device=${FERRITE_DEVICE:-cuda}  # (cpu: to try the script without a GPU)
schema=$(mktemp --suffix .json)
cat >"$schema" <<'JSON'
{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
 "color": {"enum": ["black", "white", "orange", null]}, "chip": {"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"},
 "born": {"type": "string", "format": "date"}}, "required": ["name", "age", "color", "chip", "born"]}
JSON
"$BIN" run "$model" --device "$device" --prompt "Describe a cat as JSON." --json-schema "$schema" --temperature 0 \
    >/tmp/run.out 2>/tmp/run.err
python3 -c "
import datetime, json, re, sys
v = json.load(open('/tmp/run.out'))
assert list(v) == ['name', 'age', 'color', 'chip', 'born'] and isinstance(v['age'], int), v
assert re.fullmatch('[0-9]{3}-[0-9]{4}', v['chip']) and datetime.date.fromisoformat(v['born']), v
print('run --json-schema on $device:', v)" || { cat /tmp/run.err; exit 1; }
"$BIN" serve "$model" --device "$device" --port 8765 >/tmp/serve.log 2>&1 &
server=$!
for _ in $(seq 60); do curl -sf http://127.0.0.1:8765/health >/dev/null && break; sleep 1; done
python3 - "$schema" "$device" <<'PY'
import concurrent.futures, datetime, json, re, sys, urllib.request
schema, device = json.load(open(sys.argv[1])), sys.argv[2]
def post(body):
    req = urllib.request.Request("http://127.0.0.1:8765/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())["choices"][0]
def ask(i):
    msgs = [{"role": "user", "content": f"Describe cat number {i} as JSON."}]
    kind = i % 5
    body = {"messages": msgs, "max_tokens": 200, "temperature": 0.7, "seed": i}
    if kind == 0:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}}
    elif kind == 1:
        body["guided_choice"] = ["yes", "no", "maybe"]
    elif kind == 2:
        body["guided_regex"] = r"(Yes|No), [0-9]{1,2}\."
    elif kind == 3:
        body["guided_grammar"] = 'root ::= "[" item (", " item)* "]"\nitem ::= [a-z]+ | root'
    c = post(body)
    text = c["message"]["content"]
    if kind == 0:
        v = json.loads(text)
        assert list(v) == ["name", "age", "color", "chip", "born"] and isinstance(v["age"], int), text
        assert re.fullmatch("[0-9]{3}-[0-9]{4}", v["chip"]) and datetime.date.fromisoformat(v["born"]), text
    elif kind == 1:
        assert text in ("yes", "no", "maybe"), text
    elif kind == 2:
        assert re.fullmatch(r"(Yes|No), [0-9]{1,2}\.", text), text
    elif kind == 3:
        # (A reply cut by max_tokens is a prefix of a sentence.)
        depth = 0
        for ch in text:
            depth += {"[": 1, "]": -1}.get(ch, 0)
            assert depth >= 0 and (ch.islower() or ch in "[], "), text
        assert text.startswith("[") and (depth == 0) == (c["finish_reason"] == "stop"), text
    return kind, c["finish_reason"]
with concurrent.futures.ThreadPoolExecutor(24) as pool:
    results = list(pool.map(ask, range(50)))
print(f"serve on {device}, 50 concurrent (10 each: json_schema, guided_choice, guided_regex, guided_grammar,",
      "plain): all valid;",
      "finish reasons", sorted(set(results)))
PY
rc=$?
kill $server
wait $server 2>/dev/null
exit $rc
