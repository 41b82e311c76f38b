"""An MNIST-style CNN, in the style of PyTorch's mnist example: Adadelta, StepLR,
`log_softmax` + `nll_loss`, `torch.flatten`, a test pass with `reduction='sum'`, a checkpoint.

Plain PyTorch. The test runs it with torch and with `import torch` resolving to sbpflow. The
weights and data come from a seeded NumPy generator, so both runs start the same.
"""
import argparse
import json
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.0)
        self.dropout2 = nn.Dropout(0.0)
        self.fc1 = nn.Linear(256, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = F.dropout(x, p=0.0, training=self.training)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def train(args, model, device, train_loader, optimizer, epoch, losses):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader), loss.item()))


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'.format(
        test_loss, correct, len(test_loader.dataset),
        100. * correct / len(test_loader.dataset)))
    return test_loss, correct


def main():
    parser = argparse.ArgumentParser(description='PyTorch MNIST Example')
    parser.add_argument('--batch-size', type=int, default=16)
    parser.add_argument('--epochs', type=int, default=2)
    parser.add_argument('--lr', type=float, default=1.0)
    parser.add_argument('--gamma', type=float, default=0.7)
    parser.add_argument('--no-accel', action='store_true')
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--log-interval', type=int, default=2)
    args = parser.parse_args([])
    use_accel = not args.no_accel and torch.accelerator.is_available()
    torch.manual_seed(args.seed)
    if use_accel:
        device = torch.accelerator.current_accelerator()
    else:
        device = torch.device("cpu")
    train_kwargs = {'batch_size': args.batch_size}
    test_kwargs = {'batch_size': 32}
    if use_accel:
        train_kwargs.update({'num_workers': 1, 'pin_memory': True, 'shuffle': True})

    rng = np.random.default_rng(0)
    protos = rng.normal(size=(10, 1, 12, 12)).astype(np.float32)
    labels = rng.integers(0, 10, size=96)
    images = protos[labels] + 0.5 * rng.normal(size=(96, 1, 12, 12)).astype(np.float32)
    images = (images - images.mean()) / images.std()
    x = torch.from_numpy(images.astype(np.float32))
    y = torch.from_numpy(labels)
    dataset1 = TensorDataset(x[:64], y[:64])
    dataset2 = TensorDataset(x[64:], y[64:])
    train_loader = torch.utils.data.DataLoader(dataset1, **train_kwargs)
    test_loader = DataLoader(dataset2, **test_kwargs)

    model = Net().to(device)
    with torch.no_grad():
        for p in model.parameters():
            bound = 1.0 / np.sqrt(max(p[0].numel(), 1))
            p.copy_(torch.tensor(rng.uniform(-bound, bound, size=tuple(p.shape)),
                                 dtype=torch.float32))
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    losses, tests, lrs = [], [], []
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch, losses)
        tests.extend(test(model, device, test_loader))
        scheduler.step()
        lrs.append(scheduler.get_last_lr()[0])

    with tempfile.TemporaryDirectory() as d:
        torch.save(model.state_dict(), os.path.join(d, "mnist_cnn.pt"))
        model.load_state_dict(torch.load(os.path.join(d, "mnist_cnn.pt")))
    print(json.dumps({"losses": losses, "tests": tests, "lrs": lrs}))


if __name__ == '__main__':
    main()
