"""PyTorch trainers of the validation set: plain eager loops logged by
`tensorboard_gradients.torch.GradientMonitor` at every step.

torchvision is not used: its PyPI wheels are CUDA builds whose compiled operators do not load
against this project's CPU torch 2.13.0 (``operator torchvision::nms does not exist`` at import),
so `resnet18` below is torchvision's ResNet-18 definition written out (``BasicBlock``, the
``layerN.M.convK`` / ``bnK`` / ``downsample.0|1`` / ``fc`` names, Kaiming-normal fan-out init,
BN weight 1 and bias 0, torchvision's default ``zero_init_residual=False``).
"""

import collections

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from tensorboard_gradients.torch import GradientMonitor

from validation_models import data


def _batches(x, y, batch, steps, seed):
    """Epochs of shuffled mini-batches, ``steps`` of them in all, as tensors."""
    rng = np.random.default_rng(seed + 1)
    n = len(x)
    produced = 0
    while produced < steps:
        order = rng.permutation(n)
        for start in range(0, n - batch + 1, batch):
            if produced == steps:
                return
            index = order[start:start + batch]
            yield torch.from_numpy(x[index]), torch.from_numpy(y[index])
            produced += 1


def _train(model, optimizer, batches, log_dir, loss_fn, schedule=None, clip=None):
    """The eager loop: forward, backward, `monitor.step()` before clipping and the update."""
    losses = []
    with GradientMonitor(model, log_dir) as monitor:
        for step, (x, y) in enumerate(batches, start=1):
            if schedule is not None:
                for group in optimizer.param_groups:
                    group["lr"] = schedule(step)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model, x, y)
            loss.backward()
            monitor.step(step)
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            losses.append(float(loss.detach()))
    parameters = [p for p in model.parameters() if p.requires_grad]
    finite = [v for v in losses if np.isfinite(v)]
    return {"parameters": int(sum(p.numel() for p in parameters)),
            "variables": len(parameters),
            "loss": (losses[0], finite[-1] if finite else float("nan"))}


def _cross_entropy(model, x, y):
    return F.cross_entropy(model(x), y)


# ----------------------------------------------------------------------------- ResNet-18


class BasicBlock(nn.Module):
    """torchvision.models.resnet.BasicBlock."""

    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """torchvision.models.resnet18(weights=None, num_classes=...): same layers, names, init."""

    def __init__(self, num_classes=10, aux_head=False):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(64, 2)
        self.layer2 = self._make_layer(128, 2, stride=2)
        self.layer3 = self._make_layer(256, 2, stride=2)
        self.layer4 = self._make_layer(512, 2, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        # The disconnected-branch case: an auxiliary classifier built but never called.
        self.aux_classifier = nn.Linear(256, num_classes) if aux_head else None
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(log_dir, steps, seed=0, batch=16, aux_head=False):
    """ResNet-18 on 32x32x3 (batch 16), 10 classes, SGD(0.05, momentum 0.9, weight decay 5e-4).
    ``aux_head``: the disconnected-branch variant (``aux_classifier`` never called)."""
    torch.manual_seed(seed)
    model = ResNet18(aux_head=aux_head)
    x, y = data.images(batch * 20, seed=seed)
    x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    return _train(model, optimizer, _batches(x, y, batch, steps, seed), log_dir, _cross_entropy)


# ----------------------------------------------------------------------------- GPT-2


def gpt2(log_dir, steps, seed=0, batch=16, length=32, layers=2, width=64, heads=4,
         vocabulary=256):
    """A small GPT-2 from `transformers.GPT2Config` / `GPT2LMHeadModel` (pre-LayerNorm blocks,
    tied embeddings), next-token loss on a synthetic Markov text, the nanoGPT recipe: AdamW(6e-4,
    betas (0.9, 0.95), weight decay 0.1 on 2-D weights), linear warm-up then cosine decay,
    ``clip_grad_norm_(1.0)``."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=vocabulary, n_positions=length, n_embd=width, n_layer=layers, n_head=heads,
        bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=6e-4, betas=(0.9, 0.95))
    warmup = max(1, steps // 10)

    def schedule(step):
        if step <= warmup:
            return 6e-4 * step / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 6e-5 + 0.5 * (6e-4 - 6e-5) * (1 + np.cos(np.pi * progress))

    tokens = data.markov_text(batch * 20, length=length, vocabulary=vocabulary, seed=seed)
    batches = _batches(tokens, tokens, batch, steps, seed)

    def loss_fn(model, x, _):
        return model(input_ids=x, labels=x).loss

    return _train(model, optimizer, batches, log_dir, loss_fn, schedule=schedule, clip=1.0)


# ----------------------------------------------------------------------------- LSTM


class LSTMClassifier(nn.Module):
    def __init__(self, vocabulary=2000, embedding=64, hidden=64, classes=2):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, embedding)
        self.lstm = nn.LSTM(embedding, hidden, batch_first=True)
        self.classifier = nn.Linear(hidden, classes)

    def forward(self, tokens):
        _, (hidden, _) = self.lstm(self.embedding(tokens))
        return self.classifier(hidden[-1])


def lstm_text(log_dir, steps, seed=0, batch=32):
    """nn.Embedding(2000, 64) -> nn.LSTM(64) -> nn.Linear(2) on synthetic tokens, Adam(1e-3):
    the PyTorch twin of the Keras LSTM text classifier."""
    torch.manual_seed(seed)
    model = LSTMClassifier()
    x, y = data.token_classes(batch * 20, seed=seed)
    x = x.astype("int64")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return _train(model, optimizer, _batches(x, y, batch, steps, seed), log_dir, _cross_entropy)


# ----------------------------------------------------------------------------- sick MLPs


def _mlp(widths, activation):
    layers = []
    for i, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append((f"fc{i}", nn.Linear(n_in, n_out)))
        if i < len(widths) - 2:
            layers.append((f"act{i}", activation()))
    return nn.Sequential(collections.OrderedDict(layers))


def deep_sigmoid(log_dir, steps, seed=0, batch=64, depth=12, width=64):
    """``depth`` sigmoid Linear layers (``fc0`` input side), PyTorch's default init, SGD(0.1)."""
    torch.manual_seed(seed)
    model = _mlp([32] + [width] * depth + [10], nn.Sigmoid)
    x, y = data.features(batch * 20, seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return _train(model, optimizer, _batches(x, y, batch, steps, seed), log_dir, _cross_entropy)


def dead_relu(log_dir, steps, seed=0, batch=64):
    """A 4-layer ReLU MLP whose second layer ``fc1`` starts with bias -10 (pre-activations about
    -10 +- 1): every one of its ReLUs is dead from step 1 and stays so (Adam(1e-3))."""
    torch.manual_seed(seed)
    model = _mlp([32, 128, 128, 128, 10], nn.ReLU)
    with torch.no_grad():
        model.fc1.bias.fill_(-10.0)
    x, y = data.features(batch * 20, seed=seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return _train(model, optimizer, _batches(x, y, batch, steps, seed), log_dir, _cross_entropy)


def scaled_loss(log_dir, steps, seed=0, batch=64, scale=1e6):
    """A 4-layer ReLU MLP trained on ``loss * 1e6`` (a loss scale never undone): Adam is
    scale-free, so it trains, but every gradient is a million times too large."""
    torch.manual_seed(seed)
    model = _mlp([32, 128, 128, 128, 10], nn.ReLU)
    x, y = data.features(batch * 20, seed=seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_fn(model, x, y):
        return F.cross_entropy(model(x), y) * scale

    return _train(model, optimizer, _batches(x, y, batch, steps, seed), log_dir, loss_fn)


def diverging_lr(log_dir, steps, seed=0, batch=64, switch=40, factor=300.0):
    """A 6-layer ReLU MLP, SGD(0.01, momentum 0.9) healthy up to step ``switch``; then a broken
    schedule multiplies the learning rate by ``factor``: the norms climb and turn NaN/Inf."""
    torch.manual_seed(seed)
    model = _mlp([32] + [128] * 5 + [10], nn.ReLU)
    x, y = data.features(batch * 20, seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def schedule(step):
        return 0.01 if step < switch else 0.01 * factor

    return _train(model, optimizer, _batches(x, y, batch, steps, seed), log_dir, _cross_entropy,
                  schedule=schedule)
