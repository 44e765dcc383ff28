// llama.cpp's own speed on a GGUF file, on this machine, through the prebuilt llama.cpp that
// the npm package node-llama-cpp ships (bench/llama_cpp/run.sh installs it): the same-machine
// baseline for decode_bench / sparse_decode_bench / generate's prompt figures.
//
// Per file and thread count, `rounds` times: a `prompt`-token prompt of fixed ids (3, 4, ...,
// as decode_bench uses) evaluated in one batch (prompt tok/s), then `tokens` greedy decode steps
// (decode tok/s = steps / their time; the first step, which follows the prompt, is excluded).
// Prints one line per round and the medians, logfmt.
import { getLlama } from "node-llama-cpp";

const args = process.argv.slice(2);
const opt = { threads: [1, 2], tokens: 32, prompt: 64, rounds: 3, models: [] };
for (let i = 0; i < args.length; ++i) {
  const a = args[i], v = args[i + 1];
  if (a === "--model") { opt.models.push(v); ++i; }
  else if (a === "--threads") { opt.threads = v.split(",").map(Number); ++i; }
  else if (a === "--tokens") { opt.tokens = Number(v); ++i; }
  else if (a === "--prompt") { opt.prompt = Number(v); ++i; }
  else if (a === "--rounds") { opt.rounds = Number(v); ++i; }
  else { console.error(`usage: decode.mjs --model M.gguf [--model ...] [--threads 1,2] [--tokens 32] [--prompt 64] [--rounds 3]; unknown ${a}`); process.exit(2); }
}
if (opt.models.length === 0 || opt.threads.some((t) => !(t >= 1)) || !(opt.tokens >= 2) ||
    !(opt.prompt >= 1) || !(opt.rounds >= 1)) {
  console.error("decode.mjs: need --model, threads >= 1, tokens >= 2, prompt >= 1, rounds >= 1");
  process.exit(2);
}
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
const now = () => Number(process.hrtime.bigint()) / 1e9;

const llama = await getLlama({ gpu: false, build: "never", logLevel: "error", maxThreads: Math.max(...opt.threads) });
for (const path of opt.models) {
  const model = await llama.loadModel({ modelPath: path, gpuLayers: 0, useMmap: true });
  for (const nt of opt.threads) {
    const ctx = await model.createContext({ contextSize: opt.prompt + opt.tokens + 8, batchSize: Math.max(opt.prompt, 8), threads: { ideal: nt, min: nt }, sequences: 1 });
    const pp = [], tg = [];
    for (let r = 0; r < opt.rounds; ++r) {
      const seq = ctx.getSequence();
      const prompt = Array.from({ length: opt.prompt }, (_, p) => 3 + p);
      const t0 = now();
      await seq.evaluateWithoutGeneratingNewTokens(prompt.slice(0, -1));
      const t1 = now();
      let steps = 0, tStart = 0;
      for await (const _tok of seq.evaluate([prompt[prompt.length - 1]], { temperature: 0 })) {
        if (steps === 0) tStart = now();  // the step that ends the prompt is not a decode step
        if (++steps > opt.tokens) break;
      }
      const t2 = now();
      pp.push((opt.prompt - 1) / (t1 - t0));
      tg.push(opt.tokens / (t2 - tStart));
      console.log(`llama_cpp_round model=${path} threads=${nt} round=${r} prompt_tok_s=${pp.at(-1).toFixed(2)} decode_tok_s=${tg.at(-1).toFixed(2)}`);
      seq.dispose();
    }
    console.log(`llama_cpp model=${path} threads=${nt} prompt_tokens=${opt.prompt} decode_tokens=${opt.tokens} rounds=${opt.rounds} prompt_tok_s=${median(pp).toFixed(2)} decode_tok_s=${median(tg).toFixed(2)}`);
    await ctx.dispose();
  }
  await model.dispose();
}
