"""`torch.utils.tensorboard` for sbpflow: `SummaryWriter` writes TensorBoard event files.

    from sbpflow.utils.tensorboard import SummaryWriter   # torch.utils.tensorboard under
    with SummaryWriter("runs/exp1") as w:                 # sbpflow.mock_torch
        w.add_scalar("loss", loss, step)

The files are written through the `tensorboard` package itself (its `EventFileWriter` and its
protos), as torch does, so TensorBoard and its `EventAccumulator` read them as they read
torch's.  `tensorboard` is an optional dependency (`pip install 'sbpflow[tensorboard]'`);
without it this import fails exactly as torch's does (`No module named 'tensorboard'`).
"""

import re as _re

import tensorboard as _tensorboard  # absent: ModuleNotFoundError, as torch raises


def _version_tuple(text: str) -> tuple[int, ...]:
    """The leading release numbers of a version string ('2.21.0rc1' -> (2, 21, 0))."""
    m = _re.match(r"\d+(?:\.\d+)*", text)
    return tuple(int(p) for p in m.group(0).split(".")) if m else ()


# torch's check and message: the writer needs tensorboard's own summary writer (1.15+).
if _version_tuple(getattr(_tensorboard, "__version__", "")) < (1, 15):
    raise ImportError("TensorBoard logging requires TensorBoard version 1.15 or above")

from tensorboard.summary.writer.record_writer import RecordWriter  # noqa: E402

from .writer import FileWriter, SummaryWriter  # noqa: E402

__all__ = ["FileWriter", "RecordWriter", "SummaryWriter"]
