"""The stored form of a schedule: the spec round-trips in both codecs, and records parse."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drumbeat.schedule import Cadence, decode_schedule_spec, encode_schedule_spec, parse_record
from drumbeat.serialization import CODECS

_values = st.one_of(st.integers(-(2**53), 2**53), st.text(max_size=8), st.booleans(), st.none())
_cadences = st.one_of(
    st.builds(Cadence, every=st.integers(1, 86_400)),
    st.builds(
        Cadence,
        every=st.floats(1, 3600, allow_nan=False),
        mode=st.sampled_from(["rate", "delay"]),
        grace=st.one_of(st.none(), st.floats(0.5, 60)),
        jitter=st.floats(0, 10),
    ),
    st.builds(Cadence, cron=st.just("*/5 * * * *"), tz=st.sampled_from(["UTC", "Asia/Tokyo"])),
)


@pytest.mark.parametrize("codec", ["json", "msgpack"])
@given(
    args=st.lists(_values, max_size=4),
    kwargs=st.dictionaries(st.text(min_size=1, max_size=5), _values, max_size=3),
    cadence=_cadences,
)
def test_spec_round_trips(
    codec: str, args: list[Any], kwargs: dict[str, Any], cadence: Cadence
) -> None:
    blob = encode_schedule_spec(CODECS[codec], args, kwargs, cadence)
    assert decode_schedule_spec(blob) == (args, kwargs, cadence, None)
    limits = [[1000, 0, 2], "user_id", None]
    blob = encode_schedule_spec(CODECS[codec], args, kwargs, cadence, limits)
    assert decode_schedule_spec(blob) == (args, kwargs, cadence, limits)


def test_a_typical_spec_is_small() -> None:
    blob = encode_schedule_spec(CODECS["json"], ["switch", 30000], {}, Cadence(every=5))
    assert blob == b'[["switch",30000],5]'


def test_record_fields() -> None:
    # As _lib.lua's format_schedule writes it: gen 3, grid, priority 4 paused, runs, failures,
    # misfires, last start 4998 ms before the grid slot, 12 ms, started 3 ms late, task code 7.
    record = parse_record(b"3|1700000005000|14|120|2|1|-4998|12|3|7|" + b'[[1],"x|y"]')
    assert (record.generation, record.grid_ms, record.priority, record.paused) == (
        3, 1700000005000, 4, True
    )  # fmt: skip
    assert (record.runs, record.failures, record.misfires, record.last_ms) == (120, 2, 1, 12)
    assert record.last_start_ms == 1700000000002 and record.last_late_ms == 3
    assert (record.task_code, record.spec) == ("7", b'[[1],"x|y"]')
    never = parse_record(b"1|1700000005000|0|0|0|0||0||7|[[],5]")
    assert never.last_start_ms is None and never.last_late_ms is None and not never.paused


def test_a_record_written_before_lateness_was_recorded_still_reads() -> None:
    # The layout without `late`: the spec (never starting with a digit) follows the task code.
    for spec in (b'[[1],"x|y"]', b'[["1|2|3"],5]', b"\x92\x91\x01\x05"):
        old = parse_record(b"3|1700000005000|14|120|2|1|-4998|12|7|" + spec)
        assert (old.runs, old.last_ms, old.last_late_ms) == (120, 12, None)
        assert (old.task_code, old.spec, old.last_start_ms) == ("7", spec, 1700000000002)


def test_a_malformed_record_is_refused() -> None:
    with pytest.raises(ValueError, match="malformed"):
        parse_record(b"1|2|3")
    with pytest.raises(ValueError, match="malformed"):
        parse_record(b"1|2|3|4|5|6||0||x|[[],5]")


@pytest.mark.parametrize(
    "blob",
    [b"[[1],5]", b"[[1], 5] ", b"[[1],5]\n", b'[["a"],{"e":5,"g":1.5},{"k":[1,{"x":null}]}]'],
)
def test_a_json_spec_decodes_as_the_json_codec_decodes_it(blob: bytes) -> None:
    raw = CODECS["json"].loads(blob)
    args, kwargs, cadence, limits = decode_schedule_spec(blob)
    assert (args, kwargs, limits) == (raw[0], raw[2] if len(raw) > 2 else {}, None)
    assert cadence == (Cadence.from_wire(raw[1]) if isinstance(raw[1], dict) else Cadence(raw[1]))


@pytest.mark.parametrize("blob", [b"[[1],5]x", b"[[1],", b"[[1] 5]", b"[[1],5] ]"])
def test_a_malformed_json_spec_is_refused_as_the_json_codec_refuses_it(blob: bytes) -> None:
    with pytest.raises(ValueError) as expected:
        CODECS["json"].loads(blob)
    with pytest.raises(ValueError) as refused:
        decode_schedule_spec(blob)
    assert str(refused.value) == str(expected.value)


def test_an_interval_alone_decodes_to_a_cadence_of_that_number() -> None:
    # Intervals are decoded once per (type, value) and shared: 5 and 5.0 stay apart.
    assert type(decode_schedule_spec(b"[[],5]")[2].every) is int
    assert type(decode_schedule_spec(b"[[],5.0]")[2].every) is float
    assert decode_schedule_spec(b"[[],5]")[2] == Cadence(every=5)
    assert decode_schedule_spec(b"[[],2.5]")[2].interval_ms == 2500


def test_a_cadence_of_a_value_no_interval_has_decodes_as_before() -> None:
    """A record is data: an unhashable "interval" (a list written straight into Redis) is not
    cached, and decodes to the cadence the codec's value gives, as it did before the cache
    (left to whoever checks it), not to a TypeError of the cache."""
    assert decode_schedule_spec(b"[[],[1,2]]")[2] == Cadence(every=[1, 2])  # type: ignore[arg-type]
    assert decode_schedule_spec(b'[[],{"e":[1]}]')[2] == Cadence.from_wire({"e": [1]})
