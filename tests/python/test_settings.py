"""ferry.settings: every setting readable and settable, scopes, per-file overrides, errors."""

import math

import numpy as np
import pytest

import ferry
from ferry import _ferry


def test_every_cpp_setting_is_bound_with_a_typed_value():
    rows = ferry.settings.describe()
    described = [row["name"] for row in rows if not row["environment_only"]]
    assert ferry.settings.names() == described
    # Then the variables read where they are used (issue 46): described, with no attribute.
    read_elsewhere = {row["name"]: row["env"] for row in rows if row["environment_only"]}
    assert read_elsewhere["remote_retries"] == "FERRY_REMOTE_RETRIES"
    assert read_elsewhere["curl_library"] == "FERRY_CURL_LIBRARY"
    for name in described:
        value = getattr(ferry.settings, name)
        assert isinstance(value, str if name in ("compat_mode", "require", "host_load") else int), name


def test_settings_are_set_by_name_with_sizes_counts_and_modes():
    ferry.settings.task_size = "1MiB"
    ferry.settings.gds_threshold = 4096
    ferry.settings.compat = "on"
    ferry.settings.update(nthreads=3, require="any")
    assert ferry.settings.task_size == 1 << 20
    assert ferry.settings.gds_threshold == 4096
    assert ferry.settings.compat_mode == "on"
    assert ferry.settings.nthreads == 3
    rows = {row["name"]: row for row in ferry.settings.describe()}
    assert rows["task_size"]["source"] == "code"
    assert rows["task_size"]["env"] == "FERRY_TASK_SIZE"
    assert "task_size" in repr(ferry.settings)


def test_scope_overrides_then_restores_even_on_error():
    before = ferry.settings.as_dict()
    with pytest.raises(KeyError):
        with ferry.settings(compat="on", task_size="1MiB"):
            assert ferry.settings.compat_mode == "on"
            assert ferry.settings.task_size == 1 << 20
            with ferry.settings(task_size="2MiB"):
                assert ferry.settings.task_size == 2 << 20
            assert ferry.settings.task_size == 1 << 20
            raise KeyError("boom")
    assert ferry.settings.as_dict() == before


def test_scopes_ending_out_of_order_remove_exactly_their_own_changes():
    """Regression (issue 19, bug 4): an out-of-order exit was refused and its change stayed."""
    before = ferry.settings.as_dict()
    outer, inner = ferry.settings(task_size="1MiB"), ferry.settings(nthreads=3)
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)
    assert ferry.settings.task_size == before["task_size"]
    assert ferry.settings.nthreads == 3
    inner.__exit__(None, None, None)
    assert ferry.settings.as_dict() == before
    with pytest.raises(RuntimeError, match="not entered"):
        inner.__exit__(None, None, None)


def test_a_scope_opened_inside_another_threads_scope_leaves_nothing_behind():
    """Regression (issue 19, bug 4): the first exit raised RuntimeError and task_size stayed."""
    import threading

    before = ferry.settings.task_size
    entered, release = threading.Event(), threading.Event()
    seen = {}

    def other():
        with ferry.settings(task_size="2MiB"):
            seen["inside"] = ferry.settings.task_size
            entered.set()
            release.wait(10)

    with ferry.settings(task_size="1MiB"):
        t = threading.Thread(target=other)
        t.start()
        assert entered.wait(10)
        assert ferry.settings.task_size == 1 << 20  # the other thread's scope is not ours
    assert ferry.settings.task_size == before
    release.set()
    t.join()
    assert seen["inside"] == 2 << 20
    assert ferry.settings.task_size == before


def test_a_scope_changes_only_its_own_threads_requests(data_file):
    """Reliability issue: a scope in one thread changed another thread's request (64 tasks
    instead of 16)."""
    import threading

    path, _ = data_file
    entered, release = threading.Event(), threading.Event()

    def other():
        with ferry.settings(task_size="16KiB"):
            entered.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert entered.wait(10)
    try:
        with ferry.open(path, compat="on") as f:
            f.read(np.empty(1 << 20, np.uint8))
            assert f.last_route.tasks == 1  # 4 MiB tasks: the other thread's 16 KiB are not ours
    finally:
        release.set()
        t.join()


def test_settings_is_a_mapping():
    assert dict(ferry.settings) == ferry.settings.as_dict()
    assert ferry.settings["task_size"] == ferry.settings.task_size
    assert "task_size" in ferry.settings and len(ferry.settings) == len(ferry.settings.names())
    ferry.settings["task_size"] = "2MiB"
    assert ferry.settings["task_size"] == 2 << 20
    with pytest.raises(KeyError, match="no setting 'speed'"):
        ferry.settings["speed"]


def test_a_malformed_environment_variable_can_be_repaired_from_python(tmp_path):
    """Regression (issue 19, bug 6): with FERRY_TASK_SIZE=bogus even setting task_size raised."""
    import os
    import subprocess
    import sys

    script = (
        "import ferry\n"
        "try:\n"
        "    ferry.settings.task_size\n"
        "    raise SystemExit('the bad variable was accepted')\n"
        "except ferry.SettingError as e:\n"
        "    assert 'FERRY_TASK_SIZE' in str(e) and 'bogus' in str(e), str(e)\n"
        "ferry.settings.task_size = '1MiB'\n"
        "assert ferry.settings.task_size == 1 << 20\n"
        "assert ferry.settings.nthreads == 3  # the good variables still count\n"
        "print('repaired')\n")
    env = {**os.environ, "FERRY_TASK_SIZE": "bogus", "FERRY_NTHREADS": "3"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "repaired\n", done.stderr


def test_no_variable_ferry_reads_is_called_a_misspelling(tmp_path):
    """Regression (issue 46): FERRY_CURL_LIBRARY, honoured and documented (docs/remote.md), was
    said to be "not a ferry setting", as FERRY_CUDA_LIBRARY's misspelling."""
    import os
    import subprocess
    import sys

    read = {"FERRY_CURL_LIBRARY": "libcurl.so.4", "FERRY_CRYPTO_LIBRARY": "libcrypto.so.3",
            "FERRY_CUDA_LIBRARY": "libcuda.so.1",
            "FERRY_CUFILE_LIBRARY": "libcufile.so.0", "FERRY_STATS_DIR": str(tmp_path),
            "FERRY_STATS_PUBLISH": "1", "FERRY_REMOTE_RETRIES": "2",
            "FERRY_REMOTE_TIMEOUT": "30", "FERRY_REMOTE_DEADLINE": "60"}
    env = {**os.environ, **read, "FERRY_CURL_LIBRRY": "x"}
    done = subprocess.run([sys.executable, "-c", "import ferry; ferry.settings.task_size"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ("ferry: warning: FERRY_CURL_LIBRRY is not a ferry setting and is "
                           "ignored; did you mean FERRY_CURL_LIBRARY?\n")


@pytest.mark.parametrize("name, value, words", [
    ("task_size", "1.5MiB", ["task_size", "1.5MiB"]),
    ("task_size", "0", ["task_size"]),
    ("compat_mode", "sometimes", ["compat_mode", "sometimes", "auto"]),
    ("require", "fast", ["require", "fast", "gds"]),
    ("nthreads", "-2", ["nthreads"]),
])
def test_bad_values_raise_value_error_with_the_cpp_message(name, value, words):
    with pytest.raises(ValueError) as info:
        setattr(ferry.settings, name, value)
    assert isinstance(info.value, ferry.SettingError)
    assert (info.value.setting, info.value.value) == (name, value)
    for word in words:
        assert word in str(info.value)
    with pytest.raises(ValueError) as again:
        ferry.settings(**{name: value})  # checked when the scope is made
    assert str(again.value) == str(info.value)


def test_unknown_settings_are_errors():
    with pytest.raises(ValueError, match="unknown setting 'speed'"):
        ferry.settings.speed = 3
    with pytest.raises(AttributeError, match="no setting 'speed'"):
        ferry.settings.speed
    with pytest.raises(TypeError):
        ferry.settings.task_size = 1.5


def test_per_file_settings_split_the_request(data_file):
    path, data = data_file
    with ferry.open(path, task_size="1MiB", compat="on") as f:
        assert f.settings["task_size"] == 1 << 20
        assert f.settings["compat_mode"] == "on"
        f.read(np.empty(len(data), np.uint8))
        assert f.last_route.tasks == math.ceil(len(data) / (1 << 20))
    assert ferry.settings.task_size == 4 << 20  # the process-wide value is untouched


def test_sizes_parse_and_format_like_cpp():
    assert _ferry.parse_size("16KiB") == 16384
    assert _ferry.format_size(4 << 20) == "4 MiB"
    assert _ferry.format_size(4917248, rounded=True) == "4.69 MiB"
