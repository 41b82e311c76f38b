"""A variational autoencoder, in the style of PyTorch's vae example: `reparameterize` with
`torch.exp(0.5 * logvar)` and `torch.randn_like`, `binary_cross_entropy(reduction='sum')` + KLD.

Plain PyTorch. The test runs it with torch and with `import torch` resolving to sbpflow. The
weights and data come from a seeded NumPy generator, so both runs start the same.

torch and sbpflow draw different random numbers, so the compared run scales the noise by 0
(the sampling still runs); a few steps with the noise then check only that training works.
"""
import json

import numpy as np
import torch
import torch.utils.data
from torch import nn, optim
from torch.nn import functional as F

torch.manual_seed(1)
device = torch.device("cpu")


class VAE(nn.Module):
    def __init__(self):
        super(VAE, self).__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc21 = nn.Linear(32, 4)
        self.fc22 = nn.Linear(32, 4)
        self.fc3 = nn.Linear(4, 32)
        self.fc4 = nn.Linear(32, 64)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std * NOISE

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 64))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


# torch and sbpflow draw different random numbers: the comparison runs with the noise scaled to 0
# (the sampling still runs), a second short run with noise checks only that training works.
NOISE = 0.0


def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 64), reduction='sum')
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


rng = np.random.default_rng(0)
data = (rng.random((64, 1, 8, 8)) < rng.random((1, 1, 8, 8))).astype(np.float32)
train_loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.from_numpy(data), torch.zeros(64)), batch_size=16)
model = VAE().to(device)
with torch.no_grad():
    for p in model.parameters():
        p.copy_(torch.from_numpy(rng.uniform(-0.3, 0.3, size=p.shape).astype(np.float32)))
optimizer = optim.Adam(model.parameters(), lr=1e-2)

losses = []
for epoch in range(1, 4):
    model.train()
    train_loss = 0
    for batch_idx, (data, _) in enumerate(train_loader):
        data = data.to(device)
        optimizer.zero_grad()
        recon_batch, mu, logvar = model(data)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        train_loss += loss.item()
        optimizer.step()
        losses.append(loss.item() / len(data))
with torch.no_grad():
    sample = torch.randn(8, 4).to(device)
    sample = model.decode(sample).cpu()
    assert sample.shape == (8, 64) and bool(((sample >= 0) & (sample <= 1)).all())
    comparison = torch.cat([data[:4], recon_batch.view(16, 1, 8, 8)[:4]])
NOISE = 1.0
noisy = []
for _ in range(5):
    optimizer.zero_grad()
    recon_batch, mu, logvar = model(data)
    loss = loss_function(recon_batch, data, mu, logvar)
    loss.backward()
    optimizer.step()
    noisy.append(loss.item())
assert all(np.isfinite(noisy))
print(json.dumps({"losses": losses, "comparison": float(comparison.sum())}))
