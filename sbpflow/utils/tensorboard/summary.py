"""Summary protos for `SummaryWriter`: one function per kind of value (scalar, histogram,
image, text), each returning a `Summary` that a writer puts into an event.

The protos are tensorboard's own (`tensorboard.compat.proto`); the encodings are the ones
TensorBoard's plugins read:
- a scalar is an old-style `simple_value` (float32), or with `new_style=True` a rank-0 tensor
  under the scalars plugin (float32, or float64 with `double_precision=True`);
- a histogram is a `HistogramProto`: min, max, count, sum, sum of squares, and buckets given
  by their right edges (bucket i holds the values in (edge[i-1], edge[i]]);
- an image is a PNG (encoded with Pillow) with its height, width and channel count;
- a text is a string tensor under the text plugin, tagged `<tag>/text_summary` as torch does.
"""

from __future__ import annotations

import io

import numpy as np
from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.compat.proto.types_pb2 import DT_DOUBLE, DT_FLOAT, DT_STRING
from tensorboard.plugins.scalar import metadata as _scalar_metadata
from tensorboard.plugins.text import metadata as _text_metadata

from ...framework.tensor import Tensor

__all__ = ["histogram", "histogram_raw", "image", "image_grid", "make_np", "scalar",
           "tensorflow_bins", "text"]


def make_np(x, what: str) -> np.ndarray:
    """`x` (an sbpflow tensor, a NumPy array or scalar, a Python number or a list of them)
    as a NumPy array; `what` names the caller in the error for anything else."""
    if isinstance(x, Tensor):
        return x.detach().numpy()
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (bool, int, float, np.generic, list, tuple)) or hasattr(x, "__array__"):
        return np.asarray(x)
    raise TypeError(f"{what}: expected an sbpflow tensor, a NumPy array or a number, got "
                    f"{type(x).__name__}")


# -- scalars ---------------------------------------------------------------------------------
def scalar(tag: str, value, new_style: bool = False, double_precision: bool = False,
           what: str = "add_scalar") -> Summary:
    """A one-element value as a scalar summary (see the module docstring for the styles)."""
    arr = make_np(value, what)
    if arr.size != 1:
        raise ValueError(f"{what}: a scalar value must have exactly one element, got shape "
                         f"{tuple(arr.shape)}")
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_
            or arr.dtype.kind == "V"):  # kind V: ml_dtypes' bfloat16
        raise TypeError(f"{what}: a scalar value must be a number, got dtype {arr.dtype}")
    v = float(arr.reshape(()).astype(np.float64))
    if not new_style:
        if double_precision:
            # An old-style scalar is the proto's float32 `simple_value`: no double to give.
            raise ValueError(f"{what}: double_precision=True needs new_style=True (old-style "
                             "scalars are stored as float32 simple_value)")
        return Summary(value=[Summary.Value(tag=tag, simple_value=v)])
    if double_precision:
        proto = TensorProto(dtype=DT_DOUBLE, double_val=[v], tensor_shape=TensorShapeProto())
    else:
        proto = TensorProto(dtype=DT_FLOAT, float_val=[v], tensor_shape=TensorShapeProto())
    meta = _scalar_metadata.create_summary_metadata(display_name=tag, description="")
    return Summary(value=[Summary.Value(tag=tag, tensor=proto, metadata=meta)])


# -- histograms ------------------------------------------------------------------------------
_TF_BINS: np.ndarray | None = None


def tensorflow_bins() -> np.ndarray:
    """TensorFlow's default histogram edges: +-1e-12 growing by 10% per bucket up to 1e20, and
    0 (what `bins="tensorflow"` means; cheap to compute once)."""
    global _TF_BINS
    if _TF_BINS is None:
        pos = []
        v = 1e-12
        while v < 1e20:
            pos.append(v)
            v *= 1.1
        _TF_BINS = np.array([-x for x in reversed(pos)] + [0.0] + pos)
    return _TF_BINS


def histogram(tag: str, values, bins="tensorflow", max_bins: int | None = None) -> Summary:
    """A histogram summary of all elements of `values`.

    `bins`: "tensorflow" (TensorFlow's default edges), or anything `np.histogram` takes (a
    count, a sequence of edges, or a NumPy rule such as "auto").  `max_bins`: at most this
    many buckets, adjacent ones merged in equal groups when there are more.  Only the span
    from the first to the last non-empty bucket is kept, with one empty bucket before it so
    that its left edge is recorded too (the proto stores right edges only)."""
    arr = make_np(values, "add_histogram").astype(np.float64).reshape(-1)
    if arr.size == 0:
        raise ValueError("add_histogram: values is empty; a histogram needs at least one value")
    if max_bins is not None and (isinstance(max_bins, bool) or not isinstance(max_bins, int)
                                 or max_bins < 1):
        raise ValueError(f"add_histogram: max_bins must be a positive int or None, got "
                         f"{max_bins!r}")
    edges = tensorflow_bins() if isinstance(bins, str) and bins == "tensorflow" else bins
    counts, limits = np.histogram(arr, bins=edges)
    if max_bins is not None and counts.size > max_bins:
        group = -(-counts.size // max_bins)  # ceil: at most max_bins groups
        counts = np.pad(counts, (0, -counts.size % group)).reshape(-1, group).sum(axis=1)
        limits = np.append(limits[:-1:group], limits[-1])
    nonzero = np.flatnonzero(counts)
    if nonzero.size == 0:
        raise ValueError(f"add_histogram: no element of values falls inside the bins "
                         f"[{limits[0]:g}, {limits[-1]:g}] (NaN or out-of-range values)")
    first, last = int(nonzero[0]), int(nonzero[-1])
    return Summary(value=[Summary.Value(tag=tag, histo=HistogramProto(
        min=float(arr.min()), max=float(arr.max()), num=arr.size, sum=float(arr.sum()),
        sum_squares=float(arr.dot(arr)),
        bucket_limit=limits[first:last + 2].tolist(),
        bucket=[0.0] + counts[first:last + 1].astype(np.float64).tolist()))])


def histogram_raw(tag: str, min, max, num, sum, sum_squares, bucket_limits,
                  bucket_counts) -> Summary:
    """A histogram summary from precomputed statistics (torch's `add_histogram_raw`)."""
    limits = [float(x) for x in make_np(bucket_limits, "add_histogram_raw").reshape(-1)]
    counts = [float(x) for x in make_np(bucket_counts, "add_histogram_raw").reshape(-1)]
    if len(limits) != len(counts):
        raise ValueError(f"add_histogram_raw: bucket_limits and bucket_counts must have the "
                         f"same length, got {len(limits)} and {len(counts)}")
    return Summary(value=[Summary.Value(tag=tag, histo=HistogramProto(
        min=float(min), max=float(max), num=int(num), sum=float(sum),
        sum_squares=float(sum_squares), bucket_limit=limits, bucket=counts))])


# -- images ----------------------------------------------------------------------------------
def _permutation(dataformats, letters: str, what: str) -> tuple[int, ...]:
    """The axes of an array in `dataformats` order that put it in `letters` order."""
    if not isinstance(dataformats, str):
        raise TypeError(f"{what}: dataformats must be a string, got {type(dataformats).__name__}")
    fmt = dataformats.upper()
    if sorted(fmt) != sorted(letters):
        raise ValueError(f"{what}: dataformats must be an ordering of the letters "
                         f"{sorted(letters)} for this call, got {dataformats!r}")
    return tuple(fmt.index(c) for c in letters)


def _to_uint8(arr: np.ndarray, what: str) -> np.ndarray:
    """Pixels as uint8: uint8 as given; floats are in [0, 1] (scaled by 255, rounded to the
    nearest value, clipped); bools are 0 or 255."""
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * 255
    if np.issubdtype(arr.dtype, np.floating) or arr.dtype.kind == "V":
        f = arr.astype(np.float64)
        if not np.isfinite(f).all():
            raise ValueError(f"{what}: the image has NaN or infinite values")
        return np.clip(np.rint(f * 255.0), 0, 255).astype(np.uint8)
    raise TypeError(f"{what}: image values must be uint8 (0-255) or floating point (0-1), got "
                    f"dtype {arr.dtype}; convert with .to(torch.uint8) or divide by 255")


def _png(hwc: np.ndarray, what: str) -> Summary.Image:
    try:
        from PIL import Image
    except ImportError as e:
        raise ImportError(f"{what} needs Pillow to encode PNG images: pip install pillow "
                          "(or pip install 'sbpflow[tensorboard]')") from e
    h, w, c = hwc.shape
    if c not in (1, 2, 3, 4):
        raise ValueError(f"{what}: an image has 1 (grey), 2 (grey+alpha), 3 (RGB) or 4 (RGBA) "
                         f"channels, got {c}")
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(hwc[:, :, 0] if c == 1 else hwc)).save(buf, "PNG")
    return Summary.Image(height=h, width=w, colorspace=c, encoded_image_string=buf.getvalue())


def image(tag: str, img, dataformats: str = "CHW", what: str = "add_image") -> Summary:
    """One image (`dataformats` an ordering of CHW, or of HW for a grey image) as a PNG."""
    arr = make_np(img, what)
    letters = "HW" if len(dataformats) == 2 else "CHW"
    if arr.ndim != len(dataformats):
        raise ValueError(f"{what}: dataformats={dataformats!r} needs a {len(dataformats)}-d "
                         f"image, got shape {tuple(arr.shape)}")
    arr = arr.transpose(_permutation(dataformats, letters, what))
    hwc = arr[:, :, None] if letters == "HW" else arr.transpose(1, 2, 0)
    return Summary(value=[Summary.Value(tag=tag, image=_png(_to_uint8(hwc, what), what))])


def image_grid(tag: str, imgs, dataformats: str = "NCHW") -> Summary:
    """A batch of images laid out in a grid, 8 per row (torch's `add_images`), as one PNG."""
    what = "add_images"
    arr = make_np(imgs, what)
    if arr.ndim != 4 or len(dataformats) != 4:
        raise ValueError(f"{what}: needs a 4-d batch and 4 dataformats letters, got shape "
                         f"{tuple(arr.shape)} and {dataformats!r}")
    arr = arr.transpose(_permutation(dataformats, "NCHW", what))
    n, c, h, w = arr.shape
    if n == 0:
        raise ValueError(f"{what}: the batch is empty")
    cols = min(n, 8)
    rows = -(-n // cols)
    grid = np.zeros((rows * h, cols * w, c), dtype=arr.dtype)
    for k in range(n):
        r, q = divmod(k, cols)
        grid[r * h:(r + 1) * h, q * w:(q + 1) * w] = arr[k].transpose(1, 2, 0)
    return Summary(value=[Summary.Value(tag=tag, image=_png(_to_uint8(grid, what), what))])


# -- text ------------------------------------------------------------------------------------
def text(tag: str, text_string: str) -> Summary:
    """A string for TensorBoard's text plugin, under `<tag>/text_summary` (torch's tag)."""
    if not isinstance(text_string, str):
        raise TypeError(f"add_text: text_string must be a str, got {type(text_string).__name__}")
    proto = TensorProto(dtype=DT_STRING, string_val=[text_string.encode("utf-8")],
                        tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
    meta = _text_metadata.create_summary_metadata(display_name=tag, description="")
    return Summary(value=[Summary.Value(tag=tag + "/text_summary", tensor=proto,
                                        metadata=meta)])
