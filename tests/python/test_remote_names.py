"""What a URL shows and names (issue 45, part B), against real servers started here on 127.0.0.1
(nginx, s3rver): credentials in a URL (user:password@, a presigned query) never reach the CLI's
text or JSON, a route or load report, or an error, and such URLs load as checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ferry
from remote_servers import nginx, s3rver  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(not ferry.remote_support()[0],
                                reason=f"no libcurl: {ferry.remote_support()[1]}")

# Every secret a URL can carry: a password, and the query of presigned S3, Azure SAS and
# CloudFront URLs. None may appear in any output.
SECRETS = ("hunter2", "AKIDSECRET", "toksecret", "sigsecret", "sassecret", "cfsecret")
QUERY = ("?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDSECRET%2F20260101%2Fus-east-1"
         "&X-Amz-Security-Token=toksecret&X-Amz-Signature=sigsecret&sig=sassecret"
         "&Signature=cfsecret&token=toksecret")


def _with_secrets(url: str, query: bool = True) -> str:
    """`url` (http://127.0.0.1:PORT/...) with a user and password, and a presigned query."""
    return url.replace("http://", "http://alice:hunter2@", 1) + (QUERY if query else "")


def _no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"{secret!r} printed in:\n{text}"


def _cli(*args: str) -> subprocess.CompletedProcess:
    cli = os.environ.get("FERRY_CLI")
    if not cli:
        pytest.skip("FERRY_CLI is not set")
    return subprocess.run([cli, *args], capture_output=True, text=True, timeout=120)


def test_cli_read_never_prints_a_urls_credentials(nginx):  # noqa: F811
    url = nginx.put("names/a.bin", bytes(range(256)) * 40)
    secret = _with_secrets(url)
    r = _cli("read", secret, "--host", "--json")
    assert r.returncode == 0, r.stderr
    _no_secret(r.stdout, r.stderr)
    out = json.loads(r.stdout)
    assert out["file"] == url + "?..." and out["bytes"] == 10240
    assert out["route"]["file"] == url + "?..." and out["route"]["source"]["url"] == url + "?..."
    r = _cli("read", secret, "--host")
    assert r.returncode == 0, r.stderr
    _no_secret(r.stdout, r.stderr)
    assert f"from {url}?... into" in r.stdout
    for args in (("read", _with_secrets(nginx.url + "/names/absent.bin"), "--host"),
                 ("explain", secret), ("write", secret, "--size", "4KiB", "--host")):
        r = _cli(*args)
        _no_secret(r.stdout, r.stderr)
        assert args[0] != "explain" or r.returncode == 0, r.stderr
    assert r.returncode != 0 and "read-only" in r.stderr and url + "?..." in r.stderr


def test_python_reports_and_errors_never_show_a_urls_credentials(nginx):  # noqa: F811
    url = nginx.put("names/b.bin", bytes(5000))
    with ferry.open(_with_secrets(url)) as f:
        buf = np.empty(5000, np.uint8)
        assert f.pread(buf).result() == 5000
        _no_secret(f.path, repr(f), f.last_route.to_text(), f.last_route.to_json())
        assert f.path == url + "?..."
    with pytest.raises(FileNotFoundError) as e:
        ferry.open(_with_secrets(nginx.url + "/names/absent.bin"))
    _no_secret(str(e.value), repr(e.value), str(getattr(e.value, "filename", "")))
    assert "/names/absent.bin?..." in str(e.value)
    assert ferry._ferry.shown_path(_with_secrets(url)) == url + "?..."


def test_a_bucket_is_not_an_object(s3rver, monkeypatch, tmp_path):  # noqa: F811
    # s3rver answers GET /bucket/ with the listing's XML, which ferry read as the object's bytes.
    for k, v in s3rver.env().items():
        monkeypatch.setenv(k, v)
    s3rver.put("names-bucket", "model.safetensors", _safetensors(tmp_path))
    for url in ("s3://names-bucket/", "s3://names-bucket"):
        with pytest.raises(ferry.Error, match=f"open {url}: names a bucket, not an object"):
            ferry.open(url)
        r = _cli("read", url, "--host")
        assert r.returncode == 1 and "names a bucket, not an object" in r.stderr, r.stderr
        # As a checkpoint it is a prefix: model.safetensors under it.
        assert list(ferry.load_checkpoint(url, framework="numpy")) == ["w"]


def _safetensors(tmp_path) -> bytes:
    """A checkpoint of one tensor, "w", as model.safetensors's bytes."""
    ferry.save_checkpoint({"w": np.arange(6, dtype=np.float32)}, tmp_path / "one")
    return (tmp_path / "one" / "model.safetensors").read_bytes()


def test_presigned_and_password_urls_load_as_checkpoints(nginx, tmp_path):  # noqa: F811
    # The file's kind is told from the URL's path: "...model.safetensors?X-Amz-Signature=..."
    # was "a URL with a query names one file", and "http://user:pw@host/dir/" the same.
    d = tmp_path / "sharded"
    tensors = {f"t{i}": np.full((64, 64), i, np.float32) for i in range(3)}
    ferry.save_checkpoint(tensors, d, max_shard_size=20000)
    for p in d.iterdir():
        nginx.put(f"names/ckpt/{p.name}", p.read_bytes())
    single = nginx.put("names/one/model.safetensors", _safetensors(tmp_path))
    base = f"{nginx.url}/names/ckpt"
    for url in (_with_secrets(single), _with_secrets(single, query=False)):
        got = ferry.load_checkpoint(url, framework="numpy")
        assert got["w"].tolist() == list(range(6))
        report = ferry.last_load_report()
        _no_secret(str(report), *(r.to_text() + r.to_json() for r in report.routes))
    for url in (_with_secrets(base + "/", query=False), _with_secrets(base, query=False),
                _with_secrets(base + "/model.safetensors.index.json")):
        got = ferry.load_checkpoint(url, framework="numpy")
        assert sorted(got) == sorted(tensors) and all(
            (got[k] == v).all() for k, v in tensors.items()), url
    r = _cli("load", _with_secrets(single), "--host", "--json", "--list")
    assert r.returncode == 0, r.stderr
    _no_secret(r.stdout, r.stderr)
    out = json.loads(r.stdout)
    assert out["checkpoint"] == single + "?..." and out["shards"] == [single + "?..."]
    assert out["tensor_list"][0]["file"] == single + "?..."
    # What cannot be loaded is named as given, without its credentials.
    for url, error, says in (
            (_with_secrets(nginx.url + "/names/absent.safetensors"), FileNotFoundError, "404"),
            (_with_secrets(base + "/"), ferry.CheckpointError, "a URL with a query names one")):
        with pytest.raises(error, match=says) as e:
            ferry.load_checkpoint(url)
        _no_secret(str(e.value))
        assert url.split("?")[0].replace("alice:hunter2@", "") + "?..." in str(e.value)
        r = _cli("load", url, "--host")
        assert r.returncode == 1 and says in r.stderr, r.stderr
        _no_secret(r.stdout, r.stderr)


def test_a_presigned_s3_url_loads_as_a_checkpoint(s3rver, tmp_path):  # noqa: F811
    s3rver.put("names-presigned", "dir/model.safetensors", _safetensors(tmp_path))
    url = s3rver.presign("names-presigned", "dir/model.safetensors")
    assert "X-Amz-Signature=" in url
    assert ferry.load_checkpoint(url, framework="numpy")["w"].tolist() == list(range(6))


def test_an_index_cannot_leave_its_prefix_by_percent_encoding(nginx, tmp_path):  # noqa: F811
    # nginx decodes "..%2F" before it resolves "..": the shard was served from names/other/.
    nginx.put("names/other/model.safetensors", _safetensors(tmp_path))
    for shard in ("..%2Fother%2Fmodel.safetensors", "%2E%2E/other/model.safetensors"):
        nginx.put("names/evil/model.safetensors.index.json",
                  json.dumps({"weight_map": {"w": shard}}).encode())
        with pytest.raises(ferry.CheckpointError, match="not a plain name beside the index"):
            ferry.load_checkpoint(f"{nginx.url}/names/evil/")
        r = _cli("load", f"{nginx.url}/names/evil/", "--host")
        assert r.returncode == 1 and "not a plain name" in r.stderr, r.stderr


def test_a_local_index_naming_an_encoded_dotdot_stays_in_its_folder(tmp_path):
    # On a local disk "%2F" is no separator: the name is a file of that name inside the folder,
    # and ../other.safetensors beside the folder is never read.
    (tmp_path / "other.safetensors").write_bytes(_safetensors(tmp_path))
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "..%2Fother.safetensors"}}))
    with pytest.raises(ferry.CheckpointError, match=r"\.\.%2Fother\.safetensors does not exist"):
        ferry.load_checkpoint(d)
    (d / "..%2Fother.safetensors").write_bytes(_safetensors(tmp_path))
    assert list(ferry.load_checkpoint(d, framework="numpy")) == ["w"]


def test_kvikio_remote_file_errors_never_show_a_urls_credentials():
    import ferry.kvikio as kvikio
    for url in ("unsupported://alice:hunter2@example.com/path" + QUERY,
                "https://alice:hun?ter2@127.0.0.1:9/x.bin"):
        with pytest.raises(Exception) as e:
            kvikio.RemoteFile.open(url)
        _no_secret(str(e.value))
        assert "alice" not in str(e.value), e.value


def test_a_url_of_another_scheme_is_named_without_its_credentials():
    # Not a URL ferry reads, so a local path that does not exist: named, credentials cut.
    with pytest.raises(FileNotFoundError) as e:
        ferry.open("ftp://alice:hunter2@127.0.0.1/x.bin" + QUERY)
    _no_secret(str(e.value))
    assert "ftp://127.0.0.1/x.bin?..." in str(e.value)
    r = _cli("read", "ftp://alice:hunter2@127.0.0.1/x.bin" + QUERY, "--host")
    assert r.returncode == 1 and "ftp://127.0.0.1/x.bin?..." in r.stderr, r.stderr
    _no_secret(r.stdout, r.stderr)


@pytest.mark.parametrize("args", [
    ("check", "--path", "{url}"), ("check", "--path={url}", "--json"),
    ("plan", "--size", "1MiB", "--cufile-json", "{url}"), ("bench", "-f", "{url}"),
    ("bench", "{url}"), ("demo", "--dir", "{url}", "--size", "1MiB"), ("read", "{url}", "{url}"),
    ("stats", "--dir", "{url}")], ids=lambda a: " ".join(a).replace("{url}", "URL"))
def test_no_command_echoes_a_urls_credentials(args):
    # Commands that take local paths (and the parser) name what they were given when they refuse
    # it: a URL there is named without its credentials too.
    url = "http://alice:hunter2@127.0.0.1:9/x.bin" + QUERY
    r = _cli(*(a.replace("{url}", url) for a in args))
    assert r.returncode != 0 or args[0] == "stats"  # no process has published there
    _no_secret(r.stdout, r.stderr)


def test_array_loaders_name_a_url_without_its_credentials(monkeypatch):
    monkeypatch.setenv("FERRY_REMOTE_RETRIES", "0")  # nothing listens on port 9: fail at once
    url = "http://alice:hunter2@127.0.0.1:9/x.npy" + QUERY
    for load in (lambda: ferry.load(url), lambda: ferry.fromfile(url, dtype="uint8"),
                 lambda: ferry.read_into(url, np.empty(4, np.uint8))):
        with pytest.raises(ferry.IoError) as e:  # no such file; read_into: nothing listens
            load()
        _no_secret(str(e.value), repr(e.value), str(e.value.filename))
        assert e.value.filename == "http://127.0.0.1:9/x.npy?..."


def test_the_repr_of_a_file_whose_open_failed_does_not_crash():
    # pytest prints `self` of File.__init__ in the traceback of a failed open (of a URL no
    # server answers, here): that repr read the never-made C++ File and crashed the process.
    code = ("import ferry\n"
            "try:\n    ferry.open('http://alice:hunter2@127.0.0.1:9/x.bin')\n"
            "except ferry.Error as e:\n    tb = e.__traceback__\n"
            "    while tb.tb_next:\n        tb = tb.tb_next\n"
            "    print(repr(tb.tb_frame.f_locals['self']))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "FERRY_REMOTE_RETRIES": "0"})
    assert r.returncode == 0, r.stderr
    assert "not opened" in r.stdout
