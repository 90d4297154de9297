"""DeviceGroup: a named set of devices that components are placed on (e.g. 'model', 'sampler')."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from twinkle.mesh.platform import normalize_device_type

_VISIBLE_DEVICES = re.compile(r" *[0-9]+( *, *[0-9]+)* *")


def _check_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass
class DeviceGroup:
    """A resource group, as in the user's documents.

    ``ranks`` is either a count (``ranks=4``: four workers placed wherever the
    cluster has room) or an explicit list of device indices
    (``ranks=[4, 5, 6, 7]``). A CPU group takes only a count, since CPU cores
    have no indices to pin. Each worker takes ``gpus_per_worker`` devices, so a
    group has ``len(ranks) / gpus_per_worker`` workers. ``visible_devices``
    (e.g. ``"8,9"``) restricts which physical devices the group may use.
    """

    name: str
    ranks: list[int] | int
    device_type: str
    visible_devices: str | None = None
    gpus_per_worker: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"DeviceGroup name must be a non-empty string, got {self.name!r}")
        self.device_type = normalize_device_type(self.device_type)
        _check_positive_int(f"DeviceGroup {self.name!r}: gpus_per_worker", self.gpus_per_worker)
        if isinstance(self.ranks, bool) or not isinstance(self.ranks, int | list | tuple | range):
            raise ValueError(
                f"DeviceGroup {self.name!r}: ranks must be an int (a number of devices) or a list "
                f"of device indices, got {self.ranks!r}"
            )
        if isinstance(self.ranks, int):
            _check_positive_int(f"DeviceGroup {self.name!r}: ranks", self.ranks)
        else:
            self._check_rank_list()
        if self.num_devices % self.gpus_per_worker:
            raise ValueError(
                f"DeviceGroup {self.name!r}: {self.num_devices} devices cannot be split into "
                f"workers of gpus_per_worker={self.gpus_per_worker}"
            )
        if self.visible_devices is not None:
            self._check_visible_devices()

    def _check_rank_list(self) -> None:
        if self.device_type == "cpu":
            raise ValueError(
                f"DeviceGroup {self.name!r}: a CPU group takes a number of processes "
                f"(ranks={len(list(self.ranks))}), not a list of device indices"
            )
        ranks = list(self.ranks)
        if not ranks or any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ranks):
            raise ValueError(
                f"DeviceGroup {self.name!r}: ranks must be a non-empty list of device indices "
                f">= 0, got {self.ranks!r}"
            )
        duplicates = sorted({r for r in ranks if ranks.count(r) > 1})
        if duplicates:
            raise ValueError(f"DeviceGroup {self.name!r}: ranks {duplicates} are listed twice")
        self.ranks = ranks

    def _check_visible_devices(self) -> None:
        if not isinstance(self.visible_devices, str) or not _VISIBLE_DEVICES.fullmatch(
            self.visible_devices
        ):
            raise ValueError(
                f"DeviceGroup {self.name!r}: visible_devices must be comma-separated device "
                f"indices such as '8,9', got {self.visible_devices!r}"
            )

    @property
    def num_devices(self) -> int:
        return self.ranks if isinstance(self.ranks, int) else len(self.ranks)

    @property
    def num_workers(self) -> int:
        return self.num_devices // self.gpus_per_worker


def validate_device_groups(groups: Iterable[DeviceGroup]) -> list[DeviceGroup]:
    """Check a set of groups together: unique names, and no device claimed by two groups."""
    groups = list(groups)
    for group in groups:
        if not isinstance(group, DeviceGroup):
            raise TypeError(f"groups must hold DeviceGroup objects, got {type(group).__name__}")
    names = [g.name for g in groups]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"DeviceGroup names must be unique; repeated: {repeated}")
    owner: dict[tuple[str, int], str] = {}
    for group in groups:
        if isinstance(group.ranks, int):
            continue
        for rank in group.ranks:
            key = (group.device_type, rank)
            if key in owner:
                raise ValueError(
                    f"DeviceGroups {owner[key]!r} and {group.name!r} both claim "
                    f"{group.device_type} device {rank}; give each group its own devices"
                )
            owner[key] = group.name
    return groups
