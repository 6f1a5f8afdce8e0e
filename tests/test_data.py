"""libpiperun's data loading (runtime/data.c) and the synthetic data generator
(tools/datagen.c, piperun-data).  Builds both with ASan/UBSan into a temp dir
(independent of the Makefile), drives data.c through tests/data_probe.c, and
checks everything against numpy reading the same files: IDX, CIFAR-10 and both
token formats, the sample order (identity, and a shuffle reproduced here from
the documented splitmix64 + Fisher-Yates), float scaling, token offsets and
wrap-around, every error message; then that the generated sets are learnable
(LeNet-5 on the MNIST set, a bigram model on the tokens).
Run with /usr/bin/python3."""
import math
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RT = os.path.join(ROOT, "runtime")
TOOLS = os.path.join(ROOT, "tools")
SAN = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
WARN = ["-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE"]
ENV = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0", UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally  # noqa: E402  (the one tally every suite shares: tests/tally.py)


def check(cond, what, detail=""):
    tally.count(cond)
    print(("ok - " if cond else "not ok - ") + what)
    if not cond and detail:
        print("   " + str(detail).strip().replace("\n", "\n   ")[:2000])
    return cond


def run(*args):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=ENV)
    return p.returncode, p.stdout, p.stderr


def sanitizer_clean(err):
    return "AddressSanitizer" not in err and "runtime error" not in err and "LeakSanitizer" not in err


# ---- the reference implementation of data.h's shuffle ----
M64 = (1 << 64) - 1


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def perm_ref(n, seed, e):
    x = mix64(seed ^ mix64((e + 0x9E3779B97F4A7C15) & M64))
    p = list(range(n))
    for i in range(n - 1, 0, -1):
        x = (x + 0x9E3779B97F4A7C15) & M64
        j = mix64(x) % (i + 1)
        p[i], p[j] = p[j], p[i]
    return p


def write_idx_images(path, imgs, magic=0x803):
    n, h, w = imgs.shape
    with open(path, "wb") as f:
        f.write(struct.pack(">IIII", magic, n, h, w) + imgs.astype(np.uint8).tobytes())


def write_idx_labels(path, labels, magic=0x801):
    with open(path, "wb") as f:
        f.write(struct.pack(">II", magic, len(labels)) + np.asarray(labels, np.uint8).tobytes())


def main():
    t0 = time.time()
    T = tempfile.mkdtemp(prefix="pipecc-data.")
    try:
        body(T)
    except Exception:  # a crash in the test itself still ends with the tally
        import traceback
        traceback.print_exc()
        check(False, "test_data.py ran to the end")
    finally:
        shutil.rmtree(T, ignore_errors=True)
    print("# %.1f s" % (time.time() - t0))
    return tally.finish()


def refuses_to_replace(gen, T):
    """piperun-data replaces a file that is there only with --force, and never one that is not a regular file:
    its rename put the data in place of a device node (as root, `tokens /dev/null` replaced the system's)."""
    R = os.path.join(T, "replace")
    os.makedirs(R)
    tok, mn = os.path.join(R, "tok.bin"), os.path.join(R, "mnist")
    rc, _, err = run(gen, "tokens", tok, "--n", "100")
    rc2, _, err2 = run(gen, "mnist", mn, "--n", "10")
    if not check(rc == 0 and rc2 == 0, "piperun-data writes the sets the next checks try to replace", err + err2):
        return
    images, labels = os.path.join(mn, "train-images-idx3-ubyte"), os.path.join(mn, "train-labels-idx1-ubyte")
    before = [open(f, "rb").read() for f in (tok, images, labels)]
    rc, _, err = run(gen, "tokens", tok, "--n", "300")
    rc2, _, err2 = run(gen, "mnist", mn, "--n", "20")
    check(rc == 1 and rc2 == 1 and "tok.bin exists" in err and "--force" in err and "train-images-idx3-ubyte exists" in err2
          and [open(f, "rb").read() for f in (tok, images, labels)] == before and sanitizer_clean(err + err2),
          "piperun-data refuses to replace an existing data file without --force, naming it, the file unchanged: " + err.strip(),
          err + err2)
    os.remove(images)  # the labels alone: refused before the images are written
    rc, _, err = run(gen, "mnist", mn, "--n", "20")
    check(rc == 1 and "train-labels-idx1-ubyte exists" in err and not os.path.exists(images) and open(labels, "rb").read() == before[2],
          "piperun-data mnist checks both files before writing either (the labels there: no images written)", err)
    rc, _, err = run(gen, "tokens", tok, "--n", "300", "--force")
    check(rc == 0 and os.path.getsize(tok) == 600, "piperun-data --force replaces a regular file", err)
    fifo, link = os.path.join(R, "fifo.bin"), os.path.join(R, "link.bin")
    os.mkfifo(fifo)
    os.symlink(tok, link)
    targets = [(fifo, "a FIFO", stat.S_ISFIFO), (link, "a symbolic link", stat.S_ISLNK)]
    null = os.path.join(R, "null")
    try:  # a device node of our own (as root): /dev/null's numbers
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        targets.append((null, "a device", stat.S_ISCHR))
    except OSError as e:
        tally.skip("piperun-data --force refuses to replace a device node", f"cannot make one here ({e.strerror})")
    size = os.path.getsize(tok)
    for path, what, is_kind in targets:
        rc, _, err = run(gen, "tokens", path, "--n", "100", "--force")
        check(rc == 1 and "not a regular file" in err and what in err and is_kind(os.lstat(path).st_mode) and os.path.getsize(tok) == size,
              f"piperun-data --force refuses to replace {what}, which stays: " + err.strip(), err)
    rc, _, err = run(gen, "cifar", os.path.join(R, "cifar"), "--n", "10")
    rc2, _, err2 = run(gen, "cifar", os.path.join(R, "cifar"), "--n", "10", "--test")
    check(rc == 0 and rc2 == 0, "a new file beside existing ones needs no --force (--test's files beside the training set's)", err + err2)


NPY = os.path.join(RT, "npy.c")  # data.c reads NumPy arrays through it


def body(T):
    probe, gen = os.path.join(T, "data_probe"), os.path.join(T, "piperun-data")
    # ---- build ----
    rc, _, err = run("clang", "-O2", "-g", *WARN, "-c", os.path.join(RT, "data.c"), "-o", os.path.join(T, "data.o"))
    rc2, _, err2 = run("clang", "-O2", "-g", *WARN, os.path.join(TOOLS, "datagen.c"), os.path.join(RT, "data.c"), NPY, "-lm", "-o",
                       os.path.join(T, "piperun-data-O2"))
    check(rc == 0 and rc2 == 0 and not err and not err2, "data.c and datagen.c build warning-free with -O2 -Wall -Wextra -Werror", err + err2)
    rc, _, err = run("clang", "-O1", "-g", *SAN, *WARN, "-I" + RT, os.path.join(RT, "data.c"), NPY, os.path.join(ROOT, "tests", "data_probe.c"),
                     "-o", probe)
    rc2, _, err2 = run("clang", "-O1", "-g", *SAN, *WARN, os.path.join(TOOLS, "datagen.c"), os.path.join(RT, "data.c"), NPY, "-lm", "-o", gen)
    if not check(rc == 0 and rc2 == 0, "data_probe and piperun-data build with ASan/UBSan", err + err2):
        return

    def P(*a):
        return run(probe, *a)

    def bad(what, args, *needles):
        rc, out, err = P(*args)
        ok = rc == 1 and all(s in err for s in needles) and err.startswith("error: data ") and err.count("\n") == 1 and sanitizer_clean(err)
        check(ok, "error: %s -> %s" % (what, err.strip()[len("error: "):] if ok else "?"), "rc %d\n%s%s" % (rc, out, err))

    # ---- piperun-data ----
    M = os.path.join(T, "mnist")
    rc, out, err = run(gen, "mnist", M)
    imgf, lblf = os.path.join(M, "train-images-idx3-ubyte"), os.path.join(M, "train-labels-idx1-ubyte")
    ok = rc == 0 and sanitizer_clean(err) and sorted(os.listdir(M)) == ["train-images-idx3-ubyte", "train-labels-idx1-ubyte"]
    if check(ok, "piperun-data mnist writes the two IDX files and nothing else", err):
        raw, lraw = open(imgf, "rb").read(), open(lblf, "rb").read()
        hdr, lhdr = struct.unpack(">IIII", raw[:16]), struct.unpack(">II", lraw[:8])
        X = np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 28, 28)
        Y = np.frombuffer(lraw, np.uint8, offset=8)
        check(hdr == (0x803, 6000, 28, 28) and lhdr == (0x801, 6000) and len(raw) == 16 + 6000 * 784 and len(lraw) == 8 + 6000,
              "MNIST IDX headers are big-endian 0x803 6000x28x28 / 0x801 6000, sizes exact")
        counts = np.bincount(Y, minlength=10)
        check(Y.max() < 10 and counts.min() > 450, "MNIST labels cover 10 classes evenly (%s)" % counts.tolist())
        check(X.min() == 0 and X.max() == 255 and 0.15 < X.mean() / 255 < 0.45, "MNIST pixels span 0..255, mean ink %.2f" % (X.mean() / 255))
    M2, M3 = os.path.join(T, "mnist2"), os.path.join(T, "mnist3")
    run(gen, "mnist", M2, "--seed", "1", "--n", "6000")
    run(gen, "mnist", M3, "--seed", "2")
    same = open(imgf, "rb").read() == open(os.path.join(M2, "train-images-idx3-ubyte"), "rb").read()
    diff = open(imgf, "rb").read() != open(os.path.join(M3, "train-images-idx3-ubyte"), "rb").read()
    check(same and diff, "piperun-data is deterministic per seed (seed 1 twice identical, seed 2 different)")
    C = os.path.join(T, "cifar")
    rc, _, err = run(gen, "cifar", C, "--n", "500")
    cf = os.path.join(C, "data_batch_1.bin")
    if check(rc == 0 and os.listdir(C) == ["data_batch_1.bin"] and os.path.getsize(cf) == 500 * 3073, "piperun-data cifar writes data_batch_1.bin, 500 records of 3073 bytes", err):
        rec = np.fromfile(cf, np.uint8).reshape(500, 3073)
        check(rec[:, 0].max() < 10 and len(set(rec[:, 0])) == 10, "CIFAR labels cover 10 classes")
    TOK, TOKL = os.path.join(T, "tok.bin"), os.path.join(T, "tok_llmc.bin")
    rc, _, err = run(gen, "tokens", TOK)
    rc2, _, err2 = run(gen, "tokens", TOKL, "--llmc")
    tok = np.fromfile(TOK, "<u2")
    hdr = np.fromfile(TOKL, "<i4", count=256)
    tokl = np.fromfile(TOKL, "<u2", offset=1024)
    check(rc == 0 and rc2 == 0 and len(tok) == 200000 and tok.max() < 64 and len(set(tok.tolist())) == 64,
          "piperun-data tokens: 200000 raw uint16 tokens, vocab 64", err + err2)
    check(hdr[0] == 20240520 and hdr[1] == 1 and hdr[2] == 200000 and not hdr[3:].any() and np.array_equal(tok, tokl),
          "piperun-data tokens --llmc: llm.c header (20240520, 1, 200000) then the same tokens")
    rc, _, _ = run(gen, "tokens", os.path.join(T, "tok300.bin"), "--vocab", "300", "--n", "5000", "--seed", "7")
    t300 = np.fromfile(os.path.join(T, "tok300.bin"), "<u2")
    check(rc == 0 and len(t300) == 5000 and t300.max() < 300 and t300.max() > 255, "--vocab 300 --n 5000 gives ids up to 299")
    # --noise: the default is 0.1 (the same bytes); more noise, the same labels, noisier pixels
    C1, C6 = os.path.join(T, "c_noise01"), os.path.join(T, "c_noise06")
    rc, _, err = run(gen, "cifar", C1, "--n", "500", "--noise", "0.1")
    rc2, _, err2 = run(gen, "cifar", C6, "--n", "500", "--noise", "0.6")
    r1, r6 = (np.fromfile(os.path.join(d, "data_batch_1.bin"), np.uint8).reshape(500, 3073) for d in (C1, C6))
    check(rc == 0 and rc2 == 0 and np.array_equal(r1, rec) and np.array_equal(r6[:, 0], rec[:, 0]) and
          np.abs(r6[:, 1:].astype(int) - r1[:, 1:]).mean() > 20, "piperun-data cifar --noise: 0.1 is the default's bytes; 0.6 the same "
          "labels with noisier pixels", err + err2)
    for args in ([], ["bogus", M], ["mnist"], ["mnist", M, "--n", "0"], ["mnist", M, "--n", "12x"], ["mnist", M, "--vocab", "9"],
                 ["tokens", TOK, "--vocab", "1"], ["cifar", C, "--llmc"], ["tokens", TOK, "--n"], ["mnist", M, "extra"],
                 ["mnist", M, "--noise", "-1"], ["cifar", C, "--noise", "nan"], ["cifar", C, "--noise"], ["tokens", TOK, "--noise", "0.5"]):
        rc, out, err = run(gen, *args)
        check(rc == 2 and "usage: piperun-data" in err and sanitizer_clean(err), "piperun-data %s: usage, exit 2" % " ".join(args) if args else "piperun-data with no arguments: usage, exit 2", err)
    blocker = os.path.join(T, "afile")
    open(blocker, "w").write("x")
    rc, _, err = run(gen, "tokens", os.path.join(blocker, "t.bin"))
    rc2, _, err2 = run(gen, "mnist", os.path.join(blocker, "d"))
    check(rc == 1 and rc2 == 1 and "error" in err and "error" in err2 and sorted(os.listdir(T)).count("afile") == 1 and open(blocker).read() == "x",
          "piperun-data into an impossible path: a message, exit 1 (%s)" % err.strip(), err + err2)
    refuses_to_replace(gen, T)
    leftovers = [f for d in (T, M, C) for f in os.listdir(d) if ".tmp-" in f]
    check(not leftovers, "no temporary files left behind", leftovers)

    # ---- data_open on the generated sets ----
    for path, hint, want in ((M, 0, "kind 1 n 6000 c 1 h 28 w 28 nclasses 10"), (M, 1, "kind 1 n 6000 c 1 h 28 w 28 nclasses 10"),
                             (C, 0, "kind 2 n 500 c 3 h 32 w 32 nclasses 10"), (C, 2, "kind 2 n 500 c 3 h 32 w 32 nclasses 10"),
                             (TOK, 0, "kind 3 n 200000"), (TOKL, 3, "kind 3 n 200000")):
        rc, out, err = P("open", path, hint)
        check(rc == 0 and out.startswith(want) and sanitizer_clean(err), "data_open %s (hint %d): %s" % (os.path.basename(path), hint, want), out + err)
    # A held-out set (hint | 16, run.sh --val): the directory's test files where it has them, else its training files.
    MT, CT = os.path.join(T, "mnist_t"), os.path.join(T, "cifar_t")
    for d, k, n in ((MT, "mnist", "600"), (CT, "cifar", "300")):
        run(gen, k, d, "--n", n)
    for path, hint, want in ((MT, 16, "kind 1 n 600 "), (CT, 16, "kind 2 n 300 "), (CT, 18, "kind 2 n 300 ")):
        rc, out, err = P("open", path, hint)
        check(rc == 0 and out.startswith(want), "data_open %s (hint %d), no test files: the training files, %s" % (os.path.basename(path), hint, want),
              out + err)
    rc, _, err = run(gen, "mnist", MT, "--test")
    rc2, _, err2 = run(gen, "cifar", CT, "--test", "--n", "70")
    check(rc == 0 and rc2 == 0 and sorted(os.listdir(MT)) == ["t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", "train-images-idx3-ubyte",
                                                              "train-labels-idx1-ubyte"] and sorted(os.listdir(CT)) == ["data_batch_1.bin", "test_batch.bin"],
          "piperun-data --test writes the held-out files beside the training ones", err + err2 + str(os.listdir(MT) + os.listdir(CT)))
    for path, hint, want in ((MT, 16, "kind 1 n 1000 "), (MT, 17, "kind 1 n 1000 "), (MT, 0, "kind 1 n 600 "), (MT, 1, "kind 1 n 600 "),
                             (CT, 16, "kind 2 n 70 "), (CT, 18, "kind 2 n 70 "), (CT, 0, "kind 2 n 300 ")):
        rc, out, err = P("open", path, hint)
        check(rc == 0 and out.startswith(want), "data_open %s (hint %d): %s" % (os.path.basename(path), hint, want), out + err)
    # The same classes, other samples: the first held-out image is none of the training ones.
    tr = np.fromfile(os.path.join(CT, "data_batch_1.bin"), np.uint8).reshape(-1, 3073)
    te = np.fromfile(os.path.join(CT, "test_batch.bin"), np.uint8).reshape(-1, 3073)
    check(not any(np.array_equal(te[0], r) for r in tr) and set(te[:, 0]) <= set(range(10)), "the held-out samples are new ones")

    # ---- IDX parse and data_images scaling ----
    sel = [0, 5, 5999, 17, 5]
    out_f = os.path.join(T, "x.bin")
    rc, _, err = P("images", M, out_f, *sel)
    buf = open(out_f, "rb").read() if rc == 0 else b""
    x = np.frombuffer(buf[:4 * 784 * len(sel)], np.float32).reshape(len(sel), 1, 28, 28) if buf else None
    lab = np.frombuffer(buf[4 * 784 * len(sel):], np.int64) if buf else None
    want = X[sel].astype(np.float32)[:, None] / np.float32(255) if ok else None
    check(rc == 0 and x is not None and np.array_equal(x, want) and np.array_equal(lab, Y[sel].astype(np.int64)),
          "data_images on MNIST: float32 NCHW == pixel/255.0f exactly, int64 labels, for a slice of indices", err)
    check(x is not None and x.min() == 0.0 and x.max() == 1.0, "data_images values lie in [0,1] and reach both ends")
    # a hand-made IDX set with other dims and the dotted file names
    D = os.path.join(T, "idx_dots")
    os.makedirs(D)
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (37, 10, 12), dtype=np.uint8)
    labs = rng.integers(0, 10, 37)
    write_idx_images(os.path.join(D, "train-images.idx3-ubyte"), imgs)
    write_idx_labels(os.path.join(D, "train-labels.idx1-ubyte"), labs)
    rc, out, err = P("open", D)
    rc2, _, err2 = P("images", D, out_f, 36, 0, 3)
    buf = open(out_f, "rb").read() if rc2 == 0 else b""
    ok = rc == 0 and out.startswith("kind 1 n 37 c 1 h 10 w 12") and rc2 == 0
    ok = ok and np.array_equal(np.frombuffer(buf[:4 * 360], np.float32).reshape(3, 10, 12), imgs[[36, 0, 3]] / np.float32(255))
    ok = ok and np.array_equal(np.frombuffer(buf[4 * 360:], np.int64), labs[[36, 0, 3]])
    check(ok, "IDX with 10x12 images under the train-images.idx3-ubyte names parses like numpy", out + err + err2)

    # ---- CIFAR parse: batches 1 and 3 present, read in numeric order ----
    D = os.path.join(T, "cifar13")
    os.makedirs(D)
    recs = {}
    for b, n in ((3, 7), (1, 5)):
        r = rng.integers(0, 256, (n, 3073), dtype=np.uint8)
        r[:, 0] = rng.integers(0, 10, n)
        r.tofile(os.path.join(D, "data_batch_%d.bin" % b))
        recs[b] = r
    allr = np.concatenate([recs[1], recs[3]])
    rc, out, err = P("open", D)
    sel = list(range(12))[::-1]
    rc2, _, err2 = P("images", D, out_f, *sel)
    buf = open(out_f, "rb").read() if rc2 == 0 else b""
    ok = rc == 0 and out.startswith("kind 2 n 12 c 3 h 32 w 32") and rc2 == 0
    ok = ok and np.array_equal(np.frombuffer(buf[:4 * 3072 * 12], np.float32).reshape(12, 3, 32, 32),
                               allr[sel, 1:].reshape(12, 3, 32, 32) / np.float32(255))
    ok = ok and np.array_equal(np.frombuffer(buf[4 * 3072 * 12:], np.int64), allr[sel, 0])
    check(ok, "CIFAR-10 batches 1 and 3: 12 records in numeric order, CHW pixels and labels as numpy reads them", out + err + err2)
    rec = np.fromfile(cf, np.uint8).reshape(500, 3073)
    rc, _, err = P("images", C, out_f, 499, 0)
    buf = open(out_f, "rb").read() if rc == 0 else b""
    check(rc == 0 and np.array_equal(np.frombuffer(buf[:4 * 3072 * 2], np.float32), (rec[[499, 0], 1:] / np.float32(255)).ravel()),
          "data_images on the generated CIFAR set matches numpy", err)

    # ---- sample order ----
    def indices(path, B, shuffle, seed, steps):
        rc, out, err = P("indices", path, B, shuffle, seed, *steps)
        if rc != 0 or not sanitizer_clean(err):
            print("   " + err)
            return None
        return [list(map(int, l.split())) for l in out.splitlines()]

    B, n = 64, 6000
    bpe = n // B  # 93; samples 5952.. are dropped
    steps = [0, 1, 92, 93, 94, 200, 1000]
    got = indices(M, B, 0, 1, steps)
    want = [list(range((s % bpe) * B, (s % bpe) * B + B)) for s in steps]
    check(got == want and got[0] == list(range(64)) and got[3] == list(range(64)),
          "no shuffle: step s uses samples [k*B, k*B+B), k = s %% %d; step 93 starts epoch 1 at sample 0" % bpe)
    ep0 = indices(M, B, 1, 1, range(0, bpe))
    ep1 = indices(M, B, 1, 1, range(bpe, 2 * bpe))
    flat0 = [i for b in ep0 or [] for i in b]
    flat1 = [i for b in ep1 or [] for i in b]
    check(len(flat0) == bpe * B and len(set(flat0)) == bpe * B and 0 <= min(flat0) and max(flat0) < n,
          "shuffle: an epoch's %d batches are %d distinct samples" % (bpe, bpe * B))
    check(flat0 != flat1 and set(flat0) != set(range(bpe * B)), "shuffle: epochs 0 and 1 differ (and the dropped samples vary)")
    p0, p1 = perm_ref(n, 1, 0), perm_ref(n, 1, 1)
    check(flat0 == p0[:bpe * B] and flat1 == p1[:bpe * B], "shuffle == the documented splitmix64 Fisher-Yates reproduced in Python (epochs 0, 1)")
    again = indices(M, B, 1, 1, [5, 100])
    other = indices(M, B, 1, 2, [5, 100])
    check(again == [ep0[5], ep1[100 - bpe]] and other != again, "shuffle is deterministic per seed, different for another seed")
    mixed = indices(M, B, 1, 1, [100, 3, 100, 300, 3, 0])
    ref = [perm_ref(n, 1, s // bpe)[(s % bpe) * B:(s % bpe) * B + B] for s in [100, 3, 100, 300, 3, 0]]
    check(mixed == ref, "shuffle: steps asked out of order across epochs (the cached permutation) give the same batches")
    small = indices(D, 5, 1, 9, [0, 1, 2, 3])  # n = 12, B = 5: bpe 2
    check(small is not None and all(sorted(set(b)) == sorted(b) for b in small) and small[0] + small[1] == perm_ref(12, 9, 0)[:10]
          and small[2] + small[3] == perm_ref(12, 9, 1)[:10], "shuffle on 12 samples, B 5: two batches an epoch, the last 2 dropped")

    # ---- tokens ----
    def tokens(path, step, B, T_, first, nseq):
        rc, out, err = P("tokens", path, step, B, T_, first, nseq)
        if rc != 0 or not sanitizer_clean(err):
            print("   " + err)
            return None
        l = out.splitlines()
        return int(l[0].split()[1]), np.array(l[1].split(), np.int64), np.array(l[2].split(), np.int64)

    def ref_tokens(arr, step, B, T_, first, nseq):
        nb = (len(arr) - 1) // (B * T_)
        start = (step % nb) * B * T_
        a = start + first * T_
        return start, arr[a:a + nseq * T_].astype(np.int64), arr[a + 1:a + 1 + nseq * T_].astype(np.int64)

    TS = os.path.join(T, "tok_small.bin")
    small_tok = rng.integers(0, 1000, 3 * 4 * 8 + 1).astype("<u2")  # exactly 3 batches of B 4, T 8
    small_tok.tofile(TS)
    ok = True
    for path, arr in ((TOK, tok), (TOKL, tok), (TS, small_tok)):
        for (step, B_, T_, first, nseq) in ((0, 8, 32, 0, 8), (1, 8, 32, 0, 8), (5, 8, 32, 3, 2), (780, 8, 32, 0, 8), (781, 8, 32, 7, 1),
                                            (0, 4, 8, 0, 4), (2, 4, 8, 2, 2), (3, 4, 8, 0, 4), (100, 4, 8, 1, 3)):
            if (path != TS) != (B_ == 8):
                continue
            g, r = tokens(path, step, B_, T_, first, nseq), ref_tokens(arr, step, B_, T_, first, nseq)
            if g is None or g[0] != r[0] or not np.array_equal(g[1], r[1]) or not np.array_equal(g[2], r[2]):
                ok = False
                print("   mismatch %s step %d B %d T %d first %d nseq %d" % (os.path.basename(path), step, B_, T_, first, nseq))
    check(ok, "data_tokens == llm.c's loader (start (s % nb)*B*T, nb = (n-1)/(B*T); y = x shifted by one; sub-ranges) on raw and llm.c files")
    g = tokens(TOK, 781, 8, 32, 0, 1)
    check(g is not None and g[0] == 0 and (200000 - 1) // 256 == 781, "tokens wrap: 200000 tokens, B*T 256: step 781 starts again at 0")
    g = tokens(TS, 2, 4, 8, 3, 1)
    check(g is not None and g[0] == 64 and g[2][-1] == small_tok[-1], "97 tokens, B*T 32: step 2 reads up to the very last token as y")

    # ---- checks that pass ----
    for args, what in ((("check-images", M, 0, 1, 28, 28, 10), "generated MNIST passes a 1x28x28, 10-class model"),
                       (("check-images", C, 0, 3, 32, 32, 10), "generated CIFAR passes a 3x32x32, 10-class model"),
                       (("check-tokens", TOK, 0, 64, 257), "generated tokens pass vocab 64, one batch of 8x32+1"),
                       (("check-tokens", TOKL, 0, 64, 200000), "llm.c tokens pass with exactly n tokens needed")):
        rc, out, err = P(*args)
        check(rc == 0 and out.strip() == "ok" and sanitizer_clean(err), what, err)

    # ---- errors ----
    E = os.path.join(T, "err")
    os.makedirs(E)

    def mk(name):
        d = os.path.join(E, name)
        os.makedirs(d)
        return d

    bad("missing path", ("open", os.path.join(E, "nope")), "nope", "missing")
    bad("empty directory", ("open", mk("empty")), "no training data here", "train-images-idx3-ubyte", "data_batch_1.bin")
    d = mk("only_images")
    write_idx_images(os.path.join(d, "train-images-idx3-ubyte"), imgs)
    bad("images without labels", ("open", d), "only_images/train-labels-idx1-ubyte", "missing file")
    d = mk("gz")
    open(os.path.join(d, "train-images-idx3-ubyte.gz"), "wb").write(b"\x1f\x8b")
    open(os.path.join(d, "train-labels-idx1-ubyte.gz"), "wb").write(b"\x1f\x8b")
    bad("only .gz files", ("open", d), "train-images-idx3-ubyte", "gunzip")
    d = mk("magic")
    write_idx_images(os.path.join(d, "train-images-idx3-ubyte"), imgs, magic=0x804)
    write_idx_labels(os.path.join(d, "train-labels-idx1-ubyte"), labs)
    bad("bad image magic", ("open", d), "magic/train-images-idx3-ubyte", "bad magic 0x00000804", "0x00000803")
    d = mk("lmagic")
    write_idx_images(os.path.join(d, "train-images-idx3-ubyte"), imgs)
    write_idx_labels(os.path.join(d, "train-labels-idx1-ubyte"), labs, magic=0x08010000)
    bad("bad label magic", ("open", d), "lmagic/train-labels-idx1-ubyte", "bad magic")
    d = mk("trunc")
    write_idx_images(os.path.join(d, "train-images-idx3-ubyte"), imgs)
    write_idx_labels(os.path.join(d, "train-labels-idx1-ubyte"), labs)
    os.truncate(os.path.join(d, "train-images-idx3-ubyte"), 16 + 37 * 120 - 1)
    bad("truncated images", ("open", d), "trunc/train-images-idx3-ubyte", "truncated", "37 images of 10x12")
    d = mk("trunc_hdr")
    open(os.path.join(d, "train-images-idx3-ubyte"), "wb").write(struct.pack(">II", 0x803, 5))
    write_idx_labels(os.path.join(d, "train-labels-idx1-ubyte"), labs)
    bad("truncated header", ("open", d), "trunc_hdr/train-images-idx3-ubyte", "truncated", "header")
    d = mk("extra")
    write_idx_images(os.path.join(d, "train-images-idx3-ubyte"), imgs)
    write_idx_labels(os.path.join(d, "train-labels-idx1-ubyte"), labs)
    open(os.path.join(d, "train-labels-idx1-ubyte"), "ab").write(b"\0")
    bad("labels file with a byte too many", ("open", d), "extra/train-labels-idx1-ubyte", "extra bytes")
    d = mk("count")
    write_idx_images(os.path.join(d, "train-images-idx3-ubyte"), imgs)
    write_idx_labels(os.path.join(d, "train-labels-idx1-ubyte"), labs[:36])
    bad("images/labels count mismatch", ("open", d), "count/train-labels-idx1-ubyte", "36 labels", "37 images", "must match")
    d = mk("zerodim")
    write_idx_images(os.path.join(d, "train-images-idx3-ubyte"), np.zeros((3, 0, 5), np.uint8))
    write_idx_labels(os.path.join(d, "train-labels-idx1-ubyte"), [1, 2, 3])
    bad("zero image height", ("open", d), "zerodim/train-images-idx3-ubyte", "wrong dims")
    d = mk("range")
    big = np.zeros(400, np.uint8)
    big[345] = 12
    write_idx_images(os.path.join(d, "train-images-idx3-ubyte"), np.zeros((400, 28, 28), np.uint8))
    write_idx_labels(os.path.join(d, "train-labels-idx1-ubyte"), big)
    bad("label out of range", ("check-images", d, 0, 1, 28, 28, 10), "range/train-labels-idx1-ubyte: label 12 at sample 345 is out of range for a model with 10 classes")
    rc, out, _ = P("check-images", d, 0, 1, 28, 28, 13)
    check(rc == 0 and out.strip() == "ok", "the same labels pass a 13-class model")
    bad("wrong image size", ("check-images", M, 0, 3, 32, 32, 10), "images are 1x28x28", "expects 3x32x32")
    bad("image data for a token model", ("check-tokens", M, 0, 64, 10), "holds images", "token ids")
    bad("token data for an image model", ("check-images", TOK, 0, 1, 28, 28, 10), "holds tokens")
    d = mk("cifar_bad")
    r = rng.integers(0, 10, (4, 3073), dtype=np.uint8)
    r.tofile(os.path.join(d, "data_batch_1.bin"))
    r[2, 0] = 10
    r.tofile(os.path.join(d, "data_batch_2.bin"))
    bad("CIFAR label out of range names the batch file and record", ("check-images", d, 0, 3, 32, 32, 10),
        "cifar_bad/data_batch_2.bin: label 10 at record 2 (sample 6) is out of range for a model with 10 classes")
    open(os.path.join(d, "data_batch_2.bin"), "ab").write(b"\1\2\3")
    bad("CIFAR batch not a whole number of records", ("open", d), "data_batch_2.bin", "truncated", "3 bytes left over")
    bad("MNIST hint on a CIFAR directory", ("open", d, 1), "train-images-idx3-ubyte", "missing file")
    bad("MNIST hint on a file", ("open", TOK, 1), "tok.bin", "a file", "directory")
    bad("token hint on a directory", ("open", M, 3), "mnist", "a directory")
    d = mk("cifar_gz")
    open(os.path.join(d, "data_batch_1.bin.gz"), "wb").write(b"\x1f\x8b")
    bad("CIFAR only .gz", ("open", d), "data_batch_1.bin", "gunzip")
    tv = rng.integers(0, 64, 1000).astype("<u2")
    tv[777] = 70
    tv.tofile(os.path.join(E, "tok_vocab.bin"))
    bad("token >= vocab", ("check-tokens", os.path.join(E, "tok_vocab.bin"), 0, 64, 10),
        "tok_vocab.bin: token 70 at position 777 is out of range for a model with vocabulary 64")
    bad("too few tokens for one batch", ("check-tokens", TS, 0, 1000, 98), "tok_small.bin", "97 tokens", "needs 98")
    # A mapped file rewritten in place after the checks (issue 34, item 14): the loaders check what they hand out.
    tv[777] = 5
    tv.tofile(os.path.join(E, "tok_live.bin"))
    bad("a token file rewritten in place after the check", ("rewritten", os.path.join(E, "tok_live.bin"), 64, os.path.join(E, "tok_live.bin"),
        2 * 321 + 1), "tok_live.bin changed during the run", "token %d at position 321" % (0xff00 | int(tv[321])), "below 64")
    ML = os.path.join(T, "mnist_live")
    shutil.copytree(M, ML)
    bad("MNIST labels rewritten in place after the check", ("rewritten", ML, 10, os.path.join(ML, "train-labels-idx1-ubyte"), 8 + 4321),
        "train-labels-idx1-ubyte changed during the run", "label 255 at sample 4321", "below 10")
    open(os.path.join(E, "odd.bin"), "wb").write(b"\1\0\2")
    bad("odd-sized raw token file", ("open", os.path.join(E, "odd.bin")), "odd.bin", "truncated", "odd size")
    open(os.path.join(E, "empty.bin"), "wb").close()
    bad("empty token file", ("open", os.path.join(E, "empty.bin")), "empty.bin", "empty")
    # Issue 34, item 16: a FIFO as the data (run.sh --data or --val, a token model's or any) is refused at once:
    # open() waited for a writer, and the run hung with no time limit.
    fifo = os.path.join(E, "tokens.fifo")
    os.mkfifo(fifo)
    for hint, what in ((0, "detected"), (3, "token"), (3 | 16, "held-out token")):
        try:
            p = subprocess.run([probe, "open", fifo, str(hint)], capture_output=True, text=True, env=ENV, timeout=20)
            rc, err = p.returncode, p.stderr
        except subprocess.TimeoutExpired:
            rc, err = None, "still waiting after 20 s"
        check(rc == 1 and err.startswith("error: data ") and "tokens.fifo" in err and "not a regular file" in err and sanitizer_clean(err),
              f"error: a FIFO as {what} data is refused at once -> {err.strip()[len('error: '):]}", f"rc {rc}: {err}")

    def llmc(name, magic, version, count, ntok, pad=0):
        h = np.zeros(256, "<i4")
        h[:3] = magic, version, count
        p = os.path.join(E, name)
        open(p, "wb").write(h.tobytes() + np.arange(ntok, dtype="<u2").tobytes() + b"\0" * pad)
        return p

    bad("llm.c count larger than the file", ("open", llmc("short.bin", 20240520, 1, 100, 99)), "short.bin", "truncated", "100 tokens")
    bad("llm.c count smaller than the file", ("open", llmc("long.bin", 20240520, 1, 100, 101)), "long.bin", "count mismatch", "100 tokens")
    bad("llm.c version 2 (uint32)", ("open", llmc("v2.bin", 20240520, 2, 100, 200)), "v2.bin", "version 2")
    p = os.path.join(E, "hdr.bin")
    open(p, "wb").write(struct.pack("<iii", 20240520, 1, 5))
    bad("llm.c header cut short", ("open", p), "hdr.bin", "truncated", "1024-byte header")
    bad("an llm.c model checkpoint", ("open", llmc("model.bin", 20240326, 3, 0, 10)), "model.bin", "checkpoint")
    bad("an IDX file given as the path", ("open", imgf), "train-images-idx3-ubyte", "MNIST IDX file", "directory")
    rc, out, err = P("open", imgf, 3)
    check(rc == 0 and out.startswith("kind 3 n %d" % ((16 + 6000 * 784) // 2)), "with the token hint the same file is read as raw tokens", err)

    # ---- learnability ----
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.set_num_threads(min(4, os.cpu_count() or 1))
    torch.manual_seed(0)

    class LeNet5(nn.Module):  # as onnx_models/export.py
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.fc1, self.fc2, self.fc3 = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))

    Xf = torch.from_numpy(X.astype(np.float32)[:, None] / np.float32(255))
    Yl = torch.from_numpy(Y.astype(np.int64))
    m = LeNet5()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    losses = []
    for s in range(150):
        k = s % bpe
        loss = F.cross_entropy(m(Xf[k * 64:k * 64 + 64]), Yl[k * 64:k * 64 + 64])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    end = float(np.mean(losses[-10:]))
    print("# LeNet-5 on generated MNIST, SGD lr 0.05, batch 64: " + " ".join("%d:%.2f" % (s, losses[s]) for s in range(0, 150, 15)) + " 149:%.3f" % losses[-1])
    check(losses[0] > 2.0 and end < 0.5, "the generated MNIST set is learnable: LeNet-5 loss %.2f -> %.3f (mean of the last 10) in 150 steps" % (losses[0], end))

    V, Bt, Tt = 64, 16, 32
    train_tok = torch.from_numpy(tok[:180000].astype(np.int64))
    held = torch.from_numpy(tok[180000:].astype(np.int64))
    bigram = nn.Sequential(nn.Embedding(V, 32), nn.Linear(32, V))
    opt = torch.optim.Adam(bigram.parameters(), lr=0.02)
    nb = (len(train_tok) - 1) // (Bt * Tt)
    first = None
    for s in range(300):
        a = (s % nb) * Bt * Tt
        loss = F.cross_entropy(bigram(train_tok[a:a + Bt * Tt]), train_tok[a + 1:a + 1 + Bt * Tt])
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        ev = F.cross_entropy(bigram(held[:-1]), held[1:]).item()
    # the chain's own conditional entropies, from counts
    t = tok.astype(np.int64)
    c2 = np.bincount(t[:-1] * V + t[1:], minlength=V * V).reshape(V, V) + 1e-9
    h2 = float(-(c2 / c2.sum() * np.log(c2 / c2.sum(1, keepdims=True))).sum())
    c3 = np.bincount((t[:-2] * V + t[1:-1]) * V + t[2:], minlength=V ** 3).reshape(V * V, V) + 1e-9
    h3 = float(-(c3 / c3.sum() * np.log(c3 / c3.sum(1, keepdims=True))).sum())
    print("# bigram model on generated tokens: loss %.2f -> held-out %.3f; ln V = %.3f; empirical H(next|prev) %.3f, H(next|prev 2) %.3f"
          % (first, ev, math.log(V), h2, h3))
    check(ev < 0.5 * math.log(V), "the generated token stream is learnable: bigram held-out loss %.2f < 0.5 ln %d = %.2f" % (ev, V, 0.5 * math.log(V)))
    check(h3 < h2 - 0.3, "two tokens of context help (H %.2f < %.2f): there is something for attention to learn" % (h3, h2))


if __name__ == "__main__":
    sys.exit(main())
