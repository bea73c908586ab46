#!/usr/bin/python3
"""Several processes over MPI (mpirun ... --dist tp) against one process.

Tensor parallelism changes only the order in which the partial sums of wo and w_down
are added, so on every model here greedy text equals the single-process text, logits
agree within 1e-5 of their spread, and two runs on the same ranks give the same bits.
Faults end the whole job with one line from rank 0: a rank count that does not divide
the KV heads, ranks started on different models, options that run in one process
only, a rank killed mid-run.

    tests/dist/test_dist.py --kivi build/bin/kivi --shared ../shared [--quick]

--quick (the sanitizer build) runs one case of each kind; Open MPI's own allocations
held past exit are suppressed by library (lsan_openmpi.supp). Exits 77 (skipped) when
mpirun is missing or the build has no MPI.
"""

import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
# Sanitizer builds: Open MPI keeps some allocations past MPI_Finalize; they are
# suppressed by library (full stacks: its plugins are unloaded before the leak check).
SUPP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lsan_openmpi.supp")
ENV["ASAN_OPTIONS"] = ENV.get("ASAN_OPTIONS", "") + ":fast_unwind_on_malloc=0"
ENV["LSAN_OPTIONS"] = ENV.get("LSAN_OPTIONS", "") + f":suppressions={SUPP}:fast_unwind_on_malloc=0:print_suppressions=0"
FAILED = []


def check(cond, what):
    print(("ok:     " if cond else "FAILED: ") + what, flush=True)
    if not cond:
        FAILED.append(what)


def run(kivi, args, np_=0, stdin=None, timeout=300):
    cmd = [kivi, *args]
    if np_:
        cmd = ["mpirun", "-q", "--oversubscribe", "-np", str(np_), *cmd]
    p = subprocess.run(cmd, input=stdin, capture_output=True, env=ENV, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def logits(kivi, model, prompt, np_, extra, d, dist="tp"):
    out = os.path.join(d, "logits.bin")
    rc, _, err = run(kivi, ["logits", "-m", model, "-p", prompt, "--threads", "1", "-o", out, *extra]
                     + (["--dist", dist] if np_ else []), np_)
    if rc != 0:
        print(err)
        return None
    with open(out, "rb") as f:
        magic, n, v = struct.unpack("<III", f.read(12))
        return np.frombuffer(f.read(), dtype=np.float32).reshape(n, v)


def generate(kivi, model, np_, extra, prompt="Once upon a time", n=48, dist="tp"):
    rc, out, err = run(kivi, ["generate", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0",
                              "--threads", "1", *extra] + (["--dist", dist] if np_ else []), np_)
    return rc, out, err


def same_text(kivi, model, extra, ranks, what, n=48, dist="tp", prompt="Once upon a time"):
    rc, one, err = generate(kivi, model, 0, extra, n=n, prompt=prompt)
    if rc != 0:
        check(False, f"{what}: single process runs ({err.strip()})")
        return
    for np_ in ranks:
        rc, many, err = generate(kivi, model, np_, extra, n=n, dist=dist, prompt=prompt)
        check(rc == 0 and many == one, f"{what}: -np {np_} --dist {dist} greedy text equals one process"
              + ("" if rc == 0 and many == one else f"\n  one:  {one!r}\n  many: {many!r}\n  {err}"))


def close_logits(kivi, model, prompt, extra, ranks, what, d, float_model=None, dist="tp",
                 float_extra=None, share=0.2):
    """Float weights: every logit within 1e-5 of the spread. Block-quantized weights
    (float_model: the same model in F16) quantize each activation row to int8 per
    block: the last bit of a partial sum can move a code by one step, and the cache
    carries that to later positions, so the logits differ by up to ~1e-2 of the
    spread; that must stay a fifth or less (`share`) of what the weight quantization
    itself changes (its difference to float_model; float_extra: to the same model with
    other options, e.g. an f32 cache), and the greedy choice holds wherever the
    top two are further apart than the difference."""
    one = logits(kivi, model, prompt, 0, extra, d)
    base = None
    if float_model or float_extra is not None:
        base = logits(kivi, float_model or model, prompt, 0,
                      extra if float_extra is None else float_extra, d)
    for np_ in ranks:
        many = logits(kivi, model, prompt, np_, extra, d, dist)
        what_np = f"{what} --dist {dist}"
        if one is None or many is None:
            check(False, f"{what_np}: -np {np_} logits computed")
            continue
        spread = max(float((one.max(axis=1) - one.min(axis=1)).min()), 1e-30)
        err = float(np.abs(many - one).max()) / spread
        if base is None:
            check(err <= 1e-5, f"{what_np}: -np {np_} logits within 1e-5 of one process "
                  f"(max error {err:.2e} of the spread)")
            check(np.array_equal(one.argmax(axis=1), many.argmax(axis=1)),
                  f"{what_np}: -np {np_} greedy choice at every position equals one process")
            continue
        quant = float(np.abs(base - one).max()) / spread
        check(err <= share * quant,
              f"{what_np}: -np {np_} logits within {err:.1e} of the spread, at most {share:g} of "
              f"the quantization's own {quant:.1e}")
        top2 = np.sort(one, axis=1)[:, -2:]
        clear = (top2[:, 1] - top2[:, 0]) > 2 * np.abs(many - one).max(axis=1)
        check(np.array_equal(one.argmax(axis=1)[clear], many.argmax(axis=1)[clear]),
              f"{what_np}: -np {np_} greedy choice equals one process wherever it is clear "
              f"({int(clear.sum())} of {len(clear)} positions)")



def start_server(kivi, args, np_=0):
    """Starts kivi serve on a free port; returns (process, base URL) or (process, None)
    when it ended before listening."""
    cmd = [kivi, "serve", *args, "--port", "0", "--threads", "1"]
    if np_:
        cmd = ["mpirun", "-q", "--oversubscribe", "-np", str(np_), *cmd, "--dist", "tp"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    for line in p.stderr:
        text = line.decode(errors="replace")
        if "listening on " in text:
            url = text.split("listening on ")[1].split()[0]
            return p, url
    return p, None


def post(url, path, body, timeout=120):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()


def serve_round(url):
    """Concurrent greedy requests: two prompts with a common prefix of several blocks
    (shared in the pool), a short one, and a streamed chat; then the first prompt again
    (its published prefix mapped). The texts, in order."""
    prefix = "Once upon a time there was a little girl named Lily who loved to play. " * 8
    bodies = [{"prompt": prefix + "One day", "max_tokens": 48, "temperature": 0},
              {"prompt": prefix + "The dog", "max_tokens": 48, "temperature": 0},
              {"prompt": "The cat sat", "max_tokens": 64, "temperature": 0}]
    out = [None] * 4

    def one(i):
        try:
            out[i] = json.loads(post(url, "/v1/completions", bodies[i]))["choices"][0]["text"]
        except Exception as e:  # noqa: BLE001 - reported by the comparison
            out[i] = f"error: {e}"

    def chat():
        try:
            raw = post(url, "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 32,
                        "temperature": 0, "stream": True})
            text = ""
            for line in raw.splitlines():
                if line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0].get("delta", {})
                    text += delta.get("content") or ""
            out[3] = text
        except Exception as e:  # noqa: BLE001
            out[3] = f"error: {e}"

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)] + [threading.Thread(target=chat)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    one(0)
    return out + [out[0]]


def serving(kivi, story, quick):
    """kivi serve over -np 2 --dist tp answers as one process does."""
    for extra in ([["--kv-cache", "kivi2", "-R", "32"]] if quick else
                  [[], ["--kv-cache", "kivi2", "-R", "32"], ["--kv-cache", "int8", "--kv-share", "2"]]):
        args = ["-m", story, "--parallel", "3", "--prefill-chunk", "32", *extra]
        texts = []
        for np_ in (0, 2):
            p, url = start_server(kivi, args, np_)
            texts.append(serve_round(url) if url else [f"no server: exit {p.wait()}"])
            ended, left = end_job(p, lambda: p.send_signal(signal.SIGTERM), f"{kivi} serve -m {story}")
            check(ended is not None and ended < 10 and not left,
                  f"serve {'-np 2 ' if np_ else ''}stops on SIGTERM ({ended} s, {len(left)} left)")
        name = " ".join(extra) or "f32 cache"
        one, many = texts
        ok = one == many and all(t and not t.startswith("error") for t in one) and one[0] == one[4]
        check(ok, f"serve -np 2 --dist tp ({name}): four concurrent requests and a repeat answer as one "
                  f"process does ({many[0][:60] if many else ''!r})")
    rc, _, err = run(kivi, ["serve", "-m", story, "--port", "0", "--threads", "1", "--dist", "cp"], 2, timeout=60)
    check(rc == 1 and "--dist tp only" in err and err.count("error") == 1,
          f"serve --dist cp is refused with one line ({err.strip()[-200:]})")


def end_job(p, act, pattern):
    """Runs act() (a signal to the job or to one rank) and waits for mpirun to end: the
    seconds it took (None: it did not end in 20 s and was killed) and the processes
    matching `pattern` still running half a second later."""
    t0 = time.time()
    act()
    try:
        p.wait(timeout=20)
        ended = time.time() - t0
    except subprocess.TimeoutExpired:
        p.kill()
        ended = None
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", pattern], capture_output=True).stdout.split()
    return ended, left

def faults(kivi, story, d):
    def one_line(err):
        return len([l for l in err.splitlines() if l.strip()]) == 1

    rc, out, err = generate(kivi, story, 3, [])
    check(rc != 0 and one_line(err) and "4 KV heads" in err and "2, 4" in err,
          f"-np 3 on 4 KV heads: one line naming the rank counts that fit ({err.strip()!r})")
    rc, out, err = run(kivi, ["generate", "-m", story, "-p", "x", "-n", "4", "--threads", "1"], 2)
    check(rc != 0 and one_line(err) and "without --dist" in err,
          f"-np 2 without --dist: one line ({err.strip()!r})")
    rc, out, err = run(kivi, ["info", "-m", story], 2)
    check(rc != 0 and one_line(err) and "runs in one process" in err,
          f"info under mpirun: one line ({err.strip()!r})")
    # KV files under cp: every rank saves its shard of the positions (here over three
    # shards: full, partly filled, empty); the follow-up continues as the uninterrupted
    # run on the same ranks does. Another layout or one process is refused.
    long_prompt = "Once upon a time there was a little girl named Lily who loved to play. " * 8
    kv = ["--kv-cache", "kivi2", "-R", "32"]
    saved = os.path.join(d, "cp4.kv")
    rc, _, err = generate(kivi, story, 4, kv + ["--kv-save", saved], prompt=long_prompt, n=4, dist="cp")
    rc1, follow, err1 = generate(kivi, story, 4, kv + ["--kv-load", saved], prompt=" and then", n=60, dist="cp")
    rc2, whole, err2 = generate(kivi, story, 4, kv, prompt=long_prompt + " and then", n=60, dist="cp")
    check(rc == rc1 == rc2 == 0 and follow == whole and all(os.path.exists(saved + s) for s in ["", ".rank1", ".rank3"]),
          f"--kv-save/--kv-load under --dist cp=4: the follow-up equals the uninterrupted run "
          f"({(err + err1 + err2).strip()[-200:]})")
    rc, _, err = generate(kivi, story, 0, kv + ["--kv-load", saved], prompt="x")
    check(rc == 1 and one_line(err) and "rank 0 of --dist cp=4" in err,
          f"a cp shard's file in one process: one line ({err.strip()!r})")
    rc, _, err = generate(kivi, story, 2, kv + ["--kv-load", saved], prompt="x", dist="cp")
    check(rc == 1 and one_line(err) and "this is rank 0 of cp=2" in err,
          f"a cp=4 shard's file under cp=2: one line ({err.strip()!r})")
    # KV files under tp: one per rank; another layout is refused with one line.
    saved = os.path.join(d, "tp2.kv")
    rc, out, err = generate(kivi, story, 2, ["--kv-cache", "kivi2", "-R", "32", "--kv-save", saved])
    rc1, out1, err1 = run(kivi, ["generate", "-m", story, "-p", "x", "--threads", "1", "--kv-cache", "kivi2", "-R", "32",
                                 "--kv-load", saved])
    check(rc == 0 and rc1 != 0 and one_line(err1) and os.path.exists(saved + ".rank1"),
          f"a tp=2 KV file loaded by one process: refused ({err1.strip()!r})")
    rc4, out4, err4 = generate(kivi, story, 4, ["--kv-cache", "kivi2", "-R", "32", "--kv-load", saved],
                               prompt=" and then")
    check(rc4 != 0 and one_line(err4), f"a tp=2 KV file loaded by 4 ranks: refused ({err4.strip()!r})")
    rc, out, err = run(kivi, ["generate", "-m", story, "-p", "x", "--threads", "1", "--dist", "tp=3"], 2)
    check(rc != 0 and one_line(err) and "tp=3" in err, f"--dist tp=3 on 2 ranks: one line ({err.strip()!r})")
    rc, out, err = run(kivi, ["generate", "-m", story, "-p", "x", "--threads", "1", "--dist", "pp"], 2)
    check(rc != 0 and one_line(err) and "'pp'" in err, f"--dist pp: one line ({err.strip()!r})")
    rc, out, err = generate(kivi, story, 4, ["--ctx", "64"], dist="cp")
    check(rc != 0 and one_line(err) and "fewer than the ranks" in err,
          f"--dist cp=4 on a context of one block: one line ({err.strip()!r})")
    rc, out, err = generate(kivi, story, 2, ["--context-overflow", "shift"], dist="cp")
    check(rc != 0 and one_line(err) and "--context-overflow" in err,
          f"--dist cp with a context overflow policy: refused ({err.strip()!r})")
    # Different models behind the same command line: the model fingerprint differs.
    other = os.path.join(d, "other.bin")
    with open(story, "rb") as f:
        data = bytearray(f.read())
    data[-4:] = b"\0\0\0\0"
    with open(other, "wb") as f:
        f.write(data)
    shutil.copy(os.path.join(os.path.dirname(story), "tok512.bin"), os.path.join(d, "tok512.bin"))
    cmd = ["mpirun", "-q", "--oversubscribe",
           "-np", "1", "-x", f"KIVI_MODEL={story}", kivi, "generate", "-p", "x", "--threads", "1", "--dist", "tp", ":",
           "-np", "1", "-x", f"KIVI_MODEL={other}", kivi, "generate", "-p", "x", "--threads", "1", "--dist", "tp"]
    p = subprocess.run(cmd, capture_output=True, env=ENV, timeout=120)
    err = p.stderr.decode()
    check(p.returncode != 0 and one_line(err) and "different model files" in err and "rank 1" in err,
          f"ranks on different models: one line naming rank 1 ({err.strip()!r})")
    cmd = ["mpirun", "-q", "--oversubscribe", "-np", "1", kivi, "generate", "-m", story, "-p", "x", "--dist", "tp", ":",
           "-np", "1", kivi, "generate", "-m", story, "-p", "y", "--dist", "tp"]
    p = subprocess.run(cmd, capture_output=True, env=ENV, timeout=120)
    err = p.stderr.decode()
    check(p.returncode != 0 and one_line(err) and "different command lines" in err,
          f"ranks with different options: one line ({err.strip()!r})")

    # Ctrl-C (SIGINT to mpirun) during a chat reply ends the job.
    p = subprocess.Popen(["mpirun", "-q", "--oversubscribe", "-np", "2", kivi, "chat", "-m", story, "--chat-template",
                          "plain", "-n", "-1", "--ignore-eos", "--context-overflow", "shift", "--threads", "1",
                          "--dist", "tp"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    p.stdin.write(b"Tell me a story\n")
    p.stdin.flush()
    time.sleep(2.0)
    ended, left = end_job(p, lambda: p.send_signal(signal.SIGINT), f"{kivi} chat -m {story}")
    check(ended is not None and ended < 10 and not left,
          f"Ctrl-C during a chat under mpirun ends the job (after {ended} s, {len(left)} left)")

    # A rank killed mid-run ends the job within seconds, leaving no process behind.
    p = subprocess.Popen(["mpirun", "-q", "--oversubscribe", "-np", "2", kivi, "generate", "-m", story,
                          "-p", "Once", "-n", "-1", "--ignore-eos", "--context-overflow", "shift",
                          "--threads", "1", "--dist", "tp"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    time.sleep(0.2)
    victim = None
    for _ in range(100):
        kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True).stdout.split()
        if len(kids) >= 2:
            victim = int(kids[-1])
            break
        time.sleep(0.1)
    time.sleep(1.0)  # decoding by now
    check(victim is not None, "both ranks started")
    if victim is None:
        p.kill()
        return
    ended, left = end_job(p, lambda: os.kill(victim, signal.SIGKILL),
                          f"{kivi} generate -m {story} -p Once -n -1")
    check(ended is not None and ended < 10 and p.returncode != 0,
          f"a killed rank ends the job (after {ended} s, exit {p.returncode})")
    check(not left, f"no rank left running ({left})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kivi", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    kivi = os.path.abspath(a.kivi)
    if not shutil.which("mpirun"):
        print("skipped: mpirun not found (scripts/setup.sh installs Open MPI)")
        return 77
    version = subprocess.run([kivi, "--version"], capture_output=True, text=True).stdout
    if "MPI" not in version or "without MPI" in version:
        print(f"skipped: this build has no MPI ({version.strip()})")
        return 77
    story = os.path.join(os.path.abspath(a.shared), "models", "stories260K.bin")
    quick = a.quick
    ranks = [2] if quick else [2, 4]
    with tempfile.TemporaryDirectory() as d:
        # The real model (llama2.c, f32 weights, 8 query and 4 KV heads): text.
        caches = [[]] if quick else [[], ["--kv-cache", "f16"], ["--kv-cache", "int8"],
                                     ["--kv-cache", "kivi2", "-R", "32"], ["--kv-cache", "kivi4", "--key-rope", "pre", "-R", "32"]]
        for extra in caches:
            same_text(kivi, story, extra, ranks, "stories260K " + (" ".join(extra) or "f32 cache"))
        if not quick:
            for g in ["tensor", "token"]:
                same_text(kivi, story, ["--kv-cache", "int8", "--int8-granularity", g], [2],
                          f"stories260K int8 per {g} (scales over every rank's heads)")
            same_text(kivi, story, ["--kv-cache", "kivi2", "-R", "32", "--ctx", "256", "--context-overflow", "window"],
                      [2], "stories260K kivi2, window policy past the context", n=400)
            same_text(kivi, story, ["--kv-cache", "f16", "--ctx", "256", "--context-overflow", "shift"],
                      [2], "stories260K f16, context shift", n=400)
            same_text(kivi, story, ["--kv-share", "2"], [2], "stories260K cross-layer sharing")
            same_text(kivi, story, ["--kv-cache", "kivi2", "-R", "32", "--sparse", "quest", "--sparse-block", "32",
                                    "--sparse-budget", "64", "--sparse-local", "64"], [2, 4],
                      "stories260K kivi2 with block-sparse attention", n=300)
        close_logits(kivi, story, "Once upon a time there was a little dog", [], ranks, "stories260K", d)
        # KV files under tp: every rank saves its heads; a follow-up from them continues
        # as one process's follow-up from its own file.
        one_kv, tp_kv = os.path.join(d, "one.kv"), os.path.join(d, "tp.kv")
        for extra in ([["--kv-cache", "kivi2", "-R", "32"]] if quick else
                      [["--kv-cache", "kivi2", "-R", "32"], ["--kv-cache", "int8", "--int8-granularity", "tensor"]]):
            rc1, _, e1 = generate(kivi, story, 0, extra + ["--kv-save", one_kv], n=8)
            rc2, _, e2 = generate(kivi, story, 2, extra + ["--kv-save", tp_kv], n=8)
            rc3, one, e3 = generate(kivi, story, 0, extra + ["--kv-load", one_kv], prompt=" and then", n=40)
            rc4, many, e4 = generate(kivi, story, 2, extra + ["--kv-load", tp_kv], prompt=" and then", n=40)
            check(rc1 == rc2 == rc3 == rc4 == 0 and one == many and "and then" in one,
                  f"--kv-save/--kv-load under -np 2 --dist tp ({' '.join(extra)}): the follow-up equals "
                  f"one process's ({(e2 + e4).strip()[-200:]})")
        # Standard input reaches every rank through rank 0.
        rc, one, _ = run(kivi, ["generate", "-m", story, "-p", "-", "-n", "32", "--temp", "0", "--threads", "1"],
                         0, stdin=b"The dog")
        rc2, many, err = run(kivi, ["generate", "-m", story, "-p", "-", "-n", "32", "--temp", "0", "--threads", "1",
                                    "--dist", "tp"], 2, stdin=b"The dog")
        check(rc == 0 and rc2 == 0 and one == many and one.startswith("The dog"),
              "a prompt on standard input: -np 2 equals one process")
        # Chat: rank 0 reads the lines.
        lines = b"Hello there\nTell me a story\n"
        chat = ["chat", "-m", story, "--chat-template", "plain", "-n", "24", "--temp", "0", "--threads", "1"]
        rc, one, _ = run(kivi, chat, 0, stdin=lines)
        rc2, many, err = run(kivi, chat + ["--dist", "tp"], 2, stdin=lines)
        check(rc == 0 and rc2 == 0 and one == many and len(one) > 20, "chat of two turns: -np 2 equals one process")
        # Sampling with a random seed: every rank draws rank 0's tokens (the text is whole).
        rc, out, err = run(kivi, ["generate", "-m", story, "-p", "Once", "-n", "40", "--seed", "-1", "--threads", "1",
                                  "--dist", "tp", "--json"], 2)
        check(rc == 0 and '"generated_tokens": 40' in out.replace(":40", ": 40"),
              f"random seed under -np 2 runs to the end ({err.strip()[-200:]})")
        # Perplexity: the same value, and the KL divergence to one process's logits ~ 0.
        text = os.path.join(a.shared, "data", "tinytales.txt")
        short = os.path.join(d, "short.txt")
        with open(text, encoding="utf-8") as f:
            open(short, "w", encoding="utf-8").write(f.read()[:3000])
        base = os.path.join(d, "base.lp")
        rc, one, err = run(kivi, ["perplexity", "-m", story, "-f", short, "--threads", "1", "--json",
                                  "--save-logits", base])
        rc2, many, err2 = run(kivi, ["perplexity", "-m", story, "-f", short, "--threads", "1", "--json",
                                     "--kld-base", base, "--dist", "tp"], 2)
        ok = rc == 0 and rc2 == 0
        if ok:
            o, m = json.loads(one), json.loads(many)
            ok = abs(o["ppl"] - m["ppl"]) <= 1e-5 * o["ppl"] and m["kld_max"] < 1e-6 and m["top1_agree"] >= 99.99
            print(f"        ppl {o['ppl']:.6f} vs {m['ppl']:.6f}, kld max {m['kld_max']:.2e}")
        check(ok, f"perplexity: -np 2 equals one process, KL to its logits ~ 0 ({err2.strip()[-300:]})")

        # Context parallelism: each rank holds a shard of the positions (stories260K's 512
        # over 4 ranks: 128 each), so prompts and generations cross shard boundaries, and
        # a prefill batch straddles them.
        long_prompt = "Once upon a time there was a little girl named Lily who loved to play. " * 12
        cp_caches = [[]] if quick else [[], ["--kv-cache", "f16"], ["--kv-cache", "int8", "--int8-granularity", "tensor"],
                                        ["--kv-cache", "kivi2", "-R", "32"], ["--kv-cache", "kivi4", "--key-rope", "pre", "-R", "32"],
                                        ["--kv-share", "2"]]
        for extra in cp_caches:
            name = "stories260K " + (" ".join(extra) or "f32 cache")
            same_text(kivi, story, extra, ranks, name, n=300, dist="cp")
            if not quick:
                # f16, int8 and KIVI codes move with the last bit of a key (the shards'
                # merge rounds differently): compared with what the format itself changes.
                stored = "--kv-cache" in extra
                close_logits(kivi, story, long_prompt, extra, [4], name + ", a prompt over 2 shards", d,
                             dist="cp", float_extra=[] if stored else None, share=0.5)
        close_logits(kivi, story, long_prompt, [], ranks, "stories260K", d, dist="cp")
        if not quick:
            same_text(kivi, story, ["--kv-cache", "kivi2", "-R", "32"], [4], "stories260K kivi2", n=300,
                      dist="tp=2,cp=2")
            close_logits(kivi, story, long_prompt, [], [4], "stories260K", d, dist="tp=2,cp=2")
        # Block-sparse attention selects per shard within budget / N: with a budget over
        # every block it is dense attention; with a small one its perplexity stays near
        # one process's at the same total budget.
        sparse = ["--kv-cache", "kivi2", "-R", "32", "--sparse", "quest", "--sparse-block", "32",
                  "--sparse-local", "64"]
        rc1, dense, _ = generate(kivi, story, 0, ["--kv-cache", "kivi2", "-R", "32", "--ignore-eos"], n=400)
        rc2, sel, err = generate(kivi, story, 2, sparse + ["--sparse-budget", "512", "--ignore-eos"], n=400,
                                 dist="cp")
        check(rc1 == rc2 == 0 and dense == sel and len(dense) > 800,
              f"--dist cp --sparse with a budget over every block: dense attention's text ({err.strip()[-200:]})")
        ppls = []
        for np_ in (0, 2):
            rc3, out, err = run(kivi, ["perplexity", "-m", story, "-f", text, "--threads", "1", "--json",
                                       *sparse, "--sparse-budget", "128"] + (["--dist", "cp"] if np_ else []), np_)
            ppls.append(json.loads(out)["ppl"] if rc3 == 0 else None)
        check(None not in ppls and abs(ppls[1] - ppls[0]) < 0.03 * ppls[0],
              f"--dist cp=2 --sparse-budget 128 (64 per shard): perplexity {ppls[1]} near one process's {ppls[0]}")
        rc3, _, err = generate(kivi, story, 4, sparse + ["--sparse-budget", "64"], dist="cp")
        check(rc3 == 1 and "less than one block" in err and err.count("error") == 1,
              f"--dist cp=4 with 16 tokens of budget per shard: one line ({err.strip()[-200:]})")
        rc2, many, err2 = run(kivi, ["perplexity", "-m", story, "-f", short, "--threads", "1", "--json",
                                     "--kld-base", base, "--dist", "cp"], 2)
        ok = rc == 0 and rc2 == 0
        if ok:
            o, m = json.loads(one), json.loads(many)
            ok = abs(o["ppl"] - m["ppl"]) <= 1e-5 * o["ppl"] and m["kld_max"] < 1e-6
            print(f"        ppl {o['ppl']:.6f} vs {m['ppl']:.6f}, kld max {m['kld_max']:.2e}")
        check(ok, f"perplexity --dist cp: equals one process ({err2.strip()[-300:]})")

        # Random-weight models of each architecture, F16 and Q4_K, at a shape whose
        # column slices hold whole 256-value blocks at 4 ranks.
        models = []
        for arch, shape in [("llama", ["--dim", "1024", "--heads", "16"]),
                            ("qwen2", ["--dim", "1024", "--heads", "16"]),
                            ("qwen3", ["--dim", "512", "--heads", "16", "--head-dim", "64"])]:
            path = os.path.join(d, f"{arch}.gguf")
            subprocess.run([kivi, "synth", "--arch", arch, "--layers", "2", *shape, "--kv-heads", "4",
                            "--ffn", "1024", "--vocab", "512", "--ctx", "512", "-o", path],
                           check=True, capture_output=True)
            models.append((arch + " F16", path, None))
            if arch == "llama" or not quick:
                q = os.path.join(d, f"{arch}-q4k.gguf")
                subprocess.run([kivi, "quantize", path, q, "q4_k_m"], check=True, capture_output=True)
                models.append((arch + " Q4_K_M", q, path))
            if quick:
                break
        swa = os.path.join(d, "swa.gguf")
        subprocess.run([kivi, "synth", "--layers", "2", "--dim", "256", "--heads", "8", "--kv-heads", "4",
                        "--ffn", "512", "--vocab", "512", "--ctx", "512", "--sliding-window", "16",
                        "--sliding-window-pattern", "2", "-o", swa], check=True, capture_output=True)
        models.append(("llama F16 sliding-window layers", swa, None))
        # A mixture of experts (every expert split over the ranks), Gemma 3 (post-norms,
        # windowed layers with their own RoPE), Phi-3 (fused QKV and gate-up views) and
        # gpt-oss (sinks and expert biases sliced per rank, output biases added once).
        for arch, opts in [("qwen3moe", ["--head-dim", "32", "--experts", "8", "--experts-used", "2"]),
                           ("gemma3", ["--head-dim", "32", "--rope-theta", "1000000", "--sliding-window", "16",
                                       "--sliding-window-pattern", "2"]),
                           ("phi3", []),
                           ("gpt-oss", ["--head-dim", "32", "--experts", "8", "--experts-used", "2",
                                        "--rope-scaling", "yarn", "--sliding-window", "16"])]:
            path = os.path.join(d, f"{arch}.gguf")
            subprocess.run([kivi, "synth", "--arch", arch, "--layers", "2", "--dim", "256", "--heads", "8",
                            "--kv-heads", "4", "--ffn", "1024", "--vocab", "512", "--ctx", "512", *opts,
                            "-o", path], check=True, capture_output=True)
            windowed = arch in ("gemma3", "gpt-oss")
            models.append((f"{arch} F16" + (" sliding-window layers" if windowed else ""), path, None))
            if quick:
                break
        prompt = "the quick brown fox jumps over the lazy dog " * 3
        for what, path, float_model in models:
            for extra in ([[]] if quick else [[], ["--kv-cache", "kivi2", "-R", "32"]]):
                name = what + (" " + " ".join(extra) if extra else "")
                close_logits(kivi, path, prompt, extra, ranks, name, d, float_model)
                same_text(kivi, path, extra, ranks, name, n=40)
                if "sliding" not in what:
                    # ~300 tokens over shards of 256 (2 ranks) or 128 (4 ranks).
                    close_logits(kivi, path, prompt * 3, extra + ["--ctx", "512"], ranks, name, d,
                                 float_model, dist="cp",
                                 float_extra=["--ctx", "512"] if extra and not float_model else None)
        # The same bits every run.
        l1 = logits(kivi, models[0][1], prompt, ranks[-1], [], d)
        l2 = logits(kivi, models[0][1], prompt, ranks[-1], [], d)
        check(l1 is not None and l2 is not None and np.array_equal(l1, l2),
              f"-np {ranks[-1]}: two runs give the same bits")
        # Q4_K column slices need whole blocks: 8 ranks would cut them.
        if not quick:
            rc, out, err = run(kivi, ["generate", "-m", os.path.join(d, "qwen3-q4k.gguf"), "-p", "x", "--threads", "1",
                                      "--dist", "tp"], 4)
            check(rc == 0, f"qwen3 Q4_K_M at 4 ranks runs ({err.strip()[-200:]})")
        serving(kivi, story, quick)
        # kivi bench: the same greedy tokens per format, each rank half the KV bytes.
        args = ["bench", "-m", story, "--kv-cache", "kivi2,int8", "-n", "48", "--ctx-fill", "200", "--json",
                "--threads", "1"]
        rc, one, _ = run(kivi, args)
        rc2, many, err = run(kivi, args + ["--dist", "tp"], 2)
        ok = rc == 0 and rc2 == 0
        if ok:
            o, m = json.loads(one), json.loads(many)
            ok = m["ranks"] == 2 and all(
                x["format"] == y["format"] and x["token_match"] == y["token_match"] and 2 * y["kv_bytes"] == x["kv_bytes"]
                for x, y in zip(o["results"], m["results"]))
        check(ok, f"bench -np 2 --dist tp: the same token match per format, half the KV bytes per rank "
                  f"({err.strip()[-200:]})")
        # Under cp rank 0 holds the first shard (256 of the 252 + 48 + 1 positions here
        # is all of them but the last 45: the f32 bytes scale by the positions held).
        args = ["bench", "-m", story, "--kv-cache", "int8", "-n", "48", "--ctx-fill", "300", "--json",
                "--threads", "1"]
        rc, one, _ = run(kivi, args)
        rc2, many, err = run(kivi, args + ["--dist", "cp"], 2)
        rc3, rand, err3 = run(kivi, args + ["--ctx-fill-random", "--dist", "cp"], 2)
        ok = rc == rc2 == rc3 == 0
        if ok:
            o, m = json.loads(one)["results"], json.loads(many)["results"]
            held, total = 256, m[0]["ctx"] + 48
            ok = (m[0]["kv_bytes"] * total == o[0]["kv_bytes"] * held and m[1]["token_match"] >= 90
                  and len(json.loads(rand)["results"]) == 2)
            print(f"        int8 token match: one process {o[1]['token_match']}%, cp=2 {m[1]['token_match']}%")
        check(ok, f"bench -np 2 --dist cp (text and random fills): rank 0's shard, greedy tokens as one "
                  f"process's ({(err + err3).strip()[-200:]})")
        faults(kivi, story, d)
    if FAILED:
        print(f"{len(FAILED)} check(s) failed")
        return 1
    print("all distributed checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
