#!/usr/bin/python3
"""The benchmark-only models (issue 15's acceptance list), exported at bench time into bench/work/models/.

  resnet18: torchvision.models.resnet18(num_classes=10), trained on 32x32 CIFAR-format images
            (onnx_models/export.py --large exports the same model, at the same input size, into large/).
  gpt2blk:  a GPT-2-small-shaped block stack: onnx_models/export.py's GPT class (the sample GPT's class) with
            d = 768, 12 heads, T = 128, 2 blocks and a vocabulary of 256, so the blocks, not the embedding or
            the head, hold the work (the head is about 1.4% of the FLOPs).

Both are exported by onnx_models/export.py's export() (torch.manual_seed(0) before the model is built, training
mode, constant folding, opset 14 as for the sample ResNet and GPT); torch_bench.py builds the PyTorch side with
build() below, after the same torch.manual_seed(0), so both sides start from the same weights.

  /usr/bin/python3 bench/bench_models.py OUTDIR [NAME...]     # export (all by default); prints one line per file
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "onnx_models"))

GPT2BLK = dict(vocab_size=256, block_size=128, n_embd=768, n_head=12, n_layer=2)

# name: (ONNX file, data kind, input shape of one sample or (vocab, T) for tokens, opset)
MODELS = {
    "resnet18": ("resnet18_32.onnx", "cifar", (3, 32, 32), 14),
    "gpt2blk": ("gpt2blk.onnx", "tokens", (GPT2BLK["vocab_size"], GPT2BLK["block_size"]), 14),
}


def build(name):
    """The torch model (call torch.manual_seed(0) first for the exported weights)."""
    if name == "resnet18":
        import torchvision
        return torchvision.models.resnet18(num_classes=10)
    if name == "gpt2blk":
        from export import GPT
        return GPT(**GPT2BLK)
    raise KeyError(name)


def path_of(name, outdir):
    return os.path.join(outdir, MODELS[name][0])


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    import export as ex
    for name in sys.argv[2:] or list(MODELS):
        fname, kind, shape, opset = MODELS[name]
        if kind == "tokens":
            make_input, input_name = ex.rand_tokens(shape[0], shape[1]), "tokens"
        else:
            make_input, input_name = ex.rand_images(*shape), "input"
        ex.export(fname, lambda: build(name), make_input, input_name, opset, outdir)


if __name__ == "__main__":
    main()
