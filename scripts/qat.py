#!/usr/bin/python3
"""Quantization-aware fine-tuning of a llama2.c model for a KIVI KV cache, data-free.

No training text is needed (LLM-QAT, Liu et al. 2023, Sec. 2.1): sequences sampled from the
original model by the engine are the data, and the loss is the KL divergence from the original
model's full-precision next-token distributions to the student's, whose attention reads a KV
cache fake-quantized exactly as a streaming kivi.cpp cache holds it at every position
(kivi.qat). An optional second term keeps the student's full-precision outputs close too.
The result is a llama2.c checkpoint for `kivi perplexity --kv-cache kivi2`.

    PYTHONPATH=build/python /usr/bin/python3 scripts/qat.py --out qat/stories260K_kivi2.bin

With --eval-text the original and the fine-tuned model are scored at the end with
kivi.perplexity (f32 and the trained cache format); that text is never used for training.
"""

import argparse
import copy
import json
import math
import os
import shutil
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if not any(os.path.isfile(os.path.join(p, "kivi", "__init__.py")) for p in sys.path if p):
    sys.path.insert(0, os.path.join(ROOT, "build", "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kivi  # noqa: E402
from kivi.llama import Llama  # noqa: E402
from kivi.qat import KiviConfig  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "..", "shared", "models", "stories260K.bin"),
                    help="original llama2.c checkpoint (default: ../shared/models/stories260K.bin)")
    ap.add_argument("--tokenizer", default=None, help="its tokenizer (default: tok512.bin beside the model)")
    ap.add_argument("--out", required=True, help="where to write the fine-tuned checkpoint (.bin)")
    ap.add_argument("--kv-cache", default="kivi2", choices=["kivi2", "kivi4", "kivi8"], help="cache format trained for")
    ap.add_argument("--group-size", "-G", type=int, default=32)
    ap.add_argument("--residual", "-R", type=int, default=32)
    ap.add_argument("--key-flush", default="batch", choices=["batch", "group"])
    ap.add_argument("--scale-dtype", default="f16", choices=["f16", "f32"])
    ap.add_argument("--grad", default="ste", choices=["ste", "lsq"],
                    help="straight-through gradient of the quantizer: ste, or lsq (also through each group's range)")
    ap.add_argument("--samples", type=int, default=256, help="sequences sampled from the original model")
    ap.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (0: the model's context)")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the data")
    ap.add_argument("--data", default=None, help="cache of the sampled sequences (.npy): reused if it matches")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-4, help="peak learning rate (AdamW, cosine decay)")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--f32-weight", type=float, default=0.5,
                    help="weight of the KL term of the student's full-precision outputs")
    ap.add_argument("--threads", type=int, default=2, help="PyTorch and engine threads")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--log", default=None, help="write the loss curve and settings as JSON here")
    ap.add_argument("--plot", default=None, help="write the loss curve as a PNG here")
    ap.add_argument("--eval-text", default=None, help="held-out text scored at the end (never trained on)")
    return ap.parse_args(argv)


def sample_sequences(model_path, tokenizer, n, seq_len, temperature, seed, threads):
    """n sequences of seq_len tokens: BOS, then stories sampled by the engine, each after a BOS."""
    m = kivi.Model(model_path, tokenizer)
    s = m.session(threads=threads)
    bos = m.bos_id
    out = np.zeros((n, seq_len), dtype=np.int64)
    t0 = time.time()
    story = 0
    for i in range(n):
        seq = [bos]
        while len(seq) < seq_len:
            g = s.generate("", max_tokens=seq_len - len(seq), temperature=temperature, top_k=0, top_p=1.0,
                           seed=seed * 1000003 + story)
            for _ in g:
                pass
            story += 1
            seq += g.token_ids
            if len(seq) < seq_len:
                seq.append(bos)  # the next story, as the model was trained: each after a BOS
        out[i] = seq[:seq_len]
        if (i + 1) % max(1, n // 10) == 0 or i + 1 == n:
            print("qat: sampled %d/%d sequences (%.0f s)" % (i + 1, n, time.time() - t0), flush=True)
    return out


def load_or_sample(args, seq_len):
    if args.data and os.path.exists(args.data):
        data = np.load(args.data)
        if data.shape == (args.samples, seq_len):
            print("qat: using the %d sampled sequences in %s" % (len(data), args.data))
            return data
        print("qat: %s holds %s, not (%d, %d): sampling again" % (args.data, data.shape, args.samples, seq_len))
    data = sample_sequences(args.model, args.tokenizer, args.samples, seq_len, args.temperature, args.seed,
                            args.threads)
    if args.data:
        os.makedirs(os.path.dirname(os.path.abspath(args.data)), exist_ok=True)
        np.save(args.data, data)
    return data


def kl(teacher_logp, student_logits):
    """Mean over tokens of KL(teacher || student)."""
    s = F.log_softmax(student_logits, dim=-1)
    return (teacher_logp.exp() * (teacher_logp - s)).sum(-1).mean()


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, p)))


def plot(log, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("kl_quant", "KL(original f32 || student, KIVI cache)"),
                       ("kl_f32", "KL(original f32 || student, f32 cache)")):
        points = [(r["step"], r[key]) for r in log if r.get(key) is not None and r[key] > 0]  # log scale
        if points:
            ax.plot(*zip(*points), label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("KL divergence (nats/token)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def evaluate(paths, text, kivi_cfg, threads, tokenizer):
    rows = {}
    for name, path in paths.items():
        m = kivi.Model(path, tokenizer)
        f32 = kivi.perplexity(m, file=text, threads=threads)
        q = kivi.perplexity(m, file=text, threads=threads, kv_cache="kivi%d" % kivi_cfg.key_bits,
                            group_size=kivi_cfg.group_size, residual=kivi_cfg.residual,
                            key_flush=kivi_cfg.key_flush, scale_dtype=kivi_cfg.scale_dtype)
        rows[name] = {"f32": f32["ppl"], "kivi": q["ppl"], "kv_cache": q["kv_cache"], "tokens": q["tokens"]}
    return rows


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    tokenizer = args.tokenizer or os.path.join(os.path.dirname(os.path.abspath(args.model)), "tok512.bin")
    bits = int(args.kv_cache[4:])
    cfg = KiviConfig(bits, bits, args.group_size, args.residual, args.key_flush, args.scale_dtype, args.grad)

    teacher = Llama.from_llama2c(args.model).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    student = copy.deepcopy(teacher).train()
    for p in student.parameters():
        p.requires_grad_(True)
    seq_len = args.seq_len or teacher.config.seq_len
    if seq_len > teacher.config.seq_len:
        sys.exit("qat: --seq-len %d is longer than the model's context %d" % (seq_len, teacher.config.seq_len))

    t_start = time.time()
    data = torch.from_numpy(load_or_sample(args, seq_len))
    t_data = time.time() - t_start
    opt = torch.optim.AdamW(student.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    gen = torch.Generator().manual_seed(args.seed)
    log = []
    t0 = time.time()
    for step in range(args.steps):
        idx = torch.randint(0, len(data), (args.batch,), generator=gen)
        tokens = data[idx]
        with torch.no_grad():
            target = F.log_softmax(teacher(tokens), dim=-1)
        loss_q = kl(target, student(tokens, kivi=cfg))
        loss = loss_q
        loss_f = None
        if args.f32_weight > 0:
            loss_f = kl(target, student(tokens))
            loss = loss + args.f32_weight * loss_f
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step + 1 == args.steps:
            rec = {"step": step, "kl_quant": loss_q.item(), "kl_f32": None if loss_f is None else loss_f.item(),
                   "lr": lr_at(step, args), "seconds": time.time() - t0}
            log.append(rec)
            print("qat: step %5d  KL kivi %.5f  KL f32 %s  lr %.2e  %.0f s" %
                  (step, rec["kl_quant"], "-" if loss_f is None else "%.5f" % rec["kl_f32"], rec["lr"],
                   rec["seconds"]), flush=True)
    t_train = time.time() - t0

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    student.save_llama2c(args.out)
    tok_out = os.path.join(os.path.dirname(os.path.abspath(args.out)), "tok512.bin")
    if os.path.exists(tokenizer) and not os.path.exists(tok_out):
        shutil.copyfile(tokenizer, tok_out)
    print("qat: wrote %s (sampling %.0f s, training %.0f s)" % (args.out, t_data, t_train))

    result = {"settings": vars(args), "kivi": cfg.__dict__, "sampling_seconds": t_data, "training_seconds": t_train,
              "log": log}
    if args.eval_text:
        rows = evaluate({"original": args.model, "fine-tuned": args.out}, args.eval_text, cfg, args.threads,
                        tokenizer)
        result["eval"] = rows
        o, f = rows["original"], rows["fine-tuned"]
        gap = o["kivi"] - o["f32"]
        closed = (o["kivi"] - f["kivi"]) / gap if gap > 0 else float("nan")
        result["gap_closed"] = closed
        result["f32_change"] = f["f32"] / o["f32"] - 1
        print("qat: perplexity on %s (%d tokens), cache %s" % (args.eval_text, o["tokens"], o["kv_cache"]))
        print("qat:   original    f32 %.4f   kivi %.4f" % (o["f32"], o["kivi"]))
        print("qat:   fine-tuned  f32 %.4f   kivi %.4f" % (f["f32"], f["kivi"]))
        print("qat:   gap closed %.1f%%, f32 change %+.2f%%" % (100 * closed, 100 * result["f32_change"]))
    if args.log:
        with open(args.log, "w") as fo:
            json.dump(result, fo, indent=1)
    if args.plot:
        plot(log, args.plot, "KIVI-%d QAT (G=%d, R=%d), data-free distillation" % (bits, cfg.group_size, cfg.residual))
    return result


if __name__ == "__main__":
    main()
