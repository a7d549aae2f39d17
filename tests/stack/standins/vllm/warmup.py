"""Build step of the vllm/vllm-openai stand-in: one `vllm serve` of the baked-in model at compose.yaml's default
knobs (and the Docker stack tier's MAX_NUM_SEQS and MAX_MODEL_LEN), stopped once /health answers, so the image
keeps torch.compile's cache and a container's first start skips the compile. Any failure fails the build."""

import socket
import subprocess
import sys
import time
import urllib.request

START_DEADLINE_S = 600  # a cold start took ~50 s on 2 shared cores; the build may share them with more
STOP_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def main() -> int:
    port = free_port()
    server = subprocess.Popen(["vllm", "serve", "/models/tiny-llama", "--host", "127.0.0.1", "--port", str(port),
                               "--max-num-seqs", "8", "--max-num-batched-tokens", "2048",
                               "--gpu-memory-utilization", "0.92", "--max-model-len", "1024"])
    deadline = time.monotonic() + START_DEADLINE_S
    try:
        while not healthy(f"http://127.0.0.1:{port}/health"):
            if server.poll() is not None:
                print(f"warmup: vllm serve exited {server.returncode} before /health answered", file=sys.stderr)
                return 1
            if time.monotonic() > deadline:
                print(f"warmup: no /health within {START_DEADLINE_S} s", file=sys.stderr)
                return 1
            time.sleep(0.5)  # polling the server's start, bounded by the deadline
        return 0
    finally:
        server.terminate()
        try:
            server.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


if __name__ == "__main__":
    sys.exit(main())
