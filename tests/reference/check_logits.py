#!/usr/bin/python3
"""Compare the engine's full-precision logits with the numpy reference.

For every prompt and every engine mode (prefill, stream, no-cache) this runs
    KIVI logits -m MODEL -t TOK -p PROMPT --mode MODE --json
and checks that
  * the engine's token ids equal the reference tokenizer's encode(prompt, bos=True),
  * max |engine logit - reference logit| <= --tol (default 1e-4) at every position.
Besides the short built-in prompts, a long prompt (the first --long-chars characters
of the text file, 509 tokens with the default files) checks late RoPE positions; it is
run in prefill and stream modes only, because the engine's no-cache mode recomputes
every prefix and takes ~20 s there (--long-no-cache adds it; --long-chars 0 skips it).
Exit status 0 when everything agrees, 1 otherwise.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as ref  # noqa: E402

DEFAULT_KIVI = os.path.join(ref.REPO_ROOT, "build", "bin", "kivi")
DEFAULT_PROMPTS = [
    "Once upon a time",
    "Lily saw a café 🐱 and said: \"Hi!\"",
    "The little dog ran to the park. He found a big stick and played with his friend Tom "
    "until the sun went down.\nThen they went home, happy and tired.",
]
MODES = ("prefill", "stream", "no-cache")


def run_engine(kivi, model, tokenizer, prompt, mode):
    cmd = [kivi, "logits", "-m", model, "-t", tokenizer, "-p", prompt, "--mode", mode, "--json"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise RuntimeError("engine failed (exit %d): %s\n%s"
                           % (r.returncode, " ".join(cmd), r.stderr.decode(errors="replace")))
    return json.loads(r.stdout.decode("utf-8"))


def main():
    ap = argparse.ArgumentParser(description="engine logits vs numpy reference")
    ap.add_argument("--kivi", default=DEFAULT_KIVI, help="engine binary")
    ref.add_path_args(ap)
    ap.add_argument("-p", "--prompt", action="append", help="prompt (repeatable; default: built-in list)")
    ap.add_argument("--mode", action="append", choices=MODES, help="engine mode (repeatable; default: all)")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--long-chars", type=int, default=1130,
                    help="length of the long prompt in characters (0: none; default 1130)")
    ap.add_argument("--long-no-cache", action="store_true",
                    help="also run the long prompt in no-cache mode (slow)")
    a = ref.resolve_paths(ap.parse_args())

    model = ref.load_model(a.model)
    tok = ref.load_tokenizer(a.tokenizer, model.vocab_size)
    modes = a.mode or list(MODES)
    if a.prompt:
        jobs = [(p, modes) for p in a.prompt]
    else:
        jobs = [(p, modes) for p in DEFAULT_PROMPTS]
        if a.long_chars > 0:
            long_prompt = ref.read_text(a.text)[:a.long_chars]
            if len(tok.encode(long_prompt, bos=True)) > model.seq_len:
                raise SystemExit("--long-chars %d gives more than seq_len tokens" % a.long_chars)
            jobs.append((long_prompt, [m for m in modes if m != "no-cache" or a.long_no_cache]))
    failures = []
    t0 = time.time()
    print("%-10s %-44s %6s %12s %5s" % ("mode", "prompt", "tokens", "max|diff|", "worst"))
    for prompt, prompt_modes in jobs:
        ids = tok.encode(prompt, bos=True)
        want = ref.forward_logits(model, ids)
        short = prompt.replace("\n", "\\n")
        short = short if len(short) <= 42 else short[:39] + "..."
        for mode in prompt_modes:
            try:
                out = run_engine(a.kivi, a.model, a.tokenizer, prompt, mode)
            except Exception as e:  # engine missing or failing
                failures.append("%s %r: %s" % (mode, prompt, e))
                print("%-10s %-44s ERROR %s" % (mode, short, str(e).splitlines()[0]))
                continue
            eng_ids = [int(t) for t in out.get("tokens", [])]
            if eng_ids != ids:
                failures.append("%s %r: token ids differ\n  engine    %s\n  reference %s"
                                % (mode, prompt, eng_ids, ids))
                print("%-10s %-44s TOKEN MISMATCH" % (mode, short))
                continue
            got = np.asarray(out["logits"], dtype=np.float64)
            if got.shape != want.shape:
                failures.append("%s %r: logits shape %s, expected %s"
                                % (mode, prompt, got.shape, want.shape))
                print("%-10s %-44s SHAPE MISMATCH %s" % (mode, short, got.shape))
                continue
            per_pos = np.abs(got - want).max(axis=1)
            worst = int(per_pos.argmax())
            ok = bool(np.all(per_pos <= a.tol))
            print("%-10s %-44s %6d %12.3e %5d%s"
                  % (mode, short, len(ids), per_pos[worst], worst, "" if ok else "  FAIL"))
            if not ok:
                bad = np.nonzero(per_pos > a.tol)[0]
                failures.append("%s %r: max |diff| %.3e at position %d exceeds %.1e (%d positions over)"
                                % (mode, prompt, per_pos[worst], worst, a.tol, bad.size))
    print("time %.1f s" % (time.time() - t0))
    if failures:
        print("\nFAILED (%d):" % len(failures))
        for f in failures:
            print("  " + f)
        return 1
    print("OK: token ids identical and all logits within %.1e" % a.tol)
    return 0


if __name__ == "__main__":
    sys.exit(main())
