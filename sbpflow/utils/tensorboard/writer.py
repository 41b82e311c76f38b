"""`SummaryWriter` and `FileWriter`: torch.utils.tensorboard's writers for sbpflow.

A `FileWriter` owns one event file in one directory (tensorboard's `EventFileWriter`, which
queues events and writes them from a background thread every `flush_secs` or when the queue
holds `max_queue`).  A `SummaryWriter` owns the FileWriter of its `log_dir` and one more per
`add_scalars` series (`<log_dir>/<main_tag>_<tag>`, torch's layout, so that TensorBoard shows
each series as a run and draws them in one chart).

Values may be sbpflow tensors, NumPy arrays or Python numbers.  `close()` flushes and closes
every file; a later `add_*` call opens new event files in the same directories, as torch's
writer does.
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from datetime import datetime

from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.graph_pb2 import GraphDef
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from . import _graph, summary

__all__ = ["FileWriter", "SummaryWriter"]


class FileWriter:
    """Writes `Event` protos to a new event file in `log_dir` (torch's FileWriter)."""

    def __init__(self, log_dir, max_queue: int = 10, flush_secs: float = 120,
                 filename_suffix: str = ""):
        self.event_writer = EventFileWriter(os.fspath(log_dir), max_queue, flush_secs,
                                            filename_suffix)

    def get_logdir(self) -> str:
        return self.event_writer.get_logdir()

    def add_event(self, event: Event, step=None, walltime=None) -> None:
        """Write `event`, stamped with `walltime` (default: now) and `step` when given."""
        event.wall_time = time.time() if walltime is None else float(walltime)
        if step is not None:
            event.step = int(step)
        self.event_writer.add_event(event)

    def add_summary(self, summary_proto: Summary, global_step=None, walltime=None) -> None:
        self.add_event(Event(summary=summary_proto), global_step, walltime)

    def add_graph(self, graph_def: GraphDef, walltime=None) -> None:
        """Write a `GraphDef` (TensorBoard's graph tab shows the last one of a run)."""
        if not isinstance(graph_def, GraphDef):
            raise TypeError(f"FileWriter.add_graph: expected a GraphDef, got "
                            f"{type(graph_def).__name__} (sbpflow writes no run metadata)")
        self.add_event(Event(graph_def=graph_def.SerializeToString()), None, walltime)

    def flush(self) -> None:
        self.event_writer.flush()

    def close(self) -> None:
        self.event_writer.close()


def _default_log_dir(comment: str) -> str:
    """torch's default: runs/<Mon><day>_<HH-MM-SS>_<hostname><comment>."""
    stamp = datetime.now().strftime("%b%d_%H-%M-%S")
    return os.path.join("runs", f"{stamp}_{socket.gethostname()}{comment}")


def _check_tag(tag, what: str) -> str:
    if not isinstance(tag, str):
        raise TypeError(f"{what}: tag must be a str, got {type(tag).__name__}")
    return tag


def _unsupported(name: str):
    def method(self, *args, **kwargs):
        raise NotImplementedError(f"SummaryWriter.{name} is not implemented in sbpflow; "
                                  "supported: add_scalar, add_scalars, add_histogram, "
                                  "add_histogram_raw, add_image, add_images, add_text, "
                                  "add_graph")
    method.__name__ = name
    method.__doc__ = f"torch's SummaryWriter.{name}: not implemented (raises)."
    return method


class SummaryWriter:
    """Writes TensorBoard summaries to event files in `log_dir` (torch's SummaryWriter).

    `log_dir`: default `runs/<datetime>_<hostname><comment>`; `comment` is only used for the
    default (as in torch; given with a `log_dir` it warns).  `purge_step`: when a run restarts
    from step T, events with step >= T already in this directory (and in its `add_scalars`
    series) are hidden from TensorBoard.  `max_queue`, `flush_secs`, `filename_suffix`: as
    tensorboard's `EventFileWriter` (queue length before a write, seconds between flushes,
    suffix of the event file names)."""

    def __init__(self, log_dir=None, comment: str = "", purge_step=None, max_queue: int = 10,
                 flush_secs: float = 120, filename_suffix: str = ""):
        if log_dir is None:
            log_dir = _default_log_dir(comment)
        elif comment:
            warnings.warn("SummaryWriter: comment is only appended to the default log_dir; "
                          f"with log_dir={os.fspath(log_dir)!r} it is not used", stacklevel=2)
        if purge_step is not None and (isinstance(purge_step, bool)
                                       or not isinstance(purge_step, int) or purge_step < 0):
            raise ValueError(f"SummaryWriter: purge_step must be a non-negative int or None, "
                             f"got {purge_step!r}")
        self.log_dir = os.fspath(log_dir)
        self.purge_step = purge_step
        self.max_queue = max_queue
        self.flush_secs = flush_secs
        self.filename_suffix = filename_suffix
        self.file_writer: FileWriter | None = None
        self.all_writers: dict[str, FileWriter] = {}
        self._purged: set[str] = set()  # directories whose restart marker is written
        self._get_file_writer()

    # -- writers -----------------------------------------------------------------------------
    def _open(self, log_dir: str) -> FileWriter:
        """The FileWriter of `log_dir`, opened on first use.  The first one of a directory
        starts with the restart marker when `purge_step` is set: a SessionLog START at that
        step, on which TensorBoard drops the directory's earlier events from that step on."""
        writer = self.all_writers.get(log_dir)
        if writer is None:
            writer = self.all_writers[log_dir] = FileWriter(
                log_dir, self.max_queue, self.flush_secs, self.filename_suffix)
            if self.purge_step is not None and log_dir not in self._purged:
                writer.add_event(Event(session_log=SessionLog(status=SessionLog.START)),
                                 self.purge_step)
                self._purged.add(log_dir)
        return writer

    def _get_file_writer(self) -> FileWriter:
        if self.file_writer is None:
            self.file_writer = self._open(self.log_dir)
        return self.file_writer

    def get_logdir(self) -> str:
        """The directory the event files are written to."""
        return self.log_dir

    def _write(self, summary_proto: Summary, global_step, walltime,
               writer: FileWriter | None = None) -> None:
        (writer or self._get_file_writer()).add_summary(summary_proto, global_step, walltime)

    # -- summaries ---------------------------------------------------------------------------
    def add_scalar(self, tag: str, scalar_value, global_step=None, walltime=None,
                   new_style: bool = False, double_precision: bool = False) -> None:
        """One value of a scalar series.  Old style: a float32 `simple_value`; `new_style`:
        a tensor under the scalars plugin, float64 with `double_precision`."""
        _check_tag(tag, "add_scalar")
        self._write(summary.scalar(tag, scalar_value, new_style, double_precision),
                    global_step, walltime)

    def add_scalars(self, main_tag: str, tag_scalar_dict: dict, global_step=None,
                    walltime=None) -> None:
        """Several series in one chart: each `tag` goes to its own run directory
        `<log_dir>/<main_tag>_<tag>` ('/' in main_tag becomes '_'), under tag `main_tag`."""
        _check_tag(main_tag, "add_scalars")
        if not isinstance(tag_scalar_dict, dict):
            raise TypeError(f"add_scalars: tag_scalar_dict must be a dict, got "
                            f"{type(tag_scalar_dict).__name__}")
        base = self._get_file_writer().get_logdir()
        walltime = time.time() if walltime is None else walltime
        for tag, value in tag_scalar_dict.items():
            _check_tag(tag, "add_scalars")
            writer = self._open(base + "/" + main_tag.replace("/", "_") + "_" + tag)
            self._write(summary.scalar(main_tag, value, what="add_scalars"), global_step,
                        walltime, writer)

    def add_histogram(self, tag: str, values, global_step=None, bins="tensorflow",
                      walltime=None, max_bins=None) -> None:
        """A histogram of all elements of `values` (see `summary.histogram` for bins)."""
        _check_tag(tag, "add_histogram")
        self._write(summary.histogram(tag, values, bins, max_bins), global_step, walltime)

    def add_histogram_raw(self, tag: str, min, max, num, sum, sum_squares, bucket_limits,
                          bucket_counts, global_step=None, walltime=None) -> None:
        """A histogram from precomputed statistics; bucket_limits are right edges."""
        _check_tag(tag, "add_histogram_raw")
        self._write(summary.histogram_raw(tag, min, max, num, sum, sum_squares, bucket_limits,
                                          bucket_counts), global_step, walltime)

    def add_image(self, tag: str, img_tensor, global_step=None, walltime=None,
                  dataformats: str = "CHW") -> None:
        """One image as a PNG.  `dataformats`: an ordering of CHW (or HW for grey).  Values:
        uint8 0-255, or floats 0-1 (scaled by 255, rounded, clipped)."""
        _check_tag(tag, "add_image")
        self._write(summary.image(tag, img_tensor, dataformats), global_step, walltime)

    def add_images(self, tag: str, img_tensor, global_step=None, walltime=None,
                   dataformats: str = "NCHW") -> None:
        """A batch of images as one PNG grid, 8 images per row."""
        _check_tag(tag, "add_images")
        self._write(summary.image_grid(tag, img_tensor, dataformats), global_step, walltime)

    def add_text(self, tag: str, text_string: str, global_step=None, walltime=None) -> None:
        """A string (TensorBoard renders it as Markdown), under `<tag>/text_summary`."""
        _check_tag(tag, "add_text")
        self._write(summary.text(tag, text_string), global_step, walltime)

    def add_graph(self, model, input_to_model=None, verbose: bool = False,
                  use_strict_trace: bool = True) -> None:
        """The graph of `model(*input_to_model)`, traced by sbpflow's tracer (see `_graph`).
        `verbose` prints the traced Job."""
        job = _graph.trace_module(model, input_to_model, use_strict_trace)
        if verbose:
            print(job)
        self._get_file_writer().add_graph(_graph.graph_def(job, type(model).__name__))

    add_audio = _unsupported("add_audio")
    add_custom_scalars = _unsupported("add_custom_scalars")
    add_custom_scalars_marginchart = _unsupported("add_custom_scalars_marginchart")
    add_custom_scalars_multilinechart = _unsupported("add_custom_scalars_multilinechart")
    add_embedding = _unsupported("add_embedding")
    add_figure = _unsupported("add_figure")
    add_hparams = _unsupported("add_hparams")
    add_image_with_boxes = _unsupported("add_image_with_boxes")
    add_mesh = _unsupported("add_mesh")
    add_onnx_graph = _unsupported("add_onnx_graph")
    add_pr_curve = _unsupported("add_pr_curve")
    add_pr_curve_raw = _unsupported("add_pr_curve_raw")
    add_tensor = _unsupported("add_tensor")
    add_video = _unsupported("add_video")

    # -- lifetime ----------------------------------------------------------------------------
    def flush(self) -> None:
        """Write every pending event of every file to disk."""
        for writer in self.all_writers.values():
            writer.flush()

    def close(self) -> None:
        """Flush and close every event file; a later add_* opens new ones."""
        for writer in self.all_writers.values():
            writer.flush()
            writer.close()
        self.file_writer = None
        self.all_writers = {}

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()
