"""The small PyTorch networks of the instability set, each in the shape the literature trains it.

Names follow what users' code names (``blocks.0.attn.c_attn``, ``lstm``, ``head``), so alerts read
as they would on a real model.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    """``depth`` Linear layers of ``width`` with ReLU between them (fc0 ... fcN)."""

    def __init__(self, inputs, width, outputs, depth):
        super().__init__()
        sizes = [inputs] + [width] * (depth - 1) + [outputs]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = layer(x)
            if index < len(self.layers) - 1:
                x = F.relu(x)
        return x


class RNNLanguageModel(nn.Module):
    """An Elman RNN (tanh) language model: ``embed``, ``rnn``, ``head`` (Pascanu et al. 2013's
    setting for exploding gradients)."""

    def __init__(self, vocabulary, width=64):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.rnn = nn.RNN(width, width, batch_first=True, nonlinearity="tanh")
        self.head = nn.Linear(width, vocabulary)

    def forward(self, tokens):
        outputs, _ = self.rnn(self.embed(tokens))
        return self.head(outputs)


class Attention(nn.Module):
    """nanoGPT's causal self-attention (``c_attn``, ``c_proj``), with optional qk-layernorm
    (Wortsman et al. 2023, arXiv 2309.14322: it removes attention-logit growth)."""

    def __init__(self, width, heads, qk_norm):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)
        head = width // heads
        self.q_norm = nn.LayerNorm(head) if qk_norm else None
        self.k_norm = nn.LayerNorm(head) if qk_norm else None

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    """A transformer block, pre-LN (GPT-2) or post-LN (the original Transformer, which needs a
    learning-rate warm-up to train: Xiong et al. 2020, arXiv 2002.04745)."""

    def __init__(self, width, heads, qk_norm, post_ln=False):
        super().__init__()
        self.post_ln = post_ln
        self.ln_1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads, qk_norm)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential()
        self.mlp.add_module("c_fc", nn.Linear(width, 4 * width))
        self.mlp.add_module("gelu", nn.GELU())
        self.mlp.add_module("c_proj", nn.Linear(4 * width, width))

    def forward(self, x):
        if self.post_ln:
            x = self.ln_1(x + self.attn(x))
            return self.ln_2(x + self.mlp(x))
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    """A nanoGPT-sized decoder: token and position embeddings, ``layers`` blocks (pre-LN unless
    ``post_ln``), a final LayerNorm and an untied head; GPT-2's init (normal 0.02, residual projections scaled by
    1/sqrt(2 * layers))."""

    def __init__(self, vocabulary, length, width=64, layers=2, heads=4, qk_norm=False,
                 post_ln=False):
        super().__init__()
        self.wte = nn.Embedding(vocabulary, width)
        self.wpe = nn.Embedding(length, width)
        self.blocks = nn.ModuleList(Block(width, heads, qk_norm, post_ln) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary, bias=False)
        for name, parameter in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(parameter, 0.0, 0.02 / math.sqrt(2 * layers))
            elif parameter.dim() == 2:
                nn.init.normal_(parameter, 0.0, 0.02)
            elif name.endswith(".bias"):
                nn.init.zeros_(parameter)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class LSTMLanguageModel(nn.Module):
    """Embedding, a ``layers``-deep LSTM, a Linear head: the classic word-level LM."""

    def __init__(self, vocabulary, width=64, layers=2):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.lstm = nn.LSTM(width, width, num_layers=layers, batch_first=True)
        self.head = nn.Linear(width, vocabulary)

    def forward(self, tokens):
        output, _ = self.lstm(self.embedding(tokens))
        return self.head(output)


class SmallCNN(nn.Module):
    """Two conv layers and a Linear head, without normalisation."""

    def __init__(self, channels=1, classes=10, width=16):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.head = nn.Linear(2 * width * 4, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.adaptive_avg_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))
