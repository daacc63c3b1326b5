#!/usr/bin/env bash
# Structured outputs on a GPU: SmolLM2 (GGUF, at $1) through `ferrite run
# --device cuda --json-schema` and through `serve --device cuda` with
# json_schema, guided_choice and plain requests in flight together (the
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
 "color": {"enum": ["black", "white", "orange", null]}}, "required": ["name", "age", "color"]}
JSON
"$BIN" run "$model" --device "$device" --prompt "Describe a cat as JSON." --json-schema "$schema" --temperature 0 \
    >/tmp/run.out 2>/tmp/run.err
python3 -c "
import json, sys
v = json.load(open('/tmp/run.out'))
assert list(v) == ['name', 'age', 'color'] and isinstance(v['age'], int), v
print('run --json-schema on cuda:', v)" || { cat /tmp/run.err; exit 1; }
"$BIN" serve "$model" --device "$device" --port 8765 >/tmp/serve.log 2>&1 &
server=$!
for _ in $(seq 60); do curl -sf http://127.0.0.1:8765/health >/dev/null && break; sleep 1; done
python3 - "$schema" <<'PY'
import concurrent.futures, json, sys, urllib.request
schema = json.load(open(sys.argv[1]))
def post(body):
    req = urllib.request.Request("http://127.0.0.1:8765/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())["choices"][0]
def ask(i):
    msgs = [{"role": "user", "content": f"Describe cat number {i} as JSON."}]
    kind = i % 3
    body = {"messages": msgs, "max_tokens": 120, "temperature": 0.7, "seed": i}
    if kind == 0:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}}
    elif kind == 1:
        body["guided_choice"] = ["yes", "no", "maybe"]
    c = post(body)
    text = c["message"]["content"]
    if kind == 0:
        v = json.loads(text)
        assert list(v) == ["name", "age", "color"] and isinstance(v["age"], int), text
    elif kind == 1:
        assert text in ("yes", "no", "maybe"), text
    return kind, c["finish_reason"]
with concurrent.futures.ThreadPoolExecutor(24) as pool:
    results = list(pool.map(ask, range(48)))
print("serve on cuda, 48 concurrent (16 json_schema, 16 guided_choice, 16 plain): all valid;",
      "finish reasons", sorted(set(results)))
PY
rc=$?
kill $server
wait $server 2>/dev/null
exit $rc
