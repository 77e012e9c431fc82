"""Horovod's tuning variables as Horovod reads them (strtol / strtof, as
horovod/common/operations.cc does), in the what-if's settings, the lineage's
threshold and the finding that says when a text means something else to
Horovod than to a person."""

from __future__ import annotations

import pytest
from analysis_fixtures import training

from profiler.analysis.findings import advise_frame
from profiler.analysis.fusion_whatif import _settings
from profiler.formats.horovod_env import c_strtof, c_strtol, settings
from profiler.formats.lineage import fusion_threshold

MIB = 1 << 20


@pytest.mark.parametrize("text, value, whole", [
    ("1024", 1024, True), (" 1024 ", 1024, True), ("+7", 7, True), ("-5", -5, True),
    ("64MB", 64, False), ("64 MiB", 64, False), ("1e6", 1, False), ("0x10", 0, False),
    ("", 0, False), ("abc", 0, False), ("99999999999999999999", (1 << 63) - 1, True),
])
def test_strtol_as_c_reads_it(text: str, value: int, whole: bool) -> None:
    assert c_strtol(text) == (value, whole)


@pytest.mark.parametrize("text, value, whole", [
    ("5", 5.0, True), ("2.5", 2.5, True), (".5", 0.5, True), ("1e1", 10.0, True),
    ("5ms", 5.0, False), ("-1", -1.0, True), ("", 0.0, False), ("ms", 0.0, False),
])
def test_strtof_as_c_reads_it(text: str, value: float, whole: bool) -> None:
    assert c_strtof(text) == (value, whole)


def test_settings_as_horovod_ran() -> None:
    assert _settings({}) == (128 * MIB, 1.0, 1024)  # Horovod's defaults
    assert _settings(None) == (128 * MIB, 1.0, 1024)
    assert _settings({"HOROVOD_FUSION_THRESHOLD": "64MB", "HOROVOD_CYCLE_TIME": "5ms",
                      "HOROVOD_CACHE_CAPACITY": "2k"}) == (64, 5.0, 2)
    # set but empty: no number, 0: fusion off, a cycle of 0 ms, the cache off
    assert _settings({"HOROVOD_FUSION_THRESHOLD": "", "HOROVOD_CYCLE_TIME": "",
                      "HOROVOD_CACHE_CAPACITY": ""}) == (0, 0.0, 0)
    # a negative capacity wraps around in Horovod's uint32_t
    assert _settings({"HOROVOD_CACHE_CAPACITY": "-1"})[2] == (1 << 32) - 1
    assert _settings({"HOROVOD_FUSION_THRESHOLD": "-5"})[0] == 0
    assert fusion_threshold({"HOROVOD_FUSION_THRESHOLD": "64MB"}) == 64
    assert fusion_threshold({}) == 128 * MIB
    assert fusion_threshold(None) is None
    clean = settings({"HOROVOD_FUSION_THRESHOLD": "67108864", "HOROVOD_CYCLE_TIME": "2.5",
                      "HOROVOD_CACHE_CAPACITY": "0"})
    assert clean.misread == [] and clean.cache_capacity == 0


def test_a_misread_setting_is_a_finding_and_a_plain_one_is_not() -> None:
    df = training(steps=14)
    a = advise_frame(df, {"env": {"HOROVOD_FUSION_THRESHOLD": "64MB",
                                  "HOROVOD_CYCLE_TIME": "5ms"}})
    found = [f for f in a.findings if f.key == "horovod_settings"]
    assert [f.headline for f in found] == [
        "HOROVOD_FUSION_THRESHOLD='64MB' is 64 bytes to Horovod (strtol reads its leading "
        "digits)",
        "HOROVOD_CYCLE_TIME='5ms' is 5 ms to Horovod (strtof reads its leading number)"]
    assert all(f.significant and f.cost_ms is None for f in found)
    assert found[0].recommendation == ("write HOROVOD_FUSION_THRESHOLD as a plain number of "
                                       "bytes")
    assert found[0].numbers == {"variable": "HOROVOD_FUSION_THRESHOLD", "text": "64MB"}
    for env in ({}, {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "10"}):
        b = advise_frame(df, {"env": env})
        assert not [f for f in b.findings if f.key == "horovod_settings"], env
    assert not [f for f in advise_frame(df, {}).findings if f.key == "horovod_settings"]


def test_the_control_finding_states_the_cycle_horovod_ran_with() -> None:
    df = training(steps=14)
    for env, said in (({"HOROVOD_CYCLE_TIME": "5ms"}, "HOROVOD_CYCLE_TIME=5 ms)"),
                      ({}, "HOROVOD_CYCLE_TIME=1 ms (default))")):
        (f,) = [f for f in advise_frame(df, {"env": env}).findings if f.key == "control_plane"]
        assert said in f.details[0], f.details
