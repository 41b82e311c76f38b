"""An LSTM image classifier, in the style of PyTorch's mnist_rnn example: the rows of a 12x12
image are the time steps; BatchNorm1d on the last output, Adadelta and StepLR.

Plain PyTorch. The test runs it with torch and with `import torch` resolving to sbpflow. The
weights and data come from a seeded NumPy generator, so both runs start the same.
"""
import json

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.rnn = nn.LSTM(input_size=12, hidden_size=32, batch_first=True)
        self.batchnorm = nn.BatchNorm1d(32)
        self.dropout1 = nn.Dropout2d(0.0)
        self.dropout2 = nn.Dropout2d(0.0)
        self.fc1 = nn.Linear(32, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, input):
        input = input.reshape(-1, 12, 12)
        output, hidden = self.rnn(input)
        output = output[:, -1, :]
        output = self.batchnorm(output)
        output = self.dropout1(output)
        output = self.fc1(output)
        output = F.relu(output)
        output = self.dropout2(output)
        output = self.fc2(output)
        output = F.log_softmax(output, dim=1)
        return output


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
rng = np.random.default_rng(0)
protos = rng.normal(size=(10, 1, 12, 12)).astype(np.float32)
labels = rng.integers(0, 10, size=96)
images = protos[labels] + 0.5 * rng.normal(size=(96, 1, 12, 12)).astype(np.float32)
train_set = torch.utils.data.TensorDataset(torch.from_numpy(images[:64]),
                                           torch.from_numpy(labels[:64]))
test_set = torch.utils.data.TensorDataset(torch.from_numpy(images[64:]),
                                          torch.from_numpy(labels[64:]))
train_loader = torch.utils.data.DataLoader(train_set, batch_size=16, shuffle=False)
test_loader = torch.utils.data.DataLoader(test_set, batch_size=32)
model = Net().to(device)
with torch.no_grad():
    for name, p in model.named_parameters():
        p.copy_(torch.from_numpy(rng.uniform(-0.2, 0.2, size=p.shape).astype(np.float32)))
optimizer = optim.Adadelta(model.parameters(), lr=3.0)
scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
losses, tests = [], []
for epoch in range(1, 4):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    tests += [test_loss / len(test_loader.dataset), correct]
    scheduler.step()
print(json.dumps({"losses": losses, "tests": tests,
                  "running_mean": model.batchnorm.running_mean.tolist()}))
