"""FS-EB inside your own PyTorch loop, on scikit-learn's 8×8 digits (no download, CPU, seconds).

    python docs/examples/own_loop.py

The model is a tiny MLP, so ``feature_fn`` says where its penultimate features h(x; φ0) are; a
timm model needs none (``timm_features`` is the default). The context batch x̂ is corrupted
training inputs (Gaussian pixel noise). Each epoch prints the loss terms on the whole training set.
"""

import torch
from sklearn.datasets import load_digits
from torch import nn

from fseb_ft import FSEBObjective

torch.manual_seed(0)
data, target = load_digits(return_X_y=True)  # 1,797 real 8×8 images, labels 0-9
x, y = torch.tensor(data / 16, dtype=torch.float32), torch.tensor(target)  # pixels in [0, 1]
model = nn.Sequential(nn.Sequential(nn.Linear(64, 128), nn.ReLU()), nn.Linear(128, 10))
prior = {"prior_var": 1.0, "prior_cov_scale": 0.01, "prior_cov_diag": 1.0}
objective = FSEBObjective(
    model, num_train=len(x), reg_scale=1.0, **prior, feature_fn=lambda phi0, x_hat: phi0[0](x_hat)
)  # φ0 = frozen copy of model; phi0[0] is its feature extractor
optimizer = torch.optim.SGD(objective.trainable_parameters(), lr=0.05, momentum=0.9)
for epoch in range(8):
    for batch in torch.randperm(len(x)).split(64):
        x_context = x[torch.randint(len(x), (32,))] + 0.3 * torch.randn(32, 64)  # corrupted x̂
        terms = objective(x[batch], y[batch], x_context)  # loss, nll, fs_reg, param_reg, logits
        optimizer.zero_grad()
        terms["loss"].backward()
        optimizer.step()
    with torch.no_grad():
        terms = objective(x, y, x_context)
    print(f"epoch {epoch + 1}", *(f"{k}={v:.4f}" for k, v in terms.items() if v.ndim == 0))
