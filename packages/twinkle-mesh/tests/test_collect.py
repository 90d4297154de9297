"""collect(): how per-worker results become one value, for every mode, without Ray."""

import numpy as np
import pytest
import torch

from twinkle.data_format import ModelOutput
from twinkle.infra import collect, dispatch
from twinkle.mesh import DeviceMesh


def test_none_returns_the_list_as_is():
    results = [{"a": 1}, None, [3]]
    assert collect("none", results) == results


def test_first_returns_worker_0():
    assert collect("first", [{"loss": 1.0}, {"loss": 2.0}]) == {"loss": 1.0}


def test_flatten_concatenates_lists_in_worker_order():
    assert collect("flatten", [[1, 2], [3], [], [4]]) == [1, 2, 3, 4]


def test_flatten_keeps_tuples_as_tuples():
    assert collect("flatten", [(1,), (2, 3)]) == (1, 2, 3)


def test_flatten_joins_numpy_arrays_along_axis_0():
    out = collect("flatten", [np.ones((2, 3)), np.zeros((1, 3))])
    assert out.shape == (3, 3)
    np.testing.assert_array_equal(out[:, 0], [1, 1, 0])


def test_flatten_goes_through_nested_dicts_and_gathers_scalars():
    results = [
        {"logps": [[0.1], [0.2]], "stats": {"tokens": np.array([5, 6]), "loss": 0.5}},
        {"logps": [[0.3]], "stats": {"tokens": np.array([7]), "loss": 0.7}},
    ]
    out = collect("flatten", results)
    assert out["logps"] == [[0.1], [0.2], [0.3]]
    np.testing.assert_array_equal(out["stats"]["tokens"], [5, 6, 7])
    assert out["stats"]["loss"] == [0.5, 0.7]


def test_flatten_of_scalars_is_one_entry_per_worker_and_of_nones_is_none():
    assert collect("flatten", [1.5, 2.5, "x"]) == [1.5, 2.5, "x"]
    assert collect("flatten", [None, None]) is None


def test_flatten_with_fewer_items_than_workers_drops_nothing():
    assert collect("flatten", [["a"], ["b"], [], []]) == ["a", "b"]


def test_flatten_rejects_workers_that_disagree():
    with pytest.raises(TypeError, match=r"disagree at result\['x'\].*worker 1 returned float"):
        collect("flatten", [{"x": [1]}, {"x": 2.0}])
    with pytest.raises(ValueError, match="keys"):
        collect("flatten", [{"a": [1]}, {"b": [1]}])
    with pytest.raises(ValueError, match=r"shapes per worker: \[\(1, 2\), \(1, 3\)\]"):
        collect("flatten", [np.ones((1, 2)), np.ones((1, 3))])


@pytest.mark.parametrize(("mode", "expected"), [("sum", 6), ("mean", 2.0)])
def test_mean_and_sum_of_numbers(mode, expected):
    out = collect(mode, [1, 2, 3])
    assert out == expected
    assert isinstance(out, float) == (mode == "mean")


def test_mean_and_sum_recurse_through_dicts_lists_and_arrays():
    results = [
        {"loss": 1.0, "acc": np.float32(0.5), "per_layer": [1.0, np.array([1.0, 3.0])]},
        {"loss": 3.0, "acc": np.float32(1.0), "per_layer": [3.0, np.array([3.0, 5.0])]},
    ]
    mean = collect("mean", results)
    assert mean["loss"] == 2.0
    assert mean["acc"] == pytest.approx(0.75)
    assert mean["per_layer"][0] == 2.0
    np.testing.assert_allclose(mean["per_layer"][1], [2.0, 4.0])
    total = collect("sum", results)
    np.testing.assert_allclose(total["per_layer"][1], [4.0, 8.0])
    np.testing.assert_allclose(results[0]["per_layer"][1], [1.0, 3.0])


@pytest.mark.parametrize(
    ("bad", "shown"),
    [("ok", "str"), (None, "NoneType"), (True, "bool"), (np.array("a"), "<U1")],
)
def test_mean_over_a_non_number_names_the_key_path_and_type(bad, shown):
    results = [{"metrics": {"acc": 1.0}}, {"metrics": {"acc": bad}}]
    with pytest.raises(TypeError) as info:
        collect("mean", results)
    message = str(info.value)
    assert "result['metrics']['acc']" in message
    assert f"worker 1 returned {shown}" in message


def test_sum_rejects_mismatched_lengths_and_shapes():
    with pytest.raises(ValueError, match=r"different length per worker: \[2, 1\]"):
        collect("sum", [[1, 2], [3]])
    with pytest.raises(ValueError, match="different shape per worker"):
        collect("sum", [np.ones(2), np.ones(3)])


def test_last_pp_takes_one_result_per_data_rank_from_the_last_stage():
    mesh = DeviceMesh.from_sizes(pp_size=2, dp_size=2, tp_size=2, device_type="cpu")
    results = [[f"rank{r}"] for r in range(8)]
    # last stage = ranks 4..7; its first tp peers are rank 4 (dp 0) and rank 6 (dp 1)
    assert collect("last_pp", results, mesh) == ["rank4", "rank6"]


def test_last_pp_with_one_data_rank_returns_that_result_as_is():
    mesh = DeviceMesh.from_sizes(pp_size=2, tp_size=2, device_type="cpu")
    results = [None, None, {"logits": [1]}, {"logits": [2]}]
    assert collect("last_pp", results, mesh) == {"logits": [1]}


def test_last_pp_counts_ulysses_peers_once():
    mesh = DeviceMesh.from_sizes(dp_size=4, ulysses_size=2, device_type="cpu")
    assert collect("last_pp", [[0], [1], [2], [3]], mesh) == [0, 2]


def test_last_pp_needs_a_matching_mesh():
    with pytest.raises(ValueError, match="needs the component's device_mesh"):
        collect("last_pp", [[1]])
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    with pytest.raises(ValueError, match="3 results for a device_mesh of world_size 2"):
        collect("last_pp", [[1], [2], [3]], mesh)


def test_a_collect_function_receives_all_results_and_the_mesh():
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    assert collect(lambda results, m: (max(results), m), [3, 9], mesh) == (9, mesh)


def _collect(all_results, device_mesh):
    """The RemoteClass page's collect function, filled in: one result per data rank (the
    ranks whose tp coordinate is 0, read from the rank array), in data-rank order."""
    tp_axis = device_mesh.mesh_dim_names.index("tp")
    first_tp = device_mesh.mesh.take(0, axis=tp_axis).ravel().tolist()
    by_data_rank = sorted(first_tp, key=device_mesh.data_rank_of)
    return [item for rank in by_data_rank for item in all_results[rank]]


def test_the_pages_collect_function_reads_the_rank_array_and_dim_names():
    mesh = DeviceMesh(mesh=[[3, 1], [2, 0]], mesh_dim_names=("dp", "tp"), device_type="cpu")
    # rank r returned its data rank's share: ranks 3 and 1 read slice 0, ranks 2 and 0 slice 1
    results = [["c", "d"], ["a", "b"], ["c", "d"], ["a", "b"]]
    assert collect(_collect, results, mesh) == ["a", "b", "c", "d"]


def test_unknown_mode_lists_the_valid_ones():
    with pytest.raises(ValueError, match="'first', 'last_pp', 'rows'"):
        collect("avg", [1])


def test_results_must_be_a_non_empty_list():
    with pytest.raises(TypeError, match="one entry per worker"):
        collect("first", {"a": 1})
    with pytest.raises(ValueError, match="no results"):
        collect("mean", [])


def _share_output(logps: torch.Tensor, labels: torch.Tensor) -> ModelOutput:
    """What a worker's forward_backward returns for its rows: the mean of its summed loss
    over its label tokens, the count, and its rows' logps (right-padded to its longest)."""
    if logps.shape[0] == 0:
        return ModelOutput(logps=torch.empty(0, 0), num_tokens=0.0)
    mask = labels != -100
    tokens = float(mask.sum())
    loss_sum = float(-(logps * mask).sum())
    return ModelOutput(loss=loss_sum / tokens, logps=logps, num_tokens=tokens)


@pytest.mark.parametrize(("rows", "dp"), [(5, 2), (3, 2), (1, 2), (4, 4), (2, 3)])
def test_rows_restores_the_batch_of_one_process_from_the_slice_dp_shares(rows, dp):
    """Uneven shares, and workers with no rows (fewer rows than workers), come back as the
    output one process returns for the whole batch: the loss is the summed losses over the
    summed tokens, not a mean of the shares' means."""
    mesh = DeviceMesh.from_sizes(dp_size=dp, device_type="cpu")
    generator = torch.Generator().manual_seed(rows * 10 + dp)
    lengths = [3 + (7 * i) % 5 for i in range(rows)]
    width = max(lengths)
    logps = -torch.rand(rows, width, generator=generator, dtype=torch.float64)
    labels = torch.tensor([[1] * n + [-100] * (width - n) for n in lengths])
    logps = logps * (labels != -100)  # a model's logps are 0 off the labels
    whole = _share_output(logps, labels)
    results = []
    for worker in range(dp):
        (share_logps, share_labels, share_lengths), _ = dispatch(
            "slice_dp", dp, worker, (logps.numpy(), labels.numpy(), lengths), {}, mesh
        )
        keep = max(share_lengths, default=0)  # each worker pads to its own longest row
        share_logps, share_labels = share_logps[:, :keep], share_labels[:, :keep]
        results.append(_share_output(torch.from_numpy(share_logps), torch.from_numpy(share_labels)))
    joined = collect("rows", results, mesh)
    assert isinstance(joined, ModelOutput)
    torch.testing.assert_close(joined.logps, whole.logps, rtol=0, atol=0)
    assert joined.num_tokens == whole.num_tokens
    assert joined.loss == pytest.approx(whole.loss, rel=1e-12)


def test_rows_reads_one_result_per_data_rank_of_the_last_stage():
    mesh = DeviceMesh.from_sizes(pp_size=2, dp_size=2, tp_size=2, device_type="cpu")
    results = [
        {"logps": np.full((1, 2), float(r)), "num_tokens": 2.0, "loss": float(r)} for r in range(8)
    ]
    joined = collect("rows", results, mesh)  # last stage: ranks 4 (dp 0) and 6 (dp 1)
    np.testing.assert_array_equal(joined["logps"][:, 0], [4.0, 6.0])
    assert joined["num_tokens"] == 4.0 and joined["loss"] == 5.0
    assert isinstance(joined, dict)


def test_rows_pads_numpy_rows_and_joins_lists_and_keeps_shared_values():
    results = [
        {"logps": np.ones((2, 3)), "ids": [1, 2], "adapter": "a"},
        {"logps": np.ones((1, 5)), "ids": [3], "adapter": "a"},
        {"logps": np.empty((0, 0)), "ids": [], "adapter": "a"},
    ]
    joined = collect("rows", results)
    assert joined["logps"].shape == (3, 5)
    np.testing.assert_array_equal(joined["logps"][:2, 3:], 0)
    assert joined["ids"] == [1, 2, 3] and joined["adapter"] == "a"
    assert collect("rows", [None, None]) is None


def test_rows_refuses_what_it_cannot_join():
    with pytest.raises(ValueError, match="without its num_tokens"):
        collect("rows", [ModelOutput(loss=1.0), ModelOutput(loss=2.0)])
    with pytest.raises(ValueError, match=r"result\['step'\] is 1 on one data rank but 2"):
        collect("rows", [{"step": 1}, {"step": 2}])
    with pytest.raises(ValueError, match="different number of axes"):
        collect("rows", [{"x": np.ones((1, 2))}, {"x": np.ones(3)}])
    with pytest.raises(ValueError, match="needs the component's device_mesh"):
        collect("rows", [{"x": [1]}], DeviceMesh.from_sizes(dp_size=2, device_type="cpu").mesh)
