"""A stock Dynamo graph for end-to-end tests: nats-server, ``dynamo.frontend``, the SemBlend router and
``dynamo.mocker --engine-type trtllm`` workers, all Dynamo's (or the project's) real processes.

Layout: the mockers serve ``<ns>w.backend.generate`` (the workers' namespace); the router serves
``<ns>f.semblend.generate`` and registers its model card there, so a Frontend started with ``--namespace <ns>f``
sends the model's traffic to the router, which forwards to the mockers through Dynamo's KvRouter. A Frontend in
``--router-mode kv`` on the workers' namespace is Dynamo's own routing, for comparison.

Every process binds 127.0.0.1 on a free port, uses a fresh ``DYN_FILE_KV`` discovery directory and a fresh
``HOME`` (the Frontend copies model-card files under ``$HOME/.cache``), and is stopped by its PID with SIGTERM.
Logs stay under the graph's directory (kept with ``SEMBLEND_KEEP_TEST_LOGS=1``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import nats

from semblend_apps.up import write_model_dir
from semblend_dynamo.audit import read_audit
from semblend_dynamo.events.codec import RejectedMessage, decode
from semblend_dynamo.events.schemas import RouteEvidence
from tests.support.nats import NatsServer, free_port
from tests.support.processes import stop_process

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny"
BLOCK = 16
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class GraphProcess:
    """One child process, its output in a log file; stopped by PID with SIGTERM."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)

    def log(self) -> str:
        return ANSI.sub("", self.log_path.read_text(errors="replace"))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> float:
        """SIGTERM and wait; returns the seconds it took to exit."""
        t0 = time.monotonic()
        stop_process(self.proc, timeout=timeout)
        return time.monotonic() - t0


class Mocker:
    """A ``dynamo.mocker`` worker and the Dynamo worker id it registered."""

    def __init__(self, process: GraphProcess, worker_id: int) -> None:
        self.process = process
        self.worker_id = worker_id


class ConnectorTestWorker:
    """A connector test worker, its Dynamo worker id and the connector's audit file."""

    def __init__(self, process: GraphProcess, worker_id: int, audit_path: Path) -> None:
        self.process = process
        self.worker_id = worker_id
        self.audit_path = audit_path

    def audit(self) -> list[dict[str, Any]]:
        """The connector's audit records so far."""
        return read_audit(self.audit_path) if self.audit_path.exists() else []


class DynamoGraph:
    """nats-server + mockers + (optionally) the SemBlend router and Frontends, on one event plane."""

    def __init__(self, event_plane: str, *, name: str = "g") -> None:
        self.event_plane = event_plane
        self.dir = Path(tempfile.mkdtemp(prefix=f"semblend-graph-{event_plane}-"))
        self.model_dir = write_model_dir(self.dir / "model")
        (self.dir / "home").mkdir()
        self.nats = NatsServer().start()
        prefix = f"{name}{os.getpid()}{event_plane}"
        self.worker_ns = f"{prefix}w"
        self.frontend_ns = f"{prefix}f"
        self.processes: list[GraphProcess] = []
        self.mockers: list[Mocker] = []
        self.router: GraphProcess | None = None
        self.router_port = 0
        self.env = dict(os.environ)
        for key in [k for k in self.env if k.startswith(("DYN_", "SEMBLEND_"))]:
            del self.env[key]
        self.env.update(
            {
                "DYN_DISCOVERY_BACKEND": "file",
                "DYN_FILE_KV": str(self.dir / "discovery"),
                "DYN_REQUEST_PLANE": "tcp",
                "DYN_TCP_RPC_HOST": "127.0.0.1",
                "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
                "DYN_EVENT_PLANE_HOST": "127.0.0.1",
                "DYN_SYSTEM_HOST": "127.0.0.1",
                "NATS_SERVER": self.nats.url,
                "HF_HUB_OFFLINE": "1",
                "HOME": str(self.dir / "home"),
                "PYTHONPATH": str(ROOT),
            }
        )
        if event_plane == "nats":
            self.env["DYN_EVENT_PLANE"] = "nats"
        elif event_plane != "zmq":
            raise ValueError(event_plane)

    # --- processes -------------------------------------------------------------------------------
    def _start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> GraphProcess:
        process = GraphProcess(name, cmd, env or self.env, self.dir / f"{name}.log")
        self.processes.append(process)
        return process

    def instances(self, namespace: str, component: str = "backend", endpoint: str = "generate") -> set[int]:
        """Live instance ids of an endpoint, read from the file discovery directory."""
        folder = self.dir / "discovery" / "v1" / "instances"
        prefix = f"{namespace}/{component}/{endpoint}/"
        if not folder.is_dir():
            return set()
        out = set()
        for entry in folder.iterdir():
            key = unquote(entry.name)
            if key.startswith(prefix):
                out.add(int(key[len(prefix) :], 16))
        return out

    def start_mocker(self, *, gpu_blocks: int = 512) -> Mocker:
        before = self.instances(self.worker_ns)
        cmd = [sys.executable, "-m", "dynamo.mocker", "--model-path", str(self.model_dir), "--model-name", MODEL]
        cmd += ["--engine-type", "trtllm", "--block-size", str(BLOCK), "--num-gpu-blocks-override", str(gpu_blocks)]
        cmd += ["--enable-prefix-caching", "--speedup-ratio", "100"]
        cmd += ["--endpoint", f"dyn://{self.worker_ns}.backend.generate"]
        process = self._start(f"mocker{len(self.mockers)}", cmd)
        new = wait_until(
            lambda: self.instances(self.worker_ns) - before, timeout=30, what="mocker registered", of=process
        )
        mocker = Mocker(process, next(iter(new)))
        self.mockers.append(mocker)
        return mocker

    def semblend_env(self, **settings: str) -> dict[str, str]:
        """The environment of a SemBlend process in this graph: shared ``SEMBLEND_*`` settings plus ``settings``."""
        env = dict(self.env)
        env.update(
            {
                "SEMBLEND_NATS_URL": self.nats.url,
                "SEMBLEND_DYNAMO_NAMESPACE": self.worker_ns,
                "SEMBLEND_ROUTER_NAMESPACE": self.frontend_ns,
                "SEMBLEND_WORKER_COMPONENT": "backend",
                "SEMBLEND_MODEL_ID": MODEL,
                "SEMBLEND_MODEL_PATH": str(self.model_dir),
                "SEMBLEND_BLOCK_SIZE": str(BLOCK),
                "SEMBLEND_EMBEDDER": "hash",
                "SEMBLEND_MIN_DONOR_TOKENS": "64",
                "SEMBLEND_MIN_SPAN_TOKENS": "32",
                "SEMBLEND_LOG_FORMAT": "json",
            }
        )
        env.update({f"SEMBLEND_{k.upper()}": v for k, v in settings.items()})
        return env

    def start_router(self, **settings: str) -> GraphProcess:
        self.router_port = free_port()
        env = self.semblend_env(metrics_host="127.0.0.1", metrics_port=str(self.router_port), **settings)
        self.router = self._start("router", [sys.executable, "-m", "semblend_dynamo.router"], env)
        router = self.router
        wait_until(lambda: "SEMBLEND_ROUTER_READY" in router.log(), timeout=60, what="router ready", of=router)
        return router

    def start_connector_worker(
        self, *, capacity_blocks: int = 4096, serve_first: str = "", **settings: str
    ) -> ConnectorTestWorker:
        """A connector test worker (tests/support/dynamo_connector_test_worker.py) beside the mockers.

        ``settings`` are ``SEMBLEND_*`` settings on top of the graph's shared ones (give the router the same shared
        ones); its audit file is ``<graph dir>/connector-audit.jsonl``. ``serve_first``: a prompt it serves before it
        reports ready, so requests that start with it are steered to it by Dynamo's KV routing.
        """
        audit = self.dir / "connector-audit.jsonl"
        env = self.semblend_env(audit_path=str(audit), audit_append="1", **settings)
        cmd = [sys.executable, "-m", "tests.support.dynamo_connector_test_worker", "--namespace", self.worker_ns]
        cmd += ["--model", MODEL, "--model-path", str(self.model_dir), "--capacity-blocks", str(capacity_blocks)]
        cmd += ["--serve-first", serve_first]
        process = self._start("connector-worker", cmd, env)
        ready = wait_until(
            lambda: re.search(r"^READY (\d+) (\{.*)$", process.log(), re.M), timeout=60, what="ready", of=process
        )
        # the runtime's own log lines share the stream and may follow the JSON without a newline
        status, _ = json.JSONDecoder().raw_decode(ready.group(2))
        if not status["hints_subscribed"]:
            raise AssertionError(f"connector test worker did not subscribe to its hints:\n{process.log()[-3000:]}")
        return ConnectorTestWorker(process, int(ready.group(1)), audit)

    def start_frontend(self, *, router_mode: str = "round-robin", namespace: str | None = None) -> Frontend:
        port = free_port()
        cmd = [sys.executable, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port)]
        cmd += ["--router-mode", router_mode, "--namespace", namespace or self.frontend_ns]
        cmd += ["--kv-cache-block-size", str(BLOCK)]
        process = self._start(f"frontend-{router_mode}", cmd)
        frontend = Frontend(process, f"http://127.0.0.1:{port}")
        wait_until(frontend.model_listed, timeout=60, what="frontend lists the model", of=process)
        return frontend

    # --- the router's records --------------------------------------------------------------------
    def router_get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.router_port}{path}", timeout=5) as resp:
            return json.loads(resp.read()) if path != "/metrics" else resp.read().decode()

    def router_metric(self, name: str, **labels: str) -> float:
        total = 0.0
        for line in self.router_get("/metrics").splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                head, value = line.rsplit(" ", 1)
                if all(f'{k}="{v}"' in head for k, v in labels.items()):
                    total += float(value)
        return total

    def evidence_subject(self) -> str:
        return f"namespace.{self.worker_ns}.component.backend.endpoint.generate.semblend.evidence"

    def hints_subject(self) -> str:
        """Every worker's hint subject."""
        return f"namespace.{self.worker_ns}.component.backend.endpoint.generate.semblend.hints.*"

    def close(self) -> dict[str, float]:
        """Stop every process (reverse start order) by PID with SIGTERM; returns each one's exit seconds."""
        took = {}
        for process in reversed(self.processes):
            took[process.name] = process.stop()
        self.nats.stop()
        if os.environ.get("SEMBLEND_KEEP_TEST_LOGS") == "1":
            print(f"graph logs kept in {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
            shutil.rmtree(self.nats.store, ignore_errors=True)
        return took


class Frontend:
    """A ``dynamo.frontend`` process and its OpenAI HTTP API."""

    def __init__(self, process: GraphProcess, url: str) -> None:
        self.process = process
        self.url = url

    def model_listed(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as resp:
                return any(m.get("id") == MODEL for m in json.loads(resp.read()).get("data", []))
        except (OSError, ValueError):
            return False

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST JSON to the Frontend; returns the response JSON (raises ``urllib.error.HTTPError`` on an error)."""
        req = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            return dict(json.loads(resp.read()))

    def complete(self, prompt: str, *, max_tokens: int = 2) -> dict[str, Any]:
        """One ``/v1/completions`` request."""
        return self.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens})

    def selected_workers(self) -> list[int]:
        """Workers Dynamo's KV router chose, in order, from the Frontend's ``Selected worker`` log lines."""
        return [int(m) for m in re.findall(r"Selected worker.*?worker_id=(\d+)", self.process.log())]


class EvidenceTap:
    """Collects the router's ``RouteEvidence`` records (its own record of every decision), or the records of another
    ``schema`` (its ``DonorHint`` messages), from NATS."""

    def __init__(self, nats_url: str, subject: str, schema: type[Any] = RouteEvidence) -> None:
        self.schema = schema
        self.records: list[Any] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(nats_url, subject),), daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("evidence tap did not connect to NATS")

    async def _run(self, url: str, subject: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        nc = await nats.connect(url)

        async def on_msg(msg: Any) -> None:
            try:
                record = decode(msg.data, self.schema, max_bytes=1 << 20)
            except RejectedMessage:
                return
            with self._lock:
                self.records.append(record)

        await nc.subscribe(subject, cb=on_msg)
        await nc.flush()
        self._ready.set()
        await self._stop.wait()
        await nc.close()

    def count(self) -> int:
        with self._lock:
            return len(self.records)

    def next_after(self, seen: int, timeout: float = 10.0) -> RouteEvidence:
        """The record following the first ``seen`` ones (requests are sent one at a time)."""
        wait_until(lambda: self.count() > seen, timeout=timeout, what="route evidence")
        with self._lock:
            return self.records[seen]

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)


def wait_until(
    predicate: Callable[[], Any], timeout: float = 20.0, *, what: str = "condition", of: GraphProcess | None = None
) -> Any:
    """Poll ``predicate`` until truthy; AssertionError naming ``what`` (and the process log's tail) on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if of is not None and not of.alive():
            raise AssertionError(f"{of.name} exited {of.proc.returncode} before {what}:\n{of.log()[-3000:]}")
        time.sleep(0.05)
    tail = f":\n{of.log()[-3000:]}" if of is not None else ""
    raise AssertionError(f"{what} not within {timeout}s{tail}")
