"""Times: ``broker.envelope``'s integer-arithmetic ``format_ms``/``parse_ms`` give exactly what
``datetime`` gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.envelope import _spelled, format_ms, format_time, parse_ms, parse_time, to_ms

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CHECKS = settings(max_examples=2000, deadline=None, derandomize=True, database=None)
ZONES = st.sampled_from([UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-11, minutes=-30))])
MOMENTS = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=ZONES)


@CHECKS
@given(MOMENTS)
def test_format_time_is_the_spelled_form(moment: datetime) -> None:
    assert format_time(moment) == _spelled(moment)


@CHECKS
@given(st.integers(0, 253_402_300_799_999))
def test_milliseconds_survive_format_and_parse(ms: int) -> None:
    text = format_ms(ms)
    assert text == _spelled(EPOCH + timedelta(milliseconds=ms))
    assert parse_ms(text) == ms == to_ms(parse_time(text))


def test_text_that_is_not_the_canonical_form_takes_the_general_parser() -> None:
    assert parse_ms("2026-11-29T13:45:12.345Z") == to_ms(
        datetime(2026, 11, 29, 13, 45, 12, 345000, tzinfo=UTC)
    )
    assert parse_ms("2026-11-29T13:45:12.3Z") == parse_ms("2026-11-29T13:45:12.300Z")


@pytest.mark.parametrize(
    "text",
    [
        "2026-02-30T00:00:00.000Z",
        "2025-02-29T00:00:00.000Z",
        "2026-13-01T00:00:00.000Z",
        "2026-01-01T24:00:00.000Z",
    ],
)
def test_a_date_that_does_not_exist_is_refused_as_datetime_refuses_it(text: str) -> None:
    with pytest.raises(ValueError):
        parse_ms(text)
    assert parse_ms("2024-02-29T23:59:59.999Z") == to_ms(
        datetime(2024, 2, 29, 23, 59, 59, 999000, tzinfo=UTC)
    )
