"""What the ferry CLI tells a new user who asks for something it cannot do (issue 47): a GPU on
a machine without a driver points at host memory, an explicit bench GPU is never replaced by
host memory, mistyped and incomplete options are named with what they take, and the commands
that predict a read (check, explain, plan) exit as that read would."""

import json
import os
import struct
import subprocess

import pytest

CLI = os.environ.get("FERRY_CLI")
pytestmark = pytest.mark.skipif(not CLI, reason="FERRY_CLI (the built ferry tool) is not set")

# The same machine as far as ferry can tell, whether or not it has a GPU: no libcuda to load.
NO_DRIVER = {"FERRY_CUDA_LIBRARY": "/nonexistent/libcuda.so.1"}
FAKE_CUDA = os.environ.get("FERRY_FAKE_CUDA", "")


def ferry(*args, env=None):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def one_error_line(done):
    assert done.stderr.startswith("ferry: ") and done.stderr.count("\n") == 1, done.stderr
    return done.stderr


@pytest.fixture
def data(tmp_path):
    p = tmp_path / "data.bin"
    p.write_bytes(os.urandom(1 << 16))
    return p


@pytest.fixture
def checkpoint(tmp_path):
    p = tmp_path / "model.safetensors"
    head = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    p.write_bytes(struct.pack("<Q", len(head)) + head + bytes(16))
    return p


# --- 1. No driver: say what works without one ------------------------------------------------

@pytest.mark.parametrize("command,hint", [
    ("read", "to read into host memory, pass --host"),
    ("load", "to read into host memory, pass --host"),
    ("write", "to write from host memory, pass --host"),
])
def test_a_gpu_without_a_driver_points_at_host_memory(tmp_path, data, checkpoint, command, hint):
    args = {"read": [data, "--gpu", 0], "load": [checkpoint, "--gpu", 0],
            "write": [tmp_path / "out.bin", "--size", "4KiB", "--gpu", 0]}[command]
    done = ferry(command, *args, env=NO_DRIVER)
    assert done.returncode == 1, done.stderr
    line = one_error_line(done)
    assert line.startswith(f"ferry: {command}: no CUDA driver: /nonexistent/libcuda.so.1 not found")
    assert line.rstrip().endswith(hint), line


def test_pinned_memory_without_a_driver_points_at_pageable_host_memory(data):
    done = ferry("read", data, "--pinned", env=NO_DRIVER)
    assert done.returncode == 1 and "pass --host" in one_error_line(done)
    done = ferry("read", data, "--host", env=NO_DRIVER)
    assert done.returncode == 0 and "pass --host" not in done.stdout + done.stderr


# --- 2. bench --gpu N is that GPU or an error ------------------------------------------------

@pytest.mark.parametrize("gpu", [["--gpu", "0"], ["-d", "0"], ["--memory", "gpu:0"]])
def test_bench_on_an_explicit_gpu_without_a_driver_fails_before_any_file(tmp_path, gpu):
    done = ferry("bench", "-s", "1MiB", "-D", tmp_path, *gpu, env=NO_DRIVER)
    assert done.returncode == 1, done.stdout + done.stderr
    line = one_error_line(done)
    assert "bench: no CUDA driver" in line and "pass --memory host" in line, line
    assert done.stdout == "" and os.listdir(tmp_path) == []


def test_bench_gpu_alone_is_that_gpu_and_no_memory_flag_is_host_memory_with_a_note(tmp_path):
    assert ferry("bench", "-s", "1MiB", "-D", tmp_path, "--gpu", 0, env=NO_DRIVER).returncode == 1
    done = ferry("bench", "-s", "1MiB", "-D", tmp_path, "--total", "1MiB", env=NO_DRIVER)
    assert done.returncode == 0, done.stderr
    assert "note: no GPU, using host memory" in done.stdout, done.stdout
    lines = ferry("bench", "-s", "1MiB", "-D", tmp_path, "--total", "1MiB", "--json",
                  env=NO_DRIVER).stdout.splitlines()
    case = json.loads(lines[0])
    assert case["memory"] == "host" and "no GPU, using host memory" in case["notes"]


def test_bench_gpu_and_memory_both_choose_the_memory(tmp_path):
    done = ferry("bench", "-D", tmp_path, "--gpu", "0", "--memory", "host")
    assert done.returncode == 2 and "excludes" in one_error_line(done)


# --- 3. Mistyped options and commands, help -----------------------------------------------

@pytest.mark.parametrize("args", [["--verison"], ["--verison", "read"], ["--vresion"]])
def test_a_mistyped_option_of_ferry_itself_is_named_with_the_nearest(args):
    done = ferry(*args)
    assert done.returncode == 2
    line = one_error_line(done)
    assert line == f"ferry: unknown option '{args[0]}': did you mean '--version'?\n", line


def test_an_unknown_option_of_ferry_itself_far_from_any_says_where_they_are_listed():
    line = one_error_line(ferry("--frobnicate-everything"))
    assert "unknown option '--frobnicate-everything' (ferry --help lists them)" in line


@pytest.mark.parametrize("args,usage", [(["help"], "Usage: ferry [OPTIONS] SUBCOMMAND"),
                                        (["help", "read"], "Usage: ferry read"),
                                        (["help", "bench"], "Usage: ferry bench")])
def test_help_as_a_word_prints_the_help(args, usage):
    done = ferry(*args)
    assert done.returncode == 0, done.stderr
    assert usage in done.stdout, done.stdout


def test_help_of_an_unknown_command_names_the_nearest_and_no_command_lists_them():
    done = ferry("help", "raed")
    assert done.returncode == 2
    assert one_error_line(done) == "ferry: unknown command 'raed': did you mean 'read'?\n"
    done = ferry()
    assert done.returncode == 2
    assert "no command given" in one_error_line(done) and "read, write" in done.stderr


# --- 4. A value missing or of the wrong type: the option and what it takes -----------------

@pytest.mark.parametrize("args,expected", [
    (["stats", "-p"], "ferry: stats: -p/--pid needs a process id from 1 to 4194304\n"),
    (["stats", "--pid"], "ferry: stats: -p/--pid needs a process id from 1 to 4194304\n"),
    (["stats", "--watch"],
     "ferry: stats: --watch needs a number of seconds above 0 and at most 86400\n"),
    (["bench", "-d"], "ferry: bench: -d/--gpu needs a GPU ordinal from 0 to 9999\n"),
    (["read", "x", "--gpu"], "ferry: read: --gpu needs a GPU ordinal, a list such as 0,1, or all\n"),
    (["explain", "x", "--gpu"], "ferry: explain: --gpu needs a GPU ordinal from 0 to 9999\n"),
    (["plan", "--size"], "ferry: plan: --size needs a value (bytes to read, e.g. 1GiB)\n"),
])
def test_a_missing_value_names_the_option_and_what_it_takes(args, expected):
    done = ferry(*args)
    assert done.returncode == 2
    line = one_error_line(done)
    assert line.startswith(expected), line
    for raw in ("required", "missing", "INT", "TEXT", "At least"):
        assert raw not in line, line


def test_a_value_of_the_wrong_type_names_the_option_and_the_value():
    done = ferry("bench", "--seed", "abc")
    assert done.returncode == 2
    line = one_error_line(done)
    assert line.startswith("ferry: bench: --seed takes a value (seed of the random offsets"), line
    assert line.rstrip().endswith("not 'abc'") and "Could not convert" not in line, line


# --- 5. check, explain and plan exit as the read they predict ------------------------------

def test_explain_and_plan_exit_1_for_a_read_that_would_fail_and_0_for_one_that_would_run(data):
    explain = ferry("explain", data, "--gpu", 0, env=NO_DRIVER)
    plan = ferry("plan", "--size", "1MiB", "--gpu", 0, env=NO_DRIVER)
    read = ferry("read", data, "--gpu", 0, env=NO_DRIVER)
    assert read.returncode == explain.returncode == plan.returncode == 1, (explain, plan)
    assert "explain: the read would fail: no CUDA driver" in explain.stdout  # the whole report
    assert "layer 1 (ferry)" in explain.stdout
    assert "plan: the read would fail: no CUDA driver" in plan.stderr
    done = ferry("explain", data, "--gpu", 0, "--json", env=NO_DRIVER)
    assert done.returncode == 1 and json.loads(done.stdout)["failure"].startswith("no CUDA driver")
    assert ferry("explain", data, "--host", env=NO_DRIVER).returncode == 0
    assert ferry("plan", "--size", "1MiB", "--host", env=NO_DRIVER).returncode == 0
    # Without a driver the default read goes to host memory: nothing fails, nothing to say.
    assert ferry("check", env=NO_DRIVER).returncode == 0


@pytest.mark.skipif(not os.path.exists(FAKE_CUDA),
                    reason="FERRY_FAKE_CUDA does not name the libcuda double (scripts/test sets "
                           "it)")
def test_check_exits_1_when_the_default_gpu_read_would_fail(data):
    # A GPU, and a setting that refuses every path it has: cuFile required, cuFile absent.
    env = {"FERRY_CUDA_LIBRARY": FAKE_CUDA, "FERRY_REQUIRE": "cufile",
           "FERRY_CUFILE_LIBRARY": "/nonexistent/libcufile.so.0"}
    check = ferry("check", env=env)
    assert "ferry will fail GPU reads" in check.stdout, check.stdout
    assert check.returncode == 1 and "a read into GPU memory would fail" in check.stderr
    assert ferry("check", "--json", env=env).returncode == 1
    explain = ferry("explain", data, env=env)
    read = ferry("read", data, env=env)
    assert read.returncode == explain.returncode == 1, (read.stderr, explain.stdout)
    assert ferry("check", env={"FERRY_CUDA_LIBRARY": FAKE_CUDA}).returncode == 0
