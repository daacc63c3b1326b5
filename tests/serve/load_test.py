"""Load test for `ferrite serve`: many concurrent streaming requests, a third
of them disconnecting after their first token. Every request that stays must
finish normally, and afterwards /metrics must show no running or waiting
request and every KV block free.

Usage: python load_test.py BASE_URL API_KEY MODEL [N]
"""

import asyncio
import re
import sys
import time

import urllib.request

import openai

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
N = int(sys.argv[4]) if len(sys.argv) > 4 else 200


async def one(client, i):
    leave_early = i % 3 == 0
    finish = None
    try:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Tell me a story about request {i}."}],
            max_tokens=400 if leave_early else 24,
            temperature=0.7,
            seed=i,
            stream=True,
        )
        async with stream:
            async for chunk in stream:
                if leave_early and chunk.choices and chunk.choices[0].delta.content:
                    return None  # leaving the block closes the connection mid-generation
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
    except openai.APIError as e:
        return f"request {i}: {e}"
    if finish not in ("stop", "length"):
        return f"request {i}: finished with {finish!r}"
    return None


def metric(text, name):
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    if not m:
        sys.exit(f"FAILED: /metrics has no {name}")
    return float(m.group(1))


async def main():
    # The client's default pool (1,000 connections) holds every request at once.
    async with openai.AsyncOpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0, timeout=600) as client:
        t0 = time.time()
        errors = [e for e in await asyncio.gather(*(one(client, i) for i in range(N))) if e]
        if errors:
            sys.exit(f"FAILED: {len(errors)} requests failed, first: {errors[0]}")
        # The server frees a disconnected request's blocks at once; allow it a moment.
        for _ in range(100):
            text = urllib.request.urlopen(f"{BASE}/metrics").read().decode()
            used = metric(text, "ferrite_kv_cache_blocks_used")
            busy = metric(text, "ferrite_num_requests_running") + metric(text, "ferrite_num_requests_waiting")
            if used == 0 and busy == 0:
                break
            await asyncio.sleep(0.1)
        else:
            sys.exit(f"FAILED: after the load, {used} KV blocks used and {busy} requests still running or waiting")
        print(f"load test: {N} streaming requests ({N // 3 + 1} disconnected early) in {time.time() - t0:.1f}s; "
              f"all KV blocks free")


asyncio.run(main())
