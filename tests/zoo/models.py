"""The real-model zoo: torchvision classifiers and two transformer language
models, built with random initialization (fixed seeds, never downloaded
weights) at sizes small enough to train a few steps on 2 cores, and their
ONNX export in training mode.

Images are CIFAR-10's 3x32x32 (the runtime's image formats are MNIST 1x28x28
and CIFAR-10 3x32x32).  Two torchvision models need a word at that size:

  * vgg11_bn: five max-pools take 32x32 to 1x1 and torchvision's
    AdaptiveAvgPool2d((7, 7)) then copies the one value into every cell of
    7x7.  torch's ONNX exporter refuses adaptive pooling whose output is not a
    divisor of its input, so `avgpool` is exported as the same copy written as
    expand(); the values are identical (an average over one element is the
    element), the classifier keeps its 512*7*7 inputs.
  * alexnet: its three stride-2 max-pools need at least 63x63, so the model
    zero-pads the 32x32 image to 64x64 (ZeroPad2d, an ONNX Pad) before
    torchvision's alexnet; the 1x1 feature map then goes through its
    AdaptiveAvgPool2d((6, 6)) written as expand(), as for vgg.

Dropout: PyTorch's random masks cannot be reproduced, so every nn.Dropout is
set to p = 0.0 before export (alexnet, vgg11_bn, mnasnet0_5, mobilenet_v2,
mobilenet_v3_small, googlenet, squeezenet1_1, the transformer LM).
"""
import importlib.util
import io
import os
import warnings

import onnx
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OPSET = 14          # BatchNormalization-14 (training_mode=1, running statistics as outputs)
VOCAB, SEQ = 64, 32  # the language models: uint16 tokens < VOCAB, sequences of SEQ

warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
warnings.filterwarnings("ignore", category=UserWarning)


def _export_module():
    spec = importlib.util.spec_from_file_location("pipecc_onnx_export", os.path.join(ROOT, "onnx_models", "export.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class ExpandPool(nn.Module):
    """AdaptiveAvgPool2d(size) of a 1x1 map, which copies the value: as expand()."""

    def __init__(self, size):
        super().__init__()
        self.size = size

    def forward(self, x):
        assert x.shape[-2:] == (1, 1), x.shape
        return x.expand(-1, -1, self.size, self.size)


class PaddedAlexNet(nn.Module):
    def __init__(self):
        super().__init__()
        import torchvision
        self.pad = nn.ZeroPad2d(16)
        self.net = torchvision.models.alexnet(weights=None, num_classes=10)
        self.net.avgpool = ExpandPool(6)

    def forward(self, x):
        return self.net(self.pad(x))


class TransformerLM(nn.Module):
    """nn.TransformerEncoder (2 layers, d 64, 4 heads, causal mask) as a
    next-token language model: token + learned position embeddings, encoder,
    linear head."""

    def __init__(self, vocab=VOCAB, T=SEQ, d=64, heads=4, layers=2):
        super().__init__()
        self.T = T
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, T, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model=d, nhead=heads, dim_feedforward=2 * d, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("causal", torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1))

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos
        return self.head(self.encoder(x, mask=self.causal))


def tied_gpt():
    """The sample GPT (onnx_models/export.py), 2 layers, with the output head's
    weight tied to the token embedding, as GPT-2 has it."""
    m = _export_module().GPT(vocab_size=VOCAB, block_size=SEQ, n_embd=64, n_head=4, n_layer=2)
    with torch.no_grad():
        m.wte.weight.normal_(0.0, 0.02)   # GPT-2's init (nn.Embedding's N(0, 1) makes tied logits huge)
    m.lm_head.weight = m.wte.weight
    return m


def _tv(name, **kw):
    def build():
        import torchvision
        m = getattr(torchvision.models, name)(weights=None, num_classes=10, **kw)
        if name == "vgg11_bn":
            m.avgpool = ExpandPool(7)
        return m
    return build


# name -> (builder, kind): kind "image" trains on CIFAR-10 (3x32x32, 10
# classes), "tokens" on a uint16 token file with next-token labels.
MODELS = {
    "resnet18": (_tv("resnet18"), "image"),
    "mobilenet_v2": (_tv("mobilenet_v2"), "image"),
    "mobilenet_v3_small": (_tv("mobilenet_v3_small"), "image"),
    "squeezenet1_1": (_tv("squeezenet1_1"), "image"),
    "shufflenet_v2_x0_5": (_tv("shufflenet_v2_x0_5"), "image"),
    "densenet121": (_tv("densenet121"), "image"),
    "googlenet": (_tv("googlenet", aux_logits=False, init_weights=True), "image"),
    "vgg11_bn": (_tv("vgg11_bn"), "image"),
    "alexnet": (PaddedAlexNet, "image"),
    "mnasnet0_5": (_tv("mnasnet0_5"), "image"),
    "transformer_lm": (TransformerLM, "tokens"),
    "gpt_tied": (tied_gpt, "tokens"),
}


def build(name, seed=0):
    """The model with random init from a fixed seed, dropout off, in train mode."""
    torch.manual_seed(seed)
    model = MODELS[name][0]()
    for mod in model.modules():
        if isinstance(mod, nn.Dropout):
            mod.p = 0.0
    model.train()
    return model


def count_params(model):
    return sum(p.numel() for p in model.parameters())


def export(name, path):
    """Export `name` to path (training mode, no constant folding, opset 14,
    dynamic batch).  Returns the torch model whose state the ONNX file holds:
    the export traces one forward pass in training mode, which moves
    BatchNorm's running statistics, so the reference starts from the file."""
    model = build(name)
    torch.manual_seed(1)
    if MODELS[name][1] == "image":
        dummy, input_name = torch.rand(2, 3, 32, 32), "input"
    else:
        dummy, input_name = torch.randint(0, VOCAB, (2, SEQ), dtype=torch.long), "tokens"
    buf = io.BytesIO()
    torch.onnx.export(model, (dummy,), buf, export_params=True, opset_version=OPSET, do_constant_folding=False,
                      training=torch.onnx.TrainingMode.TRAINING, input_names=[input_name], output_names=["logits"],
                      dynamic_axes={input_name: {0: "batch"}, "logits": {0: "batch"}})
    m = onnx.load_from_string(buf.getvalue())
    onnx.checker.check_model(m)
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return model, m
