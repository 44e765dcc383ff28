#!/usr/bin/python3
"""Differential check of the chat-template engine against Python's Jinja2 (a developer tool,
not a ctest): writes random templates mixing the constructs chat templates use, renders each
with tests/helpers/chat_template_reference.py's Jinja2 setup and with
`thermocline render-template`, and prints every case where they differ.

Usage: chat_template_differential.py THERMOCLINE_BIN [COUNT] [SEED]

Differences that cannot be removed are skipped: Python prints some objects with their memory
address (generators, bound methods, namespaces). Python runs each case under a 2 s alarm (it
has no step limit).
"""
import copy
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_template_reference import render  # noqa: E402

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris? é 世界 🌍"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "1", "content": "21C"},
    {"role": "assistant", "content": "<think>x</think>It is 21C."},
    {"role": "user", "content": ""},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City", "enum": ["Paris", "Oslo"]}}, "required": ["city"]}}}]
PRELUDE = ('{% set ns = namespace(n=0, a="") %}{% set x = 3 %}{% set s = "a,b,c" %}'
           '{% set l = [1, "two", none, [3]] %}{% set d = {"a": 1, "b": [2], "c": "x"} %}')
UNMATCHABLE = re.compile(r"<(generator object|built-in method|Namespace)")
R = random.Random(1)
names = ['messages', 'tools', 'x', 's', 'l', 'd', 'missing', 'ns', 'bos_token', 'add_generation_prompt', 'm', 'i', 'loop']
filters0 = ['trim', 'length', 'tojson', 'upper', 'lower', 'list', 'first', 'last', 'string', 'items', 'unique', 'reverse', 'sort', 'capitalize', 'title', 'int', 'float', 'abs', 'safe', 'escape', 'wordcount', 'count', 'dictsort', 'min', 'max', 'sum', 'select', 'reject']
def s_lit():
    return R.choice(["'a'", '"b c"', "''", "' x '", "'é世'", "'it\\'s'", '"q\\"t"', "'\\n'", "'<&>'", "'a,b'", "'role'", "'content'", "'user'", "'Hello World'", "'42'", "'3.5'"])
def atom(dp):
    c = R.randrange(12)
    if c == 0: return str(R.choice([0, 1, 2, -3, 10, 100]))
    if c == 1: return R.choice(['1.5', '0.1', '2.0', '1e3', '-0.5'])
    if c == 2: return s_lit()
    if c == 3: return R.choice(['true', 'false', 'none', 'True', 'None'])
    if c == 4 and dp < 3: return '[' + ', '.join(expr(dp + 1) for _ in range(R.randrange(4))) + ']'
    if c == 5 and dp < 3: return '{' + ', '.join(s_lit() + ': ' + expr(dp + 1) for _ in range(R.randrange(3))) + '}'
    if c == 6 and dp < 3: return '(' + expr(dp + 1) + ')'
    return R.choice(names)
def postfix(e, dp):
    for _ in range(R.randrange(3)):
        c = R.randrange(10)
        if c == 0: e += '.' + R.choice(['role', 'content', 'function', 'name', 'items', 'strip', 'a', 'n', 'tool_calls', 'index0', 'first'])
        elif c == 1: e += '[' + R.choice(['0', '-1', '1', "'role'", "'content'", "'a'", 'i']) + ']'
        elif c == 2: e += R.choice(['[1:]', '[:2]', '[::-1]', '[-2:]'])
        elif c == 3: e += R.choice(['.strip()', ".split(',')", '.split()', ".startswith('a')", ".endswith(('x','c'))", '.upper()', ".replace('a','b')", '.items()', ".get('a')", ".get('zz', 1)", '.keys()', ".find('b')", ".join(['p','q'])", '.lower()', '.values()'])
        elif c == 4: e += '|' + R.choice(filters0)
        elif c == 5: e += '|' + R.choice(["join(', ')", "default('d')", "default('d', true)", "replace('a', 'X')", "indent(2)", "indent(2, first=true)", "tojson(indent=2)", "trim('x')", "map('upper')", "map(attribute='role')", "selectattr('role', 'equalto', 'user')", "rejectattr('content')", "selectattr('a', 'defined')", "select('string')", "join('|', attribute='role')", "int(5)", "sort(reverse=true)", "batchx"]) 
        elif c == 6: e += ' is ' + R.choice(['defined', 'undefined', 'none', 'string', 'number', 'mapping', 'iterable', 'sequence', 'not none', 'odd', 'even', "equalto 'a'", 'in [1, 2]', 'integer', 'float', 'boolean', 'true', 'lower'])
    return e
def expr(dp=0):
    e = postfix(atom(dp), dp)
    if dp < 3 and R.random() < 0.5:
        op = R.choice(['+', '-', '*', '/', '//', '%', '**', '~', '==', '!=', '<', '>', '<=', '>=', 'in', 'not in', 'and', 'or'])
        e = e + ' ' + op + ' ' + expr(dp + 1)
    if dp < 2 and R.random() < 0.15: e = expr(dp + 1) + ' if ' + e + ' else ' + expr(dp + 1)
    if R.random() < 0.1: e = 'not ' + e
    if R.random() < 0.1: e = '-' + e
    return e
def ws():
    return R.choice(['', '', ' ', '\n', '  \n  ', '\n\n', '\t'])
def tag(body):
    l = R.choice(['{%', '{%-', '{%+']); r = R.choice(['%}', '-%}', '+%}'])
    return l + ' ' + body + ' ' + r
def stmt(dp):
    c = R.randrange(9)
    if c == 0: return ws() + R.choice(['text', 'A b', 'é', '<x>']) + ws()
    if c in (1, 2): return ws() + R.choice(['{{', '{{-']) + ' ' + expr() + ' ' + R.choice(['}}', '-}}']) + ws()
    if c == 3 and dp < 3:
        out = tag('if ' + expr()) + block(dp + 1)
        if R.random() < 0.4: out += tag('elif ' + expr()) + block(dp + 1)
        if R.random() < 0.4: out += tag('else') + block(dp + 1)
        return out + tag('endif')
    if c == 4 and dp < 3:
        tgt = R.choice(['m', 'i', 'k, v'])
        it = R.choice(['messages', 'tools', 'l', 'd', 'd|items', 's', 'range(3)', 'messages[1:]', expr()])
        cond = (' if ' + expr()) if R.random() < 0.2 else ''
        out = tag('for ' + tgt + ' in ' + it + cond) + block(dp + 1, loop=True)
        if R.random() < 0.2: out += tag('else') + block(dp + 1)
        return out + tag('endfor')
    if c == 5: return tag('set ' + R.choice(['x', 's', 'l', 'y', 'ns.n', 'ns.a']) + ' = ' + expr())
    if c == 6 and dp < 2: return tag('macro mac(a, b=2)') + block(dp + 1) + tag('endmacro') + '{{ mac(' + expr() + ') }}'
    if c == 7: return '{# c #}' + ws()
    return tag('set y') + block(dp + 1) + tag('endset') + '{{ y }}'
def block(dp, loop=False):
    out = ''.join(stmt(dp) for _ in range(R.randrange(1, 4)))
    if loop and R.random() < 0.2: out += tag(R.choice(['if loop.index > 1', 'if true'])) + tag(R.choice(['break', 'continue'])) + tag('endif')
    if loop and R.random() < 0.3: out += '{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.previtem is defined }}'
    return out


def main():
    binary = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    R.seed(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    tmp = tempfile.mkdtemp()
    with open(os.path.join(tmp, "messages.json"), "w") as f:
        json.dump(MESSAGES, f)
    with open(os.path.join(tmp, "tools.json"), "w") as f:
        json.dump(TOOLS, f)

    def timeout(*_):
        raise TimeoutError()

    signal.signal(signal.SIGALRM, timeout)
    compared = rendered = differ = 0
    for k in range(count):
        source = PRELUDE + block(0)
        path = os.path.join(tmp, "t.jinja")
        with open(path, "w") as f:
            f.write(source)
        variables = {"messages": copy.deepcopy(MESSAGES), "tools": copy.deepcopy(TOOLS),
                     "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"}
        signal.alarm(2)
        try:
            want = render({"template": source, "variables": variables})
        except TimeoutError:
            continue
        finally:
            signal.alarm(0)
        got = subprocess.run([binary, "render-template", "--template", path, "--messages",
                              os.path.join(tmp, "messages.json"), "--tools",
                              os.path.join(tmp, "tools.json"), "--add-generation-prompt",
                              "--bos-token", "<s>", "--eos-token", "</s>"], capture_output=True)
        compared += 1
        rendered += want["ok"]
        out = got.stdout.decode("utf-8", "replace")
        if want["ok"] == (got.returncode == 0) and (not want["ok"] or out == want["output"]):
            continue
        if want["ok"] and UNMATCHABLE.search(want["output"]):
            continue
        differ += 1
        print(f"--- case {k}\n{source[len(PRELUDE):]}\n  python: "
              f"{want.get('error') or repr(want['output'][:300])}\n  c++:    "
              f"{got.stderr.decode()[:300] if got.returncode else repr(out[:300])}")
    print(f"{compared} compared ({rendered} rendered by Python), {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
