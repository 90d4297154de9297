"""DeviceGroup and validate_device_groups."""

from __future__ import annotations

import pickle

import pytest

from twinkle.mesh import DeviceGroup, validate_device_groups

# ---- construction --------------------------------------------------------------------------


def test_int_ranks():
    group = DeviceGroup(name="model", ranks=4, device_type="cuda")
    assert group.ranks == 4
    assert group.num_devices == 4
    assert group.num_workers == 4
    assert group.gpus_per_worker == 1
    assert group.visible_devices is None


def test_list_ranks():
    group = DeviceGroup(name="sampler", ranks=[4, 5, 6, 7], device_type="cuda")
    assert group.ranks == [4, 5, 6, 7]
    assert group.num_devices == 4
    assert group.num_workers == 4


def test_ranks_as_tuple_or_range_become_a_list():
    assert DeviceGroup(name="a", ranks=(2, 3), device_type="cuda").ranks == [2, 3]
    assert DeviceGroup(name="b", ranks=range(4, 6), device_type="npu").ranks == [4, 5]


def test_list_ranks_keep_their_order():
    # Explicit device indices are placement instructions, not a set: order is kept.
    assert DeviceGroup(name="g", ranks=[3, 1, 2], device_type="cuda").ranks == [3, 1, 2]


def test_cpu_group_with_count():
    group = DeviceGroup(name="reward", ranks=8, device_type="CPU")
    assert group.device_type == "cpu"
    assert group.num_workers == 8


@pytest.mark.parametrize("ranks", [[0, 1], [0], (0, 1)])
def test_cpu_group_with_list_is_an_error(ranks):
    with pytest.raises(ValueError, match=r"'cpu_group'.*CPU group takes a number"):
        DeviceGroup(name="cpu_group", ranks=ranks, device_type="cpu")


@pytest.mark.parametrize(("given", "expected"), [("GPU", "cuda"), ("gpu", "cuda"), ("NPU", "npu")])
def test_device_type_is_normalized(given, expected):
    assert DeviceGroup(name="g", ranks=2, device_type=given).device_type == expected


def test_unknown_device_type():
    with pytest.raises(ValueError, match="unknown device_type 'tpu'"):
        DeviceGroup(name="g", ranks=2, device_type="tpu")


def test_duplicate_ranks():
    with pytest.raises(ValueError, match=r"'g': ranks \[1, 3\] are listed twice"):
        DeviceGroup(name="g", ranks=[0, 1, 3, 1, 3, 3], device_type="cuda")


@pytest.mark.parametrize("ranks", [0, -1, -4])
def test_non_positive_rank_count(ranks):
    with pytest.raises(ValueError, match="ranks must be a positive integer"):
        DeviceGroup(name="g", ranks=ranks, device_type="cuda")


@pytest.mark.parametrize("ranks", [True, False])
def test_bool_ranks(ranks):
    with pytest.raises(ValueError, match="ranks must be an int"):
        DeviceGroup(name="g", ranks=ranks, device_type="cuda")


@pytest.mark.parametrize(
    "ranks", [[0, -1], [-3], [True, 1], [0, False], [0, 1.0], ["0", "1"], [], [None]]
)
def test_bad_rank_lists(ranks):
    with pytest.raises(ValueError, match="non-empty list of device indices >= 0"):
        DeviceGroup(name="g", ranks=ranks, device_type="cuda")


def test_string_ranks_are_rejected():
    with pytest.raises(ValueError, match="device indices"):
        DeviceGroup(name="g", ranks="0,1", device_type="cuda")


@pytest.mark.parametrize("name", ["", None, 3])
def test_bad_name(name):
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        DeviceGroup(name=name, ranks=2, device_type="cuda")


# ---- gpus_per_worker -----------------------------------------------------------------------


def test_gpus_per_worker_divides():
    group = DeviceGroup(name="g", ranks=[0, 1, 2, 3, 4, 5], device_type="cuda", gpus_per_worker=2)
    assert group.num_devices == 6
    assert group.num_workers == 3
    assert DeviceGroup(name="h", ranks=8, device_type="cuda", gpus_per_worker=4).num_workers == 2
    assert DeviceGroup(name="i", ranks=4, device_type="cuda", gpus_per_worker=4).num_workers == 1


@pytest.mark.parametrize(("ranks", "per_worker"), [(4, 3), ([0, 1, 2], 2), (2, 4)])
def test_gpus_per_worker_not_dividing(ranks, per_worker):
    devices = ranks if isinstance(ranks, int) else len(ranks)
    message = f"{devices} devices cannot be split into workers of gpus_per_worker={per_worker}"
    with pytest.raises(ValueError, match=message):
        DeviceGroup(name="g", ranks=ranks, device_type="cuda", gpus_per_worker=per_worker)


@pytest.mark.parametrize("per_worker", [0, -2, True, 1.5, "2", None])
def test_bad_gpus_per_worker(per_worker):
    with pytest.raises(ValueError, match="gpus_per_worker must be a positive integer"):
        DeviceGroup(name="g", ranks=4, device_type="cuda", gpus_per_worker=per_worker)


# ---- visible_devices -----------------------------------------------------------------------


@pytest.mark.parametrize("visible", ["8,9", "0", "0,1,2,3", " 8, 9 "])
def test_good_visible_devices(visible):
    group = DeviceGroup(name="g", ranks=2, device_type="cuda", visible_devices=visible)
    assert group.visible_devices == visible


@pytest.mark.parametrize("visible", ["", "8,", ",8", "8;9", "a,b", "-1", "8,,9", "0x1", "1.5"])
def test_bad_visible_devices(visible):
    with pytest.raises(ValueError, match=r"visible_devices must be comma-separated"):
        DeviceGroup(name="g", ranks=2, device_type="cuda", visible_devices=visible)


# ---- value semantics -----------------------------------------------------------------------


def test_equality_and_pickle():
    group = DeviceGroup(
        name="model", ranks=[0, 1, 2, 3], device_type="GPU", visible_devices="0,1,2,3"
    )
    assert group == DeviceGroup(
        name="model", ranks=[0, 1, 2, 3], device_type="cuda", visible_devices="0,1,2,3"
    )
    assert group != DeviceGroup(name="model", ranks=[0, 1, 2], device_type="cuda")
    clone = pickle.loads(pickle.dumps(group))
    assert clone == group
    assert clone.num_workers == 4


# ---- validate_device_groups ----------------------------------------------------------------


def test_validate_good_groups_returns_them_as_a_list():
    model = DeviceGroup(name="model", ranks=[0, 1, 2, 3], device_type="cuda")
    sampler = DeviceGroup(name="sampler", ranks=[4, 5, 6, 7], device_type="cuda")
    reward = DeviceGroup(name="reward", ranks=4, device_type="cpu")
    result = validate_device_groups(g for g in (model, sampler, reward))
    assert result == [model, sampler, reward]
    assert validate_device_groups([]) == []


def test_validate_duplicate_names():
    groups = [
        DeviceGroup(name="model", ranks=[0, 1], device_type="cuda"),
        DeviceGroup(name="model", ranks=[2, 3], device_type="cuda"),
        DeviceGroup(name="sampler", ranks=[4], device_type="cuda"),
    ]
    with pytest.raises(ValueError, match=r"names must be unique; repeated: \['model'\]"):
        validate_device_groups(groups)


def test_validate_overlapping_ranks_names_both_groups():
    groups = [
        DeviceGroup(name="model", ranks=[0, 1, 2, 3], device_type="cuda"),
        DeviceGroup(name="sampler", ranks=[3, 4], device_type="GPU"),
    ]
    with pytest.raises(ValueError, match=r"'model' and 'sampler' both claim cuda device 3"):
        validate_device_groups(groups)


def test_validate_same_indices_on_different_device_types_do_not_overlap():
    groups = [
        DeviceGroup(name="gpu_part", ranks=[0, 1], device_type="cuda"),
        DeviceGroup(name="npu_part", ranks=[0, 1], device_type="npu"),
    ]
    assert validate_device_groups(groups) == groups


def test_validate_count_groups_never_overlap():
    # Groups given as counts are placed by the cluster; they claim no specific index.
    groups = [
        DeviceGroup(name="a", ranks=4, device_type="cuda"),
        DeviceGroup(name="b", ranks=4, device_type="cuda"),
        DeviceGroup(name="c", ranks=[0, 1, 2, 3], device_type="cuda"),
    ]
    assert validate_device_groups(groups) == groups


@pytest.mark.parametrize("item", ["model", {"name": "model"}, None, 3])
def test_validate_non_device_group_items(item):
    good = DeviceGroup(name="model", ranks=[0], device_type="cuda")
    with pytest.raises(TypeError, match=rf"DeviceGroup objects, got {type(item).__name__}"):
        validate_device_groups([good, item])
