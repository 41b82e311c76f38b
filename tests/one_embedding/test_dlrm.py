"""The DLRM example learns the planted click model, with the disk tier in use."""

import re
import sys

import numpy as np

from sbpflow.examples import dlrm

from .conftest import run_job


def test_auc_helper_against_pairs():
    rng = np.random.default_rng(0)
    labels = (rng.random(300) < 0.4).astype(np.float32)
    scores = np.round(rng.standard_normal(300) + labels, 1)  # with ties
    pos, neg = scores[labels > 0], scores[labels == 0]
    pairs = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
    assert abs(dlrm.auc(labels, scores) - pairs) < 1e-12


def test_dlrm_learns_with_a_table_bigger_than_its_cache(tmp_path):
    r = dlrm.main(steps=60, batch_size=256, vocab=1000, cache_mb=0.5, path=str(tmp_path),
                  eval_size=4000, log_every=1000)
    assert r["keys"] > r["cache_rows"] and r["evictions"] > 0 and r["writebacks"] > 0
    assert 0.85 < r["planted_auc"] < 1.0
    assert r["auc"] > 0.7, r  # far above chance (0.5) after 60 steps ...
    assert r["auc"] < r["planted_auc"] + 0.01, r  # ... and not above the planted ceiling


def test_dlrm_learns_in_nn_graph(tmp_path):
    r = dlrm.main(steps=60, batch_size=256, vocab=1000, cache_mb=0.5, path=str(tmp_path),
                  eval_size=4000, log_every=1000, graph=True)
    ops = r["job_ops"]
    assert ops.count("one_embedding_lookup") == 1 and ops.count("adam_update") > 0
    assert ops.count("one_embedding_gradient_shuffle") == 1
    assert ops.count("one_embedding_adagrad_update") == 1
    assert r["keys"] > r["cache_rows"] and r["evictions"] > 0 and r["writebacks"] > 0
    assert r["auc"] > 0.7, r
    assert r["auc"] < r["planted_auc"] + 0.01, r


def test_dlrm_two_ranks_through_the_launcher(tmp_path):
    cmd = [sys.executable, "-m", "sbpflow.distributed.launch", "--nproc-per-node", "2", "-m",
           "sbpflow.examples.dlrm", "--steps", "40", "--batch-size", "128", "--vocab", "1000",
           "--cache-mb", "0.5", "--path", str(tmp_path)]
    job = run_job(cmd, timeout=300)
    assert job.returncode == 0, job.output
    m = re.search(r"held-out AUC ([0-9.]+)\s+\(planted model's AUC, the ceiling: ([0-9.]+)\)",
                  job.stdout)
    assert m, job.output
    assert float(m.group(1)) > 0.6 and float(m.group(2)) > 0.85, job.stdout
    assert (tmp_path / "rank-0" / "values").exists() and (tmp_path / "rank-1" / "values").exists()
    assert job.strays == 0
