#!/usr/bin/env python3
"""Renders the golden chat-template outputs with transformers itself into goldens.json.

    python3 -m pip install transformers==4.57.1 jinja2==3.1.6
    python3 crates/router-chat-template/testdata/generate.py

No torch (or hub access) is needed: each directory under templates/ (a tokenizer_config.json,
perhaps a chat_template.jinja) is loaded with PreTrainedTokenizerFast.from_pretrained beside
router-sim's byte-level tokenizer.json, exactly as transformers loads a model directory, and
every conversation below is rendered with apply_chat_template(..., tokenize=False).
strftime_now reads a fixed clock (NOW) so the output does not depend on the day it runs;
tests/goldens.rs gives the Rust side the same clock and asserts byte-for-byte equality.

Where a template rejects a conversation, the golden records the error instead: a
raise_exception message must be reproduced exactly, any other error only as an error.
"""

import datetime
import json
import pathlib
import shutil
import tempfile

import jinja2
import transformers
import transformers.utils.chat_template_utils as chat_template_utils
from transformers import PreTrainedTokenizerFast

HERE = pathlib.Path(__file__).resolve().parent
TOKENIZER = HERE.parents[1] / "router-sim" / "assets" / "tokenizer.json"
# 2025-03-14T15:09:26Z, what strftime_now sees.
NOW = 1741964966


class FixedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return datetime.datetime.fromtimestamp(NOW, datetime.timezone.utc).replace(tzinfo=None)


chat_template_utils.datetime = FixedDatetime

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and country, e.g. Paris, France"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "The unit"},
            },
            "required": ["location"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Heure actuelle d'un fuseau — « Europe/Paris » par exemple",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "description": "IANA zone"}},
            "required": ["timezone"],
        },
    },
}
TOOLS = [WEATHER, TIME]


def call(arguments, id="call12345", name="get_current_weather"):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_result(content, id="call12345", name="get_current_weather"):
    return {"role": "tool", "tool_call_id": id, "name": name, "content": content}


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
ASK_WEATHER = {"role": "user", "content": "What's the weather in Paris?"}

CONVERSATIONS = {
    "system_user": {"messages": [SYSTEM, {"role": "user", "content": "Hello!"}], "add_generation_prompt": True},
    "user_only_no_prompt": {"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": False},
    "multi_turn": {
        "messages": [
            SYSTEM,
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "  Another one, with spaces around.  "},
        ],
        "add_generation_prompt": True,
    },
    "multi_turn_no_prompt": {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a joke."},
            {"role": "assistant", "content": "Why did the cache miss? It was not hashed the same way."},
        ],
        "add_generation_prompt": False,
    },
    "tools_offered": {"messages": [SYSTEM, ASK_WEATHER], "tools": TOOLS, "add_generation_prompt": True},
    "tools_offered_no_system": {"messages": [ASK_WEATHER], "tools": [WEATHER], "add_generation_prompt": True},
    "tools_empty_list": {"messages": [ASK_WEATHER], "tools": [], "add_generation_prompt": True},
    "tool_call_round": {
        "messages": [
            SYSTEM,
            ASK_WEATHER,
            {"role": "assistant", "content": "", "tool_calls": [call({"location": "Paris, France", "unit": "celsius"})]},
            tool_result('{"temperature": 22, "sky": "clear"}'),
        ],
        "tools": TOOLS,
        "add_generation_prompt": True,
    },
    "tool_call_null_content": {
        "messages": [
            ASK_WEATHER,
            {"role": "assistant", "content": None, "tool_calls": [call({"location": "Paris"})]},
            tool_result("22 degrees"),
            {"role": "assistant", "content": "It is 22 degrees in Paris."},
            {"role": "user", "content": "Thanks!"},
        ],
        "tools": TOOLS,
        "add_generation_prompt": True,
    },
    "tool_call_arguments_string": {
        "messages": [
            ASK_WEATHER,
            {"role": "assistant", "content": "", "tool_calls": [call('{"location": "Paris"}')]},
            tool_result("22"),
        ],
        "tools": [WEATHER],
        "add_generation_prompt": True,
    },
    "tool_result_object": {
        "messages": [
            ASK_WEATHER,
            {"role": "assistant", "content": "", "tool_calls": [call({"location": "Paris"})]},
            tool_result({"temperature": 22.5, "raining": False, "alerts": None, "wind": [3, 4.0]}),
        ],
        "tools": [WEATHER],
        "add_generation_prompt": True,
    },
    "parallel_tool_calls": {
        "messages": [
            {"role": "user", "content": "Weather in Paris, and the time there?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call({"location": "Paris"}),
                    call({"timezone": "Europe/Paris"}, id="call67890", name="get_time"),
                ],
            },
            tool_result("22"),
            tool_result("15:09", id="call67890", name="get_time"),
        ],
        "tools": TOOLS,
        "add_generation_prompt": True,
    },
    "unicode_and_escapes": {
        "messages": [
            {"role": "system", "content": "Réponds en français. 日本語も OK 🙂"},
            {"role": "user", "content": 'Quote "this", a back\\slash, a\ttab,\na newline and <b>&amp;</b>'},
        ],
        "tools": [TIME],
        "add_generation_prompt": True,
    },
    "date_string_given": {
        "messages": [SYSTEM, {"role": "user", "content": "What day is it?"}],
        "add_generation_prompt": True,
        "kwargs": {"date_string": "01 Jan 2025"},
    },
    "thinking_disabled": {
        "messages": [{"role": "user", "content": "Quick answer: 2+2?"}],
        "add_generation_prompt": True,
        "kwargs": {"enable_thinking": False},
    },
    "reasoning_history": {
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>\nTwo plus two.\n</think>\n\n4"},
            {"role": "user", "content": "And 3+3?"},
        ],
        "add_generation_prompt": True,
    },
    "content_parts": {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "this."}],
            }
        ],
        "add_generation_prompt": True,
    },
    "roles_not_alternating": {
        "messages": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
        "add_generation_prompt": True,
    },
}


def render(tokenizer, conversation):
    try:
        text = tokenizer.apply_chat_template(
            conversation["messages"],
            tools=conversation.get("tools"),
            add_generation_prompt=conversation["add_generation_prompt"],
            tokenize=False,
            **conversation.get("kwargs", {}),
        )
        return {"text": text}
    except Exception as err:  # the golden records what the template does with it
        return {
            "error": type(err).__name__,
            # jinja2.exceptions.TemplateError itself is only ever raised by raise_exception.
            "raised": type(err) is jinja2.exceptions.TemplateError,
            "message": str(err),
        }


def load(template_dir):
    with tempfile.TemporaryDirectory() as tmp:
        for file in template_dir.iterdir():
            shutil.copy(file, tmp)
        shutil.copy(TOKENIZER, tmp)
        return PreTrainedTokenizerFast.from_pretrained(tmp)


def main():
    renders = {}
    for template_dir in sorted(p for p in (HERE / "templates").iterdir() if p.is_dir()):
        tokenizer = load(template_dir)
        renders[template_dir.name] = {name: render(tokenizer, c) for name, c in CONVERSATIONS.items()}
    goldens = {
        "generated_by": f"testdata/generate.py with transformers {transformers.__version__}, jinja2 {jinja2.__version__}",
        "now_unix": NOW,
        "conversations": CONVERSATIONS,
        "renders": renders,
    }
    with open(HERE / "goldens.json", "w", encoding="utf-8") as out:
        json.dump(goldens, out, ensure_ascii=False, indent=1)
        out.write("\n")


if __name__ == "__main__":
    main()
