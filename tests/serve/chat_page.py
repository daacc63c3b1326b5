"""The chat page at `/`, driven in headless Chromium (Playwright): it streams a
greedy reply, keeps the conversation, and its Stop button ends a long reply.

Usage: python chat_page.py BASE_URL API_KEY
"""

import sys

from playwright.sync_api import sync_playwright

BASE, KEY = sys.argv[1], sys.argv[2]
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def fail(msg):
    sys.exit(f"FAILED: {msg}")


with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
    page = browser.new_page()
    # The key a user typed earlier is remembered in localStorage.
    page.add_init_script(f"localStorage.setItem('ferrite.apiKey', {KEY!r})")
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(BASE + "/")
    # No external assets: every request the page made went to the server itself.
    if page.evaluate("performance.getEntriesByType('resource').some(r => !r.name.startsWith(location.origin))"):
        fail("the page loads external assets")
    page.fill("#temperature", "0")
    page.dispatch_event("#temperature", "input")
    page.fill("#prompt", "What is the capital of France?")
    page.click("#send")
    first = page.locator(".msg.assistant").nth(0)
    first.wait_for(state="attached", timeout=10000)
    page.wait_for_function(
        "() => ['done', 'error', 'stopped'].includes(document.querySelector('.msg.assistant')?.dataset.state)",
        timeout=60000)
    if first.get_attribute("data-state") != "done":
        fail(f"first reply ended as {first.get_attribute('data-state')}: {first.inner_text()!r}")
    reply = first.inner_text().strip()
    if not reply:
        fail("empty reply")

    # A second turn with a long answer, stopped midway.
    page.fill("#prompt", "Now write a very long essay about the history of Paris.")
    page.click("#send")
    second = page.locator(".msg.assistant").nth(1)
    second.wait_for(state="attached", timeout=10000)
    page.wait_for_function("() => document.querySelectorAll('.msg.assistant')[1]?.innerText.trim().length > 0",
                           timeout=60000)
    page.click("#stop")
    page.wait_for_function(
        "() => ['done', 'error', 'stopped'].includes(document.querySelectorAll('.msg.assistant')[1]?.dataset.state)",
        timeout=10000)
    if second.get_attribute("data-state") != "stopped":
        fail(f"stop: the second reply ended as {second.get_attribute('data-state')}")
    if page.locator(".msg.user").count() != 2:
        fail("the conversation lost a user message")
    if errors:
        fail(f"console errors: {errors}")
    browser.close()
    print(f"chat page: streamed {reply[:40]!r}..., stop works")
