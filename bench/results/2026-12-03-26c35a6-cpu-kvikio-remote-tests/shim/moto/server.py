import ctypes, os, signal, subprocess, tempfile, time, urllib.request


def _die_with_parent():
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ThreadedMotoServer:
    def __init__(self, ip_address="127.0.0.1", port=5000, verbose=False):
        self.ip, self.port = ip_address, port

    def start(self):
        d = tempfile.mkdtemp(prefix="fake-moto-s3rver-")
        key = os.environ.get("AWS_ACCESS_KEY_ID", "foobar_key")
        secret = os.environ.get("AWS_SECRET_ACCESS_KEY", "foobar_secret")
        node = ["node"]
        if subprocess.run(["node", "--openssl-legacy-provider", "-e", "0"],
                          capture_output=True).returncode == 0:
            node.append("--openssl-legacy-provider")
        self.proc = subprocess.Popen(
            node + [os.path.join(os.path.dirname(os.path.dirname(__file__)),
                                 "s3rver_for_moto.js"),
                    self.ip, str(self.port), d, key, secret], preexec_fn=_die_with_parent)
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://{self.ip}:{self.port}/", timeout=1)
                return
            except urllib.error.HTTPError:
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("s3rver did not start")

    def stop(self):
        self.proc.kill()
