"""OneFlow's global-tensor semantics that OneFlow programs rely on, on any number of ranks.

Collected on one rank by tests/framework/test_oneflow_global.py (which imports these tests),
and run by it under `mpiexec -n 2` and `-n 4`:
`mpiexec -n N python -m mpi4py -m pytest -q -p no:cacheprovider
tests/framework/oneflow_global_check.py`. Every rank runs every test in the same order
(SPMD). Oracles: NumPy, the local (single-device) result with the same seed, and the rule
that a global tensor's logical value never depends on its placement or SBP.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import sbpflow as flow
import sbpflow.nn as nn
from sbpflow import comm
from sbpflow.nn import init
from sbpflow.utils import global_view

RANK, WORLD = comm.get_rank(), comm.get_world_size()
S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
ALL = flow.placement("cpu", list(range(WORLD)))
# Placements that are not all ranks (the last rank alone; the first ranks), and a 2-D grid.
LAST = flow.placement("cpu", [WORLD - 1])
FIRST = flow.placement("cpu", list(range(max(1, WORLD // 2))))
GRID = flow.placement("cpu", [[0, 1], [2, 3]]) if WORLD == 4 else None
WHERE = [(ALL, B), (ALL, S(0)), (ALL, S(1)), (ALL, P), (LAST, S(0)), (FIRST, S(1)),
         (FIRST, P)] + ([(GRID, (S(0), S(1))), (GRID, (P, S(0))), (GRID, (B, S(1)))]
                        if GRID is not None else [])


def _id(w):
    pl, sbp = w
    return f"{len(pl.rank_list)}r-{sbp}"


def _nd(sbp):
    return sbp if isinstance(sbp, tuple) else (sbp,)


def _piece_shape(shape, pl, sbp):
    from sbpflow.sbp import local_shape

    return tuple(local_shape(tuple(shape), pl, _nd(sbp), RANK))


# -- flow.sbp ---------------------------------------------------------------------------------
def test_sbp_called_as_a_function_is_itself_and_sbp_is_a_type():
    assert flow.sbp.broadcast() is flow.sbp.broadcast
    assert flow.sbp.partial_sum() is flow.sbp.partial_sum
    assert flow.sbp.split(1)() == flow.sbp.split(1)
    for s in (B, P, S(0), S(3)):
        assert isinstance(s, flow.sbp.sbp)
    assert not isinstance(0, flow.sbp.sbp)
    x = flow.zeros(4, 2, placement=ALL, sbp=flow.sbp.broadcast())  # the called form works
    assert x.sbp == (B,)


# -- the legacy constructor ---------------------------------------------------------------------
@pytest.mark.parametrize("sbp", [B, S(0), S(1), P], ids=str)
def test_legacy_tensor_constructor_makes_a_global_tensor_of_that_shape(sbp):
    for args in ((flow.Size([5, 3]),), (5, 3)):
        x = flow.Tensor(*args, placement=ALL, sbp=sbp)
        assert x.is_global and x.shape == (5, 3) and x.sbp == (sbp,) and x.placement == ALL
        assert x.dtype == flow.float32
        assert tuple(x.to_local().shape) == _piece_shape((5, 3), ALL, sbp)
        np.testing.assert_array_equal(x.numpy(), np.zeros((5, 3), np.float32))
    data = [[1, 2], [3, 4], [5, 6]]
    y = flow.Tensor(data, placement=ALL, sbp=sbp)
    assert y.is_global and y.dtype == flow.float32
    np.testing.assert_array_equal(y.numpy(), np.array(data, np.float32))
    # torch: Tensor(Size) is a shape too (not the data [5, 3])
    assert flow.Tensor(flow.Size([5, 3])).shape == (5, 3)


# -- .data = --------------------------------------------------------------------------------------
def test_data_assignment_on_a_global_tensor_changes_it():
    x = flow.nn.Parameter(flow.zeros(6, 4, placement=ALL, sbp=S(0)))
    flow.manual_seed(11)
    y = flow.randn(6, 4, placement=ALL, sbp=S(1))
    want = y.numpy()
    x.data = y
    assert x.sbp == (S(1),) and x.requires_grad and isinstance(x, nn.Parameter)
    np.testing.assert_array_equal(x.numpy(), want)
    x.data = x.data * 2  # OneFlow's pattern: a computed value
    np.testing.assert_array_equal(x.numpy(), want * 2)
    with pytest.raises(RuntimeError, match="local tensor to the .data of a global"):
        x.data = flow.ones(6, 4)


# -- .device -----------------------------------------------------------------------------------
def test_global_tensor_device_raises_as_oneflow_and_placement_sbp_remain():
    x = flow.ones(4, 3, placement=ALL, sbp=S(0))
    with pytest.raises(RuntimeError, match=r"Only local tensors have 'device'\. Please use "
                                           r"'\.placement' for global tensors\."):
        _ = x.device
    assert x.placement == ALL and x.sbp == (S(0),)
    assert x.to_local().device == flow.device("cpu", comm.get_local_rank())
    assert x.is_cpu and x.get_device() == -1
    with global_view.global_mode(True, placement=ALL, sbp=B):  # OneFlow: legal in the mode
        assert x.device == flow.device("cpu")
    with pytest.raises(RuntimeError, match="Only local tensors"):
        _ = x.device


def test_a_local_piece_is_on_cpu_local_rank_and_mixes_with_local_tensors():
    logical = np.arange(4.0 * WORLD, dtype=np.float32).reshape(WORLD, 4)
    x = flow.tensor(logical).to_global(ALL, B).to_global(sbp=S(0))
    piece = x.to_local()
    assert piece.device == flow.device("cpu", comm.get_local_rank())
    assert str(piece.device) == f"cpu:{comm.get_local_rank()}"  # OneFlow's local device
    y = piece + flow.ones(1, 4)  # a plain local tensor (device "cpu") mixes with it
    np.testing.assert_array_equal(y.numpy(), logical[RANK:RANK + 1] + 1)
    assert y.device == piece.device  # the first input's device, as OneFlow's eager ops
    back = y.to_global(ALL, S(0))
    assert back.placement == ALL and back.sbp == (S(0),)
    np.testing.assert_array_equal(back.numpy(), logical + 1)


# -- random initialisers on global parameters ------------------------------------------------
INITS = {
    "normal_": lambda t: init.normal_(t, 0.5, 2.0),
    "uniform_": lambda t: init.uniform_(t, -1.0, 3.0),
    "xavier_uniform_": init.xavier_uniform_,
    "xavier_normal_": lambda t: init.xavier_normal_(t, gain=0.7),
    "kaiming_uniform_": lambda t: init.kaiming_uniform_(t, a=0.1),
    "kaiming_normal_": lambda t: init.kaiming_normal_(t, mode="fan_out"),
    "trunc_normal_": lambda t: init.trunc_normal_(t, std=0.5, a=-0.6, b=0.8),
    "orthogonal_": init.orthogonal_,
    "zeros_": init.zeros_,
    "ones_": init.ones_,
    "constant_": lambda t: init.constant_(t, 3.5),
    "eye_": init.eye_,
}


def _local_init(fn, shape, seed):
    flow.manual_seed(seed)
    t = flow.empty(*shape)
    fn(t)
    after = flow.rand(3).numpy()  # where the generator stands afterwards
    return t.numpy(), after


@pytest.mark.parametrize("name", list(INITS))
@pytest.mark.parametrize("where", WHERE, ids=_id)
def test_init_on_a_global_parameter_equals_the_single_device_init(name, where):
    pl, sbp = where
    fn = INITS[name]
    shape = (6, 5)
    want, after = _local_init(fn, shape, seed=7)
    flow.manual_seed(7)
    w = nn.Parameter(flow.empty(*shape, placement=pl, sbp=sbp))
    out = fn(w)
    assert out is w and w.is_global and w.sbp == _nd(sbp) and w.placement == pl
    assert w.requires_grad and w.grad_fn is None
    np.testing.assert_allclose(w.numpy(), want, rtol=1e-6, atol=1e-6)
    # every rank's generator advanced as the local init's did: later draws agree too
    np.testing.assert_array_equal(flow.rand(3).numpy(), after)
    if name not in ("zeros_", "ones_", "constant_", "eye_"):
        assert np.unique(want).size > 20  # really random values were compared


def test_reset_parameters_of_a_global_module_equals_the_local_one():
    flow.manual_seed(3)
    ref = nn.Linear(5, 4)
    conv_ref = nn.Conv2d(2, 3, 3)
    ref.reset_parameters()
    conv_ref.reset_parameters()
    m = nn.Linear(5, 4).to_global(ALL, B).to_global(ALL, S(0))  # logical shape kept
    conv = nn.Conv2d(2, 3, 3).to_global(ALL, B)
    flow.manual_seed(3)
    nn.Linear(5, 4)  # draw as the reference did before its reset
    nn.Conv2d(2, 3, 3)
    m.reset_parameters()
    conv.reset_parameters()
    assert m.weight.sbp == (S(0),) and conv.weight.sbp == (B,)
    for a, b in ((m.weight, ref.weight), (m.bias, ref.bias), (conv.weight, conv_ref.weight),
                 (conv.bias, conv_ref.bias)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


# -- Parameter.numpy ---------------------------------------------------------------------------
def test_parameter_numpy_without_detach():
    p = nn.Parameter(flow.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(p.numpy(), np.arange(6.0).reshape(2, 3))
    g = nn.Parameter(flow.arange(8.0).reshape(4, 2).to_global(ALL, B).to_global(ALL, S(0)))
    np.testing.assert_array_equal(g.numpy(), np.arange(8.0).reshape(4, 2))
    # a plain tensor that requires grad too: OneFlow gives its values where torch refuses
    np.testing.assert_array_equal(flow.ones(2, requires_grad=True).numpy(), np.ones(2))


# -- modules ---------------------------------------------------------------------------------------
def test_module_to_global_and_to_local_keep_the_parameter_objects():
    flow.manual_seed(5)
    m = nn.Sequential(nn.Linear(6, 4), nn.Linear(4, 4))
    m[1].register_buffer("scale", flow.arange(3.0))
    want = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
    weight = m[0].weight
    m.to_global(ALL, S(0))
    assert m[0].weight is weight and weight.is_global and weight.sbp == (S(0),)
    assert m[1].scale.is_global
    for k, v in m.state_dict().items():  # local -> global: each rank's tensor is a piece
        assert v.shape[0] == want[k].shape[0] * WORLD
    m.to_local()
    assert m[0].weight is weight and weight.is_local and weight.requires_grad
    for k, v in m.state_dict().items():
        assert v.is_local
        np.testing.assert_array_equal(v.detach().numpy(), want[k])
    out = m(flow.randn(3, 6))
    assert out.is_local and out.shape == (3, 4)


# -- function forms, local_to_global, global_to_global ------------------------------------------
def test_flow_to_global_to_local_and_the_oneflow_conversions():
    rows = 2 * WORLD + 1
    logical = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    full = flow.tensor(logical)
    g = flow.to_global(full, placement=ALL, sbp=B)
    assert g.is_global and g.sbp == (B,)
    s = flow.to_global(g, sbp=S(0))  # a global tensor: the placement stays
    assert s.placement == ALL and s.sbp == (S(0),)
    piece = flow.to_local(s)
    lo = sum(_piece_shape((rows, 3), ALL, S(0))[0] if r == RANK else
             flow.sbp.local_shape((rows, 3), ALL, (S(0),), r)[0] for r in range(RANK))
    np.testing.assert_array_equal(piece.numpy(), logical[lo:lo + piece.shape[0]])
    back = piece.local_to_global(ALL, S(0), check_meta=True)
    np.testing.assert_array_equal(back.numpy(), logical)
    with pytest.raises(ValueError, match="both placement and sbp"):
        piece.local_to_global(ALL)
    with pytest.raises(RuntimeError, match="expected a local tensor"):
        back.local_to_global(ALL, B)
    with pytest.raises(RuntimeError, match="expected a global tensor"):
        piece.global_to_global(ALL, B)
    with pytest.raises(TypeError, match="argument 'input' must be Tensor"):
        flow.to_global([1, 2], ALL, B)
    # global_to_global with grad_sbp: the gradient comes back with the SBP asked for
    x = flow.ones(rows, 3, placement=ALL, sbp=S(0), requires_grad=True)
    y = x.global_to_global(ALL, B, grad_sbp=S(0))
    assert y.sbp == (B,)
    (y * flow.tensor(logical).to_global(ALL, B)).sum().backward()
    assert x.grad.sbp == (S(0),)
    np.testing.assert_array_equal(x.grad.numpy(), logical)


def test_env_all_device_placement():
    p = flow.env.all_device_placement("cpu")
    assert p == flow.placement("cpu", list(range(WORLD))) == flow.placement.all("cpu")
    assert list(p.rank_list) == list(range(WORLD)) and p.ranks == list(range(WORLD))


# -- global_view ---------------------------------------------------------------------------------
def test_global_view_to_global_and_to_local_over_nested_containers():
    flow.manual_seed(9)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    sd = model.state_dict()
    want = {k: v.numpy().copy() for k, v in sd.items()}
    gsd = global_view.to_global(sd, ALL, B)
    assert type(gsd) is type(sd) and list(gsd) == list(sd)
    for k, v in gsd.items():
        assert v.is_global and v.sbp == (B,)
        np.testing.assert_array_equal(v.numpy(), want[k])
    nested = {"a": [flow.ones(2 * WORLD, 2), (flow.zeros(WORLD), None)], "b": flow.ones(3)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # tensors and None: no warning
        out = global_view.to_global(nested, placement=ALL, sbp=S(0))
    assert isinstance(out["a"], list) and isinstance(out["a"][1], tuple) and out["a"][1][1] is None
    assert out["a"][0].shape == (2 * WORLD * WORLD, 2)  # each rank's tensor is a piece
    assert out["b"].is_global and out["a"][1][0].sbp == (S(0),)
    loc = global_view.to_local(out)
    np.testing.assert_array_equal(loc["a"][0].numpy(), np.ones((2 * WORLD, 2), np.float32))
    assert loc["a"][1][1] is None and loc["b"].is_local
    with pytest.warns(UserWarning, match="not a tensor"):
        same = global_view.to_global([flow.ones(2), "text"], ALL, B)
    assert same[1] == "text"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        global_view.to_global([flow.ones(2), 3], ALL, B, warn_on_non_tensor_leaf=False)
    # a function of the tensor gives each one its SBP
    picked = global_view.to_global(
        {"w": flow.ones(WORLD, 3), "v": flow.ones(3)}, ALL,
        lambda t: S(0) if t.dim() == 2 else B)
    assert picked["w"].sbp == (S(0),) and picked["v"].sbp == (B,)
    with pytest.raises(ValueError, match="needs both placement and sbp"):
        global_view.to_global(flow.ones(2), placement=ALL)


def test_global_view_over_a_module():
    flow.manual_seed(4)
    m = nn.Linear(3, 2 * WORLD)
    want = m.weight.detach().numpy().copy()
    w = m.weight
    assert global_view.to_global(m, ALL, B) is m
    assert m.weight is w and w.is_global and w.requires_grad
    np.testing.assert_array_equal(w.numpy(), want)
    global_view.to_global(m, sbp=S(0))  # global -> global: sbp only
    assert w.sbp == (S(0),)
    out = m(flow.randn(4, 3, placement=ALL, sbp=B))
    assert out.is_global and out.shape == (4, 2 * WORLD)
    global_view.to_local(m)
    assert w.is_local and w.shape == (2, 3)
    np.testing.assert_array_equal(w.detach().numpy(), want[2 * RANK:2 * RANK + 2])


def test_global_mode_makes_factories_global():
    mode = global_view.current_global_mode()
    assert not mode.is_enabled and mode.placement is None
    flow.manual_seed(2)
    local = {"randn": flow.randn(4, 3).numpy(), "rand": flow.rand(4, 3).numpy()}
    flow.manual_seed(2)
    with global_view.global_mode(True, placement=ALL, sbp=S(0)):
        cur = global_view.current_global_mode()
        assert cur.is_enabled and cur.placement == ALL and cur.sbp[0] == S(0)
        made = {"randn": flow.randn(4, 3), "rand": flow.rand(4, 3), "zeros": flow.zeros(4, 3),
                "ones": flow.ones(4, 3), "tensor": flow.tensor([[1.0, 2.0]] * 4),
                "arange": flow.arange(4), "full": flow.full((4, 3), 2.5)}
        for name, t in made.items():
            assert t.is_global and t.placement == ALL and t.sbp == (S(0),), name
        # OneFlow: in the mode a global tensor's .device is legal, and so is .to(device)
        dev = made["ones"].device
        assert dev == flow.device("cpu") and made["ones"].to(dev) is made["ones"]
        with global_view.global_mode(False):
            assert flow.ones(2).is_local
            assert not global_view.current_global_mode().is_enabled
        assert global_view.current_global_mode().is_enabled
    assert not global_view.current_global_mode().is_enabled
    assert flow.ones(2).is_local
    np.testing.assert_array_equal(made["randn"].numpy(), local["randn"])
    np.testing.assert_array_equal(made["rand"].numpy(), local["rand"])
    np.testing.assert_array_equal(made["tensor"].numpy(), np.array([[1.0, 2.0]] * 4, np.float32))
    np.testing.assert_array_equal(made["arange"].numpy(), np.arange(4))
    np.testing.assert_array_equal(made["full"].numpy(), np.full((4, 3), 2.5, np.float32))
    with pytest.raises(ValueError, match="both placement and sbp are required"):
        global_view.global_mode(True, placement=ALL)
