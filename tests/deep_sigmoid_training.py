"""A deep sigmoid MLP in PyTorch whose input-side layer stays vanished while the output side
shrinks toward it (issue 33: a finding must end only when the layer itself recovers). Used by
tests/test_vanishing_persists.py.

Five Linear + Sigmoid layers and a Linear head (PyTorch's default init), SGD, seeded batches on
the CPU, logged at every step by `tensorboard_gradients.torch.GradientMonitor`. The labels
follow an imbalanced class prior and nothing else, so what the network can learn is that
prior: the head learns it within tens of steps and the output side's gradients fall about 10x,
while layer ``0``'s gradient, carried by each sample's own error, stays at about 2e-5. Its norm
starts below ``depth_ratio`` (1e-4) x the output side's and ends above it: until the depth rule
kept a finding open until the layer's own recovery, the finding on layer ``0`` ended at step 53
of 150.
"""

import torch

from tensorboard_gradients.torch import GradientMonitor

STEPS = 150
DEPTH = 5  # sigmoid layers: layers "0", "2", "4", "6", "8", then the head "10"
FIRST_LAYER = "0"
HEAD = "10"
CLASS_PRIOR = (0.9, 1 / 30, 1 / 30, 1 / 30)


def train(log_dir, steps=STEPS, seed=0, width=32, features=16, batch=64, learning_rate=0.01):
    """Trains the network, logging every step under ``log_dir``; returns the last loss."""
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(features, width), torch.nn.Sigmoid()]
    for _ in range(DEPTH - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.Sigmoid()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, len(CLASS_PRIOR)))
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    generator = torch.Generator().manual_seed(seed)
    prior = torch.tensor(CLASS_PRIOR)
    with GradientMonitor(model, log_dir) as monitor:
        for _ in range(steps):
            x = torch.randn(batch, features, generator=generator)
            y = torch.multinomial(prior, batch, replacement=True, generator=generator)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            monitor.step()
            optimizer.step()
    return loss.item()
