"""Sub-pixel super-resolution, in the style of PyTorch's super_resolution example.

Plain PyTorch. The test runs it with torch and with `import torch` resolving to sbpflow. The
weights and images come from a seeded NumPy generator, so both runs start the same.
"""

import json
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
upscale = 2


class Net(nn.Module):
    def __init__(self, upscale_factor):
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 16, (5, 5), (1, 1), (2, 2))
        self.conv2 = nn.Conv2d(16, 16, (3, 3), (1, 1), (1, 1))
        self.conv3 = nn.Conv2d(16, 8, (3, 3), (1, 1), (1, 1))
        self.conv4 = nn.Conv2d(8, upscale_factor ** 2, (3, 3), (1, 1), (1, 1))
        self.pixel_shuffle = nn.PixelShuffle(upscale_factor)

    def forward(self, x):
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.relu(self.conv3(x))
        return self.pixel_shuffle(self.conv4(x))


rng = np.random.default_rng(0)
# Smooth targets: upsampled noise, then low-resolution inputs by bicubic downsampling.
coarse = torch.from_numpy(rng.uniform(size=(24, 1, 6, 6)).astype(np.float32))
targets = F.interpolate(coarse, scale_factor=2, mode="bilinear", align_corners=False)
inputs = F.interpolate(targets, scale_factor=0.5, mode="bicubic", align_corners=False)
loader = DataLoader(TensorDataset(inputs, targets), batch_size=8, shuffle=False)

model = Net(upscale).to(device)
with torch.no_grad():
    for name, p in model.named_parameters():
        fan_in = p[0].numel() if p.dim() > 1 else 1
        p.copy_(torch.from_numpy(
            rng.normal(0.0, math.sqrt(2.0 / fan_in) if p.dim() > 1 else 0.01,
                       size=tuple(p.shape)).astype(np.float32)))
criterion = nn.MSELoss()
optimizer = optim.Adam(model.parameters(), lr=1e-3)

losses, psnrs = [], []
for epoch in range(3):
    for lr_img, hr_img in loader:
        optimizer.zero_grad()
        loss = criterion(model(lr_img.to(device)), hr_img.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    with torch.no_grad():
        mse = criterion(model(inputs), targets)
        psnrs.append(10 * math.log10(1 / mse.item()))
print(json.dumps({"losses": losses, "psnr": psnrs}))
