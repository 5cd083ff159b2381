"""KvikIO's environment variables (issue 16): honoured when the FERRY_* one is unset, parsed and
limited as the FERRY_* one, and named by ``describe()`` and ``ferry check``. Each case runs in a
fresh process (the environment is read once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ferry import __main__ as cli

NAMES = ["FERRY_COMPAT_MODE", "FERRY_REQUIRE", "FERRY_TASK_SIZE", "FERRY_GDS_THRESHOLD",
         "FERRY_NTHREADS", "FERRY_HOST_NTHREADS", "FERRY_BOUNCE_BUFFER_SIZE",
         "KVIKIO_COMPAT_MODE", "KVIKIO_TASK_SIZE", "KVIKIO_GDS_THRESHOLD", "KVIKIO_NTHREADS",
         "KVIKIO_NUM_THREADS", "KVIKIO_BOUNCE_BUFFER_SIZE"]


def _env(**set_):
    env = {k: v for k, v in os.environ.items() if k not in NAMES}
    env.update(set_)
    return env


def _python(program, **set_):
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env=_env(**set_), timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


DESCRIBE = ("import json, ferry, ferry.kvikio as k\n"
            "rows = {r['name']: r for r in ferry.settings.describe()}\n"
            "print(json.dumps({'rows': rows, 'kvikio': {n: int(k.defaults.get(n)) for n in "
            "('compat_mode', 'num_threads', 'task_size', 'gds_threshold', "
            "'bounce_buffer_size')}, 'host': ferry.settings.host_nthreads}))")


def test_kvikio_variables_are_ferrys_settings_and_describe_names_them():
    out = _python(DESCRIBE, KVIKIO_COMPAT_MODE="ON", KVIKIO_NTHREADS="16",
                  KVIKIO_TASK_SIZE="1048576", KVIKIO_GDS_THRESHOLD="65536",
                  KVIKIO_BOUNCE_BUFFER_SIZE="8388608")
    assert out["kvikio"] == {"compat_mode": 1, "num_threads": 16, "task_size": 1 << 20,
                             "gds_threshold": 65536, "bounce_buffer_size": 8 << 20}
    assert out["host"] == 16  # KvikIO's one pool: both of ferry's thread counts
    rows = out["rows"]
    for name, var in [("compat_mode", "KVIKIO_COMPAT_MODE"), ("nthreads", "KVIKIO_NTHREADS"),
                      ("host_nthreads", "KVIKIO_NTHREADS"), ("task_size", "KVIKIO_TASK_SIZE"),
                      ("gds_threshold", "KVIKIO_GDS_THRESHOLD"),
                      ("bounce_buffer_size", "KVIKIO_BOUNCE_BUFFER_SIZE")]:
        assert rows[name]["source"] == "environment" and rows[name]["source_env"] == var, name
    assert rows["require"]["source"] == "default" and rows["require"]["source_env"] == ""
    assert rows["nthreads"]["kvikio_env"] == ["KVIKIO_NTHREADS", "KVIKIO_NUM_THREADS"]


def test_the_ferry_variable_wins():
    out = _python(DESCRIBE, FERRY_TASK_SIZE="2MiB", KVIKIO_TASK_SIZE="1048576",
                  FERRY_NTHREADS="4", KVIKIO_NUM_THREADS="12")
    assert out["kvikio"]["task_size"] == 2 << 20 and out["kvikio"]["num_threads"] == 4
    assert out["host"] == 12
    assert out["rows"]["task_size"]["source_env"] == "FERRY_TASK_SIZE"
    assert out["rows"]["host_nthreads"]["source_env"] == "KVIKIO_NUM_THREADS"


@pytest.mark.parametrize("var,value,words", [
    ("KVIKIO_TASK_SIZE", "lots", "not a number"),
    ("KVIKIO_TASK_SIZE", "1000", "must be from 4 KiB"),
    ("KVIKIO_NTHREADS", "0", "out of range"),
    ("KVIKIO_COMPAT_MODE", "maybe", "unknown mode"),
    ("KVIKIO_GDS_THRESHOLD", "", "empty value"),
])
def test_a_malformed_kvikio_variable_is_a_setting_error_naming_it(var, value, words):
    program = ("import json, ferry, ferry.kvikio as k\n"
               "try:\n    k.defaults.get('task_size')\n"
               "except ferry.SettingError as e:\n"
               "    print(json.dumps({'text': str(e), 'setting': e.setting, 'value': e.value}))\n"
               "else:\n    print('null')\n")
    out = _python(program, **{var: value})
    assert out is not None, f"{var}={value!r} was accepted"
    assert out["setting"] == var and out["value"] == value
    assert f"{var}='{value}'" in out["text"] and words in out["text"]


def test_the_two_thread_count_names_must_agree():
    program = ("import json, ferry\n"
               "try:\n    ferry.settings.nthreads\n"
               "except ferry.SettingError as e:\n    print(json.dumps(str(e)))\n")
    text = _python(program, KVIKIO_NTHREADS="4", KVIKIO_NUM_THREADS="8")
    assert "KVIKIO_NUM_THREADS='8'" in text and "KVIKIO_NTHREADS is also set, to '4'" in text


def _check(*args, **set_):
    tool = cli.find_cli()
    if tool is None:
        pytest.skip("no ferry tool built or on PATH")
    return subprocess.run([tool, "check", *args], capture_output=True, text=True,
                          env=_env(**set_), timeout=120)


def test_ferry_check_says_which_variable_a_value_came_from():
    done = _check(KVIKIO_TASK_SIZE="8388608", FERRY_NTHREADS="4", KVIKIO_NTHREADS="12")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 MiB (environment KVIKIO_TASK_SIZE)" in done.stdout, done.stdout
    assert "4 (environment FERRY_NTHREADS)" in done.stdout, done.stdout
    assert "12 (environment KVIKIO_NTHREADS)" in done.stdout, done.stdout
    done = _check("--json", KVIKIO_TASK_SIZE="8388608")
    rows = {r["name"]: r for r in json.loads(done.stdout)["settings"]}
    assert rows["task_size"]["source_env"] == "KVIKIO_TASK_SIZE"
    assert rows["task_size"]["env"] == "FERRY_TASK_SIZE"
    assert rows["task_size"]["kvikio_env"] == ["KVIKIO_TASK_SIZE"]
    assert rows["compat_mode"]["source"] == "default" and rows["compat_mode"]["source_env"] == ""


def test_ferry_check_refuses_a_malformed_kvikio_variable_in_one_line():
    done = _check(KVIKIO_TASK_SIZE="lots")
    assert done.returncode != 0
    assert done.stdout.count("\n") + done.stderr.count("\n") >= 1
    assert "KVIKIO_TASK_SIZE='lots'" in done.stdout + done.stderr
