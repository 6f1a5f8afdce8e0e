"""NumPy data (runtime/npy.c, data.c's DATA_ARRAYS): run.sh --data FILE.npz, or a directory of x.npy
and y.npy, written by NumPy itself.

  * LeNet (n = 2, shuffled) trains on its MNIST images as an .npz of uint8, a directory of float32
    (x / 255 in NumPy) and an .npz of float64, with int64, int32 and uint8 labels, and on arrays named
    with --data-x/--data-y: every loss the same bits as the same images in MNIST's IDX files; --val
    on an .npz gives the IDX held-out set's rows.
  * The GPT (n = 2) trains on its token stream cut into sequences, x (N, T) and y = x shifted by one,
    as int64, int32 and uint16: the same losses as the uint16 token file, past the data's wrap.
  * Hostile files: 1800 damaged .npz and .npy files (cut at every length through the headers, bytes
    overwritten in the zip's records and the .npy header, at random with a fixed seed) through
    runtime/data.c and npy.c under ASan/UBSan (tests/data_probe.c): each read whole or refused with a
    message, never a crash or a sanitizer report; the same files, and zips crafted against the
    directory walk (shorter than its records, a ZIP64 locator far past the end, lengths running past
    it), through npy.c alone on exact-size heap copies, where ASan sees a read past a file's end.
  * README's "Your own model and NumPy arrays" runs as written (a PyTorch model exported, arrays
    from np.savez, compiled, built, trained, saved) and the saved model classifies its data in PyTorch.
  * Every mismatch is refused before step 1 with a message naming the file and the array, exit 2:
    the dtype, the sample shape, a NaN or inf value, a float64 past float32, the labels' dtype, shape and
    range, token ids past the vocabulary, a
    truncated .npy and .npz, a Fortran-ordered array, a big-endian one, a pickled object array, a
    structured one, a compressed .npz, a missing member, a lone .npy, counts that differ, fewer
    samples than a batch.

  /usr/bin/python3 tests/test_npy.py
"""
import csv
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPECC = os.path.join(ROOT, "bin", "pipecc")
DATAGEN = os.path.join(ROOT, "bin", "piperun-data")
DEVICES = os.path.join(ROOT, "tests", "devices_equal.txt")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402
from tally import check  # noqa: E402

STEPS = 6
GPT_STEPS = 22  # past the token data's wrap (19 batches of 8 x 32 in 5000 tokens)
GPT_T, GPT_VOCAB = 32, 64


def sh(cmd, timeout=300):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def build(model, out, batch, micro):
    r = sh([PIPECC, os.path.join(ROOT, "onnx_models", model), "-n", "2", "--batch", str(batch), "--microbatches", str(micro),
            "--devices", DEVICES, "-o", out])
    if r.returncode == 0:
        r = sh(["make", "-s", "-C", out], timeout=600)
    return r.returncode == 0, r.stderr.strip()[-400:]


def losses(path):
    with open(path) as f:
        return [row["loss"] for row in csv.DictReader(f)]


def rows(path):
    with open(path) as f:
        return f.read()


def train(pipe, data, log, *extra, steps=STEPS):
    r = sh([os.path.join(pipe, "run.sh"), "--data", data, "--steps", str(steps), "--quiet", "--log", log, *extra])
    return r.returncode, r.stderr


def mnist_arrays(d):
    x = np.fromfile(os.path.join(d, "train-images-idx3-ubyte"), np.uint8)[16:].reshape(-1, 1, 28, 28)
    y = np.fromfile(os.path.join(d, "train-labels-idx1-ubyte"), np.uint8)[8:]
    return x, y


def lenet_same(T, pipe, mnist):
    """The same images as IDX and as NumPy arrays of each dtype: the same losses."""
    ref = os.path.join(T, "idx.csv")
    rc, err = train(pipe, mnist, ref, "--shuffle")
    if not check(rc == 0, "lenet trains on MNIST IDX files (the reference)", err[-300:]):
        return
    want = losses(ref)
    x, y = mnist_arrays(mnist)
    os.makedirs(os.path.join(T, "f32dir"))
    np.save(os.path.join(T, "f32dir", "x.npy"), x.astype(np.float32) / np.float32(255))
    np.save(os.path.join(T, "f32dir", "y.npy"), y.astype(np.int32))
    np.savez(os.path.join(T, "u8.npz"), x=x, y=y.astype(np.int64))
    np.savez(os.path.join(T, "f64.npz"), x=x / 255.0, y=y)
    np.savez(os.path.join(T, "named.npz"), images=x, labels=y.astype(np.int64))
    cases = [("an .npz of uint8 images and int64 labels", "u8.npz", []),
             ("a directory of float32 x.npy (x / 255) and int32 y.npy", "f32dir", []),
             ("an .npz of float64 images and uint8 labels", "f64.npz", []),
             ("an .npz whose arrays --data-x and --data-y name", "named.npz", ["--data-x", "images", "--data-y", "labels"])]
    for what, data, extra in cases:
        log = os.path.join(T, data + ".csv")
        rc, err = train(pipe, os.path.join(T, data), log, "--shuffle", *extra)
        got = losses(log) if rc == 0 else []
        check(rc == 0 and got == want, f"lenet on {what}: the same {STEPS} losses as the IDX files, bit for bit",
              f"rc {rc} {err[-300:]}" if rc else f"{got} vs {want}")
    # --val: the held-out rows from an .npz equal those from the IDX directory's files.
    rc1, err1 = train(pipe, mnist, os.path.join(T, "vi.csv"), "--val", mnist, "--val-every", "3")
    rc2, err2 = train(pipe, os.path.join(T, "u8.npz"), os.path.join(T, "vn.csv"), "--val", os.path.join(T, "u8.npz"), "--val-every", "3")
    same = rc1 == 0 and rc2 == 0 and rows(os.path.join(T, "vi.csv.val.csv")) == rows(os.path.join(T, "vn.csv.val.csv"))
    check(same and len(rows(os.path.join(T, "vn.csv.val.csv")).splitlines()) == 1 + STEPS // 3,
          "--val FILE.npz: the held-out loss and accuracy rows equal the IDX set's", (err1 + err2)[-300:])


def gpt_same(T, pipe):
    """The token stream as sequences: x[i] = tokens[iT : iT + T], y[i] the same shifted by one."""
    tokens = os.path.join(T, "tokens.bin")
    r = sh([DATAGEN, "tokens", tokens, "--n", "5000", "--vocab", str(GPT_VOCAB), "--seed", "3"])
    if not check(r.returncode == 0, "token data written", r.stderr):
        return
    ref = os.path.join(T, "tok.csv")
    rc, err = train(pipe, tokens, ref, steps=GPT_STEPS)
    if not check(rc == 0, "gpt trains on a uint16 token file (the reference)", err[-300:]):
        return
    want = losses(ref)
    t = np.fromfile(tokens, np.uint16).astype(np.int64)
    n = (len(t) - 1) // GPT_T
    x = t[:n * GPT_T].reshape(n, GPT_T)
    y = t[1:n * GPT_T + 1].reshape(n, GPT_T)
    for dt in (np.int64, np.int32, np.uint16):
        name = f"tok_{np.dtype(dt).name}.npz"
        np.savez(os.path.join(T, name), x=x.astype(dt), y=y.astype(dt))
        log = os.path.join(T, name + ".csv")
        rc, err = train(pipe, os.path.join(T, name), log, steps=GPT_STEPS)
        got = losses(log) if rc == 0 else []
        check(rc == 0 and got == want, f"gpt on {np.dtype(dt).name} sequences in an .npz: the same {GPT_STEPS} losses as the token file",
              f"rc {rc} {err[-300:]}" if rc else f"{got[:3]} vs {want[:3]}")
    return x, y


def error_line(err):
    for line in err.splitlines():
        if line.startswith("piperun: stage") and "error" in line:
            return line
    return ""


def refused(T, pipe, what, data, words, extra=()):
    rc, err = train(pipe, data, os.path.join(T, "refused.csv"), *extra)
    line = error_line(err)
    ok = rc == 2 and all(w in line for w in words) and not os.path.exists(os.path.join(T, "refused.csv.bad"))
    check(ok, f"refused: {what}", f"rc {rc}: {line or err[-300:]}")


def npz_bytes_cut(src, dst, keep):
    with open(src, "rb") as f:
        b = f.read()
    with open(dst, "wb") as f:
        f.write(b[:keep])


def lenet_refusals(T, pipe, mnist):
    x, y = mnist_arrays(mnist)
    P = lambda name: os.path.join(T, name)  # noqa: E731
    np.savez(P("i64.npz"), x=x.astype(np.int64), y=y)
    np.savez(P("f16.npz"), x=x.astype(np.float16), y=y)
    np.savez(P("shape.npz"), x=x[:, :, :, :27], y=y)
    np.savez(P("yfloat.npz"), x=x, y=y.astype(np.float32))
    np.savez(P("y2d.npz"), x=x, y=np.stack([y, y], 1))
    bad = y.astype(np.int64)
    bad[7] = 10
    np.savez(P("yrange.npz"), x=x, y=bad)
    neg = y.astype(np.int64)
    neg[3] = -1
    np.savez(P("yneg.npz"), x=x, y=neg)
    xn = x.astype(np.float32) / 255
    xn[9, 0, 3, 4] = np.nan
    np.savez(P("nan.npz"), x=xn, y=y)
    xb = x / 255.0
    xb[2, 0, 0, 1] = 1e300
    np.savez(P("huge.npz"), x=xb, y=y)
    np.savez(P("count.npz"), x=x, y=y[:-1])
    np.savez(P("few.npz"), x=x[:20], y=y[:20])
    np.savez(P("fortran.npz"), x=np.asfortranarray(x.astype(np.float32)), y=y)
    np.savez(P("bigend.npz"), x=x.astype(">f4"), y=y)
    np.savez(P("object.npz"), x=np.array([None] * len(y), dtype=object), y=y)
    np.savez(P("struct.npz"), x=np.zeros(len(y), dtype=[("a", "<f4"), ("b", "<i4")]), y=y)
    np.savez_compressed(P("compressed.npz"), x=x, y=y)
    np.savez(P("ab.npz"), a=x, b=y)
    os.makedirs(P("trunc"))
    np.save(P("trunc/x.npy"), x)
    np.save(P("trunc/y.npy"), y)
    with open(P("trunc/x.npy"), "r+b") as f:
        f.truncate(os.path.getsize(P("trunc/x.npy")) - 100)
    np.savez(P("whole.npz"), x=x, y=y)
    npz_bytes_cut(P("whole.npz"), P("cut.npz"), os.path.getsize(P("whole.npz")) // 2)
    np.save(P("lone.npy"), x)
    os.makedirs(P("noy"))
    np.save(P("noy/x.npy"), x)
    cases = [
        ("int64 images", "i64.npz", ["i64.npz: array 'x'", "int64, but the model's input takes float32 values"]),
        ("float16 images", "f16.npz", ["f16.npz: array 'x'", "dtype '<f2' is not read by pipecc"]),
        ("images of the wrong shape", "shape.npz", ["array 'x'", "samples of shape (1, 28, 27), but the model's input takes (1, 28, 28)"]),
        ("float labels", "yfloat.npz", ["array 'y'", "float32, but labels are class numbers"]),
        ("labels of shape (N, 2)", "y2d.npz", ["array 'y'", "labels of shape (2,) a sample, but the model's loss takes ()"]),
        ("a label past the classes", "yrange.npz", ["array 'y'", "label 10 at element 7 is out of range for a model with 10 classes"]),
        ("a negative label", "yneg.npz", ["array 'y'", "label -1 at element 3 is out of range"]),
        ("a NaN image value", "nan.npz", ["nan.npz: array 'x': element " + str(9 * 784 + 3 * 28 + 4) + " is NaN, which the model cannot train on"]),
        ("a float64 value past float32's range", "huge.npz", ["array 'x': element " + str(2 * 784 + 1) + " is beyond float32's range", "(the inputs are float32)"]),
        ("x and y of different lengths", "count.npz", ["array 'y': 511 samples, but", "array 'x' has 512"]),
        ("fewer samples than a batch", "few.npz", ["few.npz has 20 samples, fewer than one batch of 32"]),
        ("a Fortran-ordered array", "fortran.npz", ["array 'x'", "a Fortran-ordered float32 array of shape (512, 1, 28, 28)"]),
        ("a big-endian array", "bigend.npz", ["array 'x'", "big-endian float32 (dtype '>f4')"]),
        ("a pickled object array", "object.npz", ["array 'x'", "an object array (dtype '|O'", "never unpickles"]),
        ("a structured array", "struct.npz", ["array 'x'", "a structured array"]),
        ("a compressed .npz", "compressed.npz", ["compressed.npz: member x.npy is compressed", "np.savez"]),
        ("an .npz without x", "ab.npz", ["ab.npz: no member x.npy (it holds: a.npy, b.npy)", "--data-x"]),
        ("a truncated .npy", "trunc", ["trunc/x.npy: truncated: shape (512, 1, 28, 28) of uint8 takes 401408 bytes, 401308 are there"]),
        ("a truncated .npz", "cut.npz", ["cut.npz: a zip with no end record (truncated?)"]),
        ("a lone .npy", "lone.npy", ["lone.npy: one NumPy array; give the directory that holds x.npy and y.npy"]),
        ("a directory without y.npy", "noy", ["noy/y.npy: missing file"]),
    ]
    for what, data, words in cases:
        refused(T, pipe, what, P(data), words)
    refused(T, pipe, "--data-x naming no array: the members listed, no hint to name them", P("ab.npz"),
            ["no member pics.npy (it holds: a.npy, b.npy)"], ["--data-x", "pics", "--data-y", "b"])
    rc, err = train(pipe, P("ab.npz"), os.path.join(T, "refused.csv"), "--data-x", "pics", "--data-y", "b")
    check("--data-x and --data-y" not in error_line(err), "... and no hint to name the arrays, which were named", error_line(err))


def gpt_refusals(T, pipe, x, y):
    P = lambda name: os.path.join(T, name)  # noqa: E731
    big = x.copy()
    big[5, 3] = GPT_VOCAB
    np.savez(P("g_vocab.npz"), x=big, y=y)
    np.savez(P("g_float.npz"), x=x.astype(np.float32), y=y)
    np.savez(P("g_y1d.npz"), x=x, y=y[:, 0])
    np.savez(P("g_len.npz"), x=x[:, :16], y=y[:, :16])
    refused(T, pipe, "a token id past the vocabulary", P("g_vocab.npz"), ["array 'x'", f"token id {GPT_VOCAB} at element {5 * GPT_T + 3}",
                                                                            f"for a model with {GPT_VOCAB} ids"])
    refused(T, pipe, "float token ids", P("g_float.npz"), ["array 'x'", "float32, but the model's input takes token ids"])
    refused(T, pipe, "one label a sequence", P("g_y1d.npz"), ["array 'y'", f"labels of shape () a sample, but the model's loss takes ({GPT_T},)"])
    refused(T, pipe, "sequences of the wrong length", P("g_len.npz"), ["array 'x'", f"samples of shape (16,), but the model's input takes ({GPT_T},)"])


SAN = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
WARN = ["-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE"]


def mutants(good, rng, count):
    """Damaged copies of good: cut short at every length through its first 400 bytes and its last 200
    (the .npy header, the zip's directory and end record), then bytes overwritten at random."""
    cuts = [good[:k] for k in range(0, min(400, len(good)))] + [good[:k] for k in range(max(0, len(good) - 200), len(good))]
    out = [good]  # the undamaged file reads whole
    while len(out) < count:
        b = bytearray(good)
        for _ in range(int(rng.integers(1, 5))):
            at = int(rng.integers(0, len(b))) if rng.random() < 0.3 else int(rng.choice([rng.integers(0, 160), rng.integers(len(b) - 200, len(b))]))
            b[min(at, len(b) - 1)] = int(rng.choice([0, 0xff, 0x7f, 0x80, int(rng.integers(0, 256))]))
        out.append(bytes(b))
    return out + cuts


def crafted():
    """Zips built to attack the directory walk: short files where len - X would wrap, a ZIP64 locator
    pointing far past the end, central entries whose lengths run past it (each also padded past the
    shortest zip with a member, where the checks themselves must hold)."""
    import struct
    end64 = struct.pack("<IIQI", 0x07064B50, 0, 1 << 44, 1) + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF,
                                                                             0xFFFFFFFF, 0)
    cd = b"PK\1\2" + b"\0" * 24 + struct.pack("<HHH", 2, 0xFFFF, 0xFFFE) + b"\0" * 12
    out = [b"PK\3\4" + end64[:20] + end64[20:42],                       # 46 bytes: the review's ZIP64 case
           b"PK\3\4" + b"PK\1\2" + b"\0" * 14 + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 2, 2, 0xFFFEFFFF, 4, 0)]  # 44 bytes
    for pad in (60, 200):
        out.append(b"PK\3\4" + b"\0" * pad + end64)
        body = b"PK\3\4" + cd + b"\0" * pad
        out.append(body + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 2, 2, len(cd), 4, 0))
        out.append(body + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, len(cd), 0xFFFFFFF0, 0))
    return out


def hostile(T):
    probe = os.path.join(T, "data_probe")
    rt = os.path.join(ROOT, "runtime")
    r = sh(["clang", "-O1", "-g", *SAN, *WARN, "-I" + rt, os.path.join(rt, "data.c"), os.path.join(rt, "npy.c"),
            os.path.join(ROOT, "tests", "data_probe.c"), "-o", probe])
    if not check(r.returncode == 0, "data_probe builds with ASan/UBSan", r.stderr[-300:]):
        return
    rng = np.random.default_rng(7)
    x = rng.random((6, 1, 4, 4)).astype(np.float32)
    y = np.arange(6, dtype=np.int64) % 3
    good_npz, good_npy = os.path.join(T, "good.npz"), os.path.join(T, "good.npy")
    np.savez(good_npz, x=x, y=y)
    np.save(good_npy, x)
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0", UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    for kind, good, count in (("npz", good_npz, 400), ("npy", good_npy, 200)):
        files = []
        for i, b in enumerate(mutants(open(good, "rb").read(), rng, count)):
            if kind == "npz":
                f = os.path.join(T, f"m{i}.npz")
            else:  # a directory of x.npy (damaged) and y.npy
                f = os.path.join(T, f"d{i}")
                os.makedirs(f)
                np.save(os.path.join(f, "y.npy"), y)
                f2 = os.path.join(f, "x.npy")
            with open(f if kind == "npz" else f2, "wb") as fh:
                fh.write(b)
            files.append(f)
        p = subprocess.run([probe, "arrays", "0", "3", "1", "1,1,4,4", *files], capture_output=True, text=True, errors="replace", env=env, timeout=300)
        lines = p.stdout.splitlines()
        bad = [ln for ln in lines if not (ln.startswith("ok ") or ln.startswith("error: data "))]
        clean = p.returncode == 0 and "Sanitizer" not in p.stderr and "runtime error" not in p.stderr and len(lines) == len(files) and not bad
        nerr = sum(ln.startswith("error") for ln in lines)
        clean = clean and lines[0] == "ok 6" and all(ln.startswith("error") for ln in lines[count:])
        check(clean, f"{len(files)} damaged {kind} data sets: the whole one read, each cut one refused, the overwritten ones read whole "
                     f"or refused with a message ({nerr} refused), no sanitizer report",
              f"rc {p.returncode} {(p.stderr[-600:] or bad[:3])}")
        # npy.c alone on exact-size heap copies: a read past a file's end is ASan's there (a mapping's last page hides it).
        heap_files = list(files) if kind == "npz" else [os.path.join(f, "x.npy") for f in files]
        if kind == "npz":
            for i, b in enumerate(crafted()):
                heap_files.append(os.path.join(T, f"c{i}.npz"))
                with open(heap_files[-1], "wb") as fh:
                    fh.write(b)
        p = subprocess.run([probe, "heap", *heap_files], capture_output=True, text=True, errors="replace", env=env, timeout=300)
        lines = p.stdout.splitlines()
        clean = p.returncode == 0 and "Sanitizer" not in p.stderr and "runtime error" not in p.stderr and len(lines) == len(heap_files) and \
            lines[0] == "ok" and all(ln == "ok" or ln.startswith("error: data ") for ln in lines) and \
            all(ln.startswith("error") for ln in lines[count:])
        check(clean, f"the same {len(heap_files)} {kind} files{' and ' + str(len(crafted())) + ' crafted zips' if kind == 'npz' else ''} "
                     f"as exact-size heap copies through npy.c: whole ones read, the others refused, no sanitizer report",
              f"rc {p.returncode} {p.stderr[-600:] or [ln for ln in lines if ln != 'ok'][:3]}")
        for f in heap_files if kind == "npz" else files:
            shutil.rmtree(f, ignore_errors=True) if kind == "npy" else os.remove(f)


def readme_block(text, marker):
    """The fenced block after README's <!-- readme-path:MARKER --> line."""
    at = text.index(f"<!-- readme-path:{marker} -->")
    start = text.index("\n", text.index("```", at)) + 1
    return text[start:text.index("```", start)]


def readme_path(T):
    """README's "Your own model and NumPy arrays", run as written: the model it trains predicts its data."""
    text = open(os.path.join(ROOT, "README.md")).read()
    d = os.path.join(T, "readme")
    os.makedirs(d)
    with open(os.path.join(d, "export.py"), "w") as f:
        f.write(readme_block(text, "python"))
    r = subprocess.run([sys.executable, "export.py"], cwd=d, capture_output=True, text=True, timeout=300)
    if not check(r.returncode == 0, "README's path: the Python block exports the model and writes the arrays", r.stderr[-300:]):
        return
    shell = readme_block(text, "shell").replace("bin/pipecc", PIPECC)
    r = subprocess.run(["bash", "-e", "-c", shell], cwd=d, capture_output=True, text=True, timeout=600)
    if not check(r.returncode == 0 and os.path.isfile(os.path.join(d, "trained.onnx")), "README's path: the shell lines compile, build, train "
                 "and save trained.onnx", r.stderr[-400:]):
        return
    import onnx
    import torch
    from onnx import numpy_helper
    data = np.load(os.path.join(d, "train.npz"))
    acc = {}
    for f in ("model.onnx", "trained.onnx"):
        model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
        model.load_state_dict({t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in onnx.load(os.path.join(d, f)).graph.initializer})
        with torch.no_grad():
            acc[f] = float((model(torch.from_numpy(data["x"])).argmax(1).numpy() == data["y"]).mean())
    check(acc["trained.onnx"] > 0.9 and acc["model.onnx"] < 0.6, "README's path: the trained model, loaded in PyTorch, classifies its data",
          f"accuracy {acc['model.onnx']:.3f} before, {acc['trained.onnx']:.3f} after")


def main():
    T = tempfile.mkdtemp(prefix="pipecc-npy.")
    os.environ["PIPECC_CACHE"] = os.path.join(T, "machine.txt")
    try:
        mnist = os.path.join(T, "mnist")
        r = sh([DATAGEN, "mnist", mnist, "--n", "512", "--seed", "1"])
        if not check(r.returncode == 0, "synthetic MNIST written", r.stderr):
            return tally.finish()
        lenet, gpt = os.path.join(T, "lenet.pipe"), os.path.join(T, "gpt.pipe")
        ok, err = build("lenet.onnx", lenet, 32, 4)
        if check(ok, "lenet at n = 2 compiled and built", err):
            lenet_same(T, lenet, mnist)
            lenet_refusals(T, lenet, mnist)
        ok, err = build("gpt.onnx", gpt, 8, 4)
        if check(ok, "gpt at n = 2 compiled and built", err):
            xy = gpt_same(T, gpt)
            if xy is not None:
                gpt_refusals(T, gpt, *xy)
        hostile(T)
        readme_path(T)
    finally:
        shutil.rmtree(T, ignore_errors=True)
    return tally.finish()


if __name__ == "__main__":
    sys.exit(main())
