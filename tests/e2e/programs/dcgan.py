"""A small DCGAN, in the style of PyTorch's dcgan example (16x16 single-channel images).

Plain PyTorch. The test runs it with torch and with `import torch` resolving to sbpflow. The
weights, images and noise come from a seeded NumPy generator, so both runs start the same.
"""

import json

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import torch.utils.data

device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
nz, ngf, ndf, nc = 8, 8, 8, 1


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


rng = np.random.default_rng(0)


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        m.weight.data.copy_(torch.from_numpy(
            rng.normal(0.0, 0.02, size=tuple(m.weight.shape)).astype(np.float32)))
    elif classname.find("BatchNorm") != -1:
        m.weight.data.copy_(torch.from_numpy(
            rng.normal(1.0, 0.02, size=tuple(m.weight.shape)).astype(np.float32)))
        m.bias.data.fill_(0)


netG = Generator().to(device)
netG.apply(weights_init)
netD = Discriminator().to(device)
netD.apply(weights_init)

images = torch.from_numpy(np.tanh(rng.normal(size=(32, nc, 16, 16))).astype(np.float32))
dataset = torch.utils.data.TensorDataset(images)
dataloader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=False)
criterion = nn.BCELoss()
fixed_noise = torch.from_numpy(rng.normal(size=(4, nz, 1, 1)).astype(np.float32))
real_label, fake_label = 1.0, 0.0
optimizerD = optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))

history = []
for epoch in range(2):
    for i, (data,) in enumerate(dataloader):
        netD.zero_grad()
        real_cpu = data.to(device)
        batch_size = real_cpu.size(0)
        label = torch.full((batch_size,), real_label, dtype=real_cpu.dtype, device=device)
        output = netD(real_cpu)
        errD_real = criterion(output, label)
        errD_real.backward()
        D_x = output.mean().item()
        noise = torch.from_numpy(rng.normal(size=(batch_size, nz, 1, 1)).astype(np.float32))
        fake = netG(noise)
        label.fill_(fake_label)
        output = netD(fake.detach())
        errD_fake = criterion(output, label)
        errD_fake.backward()
        errD = errD_real + errD_fake
        optimizerD.step()

        netG.zero_grad()
        label.fill_(real_label)
        output = netD(fake)
        errG = criterion(output, label)
        errG.backward()
        optimizerG.step()
        history.append([errD.item(), errG.item(), D_x])

netG.eval()
with torch.no_grad():
    sample = netG(fixed_noise)
print(json.dumps({"losses": [h for row in history for h in row],
                  "sample_mean": float(sample.mean()), "sample_shape": list(sample.shape)}))
