"""A character RNN with `nn.GRU`, in the style of char-rnn.pytorch: one step per character,
`Variable`, `torch.LongTensor`, Adam, `clip_grad_norm_` and temperature sampling.

Plain PyTorch. The test runs it with torch and with `import torch` resolving to sbpflow. The
weights and data come from a seeded NumPy generator, so both runs start the same.
"""
import json
import string

import numpy as np
import torch
import torch.nn as nn
from torch.autograd import Variable


class CharRNN(nn.Module):
    def __init__(self, input_size, hidden_size, output_size, model="gru", n_layers=1):
        super(CharRNN, self).__init__()
        self.model = model.lower()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.output_size = output_size
        self.n_layers = n_layers
        self.encoder = nn.Embedding(input_size, hidden_size)
        if self.model == "gru":
            self.rnn = nn.GRU(hidden_size, hidden_size, n_layers)
        elif self.model == "lstm":
            self.rnn = nn.LSTM(hidden_size, hidden_size, n_layers)
        self.decoder = nn.Linear(hidden_size, output_size)

    def forward(self, input, hidden):
        batch_size = input.size(0)
        encoded = self.encoder(input)
        output, hidden = self.rnn(encoded.view(1, batch_size, -1), hidden)
        output = self.decoder(output.view(batch_size, -1))
        return output, hidden

    def init_hidden(self, batch_size):
        if self.model == "lstm":
            return (Variable(torch.zeros(self.n_layers, batch_size, self.hidden_size)),
                    Variable(torch.zeros(self.n_layers, batch_size, self.hidden_size)))
        return Variable(torch.zeros(self.n_layers, batch_size, self.hidden_size))


all_characters = string.printable
n_characters = len(all_characters)
rng = np.random.default_rng(0)
file = "".join("the cat sat on the mat. "[i % 24] if rng.random() < 0.9 else rng.choice(list("xyz"))
               for i in range(1500))
file_len = len(file)


def char_tensor(string):
    tensor = torch.zeros(len(string)).long()
    for c in range(len(string)):
        try:
            tensor[c] = all_characters.index(string[c])
        except ValueError:
            continue
    return tensor


def random_training_set(chunk_len, batch_size):
    inp = torch.LongTensor(batch_size, chunk_len)
    target = torch.LongTensor(batch_size, chunk_len)
    for bi in range(batch_size):
        start_index = int(rng.integers(0, file_len - chunk_len))
        end_index = start_index + chunk_len + 1
        chunk = file[start_index:end_index]
        inp[bi] = char_tensor(chunk[:-1])
        target[bi] = char_tensor(chunk[1:])
    inp = Variable(inp)
    target = Variable(target)
    return inp, target


def generate(decoder, prime_str='A', predict_len=20, temperature=0.8):
    hidden = decoder.init_hidden(1)
    prime_input = Variable(char_tensor(prime_str).unsqueeze(0))
    predicted = prime_str
    for p in range(len(prime_str) - 1):
        _, hidden = decoder(prime_input[:, p], hidden)
    inp = prime_input[:, -1]
    for p in range(predict_len):
        output, hidden = decoder(inp, hidden)
        output_dist = output.data.view(-1).div(temperature).exp()
        top_i = torch.multinomial(output_dist, 1)[0]
        predicted_char = all_characters[top_i]
        predicted += predicted_char
        inp = Variable(char_tensor(predicted_char).unsqueeze(0))
    return predicted


def train(inp, target):
    hidden = decoder.init_hidden(batch_size)
    decoder.zero_grad()
    loss = 0
    for c in range(chunk_len):
        output, hidden = decoder(inp[:, c], hidden)
        loss += criterion(output.view(batch_size, -1), target[:, c])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(decoder.parameters(), 5.0)
    decoder_optimizer.step()
    return loss.data.item() / chunk_len


hidden_size, n_layers, chunk_len, batch_size = 32, 2, 12, 8
decoder = CharRNN(n_characters, hidden_size, n_characters, model="gru", n_layers=n_layers)
with torch.no_grad():
    for p in decoder.parameters():
        p.copy_(torch.from_numpy(rng.uniform(-0.15, 0.15, size=tuple(p.shape)).astype(np.float32)))
decoder_optimizer = torch.optim.Adam(decoder.parameters(), lr=0.01)
criterion = nn.CrossEntropyLoss()
losses = []
for epoch in range(1, 13):
    loss = train(*random_training_set(chunk_len, batch_size))
    losses.append(loss)
text = generate(decoder, 'the', 20, temperature=0.8)
assert len(text) == 23
print(text)
print(json.dumps({"losses": losses}))
