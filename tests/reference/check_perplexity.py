#!/usr/bin/python3
"""Compare the engine's streaming perplexity with the numpy reference, per KV configuration.

For every configuration this runs
    KIVI perplexity -m MODEL -t TOK -f TEXT --kv-cache F --kv-cache-k FK --kv-cache-v FV
         --group-size G --residual R --key-flush P --scale-dtype S --int8-granularity X
         --key-rope W --kv-rotation-seed SEED --kv-rotate ROT --json
and llama_ref.perplexity() with the same settings, and checks
  * the scored token counts are identical,
  * |ppl_engine / ppl_reference - 1| <= 0.1% for f32 and <= 0.5% for other configurations,
    except the numerically chaotic ones below (1.5%; --strict keeps 0.5% for all).

Chaotic configurations: with 2-bit keys and a residual window of at most 32 tokens
(kivi2 keys, R <= 32), the quantized perplexity depends on float32-level details. In the
reference, multiplying K and V by (1 + 1e-6 * N(0,1)) before they enter the cache moves
the tinytales ppl by up to 0.55% (kivi2 G32 R0), 0.39% (K kivi2 / V kivi4 R32 group),
0.24% (kivi2 G32 R32 batch), while every other default configuration moves by < 0.1%:
a single code that lands on the other side of a rounding boundary changes a key by a
whole quantization step and the difference cascades through later layers and groups.
tq keys (rotated, Lloyd-Max codes) are less sensitive: with R = 32 the same probe moves
the ppl by 0.046% (tq3), 0.004% (tq2), 0.002% (tq2.5) (8 and 6 seeds), with R = 16 by
0.12% (tq2); with no residual window (R = 0) by 0.06% to 0.31% (tq2.5/tq3.5 0.06%, tq4
0.12%, tq3 0.20%, tq2 0.31%), so tq keys with R = 0 count as chaotic too. (The engine
still agreed within 0.0005% on every tq configuration measured, R = 0 included.)
Rotated int8 and KIVI values (rot=hadamard) move by 0.0007% (kivi4 R = 128) to 0.048%
(int8 tensor) under the same probe, by 0.09% with kivi2 keys and R = 32 (4 seeds); the
engine agreed within 0.018% on each of them.
--noise-runs N measures this spread for every configuration (N perturbed reference runs,
shown in the "noise" column) and then uses max(tolerance, 2 x spread) instead.

A configuration is written as comma-separated key=value pairs:
    kv=FMT (both) or k=FMT,v=FMT   FMT in f32 f16 int8 kivi2 kivi4 kivi8 tq2 tq2.5 tq3 tq3.5 tq4
    G=32 R=128 flush=batch|group scale=f16|f32 gran=token|head|group|tensor rope=post|pre
    seed=N (tq and rot rotation base seed, --kv-rotation-seed; default 1802073705 = 0x6b697669)
    rot=none|hadamard (--kv-rotate: rotate int8 keys and values and KIVI values per layer
    and KV head with the tq rotation before quantizing them)
    layers=MAP (per-layer formats, --kv-cache-layers MAP; replaces kv/k/v)
Unlisted keys take the defaults (G=32, R=128, flush=batch, scale=f16, gran=head, rot=none),
e.g. "kv=kivi2,G=64,R=0,flush=group", "k=int8,v=kivi4,gran=tensor", "kv=tq4,R=32",
"k=kivi2,v=tq2.5,rope=pre" or "kv=int8,rot=hadamard". R applies to the KIVI and tq
formats (a multiple of G only where a KIVI format is used); tq quantizes keys and values
token by token. rot leaves KIVI keys, f32, f16 and tq as they are (the name drops it
where nothing is rotated); the rotated rows take the seed of seed=.
MAP is written as the engine takes it: rules LAYERS:FORMAT separated by ';', LAYERS '*'
(the layers no other rule names) or layer numbers and ranges A-B separated by ',',
FORMAT one format or KEY/VALUE, e.g. "layers=0,4-5:kivi4/tq3;*:kivi2,R=32". The commas of
a layer list do not end the item: a following piece without '=' continues the map.
The other keys (G, R, flush, scale, gran, rope, seed, rot) apply to every layer.
--list prints the default list; --quick runs a handful of configurations.

The "effect" column is the engine's quantization effect over the reference's:
(mean_nll - mean_nll[f32]) of the engine divided by the same for the reference, shown when
kv=f32 is among the configurations (kv=f32,rope=pre for keys stored before RoPE). It is more sensitive than the ppl tolerance for mild
formats whose whole effect is below 0.5% (an engine that silently kept f32 for f16 passes
the 0.5% tolerance with effect 0). Where the reference's effect is at least 5e-5 nats per
token, an effect outside 1 +- --effect-tol (default 0.5) is a failure; below that it is
shown only: the engine and the reference differ by up to ~5e-5 nats in float rounding
alone, so smaller effects (kivi8; f16 with keys before RoPE, 2e-5) have no stable ratio. Measured on tinytales: 0.79 to 1.06 for
the mild formats (int8 with f32 scales, whose effect is 2.7e-4 nats, is lowest: the
engine-reference difference of ~5e-5 nats is a fifth of it), 1.000 +- 0.012 for the rest.
tests/reference/check_logits.py compares the effects per position, for every format, at
5%.
Exit status 0 when everything agrees, 1 otherwise.
"""

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as ref  # noqa: E402

DEFAULT_KIVI = os.path.join(ref.REPO_ROOT, "build", "bin", "kivi")
TOL_F32 = 1e-3
TOL_QUANT = 5e-3
TOL_CHAOTIC = 1.5e-2
NOISE_EPS = 1e-6


def is_chaotic(spec):
    """2-bit KIVI keys with a residual window of at most 32 tokens, or tq keys with no
    residual window (see the module doc), in any layer."""
    keys = spec.formats_used()[0]
    return (("kivi2" in keys and spec.residual <= 32) or
            (bool(keys & set(ref.TQ_FORMATS)) and spec.residual == 0))


def default_configs():
    c = ["kv=f32", "kv=f16"]
    c += ["kv=int8,gran=%s" % g for g in ("token", "head", "group", "tensor")]
    c += ["kv=int8,gran=head,scale=f32"]
    c += ["kv=kivi8"]
    for bits in (4, 2):
        for G in (32, 64):
            for R in (0, 32, 128):
                if R % G:
                    continue
                for flush in ("batch", "group"):
                    c.append("kv=kivi%d,G=%d,R=%d,flush=%s" % (bits, G, R, flush))
    c += ["kv=kivi4,scale=f32", "kv=kivi2,scale=f32", "kv=kivi2,R=0,scale=f32",
          "kv=kivi2,G=64,R=128,flush=group,scale=f32"]
    c += ["k=kivi4,v=kivi2", "k=kivi2,v=kivi4,R=32,flush=group", "k=int8,v=kivi4",
          "k=int8,v=kivi2,gran=tensor,R=0", "k=f16,v=kivi2", "k=kivi2,v=f16,G=64,R=0"]
    c += ["kv=f32,rope=pre", "kv=f16,rope=pre", "kv=int8,rope=pre", "kv=kivi4,rope=pre", "kv=kivi2,R=32,rope=pre",
          "kv=kivi2,R=128,rope=pre", "kv=kivi2,G=64,R=0,flush=group,rope=pre"]
    c += ["kv=tq4", "kv=tq3", "kv=tq2.5,R=128", "kv=tq3,R=32", "k=kivi2,v=tq2,rope=pre",
          "k=kivi4,v=tq3.5,R=32,rope=pre"]
    # per-layer formats (stories260K has layers 0-4)
    c += ["layers=0:kivi4;*:kivi2,R=32", "layers=0-1:kivi4/tq3;*:kivi2/tq2,R=32,rope=pre",
          "layers=0,4:int8;1-3:kivi2/f16,G=64,R=64,flush=group"]
    # rotated int8 keys and values and KIVI values (--kv-rotate hadamard); KIVI keys stay
    # unrotated, and in the layer map f16 values and tq keep their own treatment
    c += ["kv=int8,gran=head,rot=hadamard", "kv=int8,gran=tensor,rot=hadamard",
          "kv=kivi2,R=32,rot=hadamard", "layers=0:int8;1-2:kivi4/f16;*:kivi2/tq3,R=32,rot=hadamard"]
    return c


QUICK_CONFIGS = ["kv=f32", "kv=f16", "kv=int8", "kv=kivi4", "kv=kivi2",
                 "kv=kivi2,G=64,R=0,flush=group", "k=kivi4,v=kivi2,R=32,flush=group", "kv=tq3,R=32"]


def parse_config(text):
    """'k=kivi4,v=kivi2,G=32,...' or 'layers=0,3:kivi4;*:kivi2,R=32,...' -> llama_ref.KVSpec"""
    spec = ref.KVSpec()
    items = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        if "=" not in item and items and items[-1].startswith("layers="):
            items[-1] += "," + item   # the next layer of a list in the layer map
        else:
            items.append(item)
    for item in items:
        if "=" not in item:
            raise ValueError("config item %r is not key=value (in %r)" % (item, text))
        key, val = item.split("=", 1)
        if key == "layers":
            spec.layers = val.replace(" ", "")
        elif key == "kv":
            spec.k_format = spec.v_format = val
        elif key == "k":
            spec.k_format = val
        elif key == "v":
            spec.v_format = val
        elif key == "G":
            spec.group_size = int(val)
        elif key == "R":
            spec.residual = int(val)
        elif key == "flush":
            spec.key_flush = val
        elif key == "scale":
            spec.scale_dtype = val
        elif key == "gran":
            spec.int8_granularity = val
        elif key == "rope":
            spec.key_rope = val
        elif key == "seed":
            spec.rotation_seed = int(val, 0)
        elif key == "rot":
            spec.kv_rotate = val
        else:
            raise ValueError("unknown config key %r (in %r)" % (key, text))
    spec.validate()
    return spec


def canonical(spec):
    """Short name listing only the settings that matter for the formats used."""
    keys, values = spec.formats_used()
    fm = keys | values
    if spec.layers:
        parts = ["layers=%s" % spec.layers]
    elif spec.k_format == spec.v_format:
        parts = ["kv=%s" % spec.k_format]
    else:
        parts = ["k=%s" % spec.k_format, "v=%s" % spec.v_format]
    kivi = any(f.startswith("kivi") for f in fm)
    tq = any(f in ref.TQ_FORMATS for f in fm)
    if kivi or (spec.int8_granularity == "group" and "int8" in fm):
        parts.append("G=%d" % spec.group_size)
    if kivi or tq:
        parts.append("R=%d" % spec.residual)
    if any(f.startswith("kivi") for f in keys):
        parts.append("flush=%s" % spec.key_flush)
    if kivi or tq or "int8" in fm:
        parts.append("scale=%s" % spec.scale_dtype)
    rot = spec.rotates_any()
    if (tq or rot) and spec.rotation_seed != ref.DEFAULT_ROTATION_SEED:
        parts.append("seed=%d" % spec.rotation_seed)
    if "int8" in fm:
        parts.append("gran=%s" % spec.int8_granularity)
    if spec.key_rope == "pre":
        parts.append("rope=pre")
    if rot:
        parts.append("rot=%s" % spec.kv_rotate)
    return ",".join(parts)


def engine_args(spec):
    # A layer map goes to the engine as written; --kv-cache and --kv-cache-k/-v are passed
    # as well, and the map must override them.
    args = ["--kv-cache", spec.k_format, "--kv-cache-k", spec.k_format,
            "--kv-cache-v", spec.v_format, "--group-size", str(spec.group_size),
            "--residual", str(spec.residual), "--key-flush", spec.key_flush,
            "--scale-dtype", spec.scale_dtype, "--int8-granularity", spec.int8_granularity,
            "--key-rope", spec.key_rope, "--kv-rotation-seed", str(spec.rotation_seed),
            "--kv-rotate", spec.kv_rotate]
    if spec.layers:
        args += ["--kv-cache-layers", spec.layers]
    return args


def run_engine(a, spec):
    cmd = [a.kivi, "perplexity", "-m", a.model, "-t", a.tokenizer, "-f", a.text,
           "--mode", a.mode]
    if a.ctx:
        cmd += ["--ctx", str(a.ctx)]
    cmd += engine_args(spec) + ["--json"]
    t0 = time.time()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise RuntimeError("exit %d: %s\n%s" % (r.returncode, " ".join(cmd),
                                                r.stderr.decode(errors="replace").strip()))
    out = r.stdout.decode("utf-8")
    # tolerate log lines around the JSON object: take the last line that parses
    for line in reversed(out.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                res = json.loads(line)
                res["_seconds"] = time.time() - t0
                return res
            except ValueError:
                pass
    try:
        res = json.loads(out)
    except ValueError:
        raise RuntimeError("no JSON in engine output of: %s\n%s" % (" ".join(cmd), out[:2000]))
    res["_seconds"] = time.time() - t0
    return res


# Reference side: one model/token load per worker process.
_W = {}


def _ref_init(model_path, tok_path, text_path):
    m = ref.load_model(model_path)
    tok = ref.load_tokenizer(tok_path, m.vocab_size)
    _W["model"] = m
    _W["tokens"] = tok.encode(ref.read_text(text_path), bos=False)


def _ref_run(cfg, ctx, mode, noise_seed=None):
    t0 = time.time()
    spec = parse_config(cfg)
    spec.mode = mode
    noise = None if noise_seed is None else (NOISE_EPS, noise_seed)
    r = ref.perplexity(_W["model"], _W["tokens"], ctx, spec, noise)
    r["_seconds"] = time.time() - t0
    return r


def main():
    ap = argparse.ArgumentParser(description="engine perplexity vs numpy reference per KV configuration",
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__[__doc__.index("A configuration"):])
    ap.add_argument("--kivi", default=DEFAULT_KIVI, help="engine binary")
    ref.add_path_args(ap)
    ap.add_argument("--ctx", type=int, default=None, help="context (default: the model's seq_len)")
    ap.add_argument("--mode", default="streaming", choices=("streaming", "batched"),
                    help="engine evaluation mode (only int8 tensor scales depend on it)")
    ap.add_argument("--configs", nargs="+", metavar="CFG", help="configurations (default: built-in list)")
    ap.add_argument("--quick", action="store_true", help="a handful of configurations only")
    ap.add_argument("--list", action="store_true", help="print the default configurations and exit")
    ap.add_argument("--reference-only", action="store_true", help="do not run the engine")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="reference worker processes (default: min(2, cores))")
    ap.add_argument("--tol-f32", type=float, default=TOL_F32, help="relative ppl tolerance for f32 (default 1e-3)")
    ap.add_argument("--tol-quant", type=float, default=TOL_QUANT,
                    help="relative ppl tolerance for quantized formats (default 5e-3)")
    ap.add_argument("--strict", action="store_true",
                    help="use --tol-quant for the chaotic configurations too")
    ap.add_argument("--noise-runs", type=int, default=0, metavar="N",
                    help="N perturbed reference runs per quantized configuration to measure its "
                         "numerical spread; tolerance becomes max(tol, 2 x spread)")
    ap.add_argument("--effect-tol", type=float, default=0.5,
                    help="allowed |effect - 1| where the reference's effect is >= 5e-5 nats (default 0.5)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ref.resolve_paths(ap.parse_args())

    if a.list:
        print("\n".join(default_configs()))
        return 0
    cfgs = a.configs or (QUICK_CONFIGS if a.quick else default_configs())
    specs = [parse_config(c) for c in cfgs]  # fail early on a bad configuration
    names = [canonical(s) for s in specs]
    log = sys.stderr if a.json else sys.stdout
    t_start = time.time()

    if not a.reference_only:
        # fail fast when the engine (or its perplexity command) is missing
        try:
            h = subprocess.run([a.kivi, "perplexity", "--help"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
            problem = None if h.returncode == 0 else h.stdout.decode(errors="replace").strip()
        except OSError as e:
            problem = str(e)
        if problem:
            print("the engine has no working 'perplexity' command (%s perplexity --help):\n  %s"
                  % (a.kivi, problem.splitlines()[-1] if problem else ""), file=log)
            print("(use --reference-only to compute the reference values alone)", file=log)
            return 1

    # Reference runs in worker processes while the engine runs here, one config at a time.
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=max(1, a.jobs), initializer=_ref_init,
        initargs=(a.model, a.tokenizer, a.text))
    futs = [pool.submit(_ref_run, n, a.ctx, a.mode) for n in names]
    noise_futs = [[pool.submit(_ref_run, n, a.ctx, a.mode, seed)
                   for seed in range(1, a.noise_runs + 1)]
                  if not s.all_f32() else []
                  for n, s in zip(names, specs)]

    engine = {}
    if not a.reference_only:
        for n, s in zip(names, specs):
            try:
                engine[n] = run_engine(a, s)
            except Exception as e:
                engine[n] = {"error": str(e)}

    refs = [f.result() for f in futs]
    # Quantization effect, for information: (mean_nll - mean_nll of f32), engine over
    # reference. The pass/fail tolerances are larger than the whole effect of the mild
    # formats (f16, int8, kivi8, often kivi4), so this ratio shows more than the check.
    # Keys stored before RoPE are measured against f32 with keys before RoPE: the engine
    # rotates them in float inside attention, a rounding of its own that is not the format's.
    bases = {}
    for key, base_name in (("post", "kv=f32"), ("pre", "kv=f32,rope=pre")):
        base_r = base_e = None
        if base_name in names:
            base_r = refs[names.index(base_name)]["mean_nll"]
            e = engine.get(base_name)
            if e and "error" not in e and "mean_nll" in e:
                base_e = float(e["mean_nll"])
        bases[key] = (base_r, base_e)

    rows, failures = [], []
    hdr = "%-48s %6s %12s %12s %10s %6s %7s" % ("config", "tokens", "engine ppl", "ref ppl",
                                              "rel diff", "tol", "effect")
    if a.noise_runs:
        hdr += " %8s" % "noise"
    hdr += "  status"
    print(hdr, file=log)
    print("-" * len(hdr), file=log)
    for n, s, r, nf in zip(names, specs, refs, noise_futs):
        e = engine.get(n)
        if s.all_f32():
            tol = a.tol_f32
        elif is_chaotic(s) and not a.strict and not a.noise_runs:
            tol = max(a.tol_quant, TOL_CHAOTIC)
        else:
            tol = a.tol_quant
        row = {"config": n, "ref_ppl": r["ppl"], "ref_mean_nll": r["mean_nll"],
               "ref_nll_stderr": r["nll_stderr"], "ref_tokens": r["tokens"],
               "ref_seconds": round(r["_seconds"], 3)}
        noise_txt = ""
        if a.noise_runs:
            noise_txt = " %8s" % "-"
            if nf:  # quantized configurations only
                spread = max(abs(x.result()["ppl"] / r["ppl"] - 1.0) for x in nf)
                row["noise_spread"] = spread
                tol = max(tol, 2.0 * spread)
                noise_txt = " %7.4f%%" % (100 * spread)
        row["tol"] = tol
        tol_txt = "%5.2f%%" % (100 * tol)
        if a.reference_only:
            status = "ref only"
            print("%-48s %6d %12s %12.6f %10s %6s %7s%s  %s"
                  % (n, r["tokens"], "-", r["ppl"], "-", "-", "-", noise_txt, status), file=log)
        elif e is None or "error" in e:
            status = "ENGINE ERROR" if e else "NOT RUN"
            row["engine_error"] = e["error"] if e else "not run"
            failures.append("%s: %s" % (n, row["engine_error"]))
            print("%-48s %6d %12s %12.6f %10s %6s %7s%s  %s"
                  % (n, r["tokens"], "-", r["ppl"], "-", tol_txt, "-", noise_txt, status), file=log)
        else:
            ppl = float(e["ppl"])
            rel = ppl / r["ppl"] - 1.0
            row.update({"engine_ppl": ppl, "engine_mean_nll": e.get("mean_nll"),
                        "engine_nll_stderr": e.get("nll_stderr"), "engine_tokens": e.get("tokens"),
                        "rel_diff": rel, "engine_seconds": round(e["_seconds"], 3)})
            effect = "-"
            base_r, base_e = bases["pre" if ",rope=pre" in n else "post"]
            if base_e is not None and base_r is not None and "mean_nll" in e:
                d_r = r["mean_nll"] - base_r
                if abs(d_r) > 1e-7:
                    ratio = (float(e["mean_nll"]) - base_e) / d_r
                    effect = "%.3f" % ratio
                    if abs(d_r) >= 5e-5:
                        row["effect_ratio"] = ratio
                    else:
                        row["effect_ratio_shown"] = ratio
            ok_tok = int(e.get("tokens", -1)) == r["tokens"]
            ok_eff = "effect_ratio" not in row or abs(row["effect_ratio"] - 1.0) <= a.effect_tol
            ok = ok_tok and abs(rel) <= tol and ok_eff
            status = "ok" if ok else ("FAIL tokens %s != %d" % (e.get("tokens"), r["tokens"]) if not ok_tok
                                      else "FAIL effect" if not ok_eff else "FAIL")
            if ok and tol > a.tol_quant and not s.all_f32():
                status = "ok (chaotic)" if not a.noise_runs else "ok (noise)"
            if not ok:
                failures.append("%s: %s (engine %.6f, reference %.6f, rel %+.4f%%, tol %.2f%%, effect %s, "
                                "effect tol %.2f)" % (n, status, ppl, r["ppl"], 100 * rel, 100 * tol, effect,
                                                      a.effect_tol))
            print("%-48s %6d %12.6f %12.6f %+9.4f%% %6s %7s%s  %s"
                  % (n, r["tokens"], ppl, r["ppl"], 100 * rel, tol_txt, effect, noise_txt, status),
                  file=log)
        row["status"] = status
        rows.append(row)
    pool.shutdown()
    elapsed = time.time() - t_start
    print("%d configurations, %.1f s" % (len(rows), elapsed), file=log)
    if a.json:
        print(json.dumps({"ok": not failures, "seconds": round(elapsed, 2), "results": rows}, indent=1))
    if failures:
        print("\nFAILED (%d):" % len(failures), file=log)
        for f in failures:
            print("  " + f.replace("\n", "\n    "), file=log)
        return 1
    if not a.reference_only:
        print("OK: token counts identical, every ppl within its tolerance", file=log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
