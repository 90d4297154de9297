"""dispatch(): what each worker receives, for every mode, without Ray."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from twinkle.infra import dispatch
from twinkle.mesh import DeviceMesh


def shares(mode, num_workers, *args, device_mesh=None, **kwargs):
    return [dispatch(mode, num_workers, i, args, kwargs, device_mesh) for i in range(num_workers)]


def test_slice_splits_lists_contiguously_with_remainder_to_lowest_workers():
    out = shares("slice", 3, list(range(7)))
    assert [a[0] for a, _ in out] == [[0, 1, 2], [3, 4], [5, 6]]


def test_slice_keeps_tuples_as_tuples():
    out = shares("slice", 2, ("a", "b", "c"))
    assert [a[0] for a, _ in out] == [("a", "b"), ("c",)]


def test_slice_cuts_numpy_arrays_along_axis_0():
    batch = np.arange(15).reshape(5, 3)
    (first,), _ = dispatch("slice", 2, 0, (batch,), {})
    (second,), _ = dispatch("slice", 2, 1, (batch,), {})
    np.testing.assert_array_equal(first, batch[:3])
    np.testing.assert_array_equal(second, batch[3:])


def test_slice_cuts_a_dict_of_columns_consistently_and_recursively():
    columns = {
        "input_ids": [[1], [2], [3], [4], [5]],
        "length": np.array([1, 1, 1, 1, 1]),
        "meta": {"source": ["a", "b", "c", "d", "e"], "split": "train"},
    }
    out = shares("slice", 2, columns)
    second = out[1][0][0]
    assert second["input_ids"] == [[4], [5]]
    np.testing.assert_array_equal(second["length"], [1, 1])
    assert second["meta"] == {"source": ["d", "e"], "split": "train"}


def test_slice_applies_to_kwargs_and_passes_other_values_whole():
    config = object()
    out = shares("slice", 2, "prompt", 0.5, config, batch=[1, 2, 3, 4], name="x")
    for index, (args, kwargs) in enumerate(out):
        assert args[0] == "prompt" and args[1] == 0.5 and args[2] is config
        assert kwargs == {"batch": [[1, 2], [3, 4]][index], "name": "x"}


def test_fewer_items_than_workers_gives_the_last_workers_empty_shares():
    out = shares("slice", 4, ["a", "b"], np.arange(6).reshape(2, 3), ("x", "y"))
    assert [a[0] for a, _ in out] == [["a"], ["b"], [], []]
    assert [a[1].shape for a, _ in out] == [(1, 3), (1, 3), (0, 3), (0, 3)]
    assert [a[2] for a, _ in out] == [("x",), ("y",), (), ()]


@given(total=st.integers(0, 60), workers=st.integers(1, 9))
def test_slice_shares_partition_the_batch_in_order(total, workers):
    batch = list(range(total))
    parts = [a[0] for a, _ in shares("slice", workers, batch)]
    assert [x for part in parts for x in part] == batch
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


def test_all_gives_every_worker_everything():
    batch = [1, 2, 3]
    out = shares("all", 3, batch, flag=True)
    assert all(args[0] is batch and kwargs == {"flag": True} for args, kwargs in out)


def test_slice_dp_gives_tp_and_pp_peers_the_same_data():
    mesh = DeviceMesh.from_sizes(pp_size=2, dp_size=2, tp_size=2, device_type="cpu")
    batch = list(range(5))
    out = shares("slice_dp", 8, batch, device_mesh=mesh)
    received = [args[0] for args, _ in out]
    for rank in range(8):
        assert received[rank] == ([0, 1, 2] if mesh.coords(rank)["dp"] == 0 else [3, 4])
    assert received[0] == received[1] == received[4] == received[5]
    assert received[2] != received[0]


def test_slice_dp_splits_by_data_rank_with_ulysses_peers_sharing_a_slice():
    mesh = DeviceMesh.from_sizes(dp_size=4, ulysses_size=2, device_type="cpu")
    out = shares("slice_dp", 4, list(range(4)), device_mesh=mesh)
    assert [args[0] for args, _ in out] == [[0, 1], [0, 1], [2, 3], [2, 3]]


def test_slice_dp_needs_a_mesh_with_one_rank_per_worker():
    with pytest.raises(ValueError, match="needs the component's device_mesh"):
        dispatch("slice_dp", 2, 0, ([1, 2],), {})
    mesh = DeviceMesh.from_sizes(dp_size=4, device_type="cpu")
    with pytest.raises(ValueError, match="world_size 4 but there are 2 workers"):
        dispatch("slice_dp", 2, 0, ([1, 2],), {}, mesh)


def test_a_dispatch_function_receives_worker_count_index_inputs_and_mesh():
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    seen = []

    def every_other(length, i, args, kwargs, device_mesh):
        seen.append((length, i, device_mesh))
        return [args[0][i::length]], {"rank": i}

    out = shares(every_other, 2, [0, 1, 2, 3, 4], device_mesh=mesh)
    assert out == [(([0, 2, 4],), {"rank": 0}), (([1, 3],), {"rank": 1})]
    assert seen == [(2, 0, mesh), (2, 1, mesh)]


def test_a_dispatch_function_sees_the_mesh_bound_to_the_worker_it_serves():
    """What the RemoteClass page's ``_dispatcher`` reads: worker i's data rank and the mesh's
    shape, here for an explicit rank array in which worker 0 reads the second slice."""
    mesh = DeviceMesh(mesh=[[2, 3], [0, 1]], mesh_dim_names=("dp", "tp"), device_type="cpu")

    def _dispatcher(length, i, args, kwargs, device_mesh):
        share = device_mesh.get_slice(len(args[0]))
        seen = (device_mesh.data_rank, device_mesh.data_world_size, device_mesh.tp_rank)
        return (args[0][share],), {"seen": seen, "dims": device_mesh.mesh_dim_names}

    out = shares(_dispatcher, 4, list("abcd"), device_mesh=mesh)
    assert [args for args, _ in out] == [(["c", "d"],), (["c", "d"],), (["a", "b"],), (["a", "b"],)]
    assert [k["seen"] for _, k in out] == [(1, 2, 0), (1, 2, 1), (0, 2, 0), (0, 2, 1)]
    assert all(k["dims"] == ("dp", "tp") for _, k in out)


def test_a_dispatch_function_must_return_args_and_kwargs():
    with pytest.raises(TypeError, match=r"must return \(args, kwargs\).*got list\(int\)"):
        dispatch(lambda n, i, a, k, m: [1], 2, 0, (), {})


def test_unknown_mode_lists_the_valid_ones():
    with pytest.raises(ValueError, match="'slice', 'all', 'slice_dp', or a function"):
        dispatch("split", 2, 0, (), {})


@pytest.mark.parametrize(
    ("num_workers", "worker_index", "error"),
    [(0, 0, ValueError), (2, 2, ValueError), (2, -1, ValueError), (2, 1.0, TypeError)],
)
def test_bad_worker_numbers_are_rejected(num_workers, worker_index, error):
    with pytest.raises(error):
        dispatch("slice", num_workers, worker_index, ([1, 2],), {})
