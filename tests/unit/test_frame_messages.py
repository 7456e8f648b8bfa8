"""The frames topic contract: encoding from a FrameBatch, decoding, ids and the shipped JSON Schema."""

from __future__ import annotations

import math

import jsonschema
import numpy as np
import orjson
import pytest

from agents.sinks.frames_out import encode_batch
from schemas.frame_messages import (
    FRAME_SCHEMA_PATH,
    FrameDecodeError,
    FrameMessage,
    GpuFrame,
    decode_frame_message,
    encode_frame_message,
    frame_id,
    frame_schema,
)
from schemas.frames import DERIVED_COLUMNS, VALUE_COLUMNS
from streams.align.aggregate import FrameBatch

GRID = 1_000_000_000
T0 = 1_796_200_000 * GRID


def sample_batch() -> FrameBatch:
    nodes, gpus, ticks = ["a", "a", "a", "b"], ["0", "1", "0", "0"], [T0, T0, T0 + GRID, T0]
    vals = {c: np.full(4, np.nan) for c in VALUE_COLUMNS}
    vals["power"][:] = [300.0, 310.0, np.nan, 280.5]
    vals["gpu_util"][:] = [90.0, 91.0, 92.0, 10.0]
    b = FrameBatch(np.array(ticks, np.int64), nodes, gpus,
                   [{"workload": "llm", "rank": 3}, {"workload": "llm"}, {}, {"pod": "p-1"}], vals, {},
                   np.array([0, 0, 2500, 0], np.int64))
    b.derived = {c: np.full(4, np.nan) for c in DERIVED_COLUMNS}
    b.derived["tflops"][:] = [400.0, 410.0, np.nan, 1.0]
    b.notes = ["", "", "no_power", ""]
    return b


def test_one_message_per_node_and_tick_with_its_gpus() -> None:
    out = list(encode_batch(sample_batch(), GRID))
    assert [(n, t) for n, t, _ in out] == [("a", T0), ("a", T0 + GRID), ("b", T0)]
    m = decode_frame_message(out[0][2])
    assert [g.gpu for g in m.gpus] == ["0", "1"] and m.gpus[0].values == {"power": 300.0, "gpu_util": 90.0}
    assert m.gpus[0].labels == {"workload": "llm", "rank": 3}
    assert m.gpus[0].derived["tflops"] == 400.0 and m.gpus[0].derived["cost_usd"] is None
    late = decode_frame_message(out[1][2])
    assert late.gpus[0].note == "no_power" and late.gpus[0].clock_uncertainty_us == 2.5
    assert "power" not in late.gpus[0].values  # an empty cell is an absent key


def test_the_fast_encoder_gives_the_contract_encoders_bytes() -> None:
    for _, _, raw in encode_batch(sample_batch(), GRID):
        assert encode_frame_message(decode_frame_message(raw)) == raw


def test_a_replay_that_closes_a_ticks_gpus_in_another_order_publishes_the_same_bytes() -> None:
    """The aligner gives a tick's frames in the order their series first arrived; a replay's polls can bring
    them in another, and the message must not change."""
    n = 13
    nodes, gpus = ["a"] * n, [*(str(i) for i in range(12)), "host"]
    vals = {c: np.full(n, np.nan) for c in VALUE_COLUMNS}
    vals["power"][:] = np.arange(n) * 10.0

    def batch(order: list[int]) -> FrameBatch:
        b = FrameBatch(np.full(n, T0, np.int64), [nodes[i] for i in order], [gpus[i] for i in order],
                       [{} for _ in order], {c: v[order] for c, v in vals.items()}, {}, np.zeros(n, np.int64))
        b.derived = {c: np.full(n, np.nan) for c in DERIVED_COLUMNS}
        return b

    first = list(encode_batch(batch(list(range(n))), GRID))
    again = list(encode_batch(batch([12, 5, 11, 0, 3, 10, 1, 2, 4, 6, 7, 8, 9]), GRID))
    assert first == again
    assert [g.gpu for g in decode_frame_message(first[0][2]).gpus] == [*(str(i) for i in range(12)), "host"]


def test_ids_are_deterministic_and_distinct() -> None:
    first = [raw for _, _, raw in encode_batch(sample_batch(), GRID)]
    again = [raw for _, _, raw in encode_batch(sample_batch(), GRID)]
    assert first == again
    ids = {g.id for raw in first for g in decode_frame_message(raw).gpus}
    assert len(ids) == 4 and frame_id("a", "0", T0) in ids


def test_the_shipped_schema_is_the_generated_one_and_validates_real_messages() -> None:
    shipped = orjson.loads(FRAME_SCHEMA_PATH.read_bytes())
    assert shipped == frame_schema()
    jsonschema.Draft202012Validator.check_schema(shipped)
    validator = jsonschema.Draft202012Validator(shipped)
    for _, _, raw in encode_batch(sample_batch(), GRID):
        validator.validate(orjson.loads(raw))
    bad = orjson.loads(next(encode_batch(sample_batch(), GRID))[2])
    bad["gpus"][0]["values"]["no_such_column"] = 1.0
    assert not validator.is_valid(bad)


@pytest.mark.parametrize(("mutate", "reason"), [
    (lambda d: d.update(v=2), "unknown_version"),
    (lambda d: d.pop("gpus"), "missing_field"),
    (lambda d: d.update(extra=1), "unknown_field"),
    (lambda d: d.update(id="0" * 32), "wrong_id"),
    (lambda d: d["gpus"][0]["values"].update(power=math.inf), "wrong_type"),
    (lambda d: d["gpus"][0].update(note="because"), "wrong_type"),
    (lambda d: d["gpus"][0]["labels"].update(rank="three"), "wrong_type"),
    (lambda d: d["gpus"][0]["labels"].update(workload=3), "wrong_type"),
    (lambda d: d["gpus"][0]["labels"].update(colour="red"), "wrong_type"),
    (lambda d: d["gpus"][0]["values"].update(power=True), "wrong_type"),
    (lambda d: d["gpus"][0]["values"].update(power="512"), "wrong_type"),
    (lambda d: d["gpus"][0]["values"].update(no_such_column=1.0), "unknown_field"),
    (lambda d: d["gpus"][0]["derived"].update(tflops="fast"), "wrong_type"),
    (lambda d: d["gpus"][0]["derived"].update(tflops=[1.0]), "wrong_type"),
    (lambda d: d["gpus"][0].update(note="no_power,because"), "wrong_type"),
    (lambda d: d["gpus"][0].update(labels=[]), "wrong_type"),
])
def test_a_bad_message_is_refused_with_a_reason(mutate: object, reason: str) -> None:
    doc = orjson.loads(next(encode_batch(sample_batch(), GRID))[2])
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(FrameDecodeError) as err:
        decode_frame_message(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY).replace(b"Infinity", b"1e999"))
    assert err.value.reason == reason


def test_integers_and_nulls_decode_as_the_numbers_they_are() -> None:
    doc = orjson.loads(next(encode_batch(sample_batch(), GRID))[2])
    g = doc["gpus"][0]
    g["values"]["power"] = 512
    g["derived"]["tflops"] = None
    g["derived"]["energy_j"] = 7
    g["labels"]["rank"] = 3
    got = decode_frame_message(orjson.dumps(doc)).gpus[0]
    assert type(got.values["power"]) is float and got.values["power"] == 512.0
    assert got.derived["tflops"] is None and type(got.derived["energy_j"]) is float
    assert got.labels["rank"] == 3


def test_a_sub_tick_profile_round_trips_and_is_optional() -> None:
    g = GpuFrame("0", {}, {"power": 400.0}, {"flops_per_watt": 1.2e12}, "", fpw_sub=(1.3e12, None, 1.1e12))
    m = FrameMessage("n", 1_796_200_344_000_000_000, 1_000_000_000, (g,))
    raw = encode_frame_message(m)
    assert decode_frame_message(raw) == m and orjson.loads(raw)["gpus"][0]["fpw_sub"] == [1.3e12, None, 1.1e12]
    jsonschema.validate(orjson.loads(raw), frame_schema())
    plain = FrameMessage("n", m.tick_ns, m.grid_ns, (GpuFrame("0", {}, {"power": 400.0}, {}, ""),))
    assert "fpw_sub" not in orjson.loads(encode_frame_message(plain))["gpus"][0]  # no profile: no key, as before
    doc = orjson.loads(raw)
    doc["gpus"][0]["fpw_sub"] = [1, None, 2.5]  # integers as the numbers they are, nulls kept
    got = decode_frame_message(orjson.dumps(doc)).gpus[0].fpw_sub
    assert got == (1.0, None, 2.5) and type(got[0]) is float
    for bad in ("x", [True], [None, False], ["1"], [1.0] * 601, {"a": 1}):
        doc["gpus"][0]["fpw_sub"] = bad
        with pytest.raises(FrameDecodeError, match="fpw_sub"):
            decode_frame_message(orjson.dumps(doc))


def test_every_present_value_and_derived_column_reaches_its_frame() -> None:
    rng = np.random.default_rng(7)
    n = 300
    # Patterns of present columns as real frames have them (a node's streams), and a few odd ones.
    shapes = rng.random((4, len(VALUE_COLUMNS))) < 0.7
    present = shapes[rng.integers(0, 4, n)] & (rng.random((n, len(VALUE_COLUMNS))) < 0.97)
    vals = {c: np.where(present[:, j], rng.normal(100, 50, n), np.nan) for j, c in enumerate(VALUE_COLUMNS)}
    nodes = [f"n{i % 7}" for i in range(n)]
    b = FrameBatch(T0 + GRID * (np.arange(n) // 21), nodes, [str(i % 3) for i in range(n)], [{}] * n, vals, {},
                   np.zeros(n, np.int64))
    b.derived = {c: np.where(rng.random(n) < 0.5, rng.random(n), np.nan) for c in DERIVED_COLUMNS[1:]}
    got = {g.id: g for _, _, raw in encode_batch(b, GRID) for g in decode_frame_message(raw).gpus}
    assert len(got) == n  # 7 nodes x 3 GPUs: 21 distinct frames a tick
    for i in range(n):
        g = got[frame_id(nodes[i], b.gpu[i], int(b.tick_ns[i]))]
        assert g.values == {c: vals[c][i] for c in VALUE_COLUMNS if present[i, VALUE_COLUMNS.index(c)]}
        assert g.derived[DERIVED_COLUMNS[0]] is None
        for c in DERIVED_COLUMNS[1:]:
            d = b.derived[c][i]
            assert g.derived[c] == (None if math.isnan(d) else d)


def test_a_gpu_frame_id_and_derived_columns_come_from_the_message_not_the_wire() -> None:
    m = FrameMessage("n", 1_796_200_344_000_000_000, 1_000_000_000,
                     (GpuFrame("0", {}, {"power": 400.0}, {"tflops": 400.0}, ""), GpuFrame("1", {}, {}, {}, "")))
    doc = orjson.loads(encode_frame_message(m))
    doc["gpus"][0]["id"] = "0" * 32  # a producer's own id for a GPU frame is not trusted
    del doc["gpus"][1]["derived"]["tflops"]  # nor its leaving a derived column out: null, as constructed
    got = decode_frame_message(orjson.dumps(doc))
    assert got == m and [g.id for g in got.gpus] == [frame_id("n", g, m.tick_ns) for g in ("0", "1")]
    assert all(g.derived.keys() == set(DERIVED_COLUMNS) for g in got.gpus) and got.gpus[1].derived["tflops"] is None
