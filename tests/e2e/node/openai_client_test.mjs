// The official `openai` Node client (pinned in package.json / package-lock.json, installed by
// scripts/setup.sh with `npm ci`) against the real thermocline-gateway's HTTP API on
// stories260K (docs/http.md). References are computed by other programs: greedy text by
// `thermocline generate --split` (the gateway's engine, run locally), the chat prompt by
// `thermocline render-template`, prompt token counts by `thermocline tokenize`.
//
// Usage (ctest runs it): node openai_client_test.mjs --bindir BUILD/bin --data SHARED --tmp DIR
// Exit codes: 0 passed, 1 failed, 77 skipped (the openai package is not installed; never under
// CI, where that is a failure).
import { spawn, spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = {};
for (let i = 2; i + 1 < process.argv.length; i += 2) {
  args[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
}

let OpenAI;
try {
  OpenAI = createRequire(path.join(here, "package.json"))("openai").default;
} catch (e) {
  const why = `the openai package is not installed in ${here}/node_modules (scripts/setup.sh ` +
    `runs npm ci there): ${e.message}`;
  if (process.env.CI) {
    console.error(`FAIL: ${why}`);
    process.exit(1);
  }
  console.error(`SKIP: ${why}`);
  process.exit(77);
}

const bin = (name) => path.join(args.bindir, name);
const model = path.join(args.data, "models", "stories260K", "stories260K.gguf");
fs.mkdirSync(args.tmp, { recursive: true });
const tmp = fs.mkdtempSync(path.join(args.tmp, "run-"));
// stories260K has no chat template: the gateway gets one on its command line.
const templatePath = path.join(tmp, "chat.jinja");
fs.writeFileSync(templatePath,
  "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}" +
  "{% if add_generation_prompt %}assistant:{% endif %}");

let failures = 0;
let passes = 0;
function check(cond, what, detail = "") {
  if (cond) {
    passes++;
  } else {
    failures++;
    console.error(`FAIL: ${what}${detail ? `\n  ${detail}` : ""}`);
  }
}
function equal(got, want, what) {
  check(JSON.stringify(got) === JSON.stringify(want), what,
    `got  ${JSON.stringify(got)}\n  want ${JSON.stringify(want)}`);
}

function run(cmd, argv, input) {
  const r = spawnSync(cmd, argv, { input, encoding: "utf8", maxBuffer: 16 << 20 });
  if (r.status !== 0) throw new Error(`${cmd} ${argv.join(" ")} exited ${r.status}: ${r.stderr}`);
  return r.stdout;
}

// `thermocline generate` prints exactly the prompt, the generated text and a newline.
function localGenerate(prompt, n, sampling = ["-t", "0"]) {
  const out = run(bin("thermocline"), ["generate", "-m", model, "-p", prompt, "-n", String(n),
    ...sampling, "--split", "--hot-fraction", "0.5"]);
  if (!out.startsWith(prompt) || !out.endsWith("\n")) throw new Error(`odd output ${out}`);
  return out.slice(prompt.length, -1);
}
// Token count of a text prompt with BOS as the vocabulary says.
function promptTokens(text) {
  return run(bin("thermocline"), ["tokenize", "--model", model, "--add-bos"], text)
    .trim().split(/\s+/).length;
}

const children = [];  // gateways still running: killed on the way out, whatever happened
// A gateway on free ports (the one stdout line gives them).
async function startGateway(extra) {
  const logPath = path.join(tmp, `gateway-${extra.length}.log`);
  const log = fs.openSync(logPath, "w");
  const child = spawn(bin("thermocline-gateway"), ["--model", model, "--hot-fraction", "0.5",
    "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
    "--instance", `node-e2e-${process.pid}-${extra.length}`, "--context", "256",
    "--chat-template", templatePath, ...extra], { stdio: ["ignore", "pipe", log] });
  children.push(child);
  const line = await new Promise((resolve, reject) => {
    let buf = "";
    child.stdout.on("data", (d) => {
      buf += d;
      if (buf.includes("\n")) resolve(buf.split("\n")[0]);
    });
    child.on("exit", (code) => reject(new Error(`gateway exited ${code} before listening`)));
  });
  const fields = Object.fromEntries(line.split(" ").filter((w) => w.includes("="))
    .map((w) => w.split("=", 2)));
  if (!fields.http || fields.http === "off") throw new Error(`no http= in '${line}'`);
  return { child, http: fields.http, metrics: fields.metrics, logPath: logPath };
}
async function waitServing(base, fetchOptions = {}) {
  // Loading takes well under a second here; the bound only keeps a broken gateway from
  // hanging the test.
  for (let i = 0; i < 1200; i++) {
    try {
      const r = await fetch(`${base}/health`, fetchOptions);
      if (r.status === 200) return;
    } catch { /* not listening yet */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${base}/health never answered 200`);
}
function stop(gw) {
  return new Promise((resolve) => {
    gw.child.on("exit", (code, signal) => {
      children.splice(children.indexOf(gw.child), 1);
      resolve({ code, signal });
    });
    gw.child.kill("SIGTERM");
  });
}

const PROMPT = "Once upon a time";
const N = 40;

// Startup refuses bad HTTP flags naming them, before serving anything.
function startupRefusals() {
  const badTemplate = path.join(tmp, "bad.jinja");
  fs.writeFileSync(badTemplate, "{% if %}");
  for (const [extra, want] of [
    [["--http-listen", "nonsense"], "--http-listen nonsense: not HOST:PORT"],
    [["--chat-template", path.join(tmp, "missing.jinja")], "--chat-template"],
    [["--chat-template", badTemplate], `--chat-template ${badTemplate}: `],
  ]) {
    const r = spawnSync(bin("thermocline-gateway"), ["--model", model, "--listen", "127.0.0.1:0",
      "--metrics-listen", "127.0.0.1:0", "--instance", `node-e2e-bad-${process.pid}`, ...extra],
    { encoding: "utf8" });
    check(r.status === 1 && r.stderr.includes(want), `startup with ${extra.join(" ")} is refused`,
      `status ${r.status}, stderr ${r.stderr}`);
  }
}

async function main() {
  startupRefusals();
  const gw = await startGateway(["--shutdown-grace", "0"]);
  const base = `http://${gw.http}`;
  await waitServing(base);
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0 });
  const served = "stories260K.gguf";

  // /v1/models
  const models = await client.models.list();
  equal(models.data.map((m) => m.id), [served], "models.list names the served model");

  // Completions, greedy: text == thermocline generate; usage from thermocline tokenize.
  const want = localGenerate(PROMPT, N);
  const wantPromptTokens = promptTokens(PROMPT);
  const c = await client.completions.create({ model: served, prompt: PROMPT, max_tokens: N,
    temperature: 0 });
  equal(c.choices[0].text, want, "completions text == thermocline generate -t 0");
  equal(c.choices[0].finish_reason, "length", "completions finish_reason");
  equal(c.usage, { prompt_tokens: wantPromptTokens, completion_tokens: N,
    total_tokens: wantPromptTokens + N }, "completions usage");

  const cs = await client.completions.create({ model: served, prompt: PROMPT, max_tokens: N,
    temperature: 0, stream: true, stream_options: { include_usage: true } });
  let streamed = "";
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of cs) {
    chunks++;
    for (const ch of chunk.choices) {
      streamed += ch.text;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  equal(streamed, want, "streamed completions text == thermocline generate -t 0");
  equal(finish, "length", "streamed completions finish_reason");
  equal(usage, c.usage, "streamed completions usage (stream_options.include_usage)");
  check(chunks > N / 2, "completions stream came in many chunks", `${chunks} chunks`);

  // Chat: the conversation rendered by thermocline render-template, generated locally.
  const messages = [{ role: "system", content: "You tell stories." },
    { role: "user", content: "Tell me about a cat." }];
  const messagesPath = path.join(tmp, "messages.json");
  fs.writeFileSync(messagesPath, JSON.stringify(messages));
  const rendered = run(bin("thermocline"), ["render-template", "--template", templatePath,
    "--messages", messagesPath, "--add-generation-prompt"]);
  const wantChat = localGenerate(rendered, N);
  const chatPromptTokens = promptTokens(rendered);
  const cc = await client.chat.completions.create({ model: served, messages,
    max_completion_tokens: N, temperature: 0 });
  equal(cc.choices[0].message.content, wantChat, "chat content == generate on the rendered prompt");
  equal(cc.choices[0].message.role, "assistant", "chat role");
  equal(cc.usage, { prompt_tokens: chatPromptTokens, completion_tokens: N,
    total_tokens: chatPromptTokens + N }, "chat usage");

  const ccs = await client.chat.completions.create({ model: served, messages, max_tokens: N,
    temperature: 0, stream: true, stream_options: { include_usage: true } });
  let chatStreamed = "";
  let role = null;
  usage = null;
  finish = null;
  for await (const chunk of ccs) {
    for (const ch of chunk.choices) {
      if (ch.delta.role) role = ch.delta.role;
      if (ch.delta.content) chatStreamed += ch.delta.content;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  equal(chatStreamed, wantChat, "streamed chat content == generate on the rendered prompt");
  equal(role, "assistant", "streamed chat role");
  equal(finish, "length", "streamed chat finish_reason");
  equal(usage, cc.usage, "streamed chat usage");

  // n = 3 with a seed: choice i samples as a request with seed + i does, which is what
  // thermocline generate --seed (seed + i) prints with the same sampling.
  const seed = 1234;
  const sampling = { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05 };
  const n3 = await client.completions.create({ model: served, prompt: PROMPT, max_tokens: 24,
    n: 3, seed, ...sampling });
  equal(n3.choices.map((ch) => ch.index), [0, 1, 2], "n=3 gives choices 0, 1, 2");
  for (let i = 0; i < 3; i++) {
    const local = localGenerate(PROMPT, 24, ["-t", "0.8", "--top-k", "40", "--top-p", "0.95",
      "--min-p", "0.05", "--seed", String(seed + i)]);
    equal(n3.choices[i].text, local, `n=3 choice ${i} == generate --seed ${seed + i}`);
  }
  check(new Set(n3.choices.map((ch) => ch.text)).size > 1, "n=3 choices differ",
    JSON.stringify(n3.choices.map((ch) => ch.text)));
  const n3s = await client.completions.create({ model: served, prompt: PROMPT, max_tokens: 24,
    n: 3, seed, ...sampling, stream: true });
  const perChoice = ["", "", ""];
  for await (const chunk of n3s) {
    for (const ch of chunk.choices) perChoice[ch.index] += ch.text;
  }
  equal(perChoice, n3.choices.map((ch) => ch.text), "n=3 streamed == n=3 not streamed, per index");
  equal(n3.usage.prompt_tokens, wantPromptTokens, "n=3 prompt tokens counted once");
  equal(n3.usage.completion_tokens, 72, "n=3 completion tokens summed");

  // Invalid requests: 400 with `param` naming the field (and 404 for another model).
  const bad = [
    [{ prompt: PROMPT, temperature: -1 }, 400, "temperature"],
    [{ prompt: PROMPT, max_tokens: "ten" }, 400, "max_tokens"],
    [{ prompt: PROMPT, max_tokens: 100000 }, 400, "max_tokens"],
    [{ prompt: PROMPT, top_p: 0 }, 400, "top_p"],
    [{ prompt: PROMPT, stop: 7 }, 400, "stop"],
    [{ prompt: PROMPT, n: 17 }, 400, "n"],
    [{ prompt: [1, 99999] }, 400, "prompt"],
    [{ prompt: PROMPT, response_format: { type: "json_schema", json_schema: { name: "s",
      schema: { type: "string", pattern: "a+" } } } }, 400, "response_format.json_schema"],
    [{ prompt: PROMPT, grammar: "root ::= (" }, 400, "grammar"],
    [{ prompt: PROMPT, model: "gpt-4o" }, 404, "model"],
  ];
  for (const [body, status, param] of bad) {
    try {
      await client.completions.create({ model: served, ...body });
      check(false, `${JSON.stringify(body)} was accepted`);
    } catch (e) {
      equal([e.status, e.error?.param ?? e.param], [status, param],
        `${JSON.stringify(body)} -> ${status} naming ${param} (${e.message})`);
    }
  }
  try {
    await client.chat.completions.create({ model: served, messages: [{ role: 5 }] });
    check(false, "a chat message with a numeric role was accepted");
  } catch (e) {
    equal([e.status, e.error?.param ?? e.param], [400, "messages[0].role"], "role of the wrong type");
  }

  // curl -N sees the events as they are written, uncompressed even when the client accepts gzip.
  const sse = run("curl", ["-sS", "-N", "-D", "-", "-H", "Accept-Encoding: gzip",
    `${base}/v1/completions`, "-H", "Content-Type: application/json", "-d",
    JSON.stringify({ prompt: PROMPT, max_tokens: 8, temperature: 0, stream: true })]);
  const [head, ...rest] = sse.split("\r\n\r\n");
  const body = rest.join("\r\n\r\n");
  check(/content-type: text\/event-stream/i.test(head), "curl: text/event-stream", head);
  check(!/content-encoding/i.test(head), "curl: the stream is not compressed", head);
  const dataLines = body.split("\n").filter((l) => l.startsWith("data: "));
  equal(dataLines[dataLines.length - 1], "data: [DONE]", "curl: the stream ends with data: [DONE]");
  const curlText = dataLines.slice(0, -1).map((l) => JSON.parse(l.slice(6)).choices[0]?.text ?? "")
    .join("");
  equal(curlText, localGenerate(PROMPT, 8), "curl: the streamed text");

  // /tokenize and /detokenize
  const tok = await (await fetch(`${base}/tokenize`, { method: "POST",
    body: JSON.stringify({ prompt: PROMPT }) })).json();
  equal(tok.count, wantPromptTokens, "/tokenize count == thermocline tokenize --add-bos");
  const detok = await (await fetch(`${base}/detokenize`, { method: "POST",
    body: JSON.stringify({ tokens: tok.tokens }) })).json();
  equal(detok.prompt, PROMPT, "/detokenize of /tokenize is the prompt");

  // A client that goes away mid-stream: its sequence is cancelled (counted in /metrics as
  // cancelled) and the next request is served.
  const metricsText = async () => (await fetch(`http://${gw.metrics}/metrics`)).text();
  const cancelled = (t) => Number((t.match(/thermocline_requests_total\{outcome="cancelled"\} (\d+)/) ?? [0, 0])[1]);
  // vLLM's metric names (docs/metrics.md) carry the same samples as the gateway's own.
  const scrape = await metricsText();
  const sample = (name) => Number((scrape.match(new RegExp(`^${name} (\\S+)$`, "m")) ?? [0, NaN])[1]);
  const ml = `\\{model_name="${served}"\\}`;
  const e2eCount = sample("thermocline_request_duration_seconds_count");
  check(e2eCount >= 8, "requests counted in /metrics", String(e2eCount));  // NaN fails too
  equal(sample(`vllm:e2e_request_latency_seconds_count${ml}`), e2eCount,
    "vllm:e2e_request_latency_seconds == thermocline_request_duration_seconds");
  for (const [theirs, ours] of [["vllm:generation_tokens_total", "thermocline_generated_tokens_total"],
    ["vllm:prompt_tokens_total", "thermocline_prompt_tokens_total"]]) {
    const v = sample(`${theirs}${ml}`);
    check(v > 0 && v === sample(ours), `${theirs} == ${ours} > 0`, `${v} vs ${sample(ours)}`);
  }
  const before = cancelled(await metricsText());
  const long = await client.completions.create({ model: served, prompt: PROMPT, max_tokens: 200,
    temperature: 0, ignore_eos: true, stream: true });
  for await (const chunk of long) {
    if (chunk.choices.length) break;  // leaving the loop aborts the request
  }
  let after = before;
  for (let i = 0; i < 600 && after === before; i++) {
    await new Promise((r) => setTimeout(r, 50));
    after = cancelled(await metricsText());
  }
  equal(after, before + 1, "an abandoned stream is cancelled");
  const again = await client.completions.create({ model: served, prompt: PROMPT, max_tokens: N,
    temperature: 0 });
  equal(again.choices[0].text, want, "served after a cancelled stream");

  // SIGTERM with a stream in flight: the stream ends with finish_reason abort and [DONE], the
  // gateway exits 0. The gpu worker is stopped before the request is sent, so the request is in
  // flight when the signal comes however fast the machine is (as GatewayLifecycle does).
  const logText = () => fs.readFileSync(gw.logPath, "utf8");
  const gpuPid = Number(logText().match(/event=workers_ready gpu_pid=(\d+)/)[1]);
  process.kill(gpuPid, "SIGSTOP");
  const inflight = await client.completions.create({ model: served, prompt: PROMPT,
    max_tokens: 200, temperature: 0, ignore_eos: true, stream: true });
  const exited = new Promise((resolve) => gw.child.on("exit", (code, signal) => {
    children.splice(children.indexOf(gw.child), 1);
    resolve({ code, signal });
  }));
  gw.child.kill("SIGTERM");
  for (let i = 0; i < 600 && !logText().includes("event=shutdown"); i++) {
    await new Promise((r) => setTimeout(r, 50));
  }
  process.kill(gpuPid, "SIGCONT");
  let abortReason = null;
  let tokensAfterSignal = "";
  for await (const chunk of inflight) {
    for (const ch of chunk.choices) {
      tokensAfterSignal += ch.text;
      if (ch.finish_reason) abortReason = ch.finish_reason;
    }
  }
  equal(abortReason, "abort", "a stream in flight at SIGTERM ends with finish_reason abort");
  check(want.startsWith(tokensAfterSignal), "its text is a prefix of the greedy text",
    tokensAfterSignal);
  equal(await exited, { code: 0, signal: null }, "the gateway exits 0 on SIGTERM");

  // TLS and a bearer token, from the gRPC flags.
  const cert = path.join(tmp, "cert.pem");
  const key = path.join(tmp, "key.pem");
  run("openssl", ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"]);
  // Mutual TLS: a CA of the test's own signs the client's certificate.
  const ca = path.join(tmp, "ca.pem");
  const caKey = path.join(tmp, "ca.key");
  const clientCert = path.join(tmp, "client.pem");
  const clientKey = path.join(tmp, "client.key");
  const csr = path.join(tmp, "client.csr");
  run("openssl", ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", caKey, "-out", ca,
    "-days", "1", "-subj", "/CN=node-e2e-ca"]);
  run("openssl", ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", clientKey, "-out", csr,
    "-subj", "/CN=node-e2e-client"]);
  run("openssl", ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", caKey, "-CAcreateserial",
    "-out", clientCert, "-days", "1"]);
  const tokenPath = path.join(tmp, "token");
  fs.writeFileSync(tokenPath, "node-e2e-secret-token-0123456789\n", { mode: 0o600 });
  const secure = await startGateway(["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca,
    "--auth-token-file", tokenPath]);
  const sbase = `https://${secure.http}`;
  const mtls = ["--cacert", cert, "--cert", clientCert, "--key", clientKey];
  const curlStatus = (extra, route = "/v1/models", client = mtls) => spawnSync("curl", ["-s",
    "-o", "/dev/null", "-w", "%{http_code}", ...client, ...extra, `${sbase}${route}`],
  { encoding: "utf8" }).stdout;
  for (let i = 0; i < 1200 && curlStatus([], "/health") !== "200"; i++) {
    await new Promise((r) => setTimeout(r, 100));
  }
  equal(curlStatus([], "/health"), "200", "mTLS: /health with a client certificate");
  equal(curlStatus([], "/health", ["--cacert", cert]), "000",
    "mTLS: no client certificate, no connection");
  equal(curlStatus([]), "401", "TLS: no token is 401");
  equal(curlStatus(["-H", "Authorization: Bearer wrong-token-0123456789"]), "401",
    "TLS: a wrong token is 401");
  equal(curlStatus(["-H", "Authorization: Bearer node-e2e-secret-token-0123456789"]), "200",
    "TLS: the token is 200");
  const plain = spawnSync("curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time",
    "20", `http://${secure.http}/health`], { encoding: "utf8" });
  check(plain.stdout !== "200", "TLS: plain HTTP is not served", plain.stdout);
  equal(await stop(secure), { code: 0, signal: null }, "the TLS gateway exits 0 on SIGTERM");
}

try {
  await main();
} catch (e) {
  failures++;
  console.error(`FAIL: ${e.stack}`);
} finally {
  for (const child of children) child.kill("SIGKILL");
}
console.log(`${passes} passed, ${failures} failed`);
if (failures > 0) console.error(`logs in ${tmp}`);
process.exit(failures > 0 ? 1 : 0);
