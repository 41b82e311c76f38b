"""torch's device and backend namespaces on a CPU-only machine, against torch 2.13's CPU build:
sbpflow.cuda, .amp, .cuda.amp, .accelerator, .backends, .onnx, memory formats, Tensor flags,
and what using device "cuda" raises."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import sbpflow as flow


def _outcome(fn):
    """(kind, value-or-message) of calling fn, with the warnings it raised."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            r = ("ok", fn())
        except Exception as e:  # noqa: BLE001 - the outcome is what is compared
            r = (type(e).__name__, str(e))
    return r, [(x.category, str(x.message)) for x in w]


def _same(ours, theirs):
    (ko, vo), wo = _outcome(ours)
    (kt, vt), wt = _outcome(theirs)
    assert ko == kt, (vo, vt)
    if ko != "ok":
        assert vo == vt
    assert wo == wt
    return vo, vt


# -- torch.cuda -------------------------------------------------------------------------------
CUDA_CALLS = [
    ("is_available", ()), ("device_count", ()), ("is_initialized", ()), ("get_arch_list", ()),
    ("is_bf16_supported", ()), ("is_tf32_supported", ()), ("empty_cache", ()),
    ("memory_allocated", ()), ("max_memory_allocated", ()), ("memory_reserved", ()),
    ("max_memory_reserved", ()), ("memory_cached", ()), ("max_memory_cached", ()),
    ("current_device", ()), ("get_device_name", ()), ("get_device_capability", ()),
    ("get_device_properties", (0,)), ("synchronize", ()), ("init", ()), ("seed", ()),
    ("initial_seed", ()), ("get_rng_state", ()), ("mem_get_info", ()),
    ("current_stream", ()), ("default_stream", ()), ("manual_seed", (3,)),
    ("manual_seed_all", (3,)), ("seed_all", ()), ("get_rng_state_all", ()),
    ("set_rng_state_all", ([],)), ("set_device", (-1,)),
    ("set_per_process_memory_fraction", (0.5,)),
]


@pytest.mark.parametrize("name,args", CUDA_CALLS, ids=[c[0] for c in CUDA_CALLS])
def test_cuda_functions_match_torch_cpu_build(name, args):
    ours, theirs = _same(lambda: getattr(flow.cuda, name)(*args),
                         lambda: getattr(torch.cuda, name)(*args))
    if not isinstance(theirs, str):
        assert ours == theirs


def test_cuda_memory_stats_and_contexts():
    assert flow.cuda.memory_stats() == torch.cuda.memory_stats() == {}
    _same(lambda: flow.cuda.device(0).__enter__(), lambda: torch.cuda.device(0).__enter__())
    with flow.cuda.device(-1), torch.cuda.device(-1):
        pass
    with flow.cuda.stream(None), torch.cuda.stream(None):
        pass
    _same(lambda: flow.cuda.Stream(), lambda: torch.cuda.Stream())
    _same(lambda: flow.cuda.Event(), lambda: torch.cuda.Event())


def test_cuda_manual_seed_leaves_cpu_generator_alone():
    # torch's CPU build: cuda.manual_seed seeds no CPU generator; torch.manual_seed does.
    flow.manual_seed(5)
    a = flow.rand(3).numpy()
    flow.manual_seed(5)
    flow.cuda.manual_seed_all(123)
    b = flow.rand(3).numpy()
    np.testing.assert_array_equal(a, b)


# -- using device "cuda" ----------------------------------------------------------------------
@pytest.mark.parametrize("what", ["zeros", "tensor", "randn", "to", "to_index", "cuda",
                                  "module_cuda", "module_to", "full", "to_int",
                                  "module_to_int", "mps", "xpu", "hip", "pin_memory",
                                  "module_to_device"])
def test_cuda_device_use_raises_torch_error(what, tmp_path):
    def run(lib):
        calls = {
            "zeros": lambda: lib.zeros(2, device="cuda"),
            "tensor": lambda: lib.tensor([1.0], device="cuda:0"),
            "randn": lambda: lib.randn(2, device=lib.device("cuda")),
            "to": lambda: lib.ones(2).to("cuda"),
            "to_index": lambda: lib.ones(2).to(lib.device("cuda", 0)),
            "cuda": lambda: lib.ones(2).cuda(),
            "module_cuda": lambda: lib.nn.Linear(2, 2).cuda(),
            "module_to": lambda: lib.nn.Linear(2, 2).to("cuda"),
            "full": lambda: lib.full((2,), 1.0, device="cuda"),
            "to_int": lambda: lib.ones(2).to(0),
            "module_to_int": lambda: lib.nn.Linear(2, 2).to(0),
            "mps": lambda: lib.ones(2).to("mps"),
            "xpu": lambda: lib.zeros(2, device="xpu"),
            "hip": lambda: lib.ones(2).to("hip"),
            "pin_memory": lambda: lib.ones(2).pin_memory(),
            "module_to_device": lambda: lib.nn.Linear(2, 2).to(lib.device("cuda", 0)),
        }
        return calls[what]()

    _same(lambda: run(flow), lambda: run(torch))


def test_cpu_tensor_device_queries_match_torch():
    for lib in (flow, torch):
        t = lib.ones(2)
        assert t.get_device() == -1 and t.is_pinned() is False
        assert t.to("cpu", non_blocking=True) is t


def test_cuda_device_value_exists():
    d = flow.device("cuda")
    assert (d.type, d.index) == ("cuda", None)
    d1 = flow.device("cuda:1")
    assert (d1.type, d1.index, str(d1)) == ("cuda", 1, "cuda:1")
    assert repr(d1) == repr(torch.device("cuda:1"))
    with pytest.raises(RuntimeError, match="device type at start of device string: xyz"):
        flow.device("xyz")
    # the cpu keeps working
    m = flow.nn.Linear(2, 2).to("cpu")
    assert m.weight.device == flow.device("cpu")


# -- amp ----------------------------------------------------------------------------------------
def test_autocast_cuda_warns_and_disables_like_torch():
    def body(lib, make):
        with make(lib):
            return lib.is_autocast_enabled()

    for make in (lambda lib: lib.autocast("cuda"), lambda lib: lib.amp.autocast("cuda"),
                 lambda lib: lib.autocast(device_type="cuda", dtype=lib.bfloat16),
                 lambda lib: lib.cuda.amp.autocast()):
        ours, theirs = _same(lambda make=make: body(flow, make),
                             lambda make=make: body(torch, make))
        assert ours is theirs is False
    with pytest.warns(FutureWarning, match="torch.amp.autocast"):
        assert flow.cuda.amp.autocast(enabled=False)._enabled is False


def test_autocast_cpu_not_implemented_unless_disabled():
    with pytest.raises(NotImplementedError, match="AMP.* not implemented yet in sbpflow"):
        flow.autocast("cpu")
    with pytest.raises(NotImplementedError, match="not implemented yet"):
        flow.amp.autocast(device_type="cpu", dtype=flow.bfloat16)
    x = flow.ones(2, requires_grad=True)
    with flow.autocast("cpu", enabled=False):
        y = (x * 3).sum()
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])
    _same(lambda: flow.autocast("foo"), lambda: torch.autocast("foo"))


def test_autocast_as_decorator_and_custom_fwd():
    @flow.autocast("cuda", enabled=False)
    def f(a):
        return a + 1

    assert f(flow.ones(1)).item() == 2.0

    class Double(flow.autograd.Function):
        @staticmethod
        @flow.amp.custom_fwd(device_type="cuda")
        def forward(ctx, a):
            return a * 2

        @staticmethod
        @flow.amp.custom_bwd(device_type="cuda")
        def backward(ctx, g):
            return g * 2

    x = flow.ones(2, requires_grad=True)
    Double.apply(x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0])
    assert flow.amp.is_autocast_available("cuda") == torch.amp.is_autocast_available("cuda")
    assert flow.get_autocast_dtype("cpu") == flow.bfloat16
    assert flow.get_autocast_dtype("cuda") == flow.float16


def test_grad_scaler_cuda_disabled_like_torch():
    def make(lib, deprecated):
        return lib.cuda.amp.GradScaler() if deprecated else lib.amp.GradScaler("cuda")

    for deprecated in (False, True):
        _same(lambda d=deprecated: make(flow, d).is_enabled(),
              lambda d=deprecated: make(torch, d).is_enabled())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s, ts = flow.amp.GradScaler(), torch.amp.GradScaler()
    for sc, lib in ((s, flow), (ts, torch)):
        w = lib.nn.Parameter(lib.ones(2))
        opt = lib.optim.SGD([w], lr=0.1)
        loss = sc.scale((w * 2).sum())
        loss.backward()
        sc.unscale_(opt)
        sc.step(opt)
        sc.update()
        assert sc.get_scale() == 1.0 and sc.state_dict() == {} and not sc.is_enabled()
        np.testing.assert_allclose(w.detach().numpy(), [0.8, 0.8], rtol=1e-6)
        assert sc.scale([w, w])[0] is w
        assert sc._get_growth_tracker() == 0


def test_grad_scaler_cpu_matches_torch():
    """An enabled CPU scaler: scaled loss, unscaled grads, a skipped step on inf, backoff
    and growth of the scale — step by step as torch's."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(3).astype(np.float32)
    scalers = {lib: lib.amp.GradScaler("cpu", init_scale=8.0, growth_interval=2)
               for lib in (flow, torch)}
    params = {lib: lib.nn.Parameter(lib.tensor(w0.copy())) for lib in (flow, torch)}
    opts = {lib: lib.optim.SGD([params[lib]], lr=0.1) for lib in (flow, torch)}
    for step, scale_in in enumerate([1.0, 1.0, float("inf"), 1.0, 1.0]):
        res = {}
        for lib in (flow, torch):
            p, sc, opt = params[lib], scalers[lib], opts[lib]
            opt.zero_grad()
            loss = sc.scale((p * p).sum() * scale_in)
            loss.backward()
            sc.unscale_(opt)
            grad = p.grad.detach().numpy().copy()
            sc.step(opt)
            sc.update()
            res[lib] = (loss.item(), grad, p.detach().numpy().copy(), sc.get_scale(),
                        sc._get_growth_tracker())
        (lf, gf, pf, sf, tf), (lt, gt, pt, st, tt) = res[flow], res[torch]
        assert (lf == lt) or (np.isnan(lf) and np.isnan(lt)) or lf == pytest.approx(lt), step
        np.testing.assert_allclose(gf, gt, rtol=1e-6, err_msg=str(step))
        np.testing.assert_allclose(pf, pt, rtol=1e-6, err_msg=str(step))
        assert (sf, tf) == (st, tt), step
    sd_f, sd_t = scalers[flow].state_dict(), scalers[torch].state_dict()
    assert sd_f == sd_t
    for lib in (flow, torch):
        scalers[lib].step(opts[lib])
    _same(lambda: scalers[flow].step(opts[flow]), lambda: scalers[torch].step(opts[torch]))
    _same(lambda: scalers[flow].unscale_(opts[flow]),
          lambda: scalers[torch].unscale_(opts[torch]))


# -- accelerator, backends, onnx ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["current_accelerator", "is_available", "device_count",
                                  "current_device_index", "synchronize", "current_stream",
                                  "empty_cache", "memory_allocated", "get_memory_info",
                                  "empty_host_cache", "get_device_capability", "memory_stats",
                                  "reset_peak_memory_stats", "max_memory_reserved"])
def test_accelerator_matches_torch(name):
    ours, theirs = _same(getattr(flow.accelerator, name), getattr(torch.accelerator, name))
    if not isinstance(theirs, str):
        assert ours == theirs
    _same(lambda: flow.accelerator.set_device_index(0),
          lambda: torch.accelerator.set_device_index(0))


def test_backends_flags_are_kept():
    b = flow.backends
    assert (b.cudnn.enabled, b.cudnn.benchmark, b.cudnn.deterministic, b.cudnn.allow_tf32) == (
        torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32)
    assert b.cudnn.is_available() is torch.backends.cudnn.is_available() is False
    assert b.cudnn.version() is None
    try:
        b.cudnn.benchmark = True
        b.cudnn.deterministic = True
        import sbpflow.backends.cudnn as cudnn

        assert cudnn.benchmark is True and cudnn.deterministic is True
        with b.cudnn.flags(enabled=False, benchmark=False):
            assert b.cudnn.enabled is False and b.cudnn.benchmark is False
        assert b.cudnn.enabled is True and b.cudnn.benchmark is True
    finally:
        b.cudnn.benchmark = False
        b.cudnn.deterministic = False
    m = b.cuda.matmul
    assert m.allow_tf32 is torch.backends.cuda.matmul.allow_tf32
    assert (m.allow_fp16_reduced_precision_reduction
            is torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction)
    try:
        m.allow_tf32 = True
        m.allow_fp16_reduced_precision_reduction = False
        assert m.allow_tf32 is True and m.allow_fp16_reduced_precision_reduction is False
    finally:
        m.allow_tf32, m.allow_fp16_reduced_precision_reduction = False, True
    _same(lambda: setattr(b.cuda.matmul, "foo", 1),
          lambda: setattr(torch.backends.cuda.matmul, "foo", 1))
    _same(lambda: b.cuda.matmul.foo, lambda: torch.backends.cuda.matmul.foo)
    assert b.cuda.is_built() is torch.backends.cuda.is_built() is False
    assert b.mps.is_available() is b.mps.is_built() is False
    assert torch.backends.mps.is_available() is False
    assert b.mkldnn.is_available() is False and b.openmp.is_available() is False
    assert b.cuda.flash_sdp_enabled() is True


def test_onnx_export_writes_a_model(tmp_path):
    """sbpflow.onnx.export writes a checked ONNX model (tests/onnx/ runs models through
    onnxruntime)."""
    onnx = pytest.importorskip("onnx")
    import sbpflow.onnx

    sbpflow.onnx.export(flow.nn.Linear(2, 3), (flow.ones(1, 2),), str(tmp_path / "m.onnx"))
    model = onnx.load(str(tmp_path / "m.onnx"))
    onnx.checker.check_model(model)
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [1, 3]
    assert flow.onnx.is_in_onnx_export() is False


# -- Tensor flags and memory formats -------------------------------------------------------------
def test_tensor_flags_match_torch():
    for make in (lambda lib: lib.zeros(2, 3), lambda lib: lib.zeros(2, dtype=lib.int64)):
        ft, tt = make(flow), make(torch)
        for name in ("is_cuda", "is_xpu", "is_mps", "is_sparse", "is_quantized", "is_meta",
                     "is_cpu", "is_mkldnn", "is_nested"):
            assert getattr(ft, name) is getattr(tt, name), name
        assert ft.is_complex() is tt.is_complex()
        assert ft.is_floating_point() is tt.is_floating_point()
        assert flow.is_complex(ft) is torch.is_complex(tt)
        assert flow.is_floating_point(ft) is torch.is_floating_point(tt)
    with pytest.raises(TypeError, match="must be Tensor"):
        flow.is_complex(1.0)


def test_memory_formats_accepted_same_values():
    names = ("contiguous_format", "channels_last", "preserve_format", "channels_last_3d")
    for n in names:
        assert isinstance(getattr(flow, n), flow.memory_format)
        assert repr(getattr(flow, n)) == repr(getattr(torch, n)).replace("torch", "sbpflow")
    a = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    x = flow.tensor(a)
    for fmt in (flow.channels_last, flow.contiguous_format):
        np.testing.assert_array_equal(x.contiguous(memory_format=fmt).numpy(), a)
        np.testing.assert_array_equal(x.to(memory_format=fmt).numpy(), a)
        np.testing.assert_array_equal(x.clone(memory_format=fmt).numpy(), a)
        assert flow.empty_like(x, memory_format=fmt).shape == x.shape
        np.testing.assert_array_equal(flow.zeros_like(x, memory_format=fmt).numpy(), 0 * a)
    np.testing.assert_array_equal(x.to(flow.float64, memory_format=flow.preserve_format)
                                  .numpy(), a)
    _same(lambda: flow.zeros(2, 3).contiguous(memory_format=flow.channels_last),
          lambda: torch.zeros(2, 3).contiguous(memory_format=torch.channels_last))
    _same(lambda: flow.zeros(2, 3, 4, 5).contiguous(memory_format=flow.channels_last_3d),
          lambda: torch.zeros(2, 3, 4, 5).contiguous(memory_format=torch.channels_last_3d))
    for call in (lambda lib, t: t.to(memory_format=lib.channels_last),
                 lambda lib, t: t.to(lib.float64, memory_format=lib.channels_last),
                 lambda lib, t: t.clone(memory_format=lib.channels_last),
                 lambda lib, t: lib.empty_like(t, memory_format=lib.channels_last),
                 lambda lib, t: lib.zeros_like(t, memory_format=lib.channels_last_3d),
                 lambda lib, t: t.contiguous(memory_format=lib.preserve_format).shape):
        _same(lambda c=call: c(flow, flow.zeros(2, 3)), lambda c=call: c(torch, torch.zeros(2, 3)))
    with pytest.raises(TypeError, match="memory_format"):
        flow.zeros(2).to(memory_format="channels_last")
    for shape in ((1, 2, 3, 4), (2, 1, 3, 4), (2, 3, 1, 1)):
        assert (flow.zeros(shape).is_contiguous(memory_format=flow.channels_last)
                is torch.zeros(shape).is_contiguous(memory_format=torch.channels_last)), shape
    t = flow.zeros(2, 3, 4, 5).permute(0, 2, 3, 1)  # an NHWC array seen as NCHW
    tt = torch.zeros(2, 3, 4, 5).permute(0, 2, 3, 1)
    assert t.is_contiguous(memory_format=flow.channels_last) is tt.is_contiguous(
        memory_format=torch.channels_last)
    m = flow.nn.Conv2d(2, 3, 1).to(memory_format=flow.channels_last)
    np.testing.assert_allclose(m(x).detach().numpy().shape, (1, 3, 3, 4))


# -- process-wide settings and small top-level helpers ----------------------------------------
@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64"])
def test_finfo_matches_torch(name):
    ours, theirs = flow.finfo(getattr(flow, name)), torch.finfo(getattr(torch, name))
    for attr in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution", "dtype"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert repr(ours) == repr(theirs)


def test_iinfo_and_errors_match_torch():
    for name in ("uint8", "int8", "int16", "int32", "int64"):
        ours, theirs = flow.iinfo(getattr(flow, name)), torch.iinfo(getattr(torch, name))
        assert (ours.bits, ours.min, ours.max, ours.dtype) == (
            theirs.bits, theirs.min, theirs.max, theirs.dtype)
        assert repr(ours) == repr(theirs)
    assert repr(flow.finfo()) == repr(torch.finfo())
    _same(lambda: flow.finfo(flow.int32), lambda: torch.finfo(torch.int32))
    _same(lambda: flow.iinfo(flow.float32), lambda: torch.iinfo(torch.float32))


def test_layout_and_small_helpers():
    assert flow.zeros(2).layout is flow.strided
    assert repr(flow.strided) == repr(torch.strided).replace("torch", "sbpflow")
    assert isinstance(flow.strided, flow.layout)
    assert flow.numel(flow.zeros(2, 3)) == torch.numel(torch.zeros(2, 3)) == 6
    assert flow.is_nonzero(flow.tensor([1.0])) is torch.is_nonzero(torch.tensor([1.0])) is True
    assert flow.is_nonzero(flow.tensor(0)) is torch.is_nonzero(torch.tensor(0)) is False
    _same(lambda: flow.is_nonzero(flow.zeros(2)), lambda: torch.is_nonzero(torch.zeros(2)))
    _same(lambda: flow.is_nonzero(flow.zeros(0)), lambda: torch.is_nonzero(torch.zeros(0)))
    assert flow.typename(flow.zeros(1)) == "sbpflow.FloatTensor"
    assert flow.typename(1) == torch.typename(1) == "int"
    assert flow.typename(flow.nn.Linear(1, 1)) == torch.typename(torch.nn.Linear(1, 1)).replace(
        "torch", "sbpflow")
    assert str(flow.nn.Parameter(flow.ones(1))).startswith("Parameter containing:\n")


def test_float32_matmul_precision_tracks_allow_tf32_like_torch():
    matmul = flow.backends.cuda.matmul
    try:
        for lib, m in ((flow, matmul), (torch, torch.backends.cuda.matmul)):
            assert lib.get_float32_matmul_precision() == "highest" and m.allow_tf32 is False
            lib.set_float32_matmul_precision("high")
            assert m.allow_tf32 is True
            lib.set_float32_matmul_precision("medium")
            assert lib.get_float32_matmul_precision() == "medium" and m.allow_tf32 is True
            lib.set_float32_matmul_precision("highest")
            assert m.allow_tf32 is False
        # the legacy flag moves the precision (torch: allow_tf32 = True means "high")
        matmul.allow_tf32 = True
        assert flow.get_float32_matmul_precision() == "high"
        matmul.allow_tf32 = False
        assert flow.get_float32_matmul_precision() == "highest"
        with pytest.warns(UserWarning, match="is not one of 'highest', 'high', or 'medium'"):
            flow.set_float32_matmul_precision("fast")
        assert flow.get_float32_matmul_precision() == "highest"
    finally:
        flow.set_float32_matmul_precision("highest")
        torch.set_float32_matmul_precision("highest")


def test_deterministic_algorithms_flags():
    try:
        for lib in (flow, torch):
            lib.use_deterministic_algorithms(True, warn_only=True)
            assert lib.are_deterministic_algorithms_enabled() is True
            assert lib.is_deterministic_algorithms_warn_only_enabled() is True
            lib.use_deterministic_algorithms(False)
            assert lib.are_deterministic_algorithms_enabled() is False
        _same(lambda: flow.use_deterministic_algorithms("x"),
              lambda: torch.use_deterministic_algorithms("x"))
    finally:
        flow.use_deterministic_algorithms(False)
        torch.use_deterministic_algorithms(False)


def test_default_device():
    assert flow.get_default_device() == flow.device("cpu")
    flow.set_default_device("cpu")
    flow.set_default_device(None)
    assert flow.zeros(1).device == flow.device("cpu")
    _same(lambda: flow.set_default_device("xyz"), lambda: torch.set_default_device("xyz"))
    with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled"):
        flow.set_default_device("cuda")
    assert flow.get_default_device() == flow.device("cpu")


def test_num_threads(monkeypatch):
    monkeypatch.delenv("SBPFLOW_BLAS_THREADS", raising=False)
    assert flow.get_num_threads() >= 1
    _same(lambda: flow.set_num_threads(0), lambda: torch.set_num_threads(0))
    old = flow.get_num_threads()
    try:
        flow.set_num_threads(1)
        assert flow.get_num_threads() == 1
        np.testing.assert_allclose((flow.ones(8, 8) @ flow.ones(8, 8)).numpy(), 8.0)
    finally:
        flow.set_num_threads(old)


# -- legacy tensor types ------------------------------------------------------------------------
LEGACY = ["FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor",
          "IntTensor", "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor"]


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_tensor_types_match_torch(name):
    ours, theirs = getattr(flow, name), getattr(torch, name)
    assert ours.dtype.name == str(theirs.dtype).split(".")[-1].replace("bool", "bool")
    a, b = ours(2, 3), theirs(2, 3)
    assert tuple(a.shape) == tuple(b.shape) and str(a.dtype).split(".")[-1] == str(
        b.dtype).split(".")[-1]
    assert tuple(ours().shape) == tuple(theirs().shape) == (0,)
    assert tuple(ours(flow.Size([4])).shape) == tuple(theirs(torch.Size([4])).shape)
    data = [[1, 0], [3, 4]]
    np.testing.assert_array_equal(ours(data).numpy().astype(np.float64),
                                  theirs(data).float().numpy().astype(np.float64))
    assert isinstance(ours(data), ours) and isinstance(theirs(data), theirs)
    other = "LongTensor" if name != "LongTensor" else "FloatTensor"
    assert not isinstance(getattr(flow, other)(data), ours)
    assert not isinstance(ours(data), getattr(flow.cuda, name))
    assert ours(data).type() == "sbpflow." + name
    assert flow.zeros(2).type(ours).dtype is ours.dtype
    assert flow.zeros(2).type("torch." + name).dtype is ours.dtype
    _same(lambda: getattr(flow.cuda, name)(2), lambda: getattr(torch.cuda, name)(2))
    _same(lambda: ours(2.5), lambda: theirs(2.5))


def test_tensor_type_errors_match_torch():
    for arg in ("torch.Foo", "float64"):
        _same(lambda a=arg: flow.zeros(1).type(a), lambda a=arg: torch.zeros(1).type(a))
    for arg in ("torch.cuda.FloatTensor", "cuda-type"):
        with pytest.raises(RuntimeError, match="Cannot initialize CUDA"):
            flow.zeros(1).type(flow.cuda.FloatTensor if arg == "cuda-type" else arg)
        with pytest.raises(RuntimeError, match="Cannot initialize CUDA"):
            torch.zeros(1).type(torch.cuda.FloatTensor if arg == "cuda-type" else arg)
    with pytest.raises(TypeError, match="expected FloatTensor"):
        flow.FloatTensor(flow.tensor([1, 2]))
    t = flow.tensor([1.0, 2.0])
    assert flow.FloatTensor(t) is t


def test_a_cuda_generator_raises_as_on_torchs_cpu_build():
    with pytest.raises(RuntimeError) as ref:
        torch.Generator(device="cuda")
    with pytest.raises(RuntimeError, match="Cannot get CUDA generator without ATen_cuda") as got:
        flow.Generator(device="cuda")
    assert str(ref.value).startswith(str(got.value).split(";")[0])


@pytest.mark.parametrize("spec", ["cpu:abc", "cpu:-1", "cpu:1:2", "cuda:x", "cpu:", "cpu:+1"])
def test_a_malformed_device_string_raises_torchs_error(spec):
    with pytest.raises(RuntimeError) as ref:
        torch.device(spec)
    with pytest.raises(RuntimeError) as got:
        flow.device(spec)
    assert str(got.value) == str(ref.value) == f"Invalid device string: '{spec}'"


def test_a_negative_device_index_raises_torchs_error():
    with pytest.raises(RuntimeError, match="Device index must not be negative"):
        torch.device("cpu", -1)
    with pytest.raises(RuntimeError, match="Device index must not be negative"):
        flow.device("cpu", -1)


def test_compile_is_refused_saying_so_unless_disabled():
    """torch.compile has torch's signature; sbpflow refuses it with a NotImplementedError that
    names nn.Graph, except disable=True, which returns the model unchanged as torch does."""
    import inspect

    theirs = inspect.signature(torch.compile).parameters
    ours = inspect.signature(flow.compile).parameters
    assert list(ours) == list(theirs)
    assert {k: p.default for k, p in ours.items()} == {k: p.default for k, p in theirs.items()}
    model = flow.nn.Linear(2, 2)
    with pytest.raises(NotImplementedError, match=r"torch\.compile.*nn\.Graph"):
        flow.compile(model)
    assert flow.compile(model, disable=True) is model
    assert flow.compile(disable=True)(model) is model
    assert torch.compile(disable=True)(len) is len
