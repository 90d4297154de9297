"""DeviceMesh: layout, coordinates, groups, data slicing, validation, value semantics, torch."""

from __future__ import annotations

import dataclasses
import math
import pickle
import re
import socket
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle.mesh import DeviceMesh
from twinkle.mesh import device_mesh as device_mesh_module

DENSE = ("pp", "dp", "fsdp", "cp", "tp")
RANK_PROPERTIES = (
    "dp_rank",
    "fsdp_rank",
    "tp_rank",
    "pp_rank",
    "cp_rank",
    "ulysses_rank",
    "ep_rank",
    "ep_fsdp_rank",
)


@pytest.fixture(autouse=True)
def _no_launcher_env(monkeypatch):
    """Every test starts as a plain single process: no RANK/WORLD_SIZE from the outside."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def all_coords(mesh: DeviceMesh) -> list[dict[str, int]]:
    return [mesh.coords(r) for r in range(mesh.world_size)]


def column(mesh: DeviceMesh, dim: str) -> list[int]:
    return [mesh.coords(r)[dim] for r in range(mesh.world_size)]


def slices(mesh: DeviceMesh, total: int) -> list[slice]:
    return [mesh.get_slice(total, rank=r) for r in range(mesh.world_size)]


def spans(mesh: DeviceMesh, total: int) -> list[tuple[int, int]]:
    return [(s.start, s.stop) for s in slices(mesh, total)]


# ---- every dimension alone -----------------------------------------------------------------


@pytest.mark.parametrize("dim", ["dp", "fsdp", "tp", "pp", "cp"])
def test_dense_dimension_alone(dim):
    mesh = DeviceMesh.from_sizes(**{f"{dim}_size": 4})
    assert mesh.world_size == 4
    assert mesh.size(dim) == 4
    assert mesh.has_dim(dim)
    # dp is always present (from_sizes defaults it to 1); everything else is absent.
    expected_dims = ("dp",) if dim == "dp" else tuple(d for d in DENSE if d in ("dp", dim))
    assert mesh.mesh_dim_names == expected_dims
    assert mesh.mesh_shape == tuple(4 if d == dim else 1 for d in expected_dims)
    for other in DENSE:
        if other not in expected_dims:
            assert not mesh.has_dim(other)
            assert mesh.size(other) == 1
    assert column(mesh, dim) == [0, 1, 2, 3]
    assert mesh.group_ranks(dim) == [[0, 1, 2, 3]]
    data = 4 if dim in ("dp", "fsdp") else 1
    assert mesh.data_world_size == data
    assert [mesh.data_rank_of(r) for r in range(4)] == ([0, 1, 2, 3] if data == 4 else [0] * 4)
    assert mesh.dim_names() == expected_dims


def test_dp_default_is_one_rank():
    mesh = DeviceMesh.from_sizes()
    assert mesh.mesh_dim_names == ("dp",)
    assert mesh.mesh_shape == (1,)
    assert mesh.world_size == 1
    assert mesh.coords(0) == {"dp": 0}
    assert mesh.data_world_size == 1
    assert mesh.get_slice(5, rank=0) == slice(0, 5)


@pytest.mark.parametrize(
    ("ulysses", "groups", "data_world"),
    [(4, [[0, 1, 2, 3]], 1), (2, [[0, 1], [2, 3]], 2), (1, [[0], [1], [2], [3]], 4)],
)
def test_ulysses_alone(ulysses, groups, data_world):
    mesh = DeviceMesh.from_sizes(dp_size=4, ulysses_size=ulysses)
    assert mesh.world_size == 4
    assert mesh.mesh_dim_names == ("dp",)
    assert mesh.has_dim("ulysses")
    assert mesh.size("ulysses") == ulysses
    assert mesh.group_ranks("ulysses") == groups
    assert column(mesh, "ulysses") == [r % ulysses for r in range(4)]
    assert mesh.data_world_size == data_world
    assert [mesh.data_rank_of(r) for r in range(4)] == [r // ulysses for r in range(4)]
    assert mesh.dim_names() == ("dp", "ulysses")


def test_ep_alone():
    mesh = DeviceMesh.from_sizes(dp_size=4, ep_size=2)
    assert mesh.world_size == 4
    assert mesh.size("ep") == 2
    assert mesh.group_ranks("ep") == [[0, 1], [2, 3]]
    assert column(mesh, "ep") == [0, 1, 0, 1]
    # EP peers read different data: expert parallelism does not shrink the data world.
    assert mesh.data_world_size == 4
    assert mesh.dim_names() == ("dp", "ep")
    assert not mesh.has_dim("ep_fsdp")


def test_ep_fsdp_alone():
    mesh = DeviceMesh.from_sizes(dp_size=4, ep_size=2, ep_fsdp_size=2)
    assert mesh.group_ranks("ep") == [[0, 1], [2, 3]]
    assert mesh.group_ranks("ep_fsdp") == [[0, 2], [1, 3]]
    assert column(mesh, "ep") == [0, 1, 0, 1]
    assert column(mesh, "ep_fsdp") == [0, 0, 1, 1]
    assert mesh.data_world_size == 4
    assert mesh.dim_names() == ("dp", "ep", "ep_fsdp")


def test_etp():
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2, ep_size=2, etp_size=2)
    assert mesh.world_size == 4
    assert mesh.has_dim("etp")
    assert mesh.size("etp") == 2
    assert mesh.etp_size == 2
    # etp has no groups of its own and is not a carved dimension.
    assert "etp" not in mesh.dim_names()
    with pytest.raises(ValueError, match="'etp' has no rank groups of its own"):
        mesh.group_ranks("etp")
    assert not DeviceMesh.from_sizes(tp_size=2).has_dim("etp")
    assert DeviceMesh.from_sizes(tp_size=2).size("etp") == 1


def test_vpp():
    mesh = DeviceMesh.from_sizes(pp_size=2, vpp_size=3)
    assert mesh.world_size == 2
    assert mesh.has_dim("vpp")
    assert mesh.size("vpp") == 3
    assert "vpp" not in mesh.dim_names()
    with pytest.raises(ValueError, match="'vpp' has no rank groups of its own"):
        mesh.group_ranks("vpp")
    assert column(mesh, "pp") == [0, 1]


def test_sequence_parallel():
    mesh = DeviceMesh.from_sizes(tp_size=2, sequence_parallel=True)
    assert mesh.sequence_parallel is True
    assert DeviceMesh.from_sizes(tp_size=2).sequence_parallel is False
    # Megatron sequence parallelism splits inside the tp group: data is unchanged.
    assert mesh.data_world_size == 1
    assert mesh != DeviceMesh.from_sizes(tp_size=2)


# ---- layout ----------------------------------------------------------------------------------


def test_layout_pp2_dp2_tp2_matches_the_docstring_table():
    mesh = DeviceMesh.from_sizes(pp_size=2, dp_size=2, tp_size=2)
    assert mesh.mesh_dim_names == ("pp", "dp", "tp")
    assert mesh.mesh_shape == (2, 2, 2)
    assert column(mesh, "pp") == [0, 0, 0, 0, 1, 1, 1, 1]
    assert column(mesh, "dp") == [0, 0, 1, 1, 0, 0, 1, 1]
    assert column(mesh, "tp") == [0, 1, 0, 1, 0, 1, 0, 1]
    assert mesh.group_ranks("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.group_ranks("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert mesh.group_ranks("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_layout_dp2_fsdp2_cp2_tp2():
    mesh = DeviceMesh.from_sizes(dp_size=2, fsdp_size=2, cp_size=2, tp_size=2)
    assert mesh.mesh_dim_names == ("dp", "fsdp", "cp", "tp")
    assert mesh.world_size == 16
    expected = {
        0: (0, 0, 0, 0),
        1: (0, 0, 0, 1),
        2: (0, 0, 1, 0),
        3: (0, 0, 1, 1),
        4: (0, 1, 0, 0),
        5: (0, 1, 0, 1),
        6: (0, 1, 1, 0),
        7: (0, 1, 1, 1),
        8: (1, 0, 0, 0),
        9: (1, 0, 0, 1),
        10: (1, 0, 1, 0),
        11: (1, 0, 1, 1),
        12: (1, 1, 0, 0),
        13: (1, 1, 0, 1),
        14: (1, 1, 1, 0),
        15: (1, 1, 1, 1),
    }
    for rank, (dp, fsdp, cp, tp) in expected.items():
        assert mesh.coords(rank) == {"dp": dp, "fsdp": fsdp, "cp": cp, "tp": tp}
    assert mesh.group_ranks("tp") == [[2 * i, 2 * i + 1] for i in range(8)]
    assert mesh.group_ranks("cp") == [
        [0, 2],
        [1, 3],
        [4, 6],
        [5, 7],
        [8, 10],
        [9, 11],
        [12, 14],
        [13, 15],
    ]
    assert mesh.group_ranks("fsdp") == [
        [0, 4],
        [1, 5],
        [2, 6],
        [3, 7],
        [8, 12],
        [9, 13],
        [10, 14],
        [11, 15],
    ]
    assert mesh.group_ranks("dp") == [[r, r + 8] for r in range(8)]
    assert mesh.data_world_size == 4
    assert [mesh.data_rank_of(r) for r in range(16)] == [r // 4 for r in range(16)]


def test_layout_all_five_dense_dimensions_is_row_major():
    shape = {"pp": 2, "dp": 3, "fsdp": 2, "cp": 2, "tp": 2}
    mesh = DeviceMesh.from_sizes(**{f"{d}_size": s for d, s in shape.items()})
    assert mesh.mesh_dim_names == DENSE
    assert mesh.world_size == 48
    rank = 0
    for pp in range(2):
        for dp in range(3):
            for fsdp in range(2):
                for cp in range(2):
                    for tp in range(2):
                        assert mesh.coords(rank) == {
                            "pp": pp,
                            "dp": dp,
                            "fsdp": fsdp,
                            "cp": cp,
                            "tp": tp,
                        }
                        assert mesh.data_rank_of(rank) == dp * 2 + fsdp
                        rank += 1


def test_carved_groups_in_a_full_mesh():
    # pp2 × dp2 × fsdp2 × tp2 with ulysses=2 and ep=4: the carved groups live inside one
    # (pp, cp, tp) row of data-parallel ranks, ordered by d = dp × fsdp_size + fsdp.
    mesh = DeviceMesh.from_sizes(
        pp_size=2, dp_size=2, fsdp_size=2, tp_size=2, ulysses_size=2, ep_size=4
    )
    # Ranks of the row pp=0, tp=0 in d order: d -> rank = d * tp_size.
    assert mesh.group_of("ulysses", 0) == [0, 2]
    assert mesh.group_of("ulysses", 4) == [4, 6]
    assert mesh.group_of("ulysses", 9) == [9, 11]
    assert mesh.group_of("ep", 0) == [0, 2, 4, 6]
    assert mesh.group_of("ep", 13) == [9, 11, 13, 15]
    assert len(mesh.group_ranks("ulysses")) == 8
    assert len(mesh.group_ranks("ep")) == 4
    assert mesh.coords(13) == {"pp": 1, "dp": 1, "fsdp": 0, "tp": 1, "ulysses": 0, "ep": 2}
    assert mesh.data_world_size == 2


# ---- per-rank properties read from RANK ------------------------------------------------------

PROPERTY_CASES = [
    # (sizes, rank, expected values of RANK_PROPERTIES in order)
    (dict(pp_size=2, dp_size=2, tp_size=2), 5, (0, None, 1, 1, None, None, None, None)),
    (dict(pp_size=2, dp_size=2, tp_size=2), 6, (1, None, 0, 1, None, None, None, None)),
    (dict(dp_size=2, fsdp_size=2, cp_size=2, tp_size=2), 11, (1, 0, 1, None, 1, None, None, None)),
    (dict(world_size=8, dp_size=2, ulysses_size=4), 6, (1, 2, None, None, None, 2, None, None)),
    (dict(world_size=8, dp_size=4, ep_size=2), 5, (2, 1, None, None, None, None, 1, None)),
    (
        dict(world_size=8, dp_size=2, ep_size=2, ep_fsdp_size=2),
        6,
        (1, 2, None, None, None, None, 0, 1),
    ),
    (
        dict(world_size=8, dp_size=2, ep_size=2, ep_fsdp_size=2),
        3,
        (0, 3, None, None, None, None, 1, 1),
    ),
    (dict(dp_size=1), 0, (0, None, None, None, None, None, None, None)),
]


@pytest.mark.parametrize(("sizes", "rank", "expected"), PROPERTY_CASES)
def test_rank_properties_read_rank_env(monkeypatch, sizes, rank, expected):
    mesh = DeviceMesh.from_sizes(**sizes)
    monkeypatch.setenv("RANK", str(rank))
    got = tuple(getattr(mesh, name) for name in RANK_PROPERTIES)
    assert got == expected
    assert mesh.coords() == mesh.coords(rank)
    assert mesh.data_rank == mesh.data_rank_of(rank)
    assert mesh.get_slice(100) == mesh.get_slice(100, rank=rank)


def test_rank_properties_follow_env_changes(monkeypatch):
    mesh = DeviceMesh.from_sizes(dp_size=4, tp_size=2)
    seen = []
    for rank in range(8):
        monkeypatch.setenv("RANK", str(rank))
        seen.append((mesh.dp_rank, mesh.tp_rank, mesh.data_rank))
    assert seen == [(r // 2, r % 2, r // 2) for r in range(8)]


def test_rank_defaults_to_zero_without_env():
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2)
    assert (mesh.dp_rank, mesh.tp_rank, mesh.data_rank) == (0, 0, 0)


def test_rank_env_out_of_range(monkeypatch):
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="rank 4 is outside this mesh of world size 4"):
        _ = mesh.dp_rank
    with pytest.raises(ValueError, match="outside this mesh"):
        mesh.get_slice(10)


def test_rank_env_not_an_integer(monkeypatch):
    mesh = DeviceMesh.from_sizes(dp_size=2)
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(ValueError, match="RANK='one'"):
        _ = mesh.dp_rank


@pytest.mark.parametrize(
    ("pp", "rank", "first", "last"),
    [
        (3, 0, True, False),
        (3, 3, True, False),
        (3, 4, False, False),
        (3, 7, False, False),
        (3, 8, False, True),
        (3, 11, False, True),
    ],
)
def test_is_first_last_pp(monkeypatch, pp, rank, first, last):
    # pp3 × dp2 × tp2: ranks 0-3 stage 0, 4-7 stage 1, 8-11 stage 2.
    mesh = DeviceMesh.from_sizes(pp_size=pp, dp_size=2, tp_size=2)
    monkeypatch.setenv("RANK", str(rank))
    assert mesh.pp_rank == rank // 4
    assert (mesh.is_first_pp, mesh.is_last_pp) == (first, last)


def test_is_first_and_last_pp_without_pp(monkeypatch):
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2)
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        assert mesh.pp_rank is None
        assert mesh.is_first_pp and mesh.is_last_pp


# ---- data world ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "data_world"),
    [
        (dict(dp_size=4), 4),
        (dict(dp_size=2, fsdp_size=3), 6),
        (dict(dp_size=2, tp_size=4, pp_size=2, cp_size=2), 2),
        (dict(dp_size=4, fsdp_size=2, ulysses_size=4), 2),
        (dict(dp_size=4, fsdp_size=2, ulysses_size=8), 1),
        (dict(dp_size=4, ep_size=4), 4),
        (dict(dp_size=2, fsdp_size=2, ep_size=2, ep_fsdp_size=2, ulysses_size=2), 2),
        (dict(tp_size=8), 1),
    ],
)
def test_data_world_size(sizes, data_world):
    mesh = DeviceMesh.from_sizes(**sizes)
    assert mesh.data_world_size == data_world
    ranks = [mesh.data_rank_of(r) for r in range(mesh.world_size)]
    assert sorted(set(ranks)) == list(range(data_world))
    assert all(ranks.count(k) == mesh.world_size // data_world for k in range(data_world))


# ---- groups ----------------------------------------------------------------------------------


def test_group_ranks_absent_and_unknown_dimensions():
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2)
    with pytest.raises(ValueError, match="this mesh has no 'pp' dimension"):
        mesh.group_ranks("pp")
    with pytest.raises(ValueError, match="this mesh has no 'ulysses' dimension"):
        mesh.group_ranks("ulysses")
    with pytest.raises(ValueError, match="unknown mesh dimension 'xp'"):
        mesh.group_ranks("xp")
    with pytest.raises(ValueError, match="unknown mesh dimension 'xp'"):
        mesh.size("xp")
    assert mesh.rank_in("pp", 0) is None


def test_group_of():
    mesh = DeviceMesh.from_sizes(pp_size=2, dp_size=2, tp_size=2)
    assert mesh.group_of("tp", 5) == [4, 5]
    assert mesh.group_of("dp", 5) == [5, 7]
    assert mesh.group_of("pp", 5) == [1, 5]
    with pytest.raises(ValueError, match="outside this mesh"):
        mesh.group_of("tp", 8)


# ---- the documents' examples -----------------------------------------------------------------


def test_doc_example_ulysses_4_times_data_2():
    mesh = DeviceMesh.from_sizes(world_size=8, dp_size=2, ulysses_size=4)
    assert mesh.world_size == 8
    assert mesh.mesh_dim_names == ("dp", "fsdp")
    assert mesh.mesh_shape == (2, 4)  # the Ulysses factor is folded into fsdp
    assert mesh.ulysses_size == 4
    assert mesh.data_world_size == 2
    assert mesh.group_ranks("ulysses") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert column(mesh, "ulysses") == [0, 1, 2, 3, 0, 1, 2, 3]
    assert spans(mesh, 8) == [(0, 4)] * 4 + [(4, 8)] * 4
    assert spans(mesh, 3) == [(0, 2)] * 4 + [(2, 3)] * 4


def test_doc_example_ep_2_on_8():
    mesh = DeviceMesh.from_sizes(world_size=8, dp_size=4, ep_size=2)
    assert mesh.world_size == 8
    assert mesh.mesh_dim_names == ("dp", "fsdp")
    assert mesh.mesh_shape == (4, 2)
    assert mesh.group_ranks("ep") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert column(mesh, "ep") == [0, 1] * 4
    # Each expert shard is held by 4 ranks (4-way data parallel over experts).
    holders = [[r for r in range(8) if mesh.coords(r)["ep"] == e] for e in range(2)]
    assert holders == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert mesh.data_world_size == 8


def test_doc_example_ep_2_with_ep_fsdp_2():
    mesh = DeviceMesh.from_sizes(world_size=8, dp_size=2, ep_size=2, ep_fsdp_size=2)
    assert mesh.world_size == 8
    assert mesh.mesh_dim_names == ("dp", "fsdp")
    assert mesh.mesh_shape == (2, 4)
    assert mesh.group_ranks("ep") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.group_ranks("ep_fsdp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert column(mesh, "ep") == [0, 1, 0, 1, 0, 1, 0, 1]
    assert column(mesh, "ep_fsdp") == [0, 0, 1, 1, 0, 0, 1, 1]
    assert mesh.dim_names() == ("dp", "fsdp", "ep", "ep_fsdp")


def test_doc_example_hsdp_fsdp4_dp2():
    mesh = DeviceMesh.from_sizes(fsdp_size=4, dp_size=2)
    assert mesh.world_size == 8
    assert mesh.mesh_dim_names == ("dp", "fsdp")
    assert mesh.mesh_shape == (2, 4)
    assert mesh.group_ranks("fsdp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh.group_ranks("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert mesh.data_world_size == 8
    assert spans(mesh, 16) == [(2 * r, 2 * r + 2) for r in range(8)]


def test_doc_example_actor_dp2_pp2_tp2_and_sampler_dp4():
    actor = DeviceMesh.from_sizes(dp_size=2, pp_size=2, tp_size=2)
    sampler = DeviceMesh.from_sizes(dp_size=4)
    assert actor.world_size == 8
    assert actor.data_world_size == 2
    assert sampler.world_size == 4
    assert sampler.data_world_size == 4
    # A batch of 8 goes 4 ways to the sampler and 2 ways to the actor.
    assert spans(sampler, 8) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert spans(actor, 8) == [(0, 4), (0, 4), (4, 8), (4, 8)] * 2
    batch = list(range(8))
    assert batch[actor.get_slice(len(batch), rank=6)] == [4, 5, 6, 7]


# ---- get_slice -------------------------------------------------------------------------------


def test_get_slice_uneven():
    mesh = DeviceMesh.from_sizes(dp_size=4)
    assert spans(mesh, 10) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert spans(mesh, 7) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert spans(mesh, 8) == [(0, 2), (2, 4), (4, 6), (6, 8)]


def test_get_slice_fewer_items_than_data_ranks():
    mesh = DeviceMesh.from_sizes(dp_size=4, tp_size=2)
    got = spans(mesh, 2)
    assert got == [(0, 1), (0, 1), (1, 2), (1, 2), (2, 2), (2, 2), (2, 2), (2, 2)]
    batch = ["a", "b"]
    assert [batch[s] for s in slices(mesh, 2)] == [["a"], ["a"], ["b"], ["b"], [], [], [], []]


def test_get_slice_zero_items():
    mesh = DeviceMesh.from_sizes(dp_size=3, fsdp_size=2)
    for s in slices(mesh, 0):
        assert s.stop - s.start == 0
        assert list(range(0)[s]) == []


def test_get_slice_accepts_numpy_int():
    mesh = DeviceMesh.from_sizes(dp_size=2)
    assert mesh.get_slice(np.int64(5), rank=1) == slice(3, 5)
    assert mesh.get_slice(5, rank=np.int32(1)) == slice(3, 5)


@pytest.mark.parametrize("total", [-1, 1.5, True, "3", None])
def test_get_slice_bad_total(total):
    with pytest.raises(ValueError, match="total must be a non-negative integer"):
        DeviceMesh.from_sizes(dp_size=2).get_slice(total, rank=0)


# ---- invalid inputs --------------------------------------------------------------------------

SIZE_NAMES = [
    "dp_size",
    "fsdp_size",
    "tp_size",
    "pp_size",
    "cp_size",
    "ulysses_size",
    "ep_size",
    "ep_fsdp_size",
    "etp_size",
    "vpp_size",
    "world_size",
]


@pytest.mark.parametrize("name", SIZE_NAMES)
@pytest.mark.parametrize("bad", [0, -1, -8, 2.0, "2", True, False])
def test_bad_size(name, bad):
    message = re.escape(f"{name} must be a positive integer, got {bad!r}")
    with pytest.raises(ValueError, match=f"^{message}$"):
        DeviceMesh.from_sizes(**{name: bad})


def test_dp_size_none_is_an_error():
    with pytest.raises(ValueError, match="dp_size must be a positive integer, got None"):
        DeviceMesh.from_sizes(dp_size=None)


def test_world_size_mismatch_shows_the_product():
    with pytest.raises(ValueError) as info:
        DeviceMesh.from_sizes(world_size=6, dp_size=2, pp_size=2, tp_size=2)
    message = str(info.value)
    assert "world_size=6" in message
    assert "pp(2) × dp(2) × tp(2) = 8" in message


def test_world_size_mismatch_with_carved_factor_mentions_folding():
    with pytest.raises(ValueError) as info:
        DeviceMesh.from_sizes(world_size=12, dp_size=2, ulysses_size=4)
    message = str(info.value)
    assert "dp(2) = 2" in message
    assert "nor 2 × 4 folding Ulysses/EP into fsdp" in message


def test_world_size_equal_to_product_is_accepted():
    mesh = DeviceMesh.from_sizes(world_size=8, dp_size=2, pp_size=2, tp_size=2)
    assert mesh == DeviceMesh.from_sizes(dp_size=2, pp_size=2, tp_size=2)
    # When the dense product already equals world_size, carved factors are not folded.
    carved = DeviceMesh.from_sizes(world_size=8, dp_size=8, ulysses_size=4)
    assert carved.mesh_dim_names == ("dp",)
    assert carved.data_world_size == 2


def test_fold_multiplies_an_existing_fsdp():
    mesh = DeviceMesh.from_sizes(world_size=16, dp_size=2, fsdp_size=2, ulysses_size=4)
    assert mesh.mesh_shape == (2, 8)
    assert mesh.data_world_size == 4


@pytest.mark.parametrize(
    ("sizes", "match"),
    [
        (dict(dp_size=3, ulysses_size=2), r"ulysses_size=2 must divide .* dp × fsdp = 3"),
        (dict(dp_size=2, tp_size=4, ulysses_size=4), r"ulysses_size=4 must divide .* = 2"),
        (dict(dp_size=4, ep_fsdp_size=2), "ep_fsdp_size needs ep_size"),
        (dict(dp_size=3, ep_size=2), r"ep_size × ep_fsdp_size = 2 must divide .* = 3"),
        (dict(dp_size=4, ep_size=2, ep_fsdp_size=4), r"ep_size × ep_fsdp_size = 8 must divide"),
        (dict(dp_size=2, ep_size=2, etp_size=2), r"ep_size × etp_size = 4 must divide"),
        (dict(dp_size=2, vpp_size=2), r"vpp_size .* needs pp_size >= 2"),
        (dict(dp_size=2, pp_size=1, vpp_size=2), r"vpp_size .* needs pp_size >= 2"),
        (dict(dp_size=2, sequence_parallel=True), r"sequence_parallel=True .* needs tp_size >= 2"),
        (
            dict(dp_size=2, tp_size=1, sequence_parallel=True),
            r"sequence_parallel=True .* needs tp_size >= 2",
        ),
        (dict(dp_size=2, device_type="tpu"), "unknown device_type 'tpu'"),
    ],
)
def test_invalid_combinations(sizes, match):
    with pytest.raises(ValueError, match=match):
        DeviceMesh.from_sizes(**sizes)


@pytest.mark.parametrize("rank", [8, 9, -1, 100])
def test_rank_out_of_range(rank):
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=4)
    with pytest.raises(ValueError, match=rf"rank {rank} is outside this mesh of world size 8"):
        mesh.coords(rank)
    with pytest.raises(ValueError, match="outside this mesh"):
        mesh.get_slice(10, rank=rank)
    with pytest.raises(ValueError, match="outside this mesh"):
        mesh.data_rank_of(rank)


@pytest.mark.parametrize("rank", [1.0, "1", True])
def test_rank_wrong_type(rank):
    with pytest.raises(TypeError, match="rank must be an int"):
        DeviceMesh.from_sizes(dp_size=2).coords(rank)


@pytest.mark.parametrize(
    ("names", "shape", "match"),
    [
        (("dp", "tp"), (2,), "same length"),
        (("dp", "xp"), (2, 2), r"unknown mesh dimensions \['xp'\]"),
        (("tp", "dp"), (2, 2), "must be ordered as"),
        (("dp", "dp"), (2, 2), "without repeats"),
        (("dp",), (0,), "dp_size must be a positive integer"),
        (("dp", "tp"), (2, True), "tp_size must be a positive integer"),
    ],
)
def test_direct_constructor_validation(names, shape, match):
    with pytest.raises(ValueError, match=match):
        DeviceMesh(mesh_dim_names=names, mesh_shape=shape)


def test_direct_constructor_without_dp():
    # The constructor accepts a mesh without a dp dimension; coordinates must still work.
    mesh = DeviceMesh(mesh_dim_names=("tp",), mesh_shape=(2,), device_type="cpu")
    assert mesh.coords(1) == {"tp": 1}
    assert mesh.data_world_size == 1
    assert mesh.data_rank_of(1) == 0
    assert mesh.get_slice(4, rank=1) == slice(0, 4)
    carved = DeviceMesh(mesh_dim_names=("fsdp", "tp"), mesh_shape=(4, 2), ulysses_size=2)
    assert carved.coords(5) == {"fsdp": 2, "tp": 1, "ulysses": 0}
    assert carved.data_rank_of(5) == 1
    assert carved.group_ranks("ulysses") == [[0, 2], [1, 3], [4, 6], [5, 7]]


# ---- equality, hashing, pickling -------------------------------------------------------------


def test_equality_and_hash():
    a = DeviceMesh.from_sizes(dp_size=2, tp_size=2, device_type="GPU")
    b = DeviceMesh(mesh_dim_names=("dp", "tp"), mesh_shape=(2, 2), device_type="cuda")
    assert a == b
    assert hash(a) == hash(b)
    assert {a: "x"}[b] == "x"
    assert a.device_type == "cuda"
    assert a != DeviceMesh.from_sizes(dp_size=2, tp_size=2, device_type="cpu")
    assert a != DeviceMesh.from_sizes(dp_size=4, ulysses_size=2)
    assert a != DeviceMesh.from_sizes(dp_size=4)
    assert DeviceMesh.from_sizes(dp_size=4, ulysses_size=2) != DeviceMesh.from_sizes(
        dp_size=4, ep_size=2
    )


def test_frozen():
    mesh = DeviceMesh.from_sizes(dp_size=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        mesh.ulysses_size = 2


@pytest.mark.parametrize(
    "sizes",
    [
        dict(dp_size=2, pp_size=2, tp_size=2),
        dict(world_size=8, dp_size=2, ep_size=2, ep_fsdp_size=2),
        dict(world_size=8, dp_size=2, ulysses_size=4, device_type="npu"),
        dict(
            pp_size=2,
            dp_size=2,
            vpp_size=2,
            tp_size=2,
            sequence_parallel=True,
            ep_size=2,
            etp_size=1,
        ),
    ],
)
def test_pickle_round_trip(sizes):
    mesh = DeviceMesh.from_sizes(**sizes)
    clone = pickle.loads(pickle.dumps(mesh))
    assert clone == mesh
    assert hash(clone) == hash(mesh)
    assert clone is not mesh
    assert all_coords(clone) == all_coords(mesh)
    for dim in mesh.dim_names():
        assert clone.group_ranks(dim) == mesh.group_ranks(dim)
    assert spans(clone, 37) == spans(mesh, 37)


# ---- properties (hypothesis) -----------------------------------------------------------------


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


@st.composite
def mesh_sizes(draw, max_world: int = 64) -> dict:
    sizes: dict = {}
    budget = max_world
    for dim in ("pp", "dp", "fsdp", "cp", "tp"):
        options = [s for s in (1, 2, 3, 4) if s <= budget]
        size = draw(st.sampled_from(options) if dim == "dp" else st.sampled_from([None, *options]))
        sizes[f"{dim}_size"] = size
        budget //= size or 1
    data = sizes["dp_size"] * (sizes["fsdp_size"] or 1)
    sizes["ulysses_size"] = draw(st.sampled_from([None, *divisors(data)]))
    ep = draw(st.sampled_from([None, *divisors(data)]))
    sizes["ep_size"] = ep
    if ep is not None:
        sizes["ep_fsdp_size"] = draw(st.sampled_from([None, *divisors(data // ep)]))
        stage = data * (sizes["cp_size"] or 1) * (sizes["tp_size"] or 1)
        sizes["etp_size"] = draw(st.sampled_from([None, *divisors(stage // ep)]))
    if (sizes["pp_size"] or 1) >= 2:
        sizes["vpp_size"] = draw(st.sampled_from([None, 2, 3]))
    if (sizes["tp_size"] or 1) >= 2:
        sizes["sequence_parallel"] = draw(st.booleans())
    if draw(st.booleans()):
        sizes["world_size"] = math.prod(
            sizes[f"{d}_size"] or 1 for d in ("pp", "dp", "fsdp", "cp", "tp")
        )
    return sizes


def check_slices_cover(mesh: DeviceMesh, n: int) -> None:
    by_data_rank: dict[int, slice] = {}
    for rank in range(mesh.world_size):
        k = mesh.data_rank_of(rank)
        s = mesh.get_slice(n, rank=rank)
        assert s.step is None
        # Ranks with the same data rank read the same slice.
        assert by_data_rank.setdefault(k, s) == s
    assert sorted(by_data_rank) == list(range(mesh.data_world_size))
    # Contiguous, ordered by data rank, disjoint, and covering range(n) exactly once.
    position = 0
    for k in range(mesh.data_world_size):
        s = by_data_rank[k]
        assert s.start == position
        assert s.stop >= s.start
        position = s.stop
    assert position == n
    covered = [i for k in range(mesh.data_world_size) for i in range(n)[by_data_rank[k]]]
    assert covered == list(range(n))
    lengths = [by_data_rank[k].stop - by_data_rank[k].start for k in range(mesh.data_world_size)]
    assert max(lengths) - min(lengths) <= 1
    assert lengths == sorted(lengths, reverse=True)  # the remainder goes to the lowest ranks


@settings(max_examples=200, deadline=None)
@given(sizes=mesh_sizes(), n=st.integers(0, 200))
def test_property_slices_cover_range_once_per_data_rank(sizes, n):
    mesh = DeviceMesh.from_sizes(**sizes)
    assert mesh.world_size <= 64
    check_slices_cover(mesh, n)
    for dim in ("tp", "pp", "cp", "ulysses"):
        if mesh.has_dim(dim):
            for group in mesh.group_ranks(dim):
                got = {
                    (mesh.get_slice(n, rank=r).start, mesh.get_slice(n, rank=r).stop) for r in group
                }
                assert len(got) == 1, (dim, group, got)


@settings(max_examples=200, deadline=None)
@given(sizes=mesh_sizes())
def test_property_groups_partition_the_ranks(sizes):
    mesh = DeviceMesh.from_sizes(**sizes)
    world = mesh.world_size
    assert world == math.prod(mesh.mesh_shape)
    coords = all_coords(mesh)
    # Row-major layout over the present dense dimensions, in the order pp, dp, fsdp, cp, tp.
    for rank, c in enumerate(coords):
        index = 0
        for dim in mesh.mesh_dim_names:
            index = index * mesh.size(dim) + c[dim]
        assert index == rank
    for dim in mesh.dim_names():
        groups = mesh.group_ranks(dim)
        size = mesh.size(dim)
        assert len(groups) == world // size
        assert all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(world))
        for group in groups:
            # Members are ordered by their coordinate along dim, which runs 0..size-1 ...
            assert [coords[r][dim] for r in group] == list(range(size))
            # ... and share every coordinate that does not vary inside such a group.
            if dim in DENSE:
                fixed = [d for d in mesh.mesh_dim_names if d != dim]
            else:
                fixed = [d for d in mesh.mesh_dim_names if d in ("pp", "cp", "tp")]
                fixed += {"ep": ["ep_fsdp"], "ep_fsdp": ["ep"]}.get(dim, [])
                fixed = [d for d in fixed if d in coords[0]]
            assert len({tuple(coords[r][d] for d in fixed) for r in group}) == 1
            if dim == "ulysses":
                assert len({mesh.data_rank_of(r) for r in group}) == 1
            assert mesh.group_of(dim, group[-1]) == group


@settings(max_examples=100, deadline=None)
@given(
    dp=st.integers(1, 4),
    fsdp=st.sampled_from([None, 1, 2]),
    tp=st.sampled_from([None, 1, 2]),
    ulysses=st.sampled_from([None, 1, 2, 4]),
    ep=st.sampled_from([None, 1, 2, 4]),
    ep_fsdp=st.sampled_from([None, 1, 2]),
)
def test_property_world_size_folds_carved_factor_into_fsdp(dp, fsdp, tp, ulysses, ep, ep_fsdp):
    if ep is None:
        ep_fsdp = None
    dense = dp * (fsdp or 1) * (tp or 1)
    carved = math.lcm(ulysses or 1, (ep or 1) * (ep_fsdp or 1))
    sizes = dict(dp_size=dp, fsdp_size=fsdp, tp_size=tp, ulysses_size=ulysses, ep_size=ep)
    mesh = DeviceMesh.from_sizes(world_size=dense * carved, ep_fsdp_size=ep_fsdp, **sizes)
    assert mesh.world_size == dense * carved
    assert mesh.size("fsdp") == (fsdp or 1) * carved
    assert mesh.size("dp") == dp
    assert mesh.data_world_size == dp * (fsdp or 1) * carved // (ulysses or 1)


# ---- to_torch --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def gloo_group(monkeypatch):
    import torch.distributed as dist

    assert not dist.is_initialized()
    # Torch meshes made here belong to this process group: start and end with an empty cache.
    monkeypatch.setattr(device_mesh_module, "_TORCH_MESHES", {})
    dist.init_process_group(
        "gloo",
        rank=0,
        world_size=1,
        init_method=f"tcp://127.0.0.1:{_free_port()}",
        timeout=timedelta(seconds=60),
    )
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_to_torch_one_rank_mesh(gloo_group):
    mesh = DeviceMesh.from_sizes(device_type="cpu")
    torch_mesh = mesh.to_torch()
    assert torch_mesh.device_type == "cpu"
    assert torch_mesh.mesh_dim_names == ("dp",)
    assert tuple(torch_mesh.mesh.shape) == (1,)
    assert torch_mesh.mesh.tolist() == [0]
    # Cached: the same object every time, also for an equal mesh built separately.
    assert mesh.to_torch() is torch_mesh
    assert DeviceMesh(mesh_dim_names=("dp",), mesh_shape=(1,), device_type="cpu").to_torch() is (
        torch_mesh
    )


def test_to_torch_multi_dim_one_rank_mesh(gloo_group, monkeypatch):
    mesh = DeviceMesh.from_sizes(pp_size=1, dp_size=1, fsdp_size=1, tp_size=1, device_type="CPU")
    torch_mesh = mesh.to_torch()
    assert torch_mesh.mesh_dim_names == ("pp", "dp", "fsdp", "tp")
    assert tuple(torch_mesh.mesh.shape) == (1, 1, 1, 1)
    assert torch_mesh["tp"].size() == 1
    assert mesh.to_torch() is torch_mesh
    assert DeviceMesh.from_sizes(device_type="cpu").to_torch() is not torch_mesh
    # With a process group up, the current rank comes from torch.distributed, not RANK.
    monkeypatch.setenv("RANK", "7")
    assert mesh.tp_rank == 0
    assert mesh.coords() == {"pp": 0, "dp": 0, "fsdp": 0, "tp": 0}


# ---- an explicit rank array, per-dimension sizes, a mesh bound to a rank --------------------


def test_an_explicit_rank_array_places_the_ranks_as_written():
    ranks = np.array([[0, 2], [1, 3]])  # column-major: rank 1 is dp 1, tp 0
    mesh = DeviceMesh(mesh=ranks, mesh_dim_names=("dp", "tp"), device_type="cpu")
    assert mesh.mesh.tolist() == ranks.tolist() and mesh.mesh_shape == (2, 2)
    assert mesh.mesh_dim_names == ("dp", "tp") and mesh.world_size == 4
    assert [mesh.coords(r) for r in range(4)] == [
        {"dp": 0, "tp": 0},
        {"dp": 1, "tp": 0},
        {"dp": 0, "tp": 1},
        {"dp": 1, "tp": 1},
    ]
    assert mesh.group_ranks("tp") == [[0, 2], [1, 3]]
    assert mesh.group_ranks("dp") == [[0, 1], [2, 3]]
    assert spans(mesh, 5) == [(0, 3), (3, 5), (0, 3), (3, 5)]
    row_major = DeviceMesh.from_sizes(dp_size=2, tp_size=2, device_type="cpu")
    assert mesh != row_major and hash(mesh) != hash(row_major)
    assert mesh == DeviceMesh(mesh=ranks.tolist(), mesh_dim_names=("dp", "tp"), device_type="cpu")
    assert DeviceMesh(mesh=np.arange(4).reshape(2, 2), mesh_dim_names=("dp", "tp")) == (
        DeviceMesh.from_sizes(dp_size=2, tp_size=2)
    )
    clone = pickle.loads(pickle.dumps(mesh))
    assert clone == mesh and all_coords(clone) == all_coords(mesh)
    with pytest.raises(ValueError, match="read-only"):
        mesh.mesh[0, 0] = 5
    ranks[0, 0] = 9  # the caller's array is copied, not kept
    assert mesh.mesh[0, 0] == 0


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(mesh=[0, 0, 1]), ValueError, r"each rank 0\.\.2 once"),
        (dict(mesh=[1, 2]), ValueError, r"each rank 0\.\.1 once"),
        (dict(mesh=[[0, 1]]), ValueError, "mesh has 2 axes but mesh_dim_names names 1"),
        (dict(mesh=[0.0, 1.0]), TypeError, "integer ranks"),
        (dict(mesh=[0, 1], mesh_shape=(3,)), ValueError, r"mesh_shape=\(3,\) differs"),
        (dict(), ValueError, "needs mesh .* or mesh_shape"),
    ],
)
def test_a_bad_rank_array_says_what_is_wrong(kwargs, error, match):
    with pytest.raises(error, match=match):
        DeviceMesh(mesh_dim_names=("dp",), device_type="cpu", **kwargs)


def test_every_dimension_has_a_world_size_one_when_absent():
    mesh = DeviceMesh.from_sizes(
        pp_size=2, dp_size=2, cp_size=1, tp_size=2, ep_size=2, etp_size=1, device_type="cpu"
    )
    sizes = {d: getattr(mesh, f"{d}_world_size") for d in (*DENSE, "ulysses", "ep", "ep_fsdp")}
    assert sizes == {
        "pp": 2, "dp": 2, "fsdp": 1, "cp": 1, "tp": 2, "ulysses": 1, "ep": 2, "ep_fsdp": 1,
    }  # fmt: skip
    assert mesh.etp_world_size == 1 and mesh.data_world_size == 2
    carved = DeviceMesh.from_sizes(world_size=8, dp_size=2, ulysses_size=4)
    assert (carved.dp_world_size, carved.fsdp_world_size, carved.ulysses_world_size) == (2, 4, 4)
    assert carved.data_world_size == 2


def test_a_mesh_bound_to_a_rank_reads_that_ranks_coordinates():
    mesh = DeviceMesh.from_sizes(pp_size=2, dp_size=2, tp_size=2, device_type="cpu")
    for rank in range(8):
        bound = mesh.at_rank(rank)
        assert bound == mesh and hash(bound) == hash(mesh)
        assert bound.rank == rank and bound.coords() == mesh.coords(rank)
        assert (bound.pp_rank, bound.dp_rank, bound.tp_rank) == (rank // 4, rank // 2 % 2, rank % 2)
        assert bound.data_rank == mesh.data_rank_of(rank)
        assert bound.get_slice(4) == mesh.get_slice(4, rank=rank)
        assert bound.fsdp_rank is None  # absent dimension
    assert mesh.rank == 0 and mesh.dp_rank == 0  # unbound: this process (no RANK: 0)
    with pytest.raises(ValueError, match="outside this mesh of world size 8"):
        mesh.at_rank(8)
