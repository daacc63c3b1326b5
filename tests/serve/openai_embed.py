"""Drives `ferrite serve` with an embedding model through the official `openai`
client and checks the vectors against sentence-transformers' (minilm.json).

Usage: python openai_embed.py BASE_URL API_KEY MODEL FIXTURE_JSON
Exits non-zero with a message on the first failed check.
"""

import base64
import json
import sys

import numpy as np
import openai

BASE, KEY, MODEL, FIXTURE = sys.argv[1:5]
client = openai.OpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0, timeout=120)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        sys.exit(f"FAILED: {what}")
    checks += 1


def cosine(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


case = json.load(open(FIXTURE))["cases"]["default"]
# ferrite rejects empty inputs, as other servers do.
items = [i for i in case["items"] if i["text"] != ""]
short = [i for i in items if not i["truncated"]]
check(len(short) >= 10 and len(items) > len(short), "fixture has short and truncated items")


def same_as_reference(vector, item, what):
    c = cosine(vector, item["embedding"])
    check(c >= 0.9999, f"{what}: cosine {c:.6f} for {item['text'][:40]!r}")
    check(abs(np.linalg.norm(vector) - 1) < 1e-4, f"{what}: not normalized")


# Models.
models = client.models.list()
check([m.id for m in models.data] == [MODEL], f"models: {models}")
check(models.data[0].model_extra.get("max_model_len") == case["max_length"], f"max_model_len: {models.data[0]}")

# One string (the SDK asks for base64 and decodes it).
r = client.embeddings.create(model=MODEL, input=short[1]["text"])
check(r.object == "list" and r.model == MODEL and len(r.data) == 1, f"envelope: {r}")
check(r.data[0].index == 0 and r.data[0].object == "embedding", f"data: {r.data[0]}")
check(len(r.data[0].embedding) == 384, "dimension 384")
check(r.usage.prompt_tokens == short[1]["n_tokens"] == r.usage.total_tokens, f"usage: {r.usage}")
same_as_reference(r.data[0].embedding, short[1], "single")

# A list, floats explicitly; the long items need the truncate extension.
texts = [i["text"] for i in items]
try:
    client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    check(False, "an input over 256 tokens without truncate should be refused")
except openai.BadRequestError as e:
    msg = e.body["message"] if isinstance(e.body, dict) else str(e)
    check("256" in msg and "truncate" in msg, f"too-long message: {msg}")
r = client.embeddings.create(model=MODEL, input=texts, encoding_format="float", extra_body={"truncate": True})
check([d.index for d in r.data] == list(range(len(items))), "indices in order")
for d, item in zip(r.data, items):
    same_as_reference(d.embedding, item, "list")
check(r.usage.prompt_tokens == sum(i["n_tokens"] for i in items), f"list usage: {r.usage}")
floats = [d.embedding for d in r.data]

# base64 explicitly: the raw response carries little-endian f32 bytes.
raw = client.embeddings.with_raw_response.create(model=MODEL, input=texts[:3], encoding_format="base64")
body = raw.http_response.json()
for d, f in zip(body["data"], floats[:3]):
    check(isinstance(d["embedding"], str), "base64 is a string")
    decoded = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
    check(np.array_equal(decoded, np.asarray(f, dtype=np.float32)), "base64 decodes to the float response")
parsed = raw.parse()
check(len(parsed.data) == 3, "raw response parses")

# dimensions: the leading values, renormalized (this model normalizes).
r = client.embeddings.create(model=MODEL, input=short[3]["text"], dimensions=64)
v = np.asarray(r.data[0].embedding)
check(v.shape == (64,), f"dimensions: {v.shape}")
ref = np.asarray(short[3]["embedding"][:64])
check(cosine(v, ref) >= 0.9999 and abs(np.linalg.norm(v) - 1) < 1e-4, "dimensions renormalized")

# Errors.
for bad, what in [({"input": ""}, "empty string"), ({"input": []}, "empty list"), ({"input": ["a", 1]}, "mixed")]:
    try:
        client.embeddings.create(model=MODEL, **bad)
        check(False, f"{what} should be refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400, f"{what}: {e}")
try:
    client.embeddings.create(model=MODEL, input="a", dimensions=385)
    check(False, "dimensions 385 should be refused")
except openai.BadRequestError as e:
    check("dimensions" in str(e), f"dimensions error: {e}")
try:
    client.embeddings.create(model="text-embedding-3-small", input="a")
    check(False, "unknown model should be 404")
except openai.NotFoundError:
    checks += 1
try:
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    check(False, "chat on an embedding model should be refused")
except openai.BadRequestError as e:
    check("embedding model" in str(e), f"chat error: {e}")

print(f"openai_embed.py: {checks} checks passed")
