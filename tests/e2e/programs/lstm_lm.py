"""A word-level LSTM language model, in the style of PyTorch's word_language_model example.

Plain PyTorch. The test runs it with torch and with `import torch` resolving to sbpflow. The
weights and the corpus come from a seeded NumPy generator, so both runs start the same.
"""

import json
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.backends.cudnn.benchmark = True
torch.manual_seed(0)


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.0, tie_weights=True):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.decoder.out_features)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous().to(device)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


rng = np.random.default_rng(0)
ntokens, ninp, nlayers, bptt = 40, 24, 2, 7
# A corpus with structure to learn: each token mostly follows from the one before it.
tokens = [0]
for noise in rng.random(599):
    tokens.append((tokens[-1] * 7 + 3) % ntokens if noise < 0.9 else int(noise * 1000) % ntokens)
corpus = torch.tensor(tokens, dtype=torch.long)
train_data = batchify(corpus, 8)
model = RNNModel(ntokens, ninp, ninp, nlayers).to(device)
with torch.no_grad():
    for name, p in model.named_parameters():
        p.data.copy_(torch.from_numpy(rng.uniform(-0.1, 0.1, size=tuple(p.shape))
                                      .astype(np.float32)))
criterion = nn.NLLLoss()
lr = 20.0

losses = []
for epoch in range(3):
    model.train()
    hidden = model.init_hidden(8)
    for i in range(0, train_data.size(0) - 1, bptt):
        data, targets = get_batch(train_data, i, bptt)
        model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        losses.append(loss.item())
    lr /= 1.5

# Evaluation on variable-length sequences through a packed batch.
model.eval()
lengths = torch.tensor([7, 5, 3])
seqs = torch.from_numpy(rng.integers(0, ntokens, size=(7, 3)).astype(np.int64))
with torch.no_grad():
    packed = pack_padded_sequence(model.encoder(seqs), lengths, enforce_sorted=True)
    out, (h, c) = model.rnn(packed)
    padded, out_lengths = pad_packed_sequence(out)
    eval_value = float(padded.sum() + h.sum())
print(json.dumps({"losses": losses, "eval": eval_value, "ppl": math.exp(losses[-1]),
                  "lengths": out_lengths.tolist()}))
