import math

from schemas import ddl
from schemas.catalog import BY_NAME, CATALOG, value_columns


def test_catalog_has_the_23_streams_of_the_design_in_order() -> None:
    names = [s.name for s in CATALOG]
    assert names == [
        "gpu_util", "sm_active", "tensor_active", "fb_used", "power", "temperature", "sm_clock", "pcie_tx",
        "pcie_rx", "nvlink_tx", "nvlink_rx", "ecc_errors", "xid_errors", "torch_allocated", "torch_reserved",
        "nccl_allreduce_ms", "nccl_retries", "dataloader_wait_ms", "queue_depth", "request_rate",
        "request_latency_ms", "host_cpu_util", "disk_write",
    ]
    assert [s.index for s in CATALOG] == list(range(23))
    assert set(BY_NAME) == set(names)


def test_every_sensor_has_a_finite_range_and_a_rule_fitting_its_kind() -> None:
    for s in CATALOG:
        assert math.isfinite(s.lo) and math.isfinite(s.hi) and s.lo < s.hi, s.name
        assert s.topic == f"sensors.{s.name}"
        if s.kind == "counter":
            assert s.aggs[0] == "increase"
        elif s.kind == "event":
            assert s.aggs == ("last_nonzero", "count")
        else:
            assert set(s.aggs) <= {"mean", "max", "last"}
    assert {s.name for s in CATALOG if s.scope == "host"} == {"host_cpu_util", "disk_write"}


def test_units_and_aggregations_follow_the_design_table() -> None:
    assert BY_NAME["power"].unit == "W" and BY_NAME["power"].aggs == ("mean",)
    assert BY_NAME["gpu_util"].aggs == ("mean", "max")
    assert BY_NAME["fb_used"].aggs == ("last", "max")
    assert BY_NAME["temperature"].aggs == ("max",)
    assert BY_NAME["sm_active"].hi == 1 and BY_NAME["gpu_util"].hi == 100


def test_frame_columns_are_derived_from_the_catalog_and_unique() -> None:
    cols = [c for _, _, c in value_columns()]
    assert cols[:2] == ["gpu_util", "gpu_util_max"]
    assert "xid_errors_count" in cols and "ecc_errors" in cols and "ecc_errors_last" in cols
    assert len(set(ddl.FRAME_COLUMNS)) == len(ddl.FRAME_COLUMNS)
    assert all(f"n_{s.name}" in ddl.FRAME_COLUMNS for s in CATALOG)
    for layout in ("current", "legacy"):
        table = ddl.gpu_frames("flopwatch", layout)
        for c in ddl.FRAME_COLUMNS:
            assert f"\n  {c} " in table, (layout, c)


def test_identifiers_are_validated_before_they_reach_sql() -> None:
    import pytest

    for bad in ["a;DROP TABLE x", "1abc", "", "a b", "db`x"]:
        with pytest.raises(ValueError):
            ddl.gpu_frames(bad)
    assert ddl.check_identifier("flopwatch_test_1") == "flopwatch_test_1"
