"""The native poll decoder (``native/``, ``flopwatch_native.sample_columns``) against msgspec's parse of the same
messages (``schemas.poll_decode._python_parse``): where it takes a poll it gives the same columns, bit for bit,
and it leaves to the Python path every poll with a message msgspec would not parse the same way."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from schemas.poll_decode import _native_parse, _python_parse

NOW = 1_800_000_000_000_000_000
# JSON numbers as any producer may write them: long mantissas and exponents are where float parsers round wrongly.
number_text = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(lambda x: json.dumps(x)),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.from_regex(r"\A-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][+-]?[0-9]{1,3})?\Z"),
)
stamp_text = st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1).map(str),
                       st.integers(min_value=NOW - 10**12, max_value=NOW + 10**12).map(str))
name = st.one_of(st.sampled_from(["node-01", "0", "7"]), st.text(min_size=1, max_size=4))
labels_text = st.sampled_from(['null', '{}', '{"pod": "p-1", "rank": 3}', '{"pod": "\\u00e9", "x": [1, {"y": 2}]}'])
space = st.sampled_from(["", " ", "\n\t "])


@st.composite
def message(draw: st.DrawFn) -> bytes:
    sp = draw(space)
    n = draw(st.integers(min_value=0, max_value=4))
    if n:
        ts = "[" + f",{sp}".join(draw(st.lists(stamp_text, min_size=n, max_size=n))) + "]"
        vs = "[" + ",".join(draw(st.lists(number_text, min_size=n, max_size=n))) + "]"
    else:
        ts, vs = draw(stamp_text), draw(number_text)
    fields = [f'"v":{sp}1', f'"node":{json.dumps(draw(name))}', f'"gpu":{sp}{json.dumps(draw(name))}',
              f'"ts_ns":{ts}', f'"value":{sp}{vs}']
    if draw(st.booleans()):
        fields.append(f'"labels":{sp}{draw(labels_text)}')
    if draw(st.booleans()):
        fields.append('"sensor":' + draw(st.sampled_from(['"power"', "null"])))
    if draw(st.booleans()):
        fields.append('"clock":"utc"')
    if draw(st.booleans()):
        fields.append('"extra":{"deep":[1, 2.5e3, "s", null, true]}')  # unknown fields are skipped
    order = draw(st.permutations(fields))
    return ("{" + sp + f",{sp}".join(order) + sp + "}").encode()


def same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()  # bit for bit: -0.0 is not 0.0
    return a == b


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(message(), min_size=1, max_size=6))
@example([b'{"v":1,"node":"n","gpu":"0","ts_ns":5,"value":-0}'])
@example([b'{"v":1,"node":"n","gpu":"0","ts_ns":[5, 6],"value":[0.0, -0.0]}'])
@example([b'{"v":1,"node":"n","gpu":"0","ts_ns":[5],"value":[1E400]}'])
@example([b'{"v":1,"node":"n","gpu":"0","ts_ns":[5],"value":[2.2250738585072011e-308]}'])
@example([b'{"v":1,"node":"n","gpu":"0","ts_ns":5,"value":123456789012345678901234567890}'])
def test_the_native_parse_gives_msgspec_columns_bit_for_bit(raws: list[bytes]) -> None:
    native, python = _native_parse(raws, "power"), _python_parse(raws, "power")
    if native is None:  # left to the Python path: where msgspec drops a message, or a number may be -0.0
        assert python is None or python[0] != list(range(len(raws))) or python[8] is not None \
            or b"-0" in b"".join(raws)
        return
    assert python is not None
    assert all(same(a, b) for a, b in zip(native, python, strict=True)), (native, python)


def test_the_native_parse_takes_the_usual_poll_and_its_arrays_are_writable() -> None:
    raws = [b'{"v":1,"node":"n1","gpu":"0","ts_ns":[5,6],"value":[1,2.5],"labels":{"pod":"p"}}',
            b'{"v":1,"node":"n1","gpu":"1","ts_ns":7,"value":3}']
    got = _native_parse(raws, "power")
    assert got is not None
    index, nodes, gpus, clocks, labels, lens, ts, vs, wide = got
    assert (index, nodes, gpus, clocks, labels, lens) == ([0, 1], ["n1", "n1"], ["0", "1"], ["utc", "utc"],
                                                          [{"pod": "p"}, None], [2, 1])
    assert ts.tolist() == [5, 6, 7] and vs.tolist() == [1.0, 2.5, 3.0] and wide is None
    ts[0] = 1  # the ingest's columns are its own to change
    vs[0] = 0.0


@given(st.sampled_from([
    b'{"v":1,"node":"n","gpu":"0","ts_ns":5,"value":1,"node":"m"}',  # a repeated key
    b'{"v":1.0,"node":"n","gpu":"0","ts_ns":5,"value":1}',  # not an int
    b'{"v":1,"node":"n","gpu":"0","ts_ns":5.0,"value":1}',
    b'{"v":1,"node":"n","gpu":"0","ts_ns":9223372036854775808,"value":1}',  # beyond int64
    b'{"v":1,"node":"n","gpu":"0","ts_ns":[5],"value":1}',  # a list and a scalar
    b'{"v":1,"node":"n","gpu":"0","ts_ns":[],"value":[]}',
    b'{"v":1,"node":"n","gpu":"0","ts_ns":5,"value":1e999}',
    b'{"v":1,"node":"n","gpu":"0","ts_ns":5,"value":1,"clock":null}',
    b'{"v":1,"node":"n","gpu":"0","ts_ns":5,"value":1,"sensor":"gpu_util"}',
    b'{"v":1,"node":"","gpu":"0","ts_ns":5,"value":1}',
    b'{"v":2,"node":"n","gpu":"0","ts_ns":5,"value":1}',
    b'{"v":1,"node":"n","gpu":"0","ts_ns":5,"value":NaN}',
    b'{"v":1,"node":"n","gpu":"0","ts_ns":5,"value":1} x',
    b'{"v":1,"node":"n","gpu":"0","ts_ns":5,"value":1,"labels":[1]}',
    b'{"v":1,"node":"\\ud800","gpu":"0","ts_ns":5,"value":1}',
    b'{"v":1,"node":"\xff","gpu":"0","ts_ns":5,"value":1}',  # not UTF-8
    b'{"v":1,"node":"n","gpu":"0","ts_ns":5,"value":1,"x":"\xc3"}',  # not UTF-8 where msgspec skips it
    b'{"v":1,"node":"n","gpu":"0","ts_ns":5,"value":1}\x00',
]))
def test_a_poll_with_a_message_off_the_happy_path_is_left_to_msgspec(bad: bytes) -> None:
    good = b'{"v":1,"node":"n","gpu":"0","ts_ns":5,"value":1}'
    assert _native_parse([good, bad, good], "power") is None
    assert _native_parse([good, good], "power") is not None


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.one_of(message(), st.binary(max_size=48)), min_size=1, max_size=4))
def test_on_any_bytes_the_native_parse_gives_msgspec_columns_or_none(raws: list[bytes]) -> None:
    native = _native_parse(raws, "power")
    if native is not None:
        python = _python_parse(raws, "power")
        assert python is not None and all(same(a, b) for a, b in zip(native, python, strict=True))
