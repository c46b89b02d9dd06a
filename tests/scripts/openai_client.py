"""The official OpenAI Python client against the router: chat and completions, whole and
streamed. Run by tests/tests/openai_client.rs with the router's URL; prints one JSON line of
what it saw. Needs `openai` (pinned in .ci/run)."""

import json
import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0)
seen = {}

chat = client.chat.completions.create(
    model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=3
)
seen["chat"] = {"content": chat.choices[0].message.content, "tokens": chat.usage.completion_tokens}

chunks = client.chat.completions.create(
    model="m", messages=[{"role": "user", "content": "stream"}], max_tokens=3, stream=True
)
seen["chat_stream"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

completion = client.completions.create(model="m", prompt=["one", "two"], max_tokens=2)
seen["completions"] = {
    "choices": len(completion.choices),
    "tokens": completion.usage.completion_tokens,
}

chunks = client.completions.create(model="m", prompt="stream", max_tokens=3, stream=True)
seen["completions_stream"] = "".join(c.choices[0].text for c in chunks if c.choices)

try:
    client.completions.create(model="m", prompt=[], max_tokens=2)
    seen["bad"] = None
except openai.BadRequestError as error:
    seen["bad"] = error.body.get("param") if isinstance(error.body, dict) else str(error.body)

print(json.dumps(seen))
