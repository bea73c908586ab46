// Decode speed of llama.cpp itself (node-llama-cpp 3.22.1, prebuilt CPU binaries), for
// side-by-side runs with `kivi generate` (scripts/bench-vs-llamacpp.sh).
// Usage: node llamacpp_decode_speed.mjs MODEL.gguf N THREADS ID,ID,...
// Feeds the prompt ids, then decodes N tokens greedily; prints {"prompt_ms", "decode_tps"}
// where decode_tps counts the N - 1 tokens after the first (the first one's time
// includes the prompt), as `kivi generate` reports decode speed.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, nText, threadsText, idsText] = process.argv.slice(2);
const n = Number(nText);
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath});
const context = await model.createContext({contextSize: 512, threads: Number(threadsText)});
const sequence = context.getSequence();
const t0 = performance.now();
let t1 = 0;
let count = 0;
for await (const t of sequence.evaluate(idsText.split(",").map(Number), {temperature: 0})) {
  if (++count === 1) t1 = performance.now();
  if (count >= n) break;
}
const t2 = performance.now();
console.log(JSON.stringify({prompt_ms: t1 - t0, decode_tps: (count - 1) / ((t2 - t1) / 1000)}));
process.exit(0);
