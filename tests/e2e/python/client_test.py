#!/usr/bin/python3
"""A client in another language: Debian's python3-grpcio streams a generation from the real
thermocline-gateway.

The message classes are generated at test time by the system protoc (3.21, the version
python3-protobuf 3.21 reads) from proto/thermocline/v1/generation.proto and the e2e health
proto; nothing generated is committed. Calls go through grpc's generic API
(channel.unary_stream / unary_unary with the messages' own serializers), because the Python
stub generator (python3-grpc-tools) Debian ships is too old to rely on; the wire format is all a
client in another language shares with the server, which is the point of the test.

Usage (ctest runs it): client_test.py --bindir BUILD/bin --data SHARED_DATA_DIR --tmp DIR
    [--protoc protoc]
Exit codes: 0 passed, 1 failed, 77 skipped (this python3 has no grpc module).
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import grpc
    import google.protobuf  # noqa: F401  (the generated classes need it)
except ImportError as e:  # pragma: no cover - only on machines setup.sh has not prepared
    print(f"SKIP: {sys.executable} cannot import grpc/protobuf ({e}); "
          "scripts/setup.sh installs python3-grpcio and python3-protobuf", file=sys.stderr)
    sys.exit(77)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
ARGS = None  # parsed command line, set in main()

# One greedy request, compared byte for byte with local generation (as
# GatewayGenerate.GreedyStreamEqualsLocalGeneration does in C++).
PROMPT = "Once upon a time"
N_TOKENS = 40


def generate_messages(out_dir):
    """Runs protoc --python_out for the API and the health service; returns the modules.
    The health proto is copied to e2e_health/ first: under its own path its module would be
    grpc.health.v1.health_pb2, inside the top-level package `grpc`, which is python3-grpcio."""
    health_src = os.path.join(REPO, "tests", "e2e", "protos", "grpc", "health", "v1",
                              "health.proto")
    inc = os.path.join(out_dir, "protos")
    os.makedirs(os.path.join(inc, "e2e_health"))
    # Only the file's location changes (module e2e_health.health_pb2); its proto package, and
    # so the method path /grpc.health.v1.Health/Check, stays.
    with open(health_src, encoding="utf-8") as src, \
            open(os.path.join(inc, "e2e_health", "health.proto"), "w", encoding="utf-8") as dst:
        dst.write(src.read())
    for include, rel in [(os.path.join(REPO, "proto"), "thermocline/v1/generation.proto"),
                         (inc, "e2e_health/health.proto")]:
        subprocess.run([ARGS.protoc, f"--proto_path={include}", f"--python_out={out_dir}",
                        os.path.join(include, rel)], check=True)
    sys.path.insert(0, out_dir)
    from thermocline.v1 import generation_pb2  # pylint: disable=import-outside-toplevel
    from e2e_health import health_pb2  # pylint: disable=import-outside-toplevel
    return generation_pb2, health_pb2


def shm_segments(instance):
    """The instance's shared-memory segments (shared/ipc/segment.cc names them
    thermocline-<instance>...)."""
    prefix = f"thermocline-{instance}"
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


class PythonClientTest(unittest.TestCase):
    """One gateway for the whole class; the tests run in name order and the last one stops it."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="python_client_test-", dir=ARGS.tmp)
        gen_dir = os.path.join(cls.tmp, "gen")
        os.makedirs(gen_dir)
        cls.pb, cls.health_pb = generate_messages(gen_dir)
        cls.model = os.path.join(ARGS.data, "models", "stories260K", "stories260K.gguf")
        cls.instance = f"py-e2e-{os.getpid()}"
        cls.log_path = os.path.join(cls.tmp, "gateway.log")
        cls.log = open(cls.log_path, "wb")  # pylint: disable=consider-using-with
        cls.gateway = subprocess.Popen(  # pylint: disable=consider-using-with
            [os.path.join(ARGS.bindir, "thermocline-gateway"), "--model", cls.model,
             "--hot-fraction", "0.5", "--listen", "127.0.0.1:0", "--metrics-listen",
             "127.0.0.1:0", "--instance", cls.instance, "--context", "256"],
            stdout=subprocess.PIPE, stderr=cls.log)
        # The first stdout line: "listening grpc=HOST:PORT metrics=HOST:PORT".
        line = cls.gateway.stdout.readline().decode()
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if "grpc" not in fields:
            cls.gateway.kill()
            cls.gateway.wait()
            raise RuntimeError(f"no listening line; got {line!r}; log:\n{cls.read_log()}")
        cls.address = fields["grpc"]
        cls.channel = grpc.insecure_channel(cls.address)
        pb = cls.pb
        cls.generate = cls.channel.unary_stream(
            "/thermocline.v1.Generation/Generate",
            request_serializer=pb.GenerateRequest.SerializeToString,
            response_deserializer=pb.GenerateResponse.FromString)
        cls.chat = cls.channel.unary_stream(
            "/thermocline.v1.Generation/Chat",
            request_serializer=pb.ChatRequest.SerializeToString,
            response_deserializer=pb.GenerateResponse.FromString)
        cls.tokenize = cls.channel.unary_unary(
            "/thermocline.v1.Generation/Tokenize",
            request_serializer=pb.TokenizeRequest.SerializeToString,
            response_deserializer=pb.TokenizeResponse.FromString)
        cls.detokenize = cls.channel.unary_unary(
            "/thermocline.v1.Generation/Detokenize",
            request_serializer=pb.DetokenizeRequest.SerializeToString,
            response_deserializer=pb.DetokenizeResponse.FromString)
        cls.model_info = cls.channel.unary_unary(
            "/thermocline.v1.Generation/GetModelInfo",
            request_serializer=pb.GetModelInfoRequest.SerializeToString,
            response_deserializer=pb.ModelInfo.FromString)
        cls.health = cls.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=cls.health_pb.HealthCheckRequest.SerializeToString,
            response_deserializer=cls.health_pb.HealthCheckResponse.FromString)
        # Generate answers UNAVAILABLE "loading" until the model is loaded and warmed up;
        # health turns SERVING then.
        deadline = time.monotonic() + 60
        while True:
            try:
                status = cls.health(cls.health_pb.HealthCheckRequest(service=""), timeout=5).status
                if status == cls.health_pb.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline or cls.gateway.poll() is not None:
                cls.stop_gateway()
                raise RuntimeError(f"the gateway never became SERVING; log:\n{cls.read_log()}")
            time.sleep(0.02)

    @classmethod
    def read_log(cls):
        cls.log.flush()
        with open(cls.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    @classmethod
    def stop_gateway(cls):
        """SIGTERM, then (after 20 s) SIGKILL; returns the exit code."""
        if cls.gateway.poll() is None:
            cls.gateway.send_signal(signal.SIGTERM)
            try:
                cls.gateway.wait(timeout=20)
            except subprocess.TimeoutExpired:
                cls.gateway.kill()
                cls.gateway.wait()
                return None
        return cls.gateway.returncode

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.stop_gateway()
        cls.gateway.stdout.close()
        cls.log.close()

    def greedy(self, prompt, n):
        return self.pb.GenerateRequest(text=prompt, max_new_tokens=n, temperature=0)

    def stream(self, request, call=None):
        """Runs one Generate (or `call`) call to the end: (ids per chunk, text, final)."""
        chunks, text, final = [], "", None
        for resp in (call or self.generate)(request, timeout=120):
            kind = resp.WhichOneof("kind")
            if kind == "chunk":
                self.assertIsNone(final, "a chunk after the final message")
                chunks.append(list(resp.chunk.token_ids))
                text += resp.chunk.text
            elif kind == "final":
                self.assertIsNone(final, "two final messages")
                final = resp.final
                text += resp.final.text
        return chunks, text, final

    def test_1_greedy_stream_equals_local_generation(self):
        chunks, text, final = self.stream(self.greedy(PROMPT, N_TOKENS))
        self.assertIsNotNone(final, "the stream ended without a final message")
        # `thermocline generate -t 0 --split --hot-fraction 0.5` prints the prompt, the
        # completion and a newline: the streamed text must be exactly that completion.
        local = subprocess.run(
            [os.path.join(ARGS.bindir, "thermocline"), "generate", "-m", self.model, "-p", PROMPT,
             "-n", str(N_TOKENS), "-t", "0", "--split", "--hot-fraction", "0.5",
             "--instance", f"py-local-{os.getpid()}"],
            capture_output=True, check=False)
        self.assertEqual(local.returncode, 0, local.stderr.decode(errors="replace"))
        self.assertEqual((PROMPT + text + "\n").encode(), local.stdout)
        # Every token exactly once: one id per chunk, as many as usage counts, and the ids
        # spell the streamed text (so none was repeated or dropped).
        ids = [i for c in chunks for i in c]
        self.assertTrue(all(len(c) == 1 for c in chunks), chunks)
        self.assertGreater(len(ids), 0)
        self.assertEqual(final.usage.completion_tokens, len(ids))
        self.assertEqual(self.detokenize(self.pb.DetokenizeRequest(token_ids=ids), timeout=10).text,
                         text)
        info = self.model_info(self.pb.GetModelInfoRequest(), timeout=10)
        self.assertTrue(all(0 <= i < info.vocab_size for i in ids))
        # The final message: why it ended, and the usage (the prompt as the server tokenized
        # it, BOS included).
        self.assertIn(final.finish_reason,
                      (self.pb.FINISH_REASON_LENGTH, self.pb.FINISH_REASON_EOS))
        if final.finish_reason == self.pb.FINISH_REASON_LENGTH:
            self.assertEqual(len(ids), N_TOKENS)
        prompt_ids = self.tokenize(self.pb.TokenizeRequest(text=PROMPT, add_bos=True),
                                   timeout=10).token_ids
        self.assertEqual(final.usage.prompt_tokens, len(prompt_ids))
        self.assertGreater(final.timings.time_to_first_token_seconds, 0)

    def test_2_model_info(self):
        info = self.model_info(self.pb.GetModelInfoRequest(), timeout=10)
        self.assertEqual(info.vocab_size, 512)  # stories260K
        self.assertEqual(info.context_length, 256)  # --context 256
        self.assertAlmostEqual(info.hot_fraction, 0.5)
        self.assertEqual(info.workers, "spawn")

    def test_3_invalid_request_names_the_field(self):
        request = self.greedy(PROMPT, 8)
        request.temperature = -1
        with self.assertRaises(grpc.RpcError) as raised:
            self.stream(request)
        self.assertEqual(raised.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("temperature", raised.exception.details())
        # The refusal disturbed nothing: the server still serves.
        _, text, final = self.stream(self.greedy(PROMPT, 4))
        self.assertIsNotNone(final)
        self.assertTrue(text)

    def test_4_chat_equals_generate_on_jinja2s_rendering(self):
        # Python's own Jinja2 (Debian python3-jinja2, set up as Hugging Face's
        # apply_chat_template sets it up) renders the conversation; the server's tokenization
        # of that text with special tokens parsed, generated from, is what Chat must stream.
        try:
            import jinja2.sandbox  # pylint: disable=import-outside-toplevel
        except ImportError:
            self.skipTest("no python3-jinja2")
        template = ("{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n"
                    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
        messages = [{"role": "system", "content": "You tell stories."},
                    {"role": "user", "content": "Once upon a time"}]
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        text = env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                                bos_token="<s>", eos_token="</s>")
        ids = list(self.tokenize(self.pb.TokenizeRequest(text=text, parse_special=True),
                                 timeout=10).token_ids)
        self.assertEqual(ids.count(1), 1)  # the template's <s> is the one BOS
        request = self.pb.ChatRequest(chat_template=template, max_new_tokens=24, temperature=0)
        for m in messages:
            request.messages.add(role=m["role"], content=m["content"])
        chat_chunks, chat_text, chat_final = self.stream(request, self.chat)
        gen_chunks, gen_text, gen_final = self.stream(self.pb.GenerateRequest(
            token_ids=self.pb.TokenIds(ids=ids), max_new_tokens=24, temperature=0))
        self.assertTrue(chat_text)
        self.assertEqual(chat_chunks, gen_chunks)
        self.assertEqual(chat_text, gen_text)
        self.assertEqual(chat_final.usage.prompt_tokens, len(ids))
        self.assertEqual(chat_final.finish_reason, gen_final.finish_reason)

    def test_9_sigterm_removes_the_segments(self):
        # The segments exist while the gateway runs (so the check below is not vacuous)...
        self.assertTrue(shm_segments(self.instance), os.listdir("/dev/shm"))
        code = type(self).stop_gateway()
        self.assertEqual(code, 0, self.read_log())
        # ...and none is left once it has exited (the workers' included).
        self.assertEqual(shm_segments(self.instance), [])


def main():
    global ARGS  # pylint: disable=global-statement
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bindir", required=True)
    parser.add_argument("--data", required=True, help="the shared data directory (models/)")
    parser.add_argument("--tmp", required=True, help="where the temporary directory goes")
    parser.add_argument("--protoc", default="protoc")
    ARGS, rest = parser.parse_known_args()
    ARGS.data = os.environ.get("THERMOCLINE_SHARED_DATA_DIR", ARGS.data)
    os.makedirs(ARGS.tmp, exist_ok=True)
    result = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2).result
    if not result.wasSuccessful():
        print(f"kept {getattr(PythonClientTest, 'tmp', ARGS.tmp)} (gateway.log, generated "
              "modules)", file=sys.stderr)
        sys.exit(1)
    shutil.rmtree(PythonClientTest.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
