#!/usr/bin/python3
"""Structured output through the real thermocline-gateway (docs/gateway.md#structured-output):
seeded sampled runs (temperature 1, nothing but the mask between the model and the sample) on
stories260K (SentencePiece, byte fallback) and on a model synthesized with GPT-2's byte-level
BPE vocabulary (`thermocline synth --tokenizer-from`), over HTTP (response_format json_schema,
completions and chat) and gRPC (a GBNF grammar). Every output is parsed by Python's json module
and validated against the schema by python3-jsonschema; every run must end because the grammar
completed (HTTP finish_reason "stop", gRPC FINISH_REASON_GRAMMAR), so max_tokens is sized
for the schema's longest output. Greedy, `thermocline generate --grammar / --json-schema` prints
exactly what the gateway streams under the same grammar / schema.

Usage (ctest runs it): structured_output_test.py --bindir BUILD/bin --data SHARED_DATA_DIR
    --tmp DIR [--protoc protoc]
Exit codes: 0 passed, 1 failed, 77 skipped (no grpc or jsonschema module in this python3).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

try:
    import grpc
    import jsonschema
except ImportError as e:  # pragma: no cover - only on machines setup.sh has not prepared
    print(f"SKIP: {sys.executable} cannot import grpc/jsonschema ({e}); scripts/setup.sh "
          "installs python3-grpcio and python3-jsonschema", file=sys.stderr)
    sys.exit(77)

import client_test  # the message generation of the other Python e2e test (same directory)

ARGS = None
RUNS = 50  # per model: 25 over HTTP (every fifth a chat), 25 over gRPC
MAX_TOKENS = 400

# Bounded so that the longest output (every string at its maximum, each character a 6-byte
# \uXXXX escape, a 16-digit integer, one byte per token) fits in MAX_TOKENS.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "kind": {"enum": ["cat", "dog", "owl"]},
        "count": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
        "flag": {"type": "boolean"},
        "note": {"type": ["string", "null"], "maxLength": 4},
    },
    "required": ["name", "kind", "count", "tags", "flag"],
    "additionalProperties": False,
}

# The same shape written by hand in GBNF, for the gRPC runs (outputs validated by SCHEMA).
GRAMMAR = r'''root ::= "{" "\"name\":" ws name "," ws "\"kind\":" ws kind "," ws "\"count\":" ws int "," ws "\"tags\":" ws tags "," ws "\"flag\":" ws ("true" | "false") "}"
name ::= "\"" [a-zA-Z0-9 .!?']{0,8} "\""
kind ::= "\"cat\"" | "\"dog\"" | "\"owl\""
int ::= "-"? ([0-9] | [1-9] [0-9]{0,5})
tags ::= "[" (tag ("," ws tag)?)? "]"
tag ::= "\"" [a-z]{1,6} "\""
ws ::= " "?
'''

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
PROMPT = "Once upon a time"


class Gateway:
    """One gateway process serving `model`; HTTP and gRPC on free ports."""

    def __init__(self, model, tmp, context):
        self.log_path = os.path.join(tmp, f"gateway-{os.path.basename(model)}.log")
        self.log = open(self.log_path, "wb")  # pylint: disable=consider-using-with
        self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [os.path.join(ARGS.bindir, "thermocline-gateway"), "--model", model,
             "--hot-fraction", "0.5", "--listen", "127.0.0.1:0", "--metrics-listen",
             "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--instance",
             f"py-so-{os.getpid()}-{os.path.basename(model)[:8]}", "--context", str(context)],
            stdout=subprocess.PIPE, stderr=self.log)
        line = self.proc.stdout.readline().decode()
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if "grpc" not in fields or "http" not in fields:
            self.stop()
            raise RuntimeError(f"no listening line; got {line!r}; log:\n{self.read_log()}")
        self.http = "http://" + fields["http"]
        self.channel = grpc.insecure_channel(fields["grpc"])
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(self.http + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"the gateway never became healthy; log:\n{self.read_log()}")
            time.sleep(0.05)

    def read_log(self):
        self.log.flush()
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def post(self, path, body):
        """(status, parsed JSON body)."""
        req = urllib.request.Request(self.http + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def stop(self):
        if hasattr(self, "channel"):
            self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.log.close()


class StructuredOutputTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="structured_output_test-", dir=ARGS.tmp)
        gen_dir = os.path.join(cls.tmp, "gen")
        os.makedirs(gen_dir)
        client_test.ARGS = ARGS
        cls.pb, _ = client_test.generate_messages(gen_dir)
        cls.validator = jsonschema.Draft202012Validator(SCHEMA)
        cls.bpe_model = os.path.join(cls.tmp, "gpt-2-synth.gguf")
        synth = subprocess.run(
            [os.path.join(ARGS.bindir, "thermocline"), "synth", "-o", cls.bpe_model,
             "--tokenizer-from", os.path.join(ARGS.data, "tokenizers", "ggml-vocab-gpt-2.gguf"),
             "--dim", "64", "--ffn", "128", "--layers", "1", "--heads", "2", "--kv-heads", "1",
             "--context", "1024"], capture_output=True, check=False)
        if synth.returncode != 0:
            raise RuntimeError(f"synth failed: {synth.stderr.decode(errors='replace')}")

    def check_output(self, text, where):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            self.fail(f"{where}: not JSON ({e}): {text!r}")
        errors = [e.message for e in self.validator.iter_errors(value)]
        self.assertEqual(errors, [], f"{where}: {text!r}")
        return value

    def run_model(self, model, context):
        gw = Gateway(model, self.tmp, context)
        try:
            self.runs(gw)
            self.local_equals_gateway(gw, model)
            self.refusals(gw)
        except Exception:
            print(gw.read_log()[-4000:], file=sys.stderr)
            raise
        finally:
            gw.stop()

    def runs(self, gw):
        generate = gw.channel.unary_stream(
            "/thermocline.v1.Generation/Generate",
            request_serializer=self.pb.GenerateRequest.SerializeToString,
            response_deserializer=self.pb.GenerateResponse.FromString)
        response_format = {"type": "json_schema",
                           "json_schema": {"name": "pet", "schema": SCHEMA, "strict": True}}
        seen = set()
        for i in range(RUNS // 2):
            where = f"HTTP run {i} (seed {i})"
            if i % 5 == 0:
                status, body = gw.post("/v1/chat/completions", {
                    "messages": [{"role": "user", "content": PROMPT}], "seed": i,
                    "temperature": 1, "max_tokens": MAX_TOKENS, "chat_template": CHAT_TEMPLATE,
                    "response_format": response_format})
                self.assertEqual(status, 200, f"{where}: {body}")
                text = body["choices"][0]["message"]["content"]
            else:
                status, body = gw.post("/v1/completions", {
                    "prompt": PROMPT, "seed": i, "temperature": 1, "max_tokens": MAX_TOKENS,
                    "response_format": response_format})
                self.assertEqual(status, 200, f"{where}: {body}")
                text = body["choices"][0]["text"]
            self.assertEqual(body["choices"][0]["finish_reason"], "stop", f"{where}: {text!r}")
            self.check_output(text, where)
            if i < 2:
                print(f"{where}: {text}", file=sys.stderr)
            seen.add(text)
        for i in range(RUNS // 2):
            where = f"gRPC run {i} (seed {100 + i})"
            req = self.pb.GenerateRequest(text=PROMPT, max_new_tokens=MAX_TOKENS, temperature=1,
                                          top_k=0, top_p=1, min_p=0, seed=100 + i,
                                          grammar=GRAMMAR)
            text, final = "", None
            for resp in generate(req, timeout=300):
                if resp.WhichOneof("kind") == "chunk":
                    text += resp.chunk.text
                else:
                    final = resp.final
                    text += final.text
            self.assertIsNotNone(final, where)
            self.assertEqual(final.finish_reason, self.pb.FINISH_REASON_GRAMMAR,
                             f"{where}: {text!r}")
            self.check_output(text, where)
            if i < 2:
                print(f"{where}: {text}", file=sys.stderr)
            seen.add(text)
        # Sampled, not one fixed output: the seeds must give different documents.
        self.assertGreater(len(seen), RUNS // 2, sorted(seen)[:5])

    def local_equals_gateway(self, gw, model):
        """Greedy: `thermocline generate --grammar / --json-schema` (split, as the gateway runs)
        prints exactly the gateway's completion under the same grammar / schema."""
        grammar_file = os.path.join(self.tmp, "pet.gbnf")
        schema_file = os.path.join(self.tmp, "pet.schema.json")
        with open(grammar_file, "w", encoding="utf-8") as f:
            f.write(GRAMMAR)
        with open(schema_file, "w", encoding="utf-8") as f:
            json.dump(SCHEMA, f)
        generate = gw.channel.unary_stream(
            "/thermocline.v1.Generation/Generate",
            request_serializer=self.pb.GenerateRequest.SerializeToString,
            response_deserializer=self.pb.GenerateResponse.FromString)
        text = ""
        for resp in generate(self.pb.GenerateRequest(text=PROMPT, max_new_tokens=MAX_TOKENS,
                                                     temperature=0, grammar=GRAMMAR),
                             timeout=300):
            text += resp.chunk.text if resp.WhichOneof("kind") == "chunk" else resp.final.text
        status, body = gw.post("/v1/completions", {
            "prompt": PROMPT, "temperature": 0, "max_tokens": MAX_TOKENS,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "pet", "schema": SCHEMA}}})
        self.assertEqual(status, 200, body)
        for flag, path, want in [("--grammar", grammar_file, text),
                                 ("--json-schema", schema_file, body["choices"][0]["text"])]:
            self.check_output(want, f"greedy {flag}")
            local = subprocess.run(
                [os.path.join(ARGS.bindir, "thermocline"), "generate", "-m", model, "-p", PROMPT,
                 "-n", str(MAX_TOKENS), "-t", "0", "--split", "--hot-fraction", "0.5", flag, path,
                 "--instance", f"py-so-local-{os.getpid()}"], capture_output=True, check=False)
            self.assertEqual(local.returncode, 0, local.stderr.decode(errors="replace"))
            self.assertEqual(local.stdout.decode(), PROMPT + want + "\n", flag)

    def refusals(self, gw):
        bad_schema = {"type": "object", "properties": {"name": {"type": "string",
                                                                "pattern": "^a+$"}}}
        status, body = gw.post("/v1/completions", {
            "prompt": PROMPT, "response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": bad_schema}}})
        self.assertEqual(status, 400, body)
        self.assertEqual(body["error"]["param"], "response_format.json_schema", body)
        self.assertIn("pattern at $.properties.name is not supported", body["error"]["message"])
        status, body = gw.post("/v1/completions", {"prompt": PROMPT, "grammar": "root ::= [a-"})
        self.assertEqual(status, 400, body)
        self.assertEqual(body["error"]["param"], "grammar", body)
        self.assertIn("unterminated character class", body["error"]["message"])
        generate = gw.channel.unary_stream(
            "/thermocline.v1.Generation/Generate",
            request_serializer=self.pb.GenerateRequest.SerializeToString,
            response_deserializer=self.pb.GenerateResponse.FromString)
        with self.assertRaises(grpc.RpcError) as ctx:
            list(generate(self.pb.GenerateRequest(text=PROMPT, max_new_tokens=8,
                                                  grammar="root ::= x\n"), timeout=60))
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(ctx.exception.details(),
                         "grammar: line 1, column 10: rule 'x' is used but not defined")
        # json_object: any JSON object.
        status, body = gw.post("/v1/completions", {
            "prompt": PROMPT, "seed": 3, "max_tokens": MAX_TOKENS,
            "response_format": {"type": "json_object"}})
        self.assertEqual(status, 200, body)
        if body["choices"][0]["finish_reason"] == "stop":
            self.assertIsInstance(json.loads(body["choices"][0]["text"]), dict)
        else:  # an unbounded object may run out of tokens: reported as length, text cut short
            self.assertEqual(body["choices"][0]["finish_reason"], "length")

    def test_sentencepiece_stories260k(self):
        self.run_model(os.path.join(ARGS.data, "models", "stories260K", "stories260K.gguf"), 512)

    def test_byte_level_bpe_synth(self):
        self.run_model(self.bpe_model, 1024)


def main():
    global ARGS  # pylint: disable=global-statement
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bindir", required=True)
    parser.add_argument("--data", required=True, help="the shared data directory")
    parser.add_argument("--tmp", required=True, help="where the temporary directory goes")
    parser.add_argument("--protoc", default="protoc")
    ARGS, rest = parser.parse_known_args()
    ARGS.data = os.environ.get("THERMOCLINE_SHARED_DATA_DIR", ARGS.data)
    os.makedirs(ARGS.tmp, exist_ok=True)
    result = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2).result
    if not result.wasSuccessful():
        print(f"kept {getattr(StructuredOutputTest, 'tmp', ARGS.tmp)}", file=sys.stderr)
        sys.exit(1)
    shutil.rmtree(StructuredOutputTest.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
