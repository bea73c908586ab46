#!/usr/bin/python3
"""Ctrl-C in `kivi chat`: the first stops the reply being written and the chat goes on
at the prompt; Ctrl-C at the prompt (or a second one during a reply) ends the chat, and
the conversation is still saved with --kv-save.

Runs `kivi chat` on a random-weight model slow enough (a few ms a token) that a reply
of up to 3000 tokens is still being written when SIGINT arrives.
    tests/cli/test_chat_interrupt.py --kivi build/bin/kivi
"""

import argparse
import os
import select
import signal
import subprocess
import sys
import tempfile
import time


def read_some(stream, timeout):
    """Bytes available on `stream` within `timeout` seconds (b"" if none)."""
    r, _, _ = select.select([stream], [], [], timeout)
    return os.read(stream.fileno(), 65536) if r else b""


def wait_for_output(p, timeout=60):
    """Waits for the first bytes of a reply on stdout."""
    end = time.time() + timeout
    got = b""
    while time.time() < end and not got.strip():
        got += read_some(p.stdout, 0.05)
    return got


def chat(kivi, model, extra):
    return subprocess.Popen([kivi, "chat", "-m", model, "--chat-template", "plain", "--threads", "1",
                             "--temp", "1", "--top-k", "0", "--ctx", "4096", *extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)
    print("ok:", what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kivi", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = os.path.join(d, "slow.gguf")
        subprocess.run([a.kivi, "synth", "--layers", "4", "--dim", "512", "--heads", "8", "--kv-heads", "4",
                        "--ffn", "1408", "--vocab", "512", "--ctx", "4096", "--outtype", "f32", "-o", model],
                       check=True, capture_output=True)

        # Ctrl-C during a reply stops it; the next message is answered; a second Ctrl-C
        # during that reply ends the chat, which is saved.
        kv = os.path.join(d, "conv.kv")
        p = chat(a.kivi, model, ["-n", "3000", "--kv-save", kv])
        p.stdin.write(b"hello there\n")
        p.stdin.flush()
        check(wait_for_output(p), "the first reply starts")
        p.send_signal(signal.SIGINT)
        time.sleep(0.3)
        check(p.poll() is None, "the chat goes on after one Ctrl-C")
        p.stdin.write(b"again\n")
        p.stdin.flush()
        check(wait_for_output(p), "the second reply starts")
        p.send_signal(signal.SIGINT)
        time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        err = err.decode()
        check(p.returncode == 0, "two Ctrl-C end the chat with exit 0 (%s)" % err.strip())
        check("[chat: 2 turns" in err, "both turns counted: " + err.strip().replace("\n", " | "))
        check("[conversation saved to" in err and os.path.getsize(kv) > 0, "the conversation is saved")

        # Ctrl-C at the prompt ends the chat and saves it.
        kv2 = os.path.join(d, "prompt.kv")
        p = chat(a.kivi, model, ["-n", "4", "--kv-save", kv2])
        p.stdin.write(b"hi\n")
        p.stdin.flush()
        got = b""
        end = time.time() + 60
        while time.time() < end and b"\n" not in got:
            got += read_some(p.stdout, 0.05)
        check(b"\n" in got, "a short reply ends")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        err = err.decode()
        check(p.returncode == 0, "Ctrl-C at the prompt ends the chat with exit 0")
        check("[chat: 1 turn," in err, "one turn counted: " + err.strip().replace("\n", " | "))
        check(os.path.exists(kv2), "the conversation is saved")
        # It resumes: the saved file is a conversation.
        r = subprocess.run([a.kivi, "chat", "-m", model, "--chat-template", "plain", "--threads", "1",
                            "--ctx", "4096", "-n", "2", "--json", "--kv-load", kv2],
                           input=b"more\n", capture_output=True)
        check(r.returncode == 0 and b'"turn":2' in r.stdout, "the saved chat resumes at turn 2")
    print("1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
