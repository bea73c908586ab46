// Greedy decoding with llama.cpp itself, through the npm package node-llama-cpp (3.22.1,
// installed with `npm install --ignore-scripts node-llama-cpp@3.22.1`; it ships prebuilt
// CPU binaries). Usage: node llamacpp_greedy.mjs MODEL.gguf N ID,ID,... [noflash]
// Feeds the prompt token ids as given (no tokenizer involved) and prints
// {"tokens": [the N greedy token ids]}. One thread: the ids do not depend on it, and
// llama.cpp's spinning workers slow to a crawl on a machine busy with other work.
// noflash: attention without llama.cpp's CPU flash-attention kernel, whose softmax and
// value sums run in F16 (the other path sums in F32).
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const [modelPath, nText, idsText, mode] = process.argv.slice(2);
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath});
const context = await model.createContext({contextSize: 512, threads: 1,
                                           flashAttention: mode !== "noflash"});
const sequence = context.getSequence();
const tokens = [];
for await (const t of sequence.evaluate(idsText.split(",").map(Number), {temperature: 0})) {
  tokens.push(t);
  if (tokens.length >= Number(nText)) break;
}
console.log(JSON.stringify({tokens}));
process.exit(0);
