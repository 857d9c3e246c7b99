"""``semblend-dynamo up``: a real local Dynamo graph in one command.

Starts a nats-server (unless ``--nats-url`` names one), ``dynamo.mocker --engine-type trtllm`` workers on the
bundled tokenizer, the SemBlend router and Dynamo's Frontend, all on 127.0.0.1 with file discovery in a fresh
temporary directory. The mockers serve ``<ns>-workers.backend.generate``; the router serves
``<ns>.semblend.generate`` and registers the model card there, so the Frontend (``--namespace <ns>``) sends every
request to the router, which forwards to the mockers through Dynamo's KvRouter. Ctrl-C or SIGTERM stops every
process by PID (SIGTERM, then SIGKILL after ``--grace-s``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlparse

from pydantic import BaseModel, Field

from semblend_dynamo.tokenizer import bundled_tokenizer_path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
READY_TIMEOUT_S = 90.0
SAMPLE_PROMPT = "Summarize what a KV cache does in one sentence."


class UpError(RuntimeError):
    """A start-up failure reported as one line (exit 2)."""


class UpConfig(BaseModel):
    """Settings of the local graph."""

    workers: int = Field(2, ge=1, le=16, description="mocker workers")
    nats_url: str | None = Field(None, description="an existing NATS server (default: start one on a free port)")
    http_port: int = Field(0, ge=0, le=65535, description="Frontend HTTP port (0: a free one)")
    model_name: str = Field("semblend-demo", min_length=1, description="served model name")
    namespace: str = Field("semblend", min_length=1, description="Dynamo namespace of the Frontend and router")
    block_size: int = Field(16, ge=1, le=64, description="KV tokens per block")
    gpu_blocks: int = Field(2048, ge=16, description="KV blocks per mocker worker")
    speedup_ratio: float = Field(100.0, gt=0.0, description="mocker speed-up over the emulated engine")
    embedder: Literal["minilm", "hash"] = Field("minilm", description="router embedder")
    grace_s: float = Field(5.0, gt=0.0, description="seconds between SIGTERM and SIGKILL on stop")
    workdir: Path | None = Field(None, description="logs, discovery and model dir (default: a fresh temp dir)")


def write_model_dir(path: Path) -> Path:
    """A model directory the mocker and the Frontend accept: the bundled BPE tokenizer plus small configs."""
    tokenizer = bundled_tokenizer_path()
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(tokenizer, path / "tokenizer.json")
    vocab = len(json.loads(tokenizer.read_text())["model"]["vocab"]) + 3
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab,
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "torch_dtype": "float16",
        "max_position_embeddings": 8192,
        "eos_token_id": 0,
    }
    (path / "config.json").write_text(json.dumps(config))
    tokenizer_config = {
        "eos_token": "<|endoftext|>",
        "model_max_length": 8192,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tcp_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), 0.5):
            return True
    except OSError:
        return False


def find_nats_server() -> str | None:
    return shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/local/bin:/usr/bin")


def check_dynamo() -> None:
    for module in ("dynamo.frontend", "dynamo.mocker", "dynamo.llm"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise UpError(
                f"{module} is not installed: run scripts/bootstrap.sh (ai-dynamo==1.6.1 is installed with --no-deps)"
            )


class Child:
    """One process of the graph, its output in a log file."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        with open(log_path, "w") as log:
            # own session: a terminal's Ctrl-C reaches only `up`, which stops the children in order
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class LocalGraph:
    """Owns every process of one local graph: start in dependency order, stop in reverse."""

    def __init__(self, cfg: UpConfig) -> None:
        self.cfg = cfg
        self.dir = cfg.workdir or Path(tempfile.mkdtemp(prefix="semblend-up-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []
        self.nats_url = cfg.nats_url or ""
        self.http_url = ""
        self.metrics_url = ""
        self.worker_namespace = f"{cfg.namespace}-workers"

    # --- start -----------------------------------------------------------------------------------
    def start(self) -> None:
        model_dir = self.start_workers()
        metrics_port = free_port()
        self._spawn(
            "router", [sys.executable, "-m", "semblend_dynamo.router"], self._router_env(model_dir, metrics_port)
        )
        router = self.children[-1]
        self._wait(lambda: "SEMBLEND_ROUTER_READY" in router.log_tail(100_000), "router ready")
        self.metrics_url = f"http://127.0.0.1:{metrics_port}"
        self.start_frontend(self.cfg.namespace)

    def start_workers(self) -> Path:
        """The nats-server (unless one is given) and the mockers; returns the model directory they serve."""
        check_dynamo()
        nats_server = None if self.cfg.nats_url else find_nats_server()
        if not self.cfg.nats_url and nats_server is None:
            raise UpError("nats-server not found on PATH: install it (scripts/bootstrap.sh) or pass --nats-url")
        model_dir = write_model_dir(self.dir / "model")
        (self.dir / "home").mkdir(exist_ok=True)
        if nats_server is not None:
            port = free_port()
            self.nats_url = f"nats://127.0.0.1:{port}"
            self._spawn("nats", [nats_server, "-a", "127.0.0.1", "-p", str(port)], dict(os.environ))
            self._wait(lambda: tcp_open("127.0.0.1", port), "nats-server listening", 10.0)
        else:
            parsed = urlparse(self.nats_url)
            if not tcp_open(parsed.hostname or "127.0.0.1", parsed.port or 4222):
                raise UpError(f"--nats-url {self.nats_url}: nothing listening there")
        env = self._dynamo_env()
        for i in range(self.cfg.workers):
            self._spawn(f"mocker{i}", self._mocker_cmd(model_dir), env)
        self._wait(lambda: len(self._instances(self.worker_namespace)) >= self.cfg.workers, "workers registered")
        return model_dir

    def start_frontend(self, namespace: str, name: str = "frontend") -> str:
        """A stock Frontend for the router serving ``namespace``; returns (and keeps) its URL once it lists the model."""
        http_port = self.cfg.http_port or free_port()
        cmd = [sys.executable, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(http_port)]
        cmd += ["--router-mode", "round-robin", "--namespace", namespace]
        cmd += ["--kv-cache-block-size", str(self.cfg.block_size)]
        self._spawn(name, cmd, self._dynamo_env())
        self.http_url = f"http://127.0.0.1:{http_port}"
        self._wait(self._model_listed, f"Frontend ({namespace}) lists the model")
        return self.http_url

    def _dynamo_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "SEMBLEND_"))}
        env.update(
            {
                "DYN_DISCOVERY_BACKEND": "file",
                "DYN_FILE_KV": str(self.dir / "discovery"),
                "DYN_EVENT_PLANE": "nats",
                "DYN_REQUEST_PLANE": "tcp",
                "DYN_TCP_RPC_HOST": "127.0.0.1",
                "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
                "DYN_EVENT_PLANE_HOST": "127.0.0.1",
                "DYN_SYSTEM_HOST": "127.0.0.1",
                "NATS_SERVER": self.nats_url,
                "HF_HUB_OFFLINE": "1",
                "HOME": str(self.dir / "home"),  # the Frontend copies model-card files under $HOME/.cache
            }
        )
        return env

    def _mocker_cmd(self, model_dir: Path) -> list[str]:
        cfg = self.cfg
        cmd = [sys.executable, "-m", "dynamo.mocker", "--model-path", str(model_dir), "--model-name", cfg.model_name]
        cmd += ["--engine-type", "trtllm", "--block-size", str(cfg.block_size)]
        cmd += ["--num-gpu-blocks-override", str(cfg.gpu_blocks), "--enable-prefix-caching"]
        cmd += [
            "--speedup-ratio",
            str(cfg.speedup_ratio),
            "--endpoint",
            f"dyn://{self.worker_namespace}.backend.generate",
        ]
        return cmd

    def _router_env(self, model_dir: Path, metrics_port: int) -> dict[str, str]:
        env = self._dynamo_env()
        env.update(
            {
                "SEMBLEND_NATS_URL": self.nats_url,
                "SEMBLEND_DYNAMO_NAMESPACE": self.worker_namespace,
                "SEMBLEND_ROUTER_NAMESPACE": self.cfg.namespace,
                "SEMBLEND_WORKER_COMPONENT": "backend",
                "SEMBLEND_MODEL_ID": self.cfg.model_name,
                "SEMBLEND_MODEL_PATH": str(model_dir),
                "SEMBLEND_BLOCK_SIZE": str(self.cfg.block_size),
                "SEMBLEND_EMBEDDER": self.cfg.embedder,
                "SEMBLEND_METRICS_HOST": "127.0.0.1",
                "SEMBLEND_METRICS_PORT": str(metrics_port),
            }
        )
        return env

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        self.children.append(Child(name, cmd, env, self.dir / f"{name}.log"))

    def _wait(self, ready: Callable[[], bool], what: str, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = next((c for c in self.children if not c.alive()), None)
            if dead is not None:
                raise UpError(f"{dead.name} exited ({dead.proc.returncode}) before {what}; log: {dead.log_path}")
            if time.monotonic() > deadline:
                raise UpError(f"{what}: not within {timeout:.0f} s; logs in {self.dir}")
            time.sleep(0.1)

    def _instances(self, namespace: str) -> set[str]:
        folder = self.dir / "discovery" / "v1" / "instances"
        prefix = f"{namespace}/backend/generate/"
        if not folder.is_dir():
            return set()
        return {name for name in (unquote(e.name) for e in folder.iterdir()) if name.startswith(prefix)}

    def _model_listed(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}/v1/models", timeout=2) as resp:
                return any(m.get("id") == self.cfg.model_name for m in json.loads(resp.read()).get("data", []))
        except (OSError, ValueError):
            return False

    # --- run and stop ----------------------------------------------------------------------------
    def first_exited(self) -> Child | None:
        return next((c for c in self.children if not c.alive()), None)

    def stop(self) -> None:
        """SIGTERM every child by PID (newest first), SIGKILL whatever is left after the grace period."""
        for child in reversed(self.children):
            if child.alive():
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.grace_s
        for child in reversed(self.children):
            try:
                child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait(5)


def banner(graph: LocalGraph, seconds: float) -> str:
    cfg = graph.cfg
    body = json.dumps({"model": cfg.model_name, "prompt": SAMPLE_PROMPT, "max_tokens": 16})
    return "\n".join(
        [
            f"semblend-dynamo up: ready in {seconds:.1f} s ({cfg.workers} mocker workers, router, Frontend; "
            f"NATS {graph.nats_url})",
            f"OpenAI URL: {graph.http_url}/v1",
            f"router metrics: {graph.metrics_url}/metrics",
            f"try: curl -s {graph.http_url}/v1/completions -H 'Content-Type: application/json' -d '{body}'",
            f"replay: semblend-dynamo replay --target {graph.http_url} --router-metrics {graph.metrics_url} "
            f"--model {cfg.model_name} --block-size {cfg.block_size}",
            f"logs: {graph.dir}",
            "pids: " + " ".join(f"{c.name}={c.pid}" for c in graph.children),
            "Ctrl-C stops everything.",
        ]
    )


EXAMPLES = """examples:
  semblend-dynamo up                          # nats-server, Frontend, router and 2 mocker workers on free ports
  semblend-dynamo up --workers 4 --embedder hash --workdir /tmp/semblend-up
  semblend-dynamo replay --target http://127.0.0.1:PORT/v1   # then, from another shell
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    helps = {name: field.description or "" for name, field in UpConfig.model_fields.items()}
    parser.add_argument("--workers", type=int, default=2, help=helps["workers"] + " (default 2)")
    parser.add_argument("--nats-url", default=None, help=helps["nats_url"])
    parser.add_argument("--http-port", type=int, default=0, help=helps["http_port"])
    parser.add_argument("--model-name", default="semblend-demo", help=helps["model_name"])
    parser.add_argument("--block-size", type=int, default=16, help=helps["block_size"] + " (default 16)")
    parser.add_argument("--gpu-blocks", type=int, default=2048, help=helps["gpu_blocks"])
    parser.add_argument("--embedder", choices=("minilm", "hash"), default="minilm", help=helps["embedder"])
    parser.add_argument("--grace-s", type=float, default=5.0, help=helps["grace_s"])
    parser.add_argument("--workdir", type=Path, default=None, help=helps["workdir"])


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        cfg = UpConfig(
            workers=args.workers,
            nats_url=args.nats_url,
            http_port=args.http_port,
            model_name=args.model_name,
            block_size=args.block_size,
            gpu_blocks=args.gpu_blocks,
            embedder=args.embedder,
            grace_s=args.grace_s,
            workdir=args.workdir,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        print(
            f"semblend-dynamo up: --{'-'.join(map(str, err['loc'])).replace('_', '-')}: {err['msg']}", file=sys.stderr
        )
        return 2
    try:
        graph = LocalGraph(cfg)
    except OSError as exc:
        print(f"semblend-dynamo up: --workdir={cfg.workdir}: cannot create it ({exc.strerror})", file=sys.stderr)
        return 2
    stopping = {"signal": 0}

    def on_signal(signum: int, _frame: object) -> None:
        stopping["signal"] = signum
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    t0 = time.monotonic()
    try:
        graph.start()
        print(banner(graph, time.monotonic() - t0), flush=True)
        while (dead := graph.first_exited()) is None:
            time.sleep(0.2)
        print(f"semblend-dynamo up: {dead.name} exited ({dead.proc.returncode}); log: {dead.log_path}", file=sys.stderr)
        return 1
    except UpError as exc:
        print(f"semblend-dynamo up: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("semblend-dynamo up: stopping", file=sys.stderr, flush=True)
        return 0
    finally:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not abandon children half-stopped
        graph.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
