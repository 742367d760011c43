"""
Fitting a small PyTorch model with the Sinkhorn divergence
==========================================================

A tiny generator (an affine map of Gaussian noise, ``torch.nn.Linear``) is fitted so that its
samples match a target cloud under :class:`sketchot.SamplesLoss`, used exactly as GeomLoss's
``SamplesLoss("sinkhorn", p=2, blur=...)``: the loss is a 0-d tensor and ``backward()`` gives
the gradients, computed from the Sinkhorn potentials (no unrolled iterations).

Needs PyTorch (``pip install ".[torch]"`` in a clone). The figure goes to the system's temporary
folder (or ``--out PATH``), never into the repository. Runs in about 10-20 s on two cores.
"""

# %%
# A target cloud and a generator
# ------------------------------

import argparse
import os
import tempfile

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

import sketchot

parser = argparse.ArgumentParser(description="Fit a generator with the Sinkhorn divergence")
parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "fit_torch_model.png"))
parser.add_argument("--steps", type=int, default=60)
args, _ = parser.parse_known_args()

g = torch.Generator().manual_seed(0)
n = 500
# the target: an elongated, rotated, shifted Gaussian
A_true = torch.tensor([[0.3, 0.0], [0.2, 0.15]], dtype=torch.float64)
target = torch.randn(n, 2, generator=g, dtype=torch.float64) @ A_true.T + torch.tensor([0.6, 0.4])
model = torch.nn.Linear(2, 2).double()
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
# fresh noise at every step: a warm start by point index would mean nothing, so none
loss_fn = sketchot.SamplesLoss("sinkhorn", p=2, blur=0.05, warm_start=False, rng=0)

# %%
# Training
# --------
# Fresh noise at every step, so every step solves from scratch (``warm_start=False``; the
# default warm start suits a cloud that moves, like the gradient flow example).

history = []
for step in range(args.steps):
    noise = torch.randn(n, 2, generator=g, dtype=torch.float64)
    optimizer.zero_grad()
    loss = loss_fn(model(noise), target)
    loss.backward()
    optimizer.step()
    history.append(loss.item())
    if step % 10 == 0 or step == args.steps - 1:
        print(f"step {step:3d}: loss {loss.item():.3e} ({loss_fn.last[0].backend})")

# %%
# Result
# ------

with torch.no_grad():
    samples = model(torch.randn(n, 2, generator=g, dtype=torch.float64)).numpy()
fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
left.scatter(*target.numpy().T, s=3, c="tab:red", alpha=0.5, label="target")
left.scatter(*samples.T, s=3, c="tab:blue", alpha=0.5, label="fitted generator")
left.set(aspect="equal", title="samples")
left.legend(markerscale=4)
right.semilogy(np.maximum(history, 1e-12))
right.set(xlabel="step", title="Sinkhorn divergence (GeomLoss's scale)")
fig.tight_layout()
fig.savefig(args.out, dpi=100)
print(f"figure: {args.out}")
plt.show()
