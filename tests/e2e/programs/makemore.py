"""makemore-style character models: bigram counts, a one-hot neural bigram trained by hand,
and an MLP with a hand-written batch norm, sampled with a seeded `torch.Generator`.

Plain PyTorch. The test runs it with torch and with `import torch` resolving to sbpflow. The
weights and data come from a seeded NumPy generator, so both runs start the same.

The `torch.randn(..., generator=g)` draws are replaced by NumPy ones before training (the
libraries' random numbers differ); the sampled names are printed, not compared.
"""
import json

import numpy as np
import torch
import torch.nn.functional as F

rng = np.random.default_rng(0)
syll = ["an", "el", "ma", "ri", "to", "ka", "li", "so", "ne", "vi"]
words = ["".join(rng.choice(syll, size=rng.integers(1, 4))) for _ in range(200)]
chars = sorted(list(set(''.join(words))))
stoi = {s: i+1 for i, s in enumerate(chars)}
stoi['.'] = 0
itos = {i: s for s, i in stoi.items()}
V = len(stoi)

# -- bigram counts -------------------------------------------------------------------------------
N = torch.zeros((V, V), dtype=torch.int32)
for w in words:
    chs = ['.'] + list(w) + ['.']
    for ch1, ch2 in zip(chs, chs[1:]):
        N[stoi[ch1], stoi[ch2]] += 1
P = (N+1).float()
P /= P.sum(1, keepdims=True)
g = torch.Generator().manual_seed(2147483647)
out = []
ix = 0
while True:
    p = P[ix]
    ix = torch.multinomial(p, num_samples=1, replacement=True, generator=g).item()
    out.append(itos[ix])
    if ix == 0 or len(out) > 30:
        break
log_likelihood = 0.0
n = 0
for w in words:
    chs = ['.'] + list(w) + ['.']
    for ch1, ch2 in zip(chs, chs[1:]):
        prob = P[stoi[ch1], stoi[ch2]]
        logprob = torch.log(prob)
        log_likelihood += logprob
        n += 1
nll = -log_likelihood
counts_nll = (nll / n).item()

# -- neural bigram -------------------------------------------------------------------------------
xs, ys = [], []
for w in words:
    chs = ['.'] + list(w) + ['.']
    for ch1, ch2 in zip(chs, chs[1:]):
        xs.append(stoi[ch1])
        ys.append(stoi[ch2])
xs = torch.tensor(xs)
ys = torch.tensor(ys)
num = xs.nelement()
W = torch.randn((V, V), generator=g, requires_grad=True)
with torch.no_grad():
    W.copy_(torch.from_numpy(rng.normal(size=(V, V)).astype(np.float32)))
bigram = []
for k in range(20):
    xenc = F.one_hot(xs, num_classes=V).float()
    logits = xenc @ W
    counts = logits.exp()
    probs = counts / counts.sum(1, keepdims=True)
    loss = -probs[torch.arange(num), ys].log().mean() + 0.01*(W**2).mean()
    bigram.append(loss.item())
    W.grad = None
    loss.backward()
    W.data += -10 * W.grad

# -- MLP (makemore part 3) -----------------------------------------------------------------------
block_size = 3


def build_dataset(words):
    X, Y = [], []
    for w in words:
        context = [0] * block_size
        for ch in w + '.':
            ix = stoi[ch]
            X.append(context)
            Y.append(ix)
            context = context[1:] + [ix]
    X = torch.tensor(X)
    Y = torch.tensor(Y)
    return X, Y


n1 = int(0.8*len(words))
Xtr, Ytr = build_dataset(words[:n1])
Xdev, Ydev = build_dataset(words[n1:])
n_embd, n_hidden = 6, 32
g = torch.Generator().manual_seed(2147483647)
C = torch.randn((V, n_embd), generator=g)
W1 = torch.randn((n_embd * block_size, n_hidden), generator=g) * (5/3)/((n_embd * block_size)**0.5)
W2 = torch.randn((n_hidden, V), generator=g) * 0.01
b2 = torch.randn(V, generator=g) * 0
bngain = torch.ones((1, n_hidden))
bnbias = torch.zeros((1, n_hidden))
bnmean_running = torch.zeros((1, n_hidden))
bnstd_running = torch.ones((1, n_hidden))
parameters = [C, W1, W2, b2, bngain, bnbias]
for p in parameters[:3]:
    p.data = torch.from_numpy(rng.normal(size=tuple(p.shape)).astype(np.float32)) * 0.3
print(sum(p.nelement() for p in parameters))
for p in parameters:
    p.requires_grad = True
lre = torch.linspace(-3, 0, 1000)
lrs = 10**lre
lossi = []
for i in range(30):
    ix = torch.from_numpy(rng.integers(0, Xtr.shape[0], size=(32,)))
    Xb, Yb = Xtr[ix], Ytr[ix]
    emb = C[Xb]
    embcat = emb.view(emb.shape[0], -1)
    hpreact = embcat @ W1
    bnmeani = hpreact.mean(0, keepdim=True)
    bnstdi = hpreact.std(0, keepdim=True)
    hpreact = bngain * (hpreact - bnmeani) / bnstdi + bnbias
    with torch.no_grad():
        bnmean_running = 0.999 * bnmean_running + 0.001 * bnmeani
        bnstd_running = 0.999 * bnstd_running + 0.001 * bnstdi
    h = torch.tanh(hpreact)
    logits = h @ W2 + b2
    loss = F.cross_entropy(logits, Yb)
    for p in parameters:
        p.grad = None
    loss.backward()
    lr = 0.1 if i < 20 else 0.01
    for p in parameters:
        p.data += -lr * p.grad
    lossi.append(loss.log10().item())


@torch.no_grad()
def split_loss(x, y):
    emb = C[x]
    embcat = emb.view(emb.shape[0], -1)
    hpreact = embcat @ W1
    hpreact = bngain * (hpreact - bnmean_running) / bnstd_running + bnbias
    h = torch.tanh(hpreact)
    logits = h @ W2 + b2
    loss = F.cross_entropy(logits, y)
    return loss.item()


dev = split_loss(Xdev, Ydev)
g = torch.Generator().manual_seed(2147483647 + 10)
for _ in range(3):
    out = []
    context = [0] * block_size
    while True:
        emb = C[torch.tensor([context])]
        h = torch.tanh(bngain * (emb.view(1, -1) @ W1 - bnmean_running) / bnstd_running + bnbias)
        logits = h @ W2 + b2
        probs = F.softmax(logits, dim=1)
        ix = torch.multinomial(probs, num_samples=1, generator=g).item()
        context = context[1:] + [ix]
        out.append(ix)
        if ix == 0 or len(out) > 20:
            break
    print(''.join(itos[i] for i in out))
print(json.dumps({"counts_nll": counts_nll, "bigram": bigram, "losses": lossi, "dev": dev,
                  "lrs": [lrs[0].item(), lrs[-1].item()]}))
