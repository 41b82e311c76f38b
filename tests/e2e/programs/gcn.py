"""A graph convolutional network (Kipf and Welling), in the style of PyTorch's gcn example:
the adjacency is a `torch.sparse_coo_tensor` built from an int32 NumPy edge list's
transpose, self-loops come from `torch.eye(V) + adj` (dense + sparse), the renormalisation is
`D^-1/2 A D^-1/2` with `torch.diag(...).to_sparse()` on both sides of `@` (sparse @ dense,
dense @ sparse), the node features are row-scaled the same way and handed over as a sparse
tensor, and each layer is `torch.mm(features, W)` then `torch.spmm(adj, support)`, trained
with Adam (weight decay) and NLL loss on a training mask.

Plain PyTorch. The test runs it with torch and with `import torch` resolving to sbpflow. The
graph (a planted partition: Cora-like classes, sparse bag-of-words features) and the weights
come from a seeded NumPy generator, so both runs start the same; dropout is 0 so they stay
equal (torch and sbpflow draw different random numbers).
"""
import json

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Adam

torch.manual_seed(0)
rng = np.random.default_rng(0)


class GraphConv(nn.Module):
    def __init__(self, input_dim, output_dim, use_bias=False):
        super(GraphConv, self).__init__()
        self.kernel = nn.Parameter(torch.Tensor(input_dim, output_dim))
        nn.init.xavier_normal_(self.kernel)
        self.bias = None
        if use_bias:
            self.bias = nn.Parameter(torch.Tensor(output_dim))
            nn.init.zeros_(self.bias)

    def forward(self, input_tensor, adj_mat):
        support = torch.mm(input_tensor, self.kernel)
        output = torch.spmm(adj_mat, support)
        if self.bias is not None:
            output = output + self.bias
        return output


class GCN(nn.Module):
    def __init__(self, input_dim, hidden_dim, output_dim, use_bias=True, dropout_p=0.1):
        super(GCN, self).__init__()
        self.gc1 = GraphConv(input_dim, hidden_dim, use_bias=use_bias)
        self.gc2 = GraphConv(hidden_dim, output_dim, use_bias=use_bias)
        self.dropout = nn.Dropout(dropout_p)

    def forward(self, input_tensor, adj_mat):
        x = self.gc1(input_tensor, adj_mat)
        x = F.relu(x)
        x = self.dropout(x)
        x = self.gc2(x, adj_mat)
        return F.log_softmax(x, dim=1)


def make_graph(nodes=120, classes=4, words=60):
    """A planted partition: most edges inside a class, words drawn per class."""
    labels = rng.integers(0, classes, nodes)
    edges = []
    for a in range(nodes):
        for b in rng.integers(0, nodes, 4):
            if labels[a] == labels[b] or rng.random() < 0.15:
                edges.append((a, int(b)))
    topics = rng.random((classes, words)) < 0.15
    bag = (rng.random((nodes, words)) < 0.08) | (topics[labels] & (rng.random((nodes, words))
                                                                   < 0.5))
    return bag.astype(np.int32), labels, np.array(edges, dtype=np.int32)


def load_graph():
    bag, labels, edges = make_graph()
    features = torch.FloatTensor(bag)
    scale_vector = torch.sum(features, dim=1)
    scale_vector = 1 / scale_vector
    scale_vector[scale_vector == float('inf')] = 0
    scale_vector = torch.diag(scale_vector).to_sparse()
    features = scale_vector @ features

    labels = torch.LongTensor(labels)
    V, E = len(labels), edges.shape[0]
    adj_mat = torch.sparse_coo_tensor(edges.T, torch.ones(E), (V, V), dtype=torch.int64)
    adj_mat = torch.eye(V) + adj_mat
    degree_mat = torch.sum(adj_mat, dim=1)
    degree_mat = torch.sqrt(1 / degree_mat)
    degree_mat[degree_mat == float('inf')] = 0
    degree_mat = torch.diag(degree_mat).to_sparse()
    adj_mat = degree_mat @ adj_mat @ degree_mat
    return features.to_sparse(), labels, adj_mat.to_sparse()


def test(model, criterion, input, target, mask):
    model.eval()
    with torch.no_grad():
        output = model(*input)
        output, target = output[mask], target[mask]
        loss = criterion(output, target)
        acc = (output.argmax(dim=1) == target).float().sum() / len(target)
    return loss.item(), acc.item()


features, labels, adj_mat = load_graph()
idx = torch.from_numpy(rng.permutation(len(labels)))
idx_test, idx_val, idx_train = idx[:40], idx[40:60], idx[60:]

gcn = GCN(features.shape[1], 16, labels.max().item() + 1, True, 0.0)
with torch.no_grad():  # the same start in both runs
    for p in gcn.parameters():
        p.copy_(torch.from_numpy(rng.normal(0, 0.3, size=tuple(p.shape)).astype(np.float32)))
optimizer = Adam(gcn.parameters(), lr=0.01, weight_decay=5e-4)
criterion = nn.NLLLoss()

losses, val = [], []
for epoch in range(40):
    gcn.train()
    optimizer.zero_grad()
    output = gcn(features, adj_mat)
    loss = criterion(output[idx_train], labels[idx_train])
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
    val.append(test(gcn, criterion, (features, adj_mat), labels, idx_val)[0])
loss_test, acc_test = test(gcn, criterion, (features, adj_mat), labels, idx_test)
print(f'Test set results: loss {loss_test:.4f} accuracy {acc_test:.4f}')
print(json.dumps({"losses": losses, "val": val, "test": [loss_test, acc_test],
                  "nnz": adj_mat._nnz()}))
