"""Well-known PyTorch programs run unchanged with torch and with `import torch` giving sbpflow.

Each program under `programs/` is a plain PyTorch script written the way its original is (an
LSTM language model with packed sequences, a DCGAN, a sub-pixel super-resolution net, the MNIST
CNN and LSTM classifiers, a VAE, LSTMCell time-sequence prediction with LBFGS, polynomial
regression, a Transformer language model, a nanoGPT-style character GPT, makemore's bigram and
MLP models, a GRU char-rnn, and the GCN example's model over a sparse COO adjacency), a few
steps each. The test runs it twice in fresh interpreters:
once with the real torch, and once under `sbpflow.mock_torch`, where every `import torch...`
resolves to sbpflow. The two runs must print the same losses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = ["lstm_lm", "dcgan", "super_resolution", "mnist_cnn", "mnist_rnn", "vae",
            "time_sequence", "regression", "transformer_lm", "nanogpt", "makemore", "char_rnn",
            "gcn"]
_UNDER_SBPFLOW = (
    "import runpy, sys, sbpflow.mock_torch as m; m.enable(); "
    "assert __import__('torch').__name__ == 'sbpflow'; "
    "runpy.run_path(sys.argv[1], run_name='__main__')"
)


def _run(args) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=HERE)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", PROGRAMS)
def test_program_runs_unchanged_with_torchs_losses(name):
    path = os.path.join(HERE, "programs", name + ".py")
    ref = _run([path])
    got = _run(["-c", _UNDER_SBPFLOW, path])
    assert set(got) == set(ref)
    for key in ref:
        np.testing.assert_allclose(np.asarray(got[key], dtype=np.float64),
                                   np.asarray(ref[key], dtype=np.float64),
                                   rtol=2e-4, atol=2e-5, err_msg=f"{name}: {key}")
    # The programs do learn: the loss curve goes down under both libraries.
    losses = np.asarray(got["losses"])
    if name != "dcgan":
        assert losses[-3:].mean() < losses[:3].mean()
