#!/usr/bin/python3
"""Reference renderer for the chat-template tests: Python's Jinja2 set up the way Hugging Face's
apply_chat_template sets it up (an ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks and the loopcontrols extension; tojson is json.dumps(ensure_ascii=False, indent);
globals raise_exception and strftime_now).

Usage: chat_template_reference.py CASES.json. Reads a JSON array of cases, each {"template": TEXT, "variables": {...},
"now": SECONDS}, and writes a JSON array of results, each {"ok": true, "output": TEXT} or
{"ok": false, "error": "ExceptionType: message"}.
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(value, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=["jinja2.ext.loopcontrols"])
ENV.filters["tojson"] = tojson
ENV.globals["raise_exception"] = raise_exception
COMPILED = {}  # template text -> Template (compiling dominates the run time)


def render(case):
    now = case.get("now")
    ENV.globals["strftime_now"] = lambda fmt: (
        datetime.fromtimestamp(now) if now is not None else datetime.now()).strftime(fmt)
    try:
        source = case["template"]
        if source not in COMPILED:
            COMPILED[source] = ENV.from_string(source)
        return {"ok": True, "output": COMPILED[source].render(**case["variables"])}
    except Exception as e:  # every failure is a result the C++ side must match
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    json.dump([render(c) for c in cases], sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
