"""A Transformer language model, in the style of the Transformer variant of PyTorch's
word_language_model example: a `PositionalEncoding` buffer, `nn.TransformerEncoder`, a square
subsequent mask, gradient clipping and hand-written SGD.

Plain PyTorch. The test runs it with torch and with `import torch` resolving to sbpflow. The
weights and data come from a seeded NumPy generator, so both runs start the same.
"""
import json
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=5000):
        super(PositionalEncoding, self).__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0).transpose(0, 1)
        self.register_buffer('pe', pe)

    def forward(self, x):
        x = x + self.pe[:x.size(0), :]
        return self.dropout(x)


class TransformerModel(nn.Module):
    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5):
        super(TransformerModel, self).__init__()
        from torch.nn import TransformerEncoder, TransformerEncoderLayer
        self.model_type = 'Transformer'
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        encoder_layers = TransformerEncoderLayer(ninp, nhead, nhid, dropout)
        self.transformer_encoder = TransformerEncoder(encoder_layers, nlayers)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)
        self.init_weights()

    def _generate_square_subsequent_mask(self, sz):
        mask = (torch.triu(torch.ones(sz, sz)) == 1).transpose(0, 1)
        mask = mask.float().masked_fill(mask == 0, float('-inf')).masked_fill(mask == 1, float(0.0))
        return mask

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, src, has_mask=True):
        if has_mask:
            device = src.device
            if self.src_mask is None or self.src_mask.size(0) != len(src):
                mask = self._generate_square_subsequent_mask(len(src)).to(device)
                self.src_mask = mask
        else:
            self.src_mask = None

        src = self.encoder(src) * math.sqrt(self.ninp)
        src = self.pos_encoder(src)
        output = self.transformer_encoder(src, self.src_mask)
        output = self.decoder(output)
        return F.log_softmax(output, dim=-1)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


def get_batch(source, i, bptt=8):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i:i+seq_len]
    target = source[i+1:i+1+seq_len].view(-1)
    return data, target


rng = np.random.default_rng(0)
ntokens = 30
tokens = [0]
for u in rng.random(399):
    tokens.append((tokens[-1] * 7 + 3) % ntokens if u < 0.9 else int(u * 1000) % ntokens)
train_data = batchify(torch.tensor(tokens, dtype=torch.long), 8)
model = TransformerModel(ntokens, 16, 2, 32, 2, dropout=0.0)
with torch.no_grad():
    for name, p in model.named_parameters():
        p.copy_(torch.from_numpy(rng.uniform(-0.2, 0.2, size=tuple(p.shape)).astype(np.float32)))
criterion = nn.NLLLoss()
lr = 2.0
# nn.Transformer's own mask is the same as the hand-written one.
m1 = nn.Transformer.generate_square_subsequent_mask(5)
m2 = model._generate_square_subsequent_mask(5)
assert torch.equal(m1, m2), (m1, m2)
losses = []
for epoch in range(2):
    model.train()
    for batch, i in enumerate(range(0, train_data.size(0) - 1, 8)):
        data, targets = get_batch(train_data, i)
        model.zero_grad()
        output = model(data)
        output = output.view(-1, ntokens)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        losses.append(loss.item())
model.eval()
total_loss = 0.
with torch.no_grad():
    for i in range(0, train_data.size(0) - 1, 8):
        data, targets = get_batch(train_data, i)
        output = model(data)
        output = output.view(-1, ntokens)
        total_loss += len(data) * criterion(output, targets).item()
ev = total_loss / (len(train_data) - 1)
print(json.dumps({"losses": losses, "eval": ev, "ppl": math.exp(ev)}))
